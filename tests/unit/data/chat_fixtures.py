"""Chat templates in the styles of real models and a small byte-level BPE tokenizer that knows their
control tokens, built here (nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "<pad>"]

# ChatML, as Qwen's chat models use it (a default system turn when the conversation has none).
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# Llama 3: the BOS, then header ids around each role, contents stripped.
LLAMA3 = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Tools (Qwen 2.5's layout: the tool signatures as JSON in the system turn, calls and responses in tags)
# and raise_exception on a role it does not know.
TOOLS = """{%- if tools %}
<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant.{% endif %}

# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif messages[0]['role'] == 'system' %}
<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('Unknown role: ' + message.role) }}
{%- elif message.role == 'user' or (message.role == 'system' and not loop.first) %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}
<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Ünïcode <ok>"}},
                   "required": ["city"]}}}

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "  And of Italy?  "},
    {"role": "assistant", "content": "Rome, the city of seven hills."},
]

TOOL_CONVERSATION = [
    {"role": "user", "content": "Is it raining in Oslo?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "content": "{\"rain\": true}"},
    {"role": "assistant", "content": "Yes, it is raining in Oslo."},
]

TEXT = ("the quick brown fox jumps over the lazy dog. What is the capital of France? Paris. Rome is the city "
        "of seven hills. Answer briefly. You are a helpful assistant. Is it raining in Oslo? Yes it is raining "
        "tools function weather city name arguments description required properties object string type ")


def build_tokenizer(directory: Path) -> Path:
    """A byte-level BPE ``tokenizer.json`` (about 400 ids) with the control tokens above as special tokens."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=CONTROL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator([TEXT] * 4, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    backend.save(str(path))
    return path


def write_template(directory: Path, template: str, name: str = "chat_template.jinja") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if name.endswith(".json"):
        path.write_text(json.dumps({"chat_template": template}), encoding="utf-8")
    else:
        path.write_text(template, encoding="utf-8")
    return path
