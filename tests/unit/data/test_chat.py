"""Chat templates (pentad.data.chat): the text and ids of transformers' apply_chat_template, the record a
run keeps, assistant turns found prefix by prefix, and the errors of bad templates and conversations."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from pentad.data import chat
from pentad.data.chat import ChatTemplateError, assistant_mask, check_messages
from pentad.data.tokenizers import load_tokenizer

from .chat_fixtures import (
    CHATML,
    CONVERSATION,
    LLAMA3,
    TOOL_CONVERSATION,
    TOOLS,
    WEATHER,
    build_tokenizer,
    write_template,
)

transformers = pytest.importorskip("transformers")

SPECIALS = {
    "chatml": {"eos": "<|im_end|>", "pad": "<|endoftext|>"},
    "llama3": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<pad>"},
    "tools": {"eos": "<|im_end|>", "pad": "<|endoftext|>"},
}
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "tools": TOOLS}


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def pair(tokenizer_file: Path, directory: Path, style: str, file_name: str = "chat_template.jinja"):
    """(pentad tokenizer, transformers tokenizer) with the same files, special tokens and template."""
    template = write_template(directory, TEMPLATES[style], file_name)
    ours = load_tokenizer({"type": "tokenizer_json", "file": str(tokenizer_file), "special_tokens": SPECIALS[style],
                           "chat_template": str(template)})
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file), chat_template=TEMPLATES[style],
        **{f"{role}_token": token for role, token in SPECIALS[style].items()})
    return ours, theirs


@pytest.mark.parametrize("style", ["chatml", "llama3", "tools"])
def test_text_and_ids_are_transformers(tokenizer_file, tmp_path, style):
    ours, theirs = pair(tokenizer_file, tmp_path, style)
    conversations = [CONVERSATION[:2], CONVERSATION, CONVERSATION[1:4]]
    cases = [(c, None, prompt) for c in conversations for prompt in (False, True)]
    if style == "tools":
        cases += [(TOOL_CONVERSATION, [WEATHER], False), (TOOL_CONVERSATION[:3], [WEATHER], True),
                  (CONVERSATION, [WEATHER], True)]
    for messages, tools, prompt in cases:
        text = ours.apply_chat_template(messages, add_generation_prompt=prompt, tools=tools, tokenize=False)
        assert text == theirs.apply_chat_template(messages, add_generation_prompt=prompt, tools=tools,
                                                  tokenize=False)
        ids = ours.apply_chat_template(messages, add_generation_prompt=prompt, tools=tools)
        assert ids == theirs.apply_chat_template(messages, add_generation_prompt=prompt, tools=tools,
                                                 return_dict=False)
        assert theirs.convert_tokens_to_ids("<|im_start|>" if style != "llama3" else "<|start_header_id|>") in ids
    if style == "llama3":  # the BOS comes from the template's bos_token
        assert ids[0] == ours.bos_id == theirs.bos_token_id


def test_json_record_named_templates_and_tool_use(tokenizer_file, tmp_path):
    record = tmp_path / "tokenizer_config.json"
    record.write_text(json.dumps({"chat_template": [{"name": "default", "template": CHATML},
                                                    {"name": "tool_use", "template": TOOLS}],
                                  "eos_token": "<|im_end|>", "bos_token": None}), encoding="utf-8")
    ours = load_tokenizer({"type": "tokenizer_json", "file": str(tokenizer_file), "chat_template": str(record)})
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file), eos_token="<|im_end|>",
        chat_template={"default": CHATML, "tool_use": TOOLS})
    for tools in (None, [WEATHER]):
        assert ours.apply_chat_template(CONVERSATION, tools=tools, tokenize=False) == \
            theirs.apply_chat_template(CONVERSATION, tools=tools, tokenize=False)
    assert ours.chat_template.special_tokens == {"eos_token": "<|im_end|>"}  # what the template sees
    assert "# Tools" in ours.apply_chat_template(CONVERSATION, tools=[WEATHER], tokenize=False)


def test_the_tokenizer_record_keeps_the_template(tokenizer_file, tmp_path):
    ours, _ = pair(tokenizer_file, tmp_path / "src", "chatml")
    plain = load_tokenizer({"type": "tokenizer_json", "file": str(tokenizer_file)})
    saved = ours.save(tmp_path / "run_tok")
    assert saved["chat_template"] == "chat_template.jinja" and (tmp_path / "run_tok/chat_template.jinja").is_file()
    again = load_tokenizer(saved, base_dir=tmp_path / "run_tok")
    assert again.fingerprint() == ours.fingerprint() != plain.fingerprint()
    assert again.apply_chat_template(CONVERSATION) == ours.apply_chat_template(CONVERSATION)
    assert pickle.loads(pickle.dumps(again)).apply_chat_template(CONVERSATION) == ours.apply_chat_template(CONVERSATION)
    # A tokenizer without one writes the record it always wrote.
    assert "chat_template" not in plain.save(tmp_path / "plain") and plain.chat_template is None


def test_converted_directories_keep_their_template(tokenizer_file, tmp_path):
    from pentad.interop.hf import import_chat_template

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "tokenizer_config.json").write_text(json.dumps({"chat_template": LLAMA3, "bos_token": "<|begin_of_text|>",
                                                          "eos_token": {"content": "<|eot_id|>"}}), encoding="utf-8")
    name = import_chat_template(hf, tmp_path / "tok")
    record = json.loads((tmp_path / "tok" / name).read_text(encoding="utf-8"))
    assert record == {"chat_template": LLAMA3, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    # chat_template.jinja and additional_chat_templates/ take priority, as in transformers
    write_template(hf, CHATML)
    write_template(hf / "additional_chat_templates", TOOLS, "tool_use.jinja")
    import_chat_template(hf, tmp_path / "tok2")
    record = json.loads((tmp_path / "tok2" / name).read_text(encoding="utf-8"))
    assert record["chat_template"] == [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": TOOLS}]
    assert import_chat_template(tmp_path / "tok2", tmp_path / "none") is None  # no template: nothing written


def test_assistant_tokens_per_token(tokenizer_file, tmp_path):
    ours, _ = pair(tokenizer_file, tmp_path, "chatml")
    ids, mask = assistant_mask(ours, CONVERSATION)
    pieces = [("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
               "<|im_end|>\n<|im_start|>assistant\n", False), ("Paris.<|im_end|>\n", True),
              ("<|im_start|>user\n  And of Italy?  <|im_end|>\n<|im_start|>assistant\n", False),
              ("Rome, the city of seven hills.<|im_end|>\n", True)]
    expected_ids = [i for text, _ in pieces for i in ours.encode(text)]
    expected_mask = [flag for text, flag in pieces for _ in ours.encode(text)]
    assert ids == expected_ids and mask == expected_mask
    # tool calls are assistant turns too; the tool's answer is not
    tools, _ = pair(tokenizer_file, tmp_path / "t", "tools")
    ids, mask = assistant_mask(tools, TOOL_CONVERSATION, tools=[WEATHER])
    learned = tools.decode([i for i, m in zip(ids, mask) if m])
    assert '<tool_call>\n{"name": "get_weather"' in learned and "Yes, it is raining in Oslo." in learned
    assert "rain\": true" not in learned and "Is it raining" not in learned


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer_file, tmp_path):
    rewrites = ("{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}[earlier]"
                "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}assistant: {% endif %}")
    path = write_template(tmp_path, rewrites)
    tok = load_tokenizer({"type": "tokenizer_json", "file": str(tokenizer_file), "chat_template": str(path)})
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja: the tokens of .* are not the start"):
        assistant_mask(tok, CONVERSATION)


def test_bad_templates_and_messages(tokenizer_file, tmp_path):
    tools, theirs = pair(tokenizer_file, tmp_path, "tools")
    odd = [{"role": "narrator", "content": "Once upon a time"}]
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja \(template 'default'\) failed to render this "
                                                r"conversation: Unknown role: narrator"):
        tools.apply_chat_template(odd)
    with pytest.raises(Exception, match="Unknown role: narrator"):  # transformers refuses it alike
        theirs.apply_chat_template(odd)
    broken = write_template(tmp_path / "b", "{% for m in messages %}{{ m.content }\n{% endfor %}")
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja.*line 1: not a valid Jinja template"):
        load_tokenizer({"type": "tokenizer_json", "file": str(tokenizer_file),
                        "chat_template": str(broken)}).apply_chat_template(CONVERSATION)
    with pytest.raises(ChatTemplateError, match=r"chat_template\.json: expected a JSON object with a "
                                                r"\"chat_template\" key"):
        (tmp_path / "chat_template.json").write_text("{\"template\": \"x\"}", encoding="utf-8")
        load_tokenizer({"type": "tokenizer_json", "file": str(tokenizer_file),
                        "chat_template": str(tmp_path / "chat_template.json")})
    with pytest.raises(ChatTemplateError, match=r"has no chat template"):
        chat.encode(load_tokenizer({"type": "tokenizer_json", "file": str(tokenizer_file)}), CONVERSATION)
    with pytest.raises(ChatTemplateError, match=r"messages\[1\]\.role is \"bot\"; expected one of system, user"):
        check_messages([{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}])
    with pytest.raises(ChatTemplateError, match=r"messages\[1\] is an empty assistant turn"):
        check_messages([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}])
    assert check_messages(TOOL_CONVERSATION) == TOOL_CONVERSATION


def test_sandbox_and_helpers(tokenizer_file, tmp_path):
    template = ("{{ strftime_now('%Y') | length }} {{ {'a': '<b>é'} | tojson }} {% set ns = namespace(n=0) %}"
                "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}"
                "{% endfor %}{{ ns.n }} {{ dict(x=1).x }}{% generation %}!{% endgeneration %}")
    path = write_template(tmp_path, template)
    tok = load_tokenizer({"type": "tokenizer_json", "file": str(tokenizer_file), "chat_template": str(path)})
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), chat_template=template)
    text = tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert text == theirs.apply_chat_template(CONVERSATION, tokenize=False) == '4 {"a": "<b>é"} 1 1!'
    escape = write_template(tmp_path / "e", "{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError, match="failed to render"):
        load_tokenizer({"type": "tokenizer_json", "file": str(tokenizer_file),
                        "chat_template": str(escape)}).apply_chat_template(CONVERSATION)


def test_sentencepiece_special_tokens_written_by_the_template(shared_data, tmp_path):
    """A SentencePiece model never matches <s> in text: the template's special tokens become their ids."""
    template = ("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}"
                "{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}")
    tok = load_tokenizer({"type": "sentencepiece", "model": str(shared_data / "models/sentencepiece.bpe.model"),
                          "chat_template": str(write_template(tmp_path, template))})
    messages = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "a reply"},
                {"role": "user", "content": "more"}]
    expected = [tok.bos_id, *tok.encode("user: hello worldassistant: a reply"), tok.eos_id, *tok.encode("user: more")]
    assert tok.apply_chat_template(messages) == expected
    ids, mask = assistant_mask(tok, messages[:2])
    assert ids[-1] == tok.eos_id and mask[-1] and not mask[0]
