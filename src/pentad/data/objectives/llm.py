"""Large-language-model data: pre-training on JSON lines, and supervised fine-tuning (SFT).

``llm_pretrain`` is the ``lm`` objective reading only JSON lines ``{"text": "..."}`` (other keys
are ignored; blank lines carry no text): a line that is not such an object is a bad line naming
file and line, never read as plain text. Documents are packed as in ``lm``.

``llm_sft`` reads JSON lines ``{"instruction": ..., "input": ..., "output": ...}`` (``input`` may be
missing, null or empty). The prompt is ``prompt_template`` with ``{instruction}`` and ``{input}``
replaced (``prompt_template_no_input`` when there is no input; by default the Alpaca templates),
and an example is ``[BOS] prompt output [EOS]`` (the BOS only when the tokenizer has one distinct
from its EOS). As in ``lm``, up to ``seq_length + 1`` tokens are stored and a batch has inputs
``x[:-1]`` and labels ``x[1:]``, but only positions that predict a response token (or the EOS)
are scored: ``labels.lm`` is IGNORE_INDEX on the prompt and at padding. Segments are 0 on the
prompt, 1 on the response and 0 at padding (a prefix-LM encoder reads the prompt as the prefix).

An example longer than that: with ``too_long: truncate`` (default) the response is cut (and then
has no EOS); with ``too_long: skip`` it is a bad line, so preprocessing stops on it unless
``data.on_bad_line=skip``, which skips it and counts it in the manifest's ``skipped_lines``.
An example whose prompt alone leaves no room for a response token is a bad line either way:
no instance ever has its whole response truncated away.

A corpus whose first line is an object with ``"messages"`` holds conversations instead, one per line:
``{"messages": [{"role": ..., "content": ...}, ...], "tools": [...]}`` (roles system, user, assistant,
tool; ``tools`` optional, JSON schemas the template shows). The tokenizer's chat template
(``tokenizer.chat_template``, :mod:`pentad.data.chat`) renders each, with no BOS or EOS added (the
template writes its own), and only the tokens of the assistant turns are scored, found by rendering
prefix by prefix (:func:`pentad.data.chat.assistant_mask`); they are stored as a ``scored`` array beside
the tokens. Segments are 0 before the first assistant token and 1 from it on. A conversation longer
than ``seq_length + 1`` tokens is cut at its end (``truncate``; a bad line when no assistant token is
left) or is a bad line (``skip``). An unknown role, an empty assistant turn, a conversation without one,
a template that fails to render or rewrites earlier turns: a bad line naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from pentad.data.corpus import BadLine
from pentad.data.objectives.base import Objective, ObjectiveConfig, new_batch, to_batch_tensor
from pentad.data.objectives.lm import LmObjective, LmObjectiveConfig
from pentad.data.shards import Instances, Ragged
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch

ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


class LlmPretrainObjectiveConfig(LmObjectiveConfig):
    type: Literal["llm_pretrain"] = "llm_pretrain"  # type: ignore[assignment]
    format: Literal["jsonl"] = Field("jsonl", description="Always JSON lines {\"text\": ...}.")  # type: ignore[assignment]


@OBJECTIVES.register("llm_pretrain")
class LlmPretrainObjective(LmObjective):
    """JSON-lines documents -> packed next-token windows (the ``lm`` machinery)."""

    Config = LlmPretrainObjectiveConfig
    corpus_format: ClassVar[str] = 'JSON lines, one object {"text": "..."} per line (UTF-8)'

    def begin_corpus(self, first_line: str, path: Path) -> tuple[Any, bool]:
        return "jsonl", False


class LlmSftObjectiveConfig(ObjectiveConfig):
    type: Literal["llm_sft"] = "llm_sft"
    prompt_template: str = Field(ALPACA_PROMPT, description="Prompt with {instruction} and {input}.")
    prompt_template_no_input: str = Field(
        ALPACA_PROMPT_NO_INPUT, description="Prompt with {instruction}, used when input is empty.")
    too_long: Literal["truncate", "skip"] = Field(
        "truncate", description="An example longer than seq_length + 1 tokens: truncate its "
                                "response, or treat it as a bad line (see data.on_bad_line).")

    @model_validator(mode="after")
    def _placeholders(self) -> LlmSftObjectiveConfig:
        problems = []
        if "{instruction}" not in self.prompt_template or "{input}" not in self.prompt_template:
            problems.append("prompt_template must contain '{instruction}' and '{input}'")
        if "{instruction}" not in self.prompt_template_no_input:
            problems.append("prompt_template_no_input must contain '{instruction}'")
        if "{input}" in self.prompt_template_no_input:
            problems.append("prompt_template_no_input is used when there is no input and must not "
                            "contain '{input}'")
        if problems:
            raise ValueError("; ".join(problems))
        return self


@OBJECTIVES.register("llm_sft")
class LlmSftObjective(Objective):
    """Instruction/response pairs -> causal-LM windows scored on the response only."""

    Config = LlmSftObjectiveConfig
    truncation_refused: ClassVar[str | None] = (
        "labels.lm scores only the response after the prompt, which a shorter length can cut away "
        "entirely (leaving nothing to score)")
    provides: ClassVar[frozenset[str]] = frozenset({"tokens", "segments", "padding_mask", "labels.lm"})
    corpus_format: ClassVar[str] = ('JSON lines, one object {"instruction": "...", "input": "...", '
                                    '"output": "..."} per line ("input" optional; UTF-8), or, when the first '
                                    'line is one, one conversation {"messages": [{"role": ..., "content": ...}, '
                                    '...], "tools": [...]} per line ("tools" optional)')
    field_names: ClassVar[tuple[str, ...]] = ("split",)
    collate_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, cfg: LlmSftObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: LlmSftObjectiveConfig = cfg
        eos = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
        self.require_ids(**{"an end-of-sequence token (EOS or [SEP])": eos})
        self.eos_id = int(eos)
        bos = tokenizer.bos_id
        self.bos_ids = [int(bos)] if bos is not None and int(bos) != self.eos_id else []
        self.conversations = False  # set by begin_corpus: the corpus holds {"messages": ...} lines

    def begin_corpus(self, first_line: str, path: Path) -> tuple[Any, bool]:
        try:
            record = json.loads(first_line)
        except ValueError:
            record = None
        self.conversations = isinstance(record, dict) and "messages" in record
        if self.conversations:
            from pentad.data.chat import require_template

            require_template(self.tokenizer, f"the tokenizer that reads the conversations of {path}")
        return None, False

    def array_specs(self) -> dict[str, dict[str, Any]]:
        # conversations: for each token, whether it belongs to an assistant turn
        return {"scored": {"dtype": "|u1", "shape": []}} if self.conversations else {}

    def prompt(self, instruction: str, input_text: str) -> str:
        """The prompt text of one example (placeholders replaced literally, not ``str.format``,
        so braces elsewhere in a template or an example are kept as they are)."""
        if input_text.strip():
            text = self.cfg.prompt_template.replace("{input}", input_text)
        else:
            text = self.cfg.prompt_template_no_input
        return text.replace("{instruction}", instruction)

    def parse_line(self, text: str, context: Any) -> tuple[list[int], list[int]] | tuple[list[int], list[bool]] | None:
        """``(prompt ids with BOS, response ids)`` of one example (of a conversation: its ids and which
        are scored), None for a blank line.

        Tokenizes here because whether an example fits decides whether it is a bad line.
        """
        if not text.strip():
            return None
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise BadLine(f"is not valid JSON ({exc})") from None
        if self.conversations:
            return self._conversation(record)
        if not isinstance(record, dict):
            raise BadLine(f"is JSON {type(record).__name__}, not an object with \"instruction\" "
                          f"and \"output\"")
        if "messages" in record:
            raise BadLine('is a conversation ("messages") in a corpus of instruction records (its first line '
                          'is one); a corpus holds one kind: put conversations in a corpus of their own')
        for key, required in (("instruction", True), ("output", True), ("input", False)):
            value = record.get(key)
            if (required and not isinstance(value, str)) or not (value is None or isinstance(value, str)):
                raise BadLine(f'has no string "{key}" field' if required
                              else f'has a "{key}" field that is not a string')
        if not record["output"].strip():
            raise BadLine('has an empty "output" (nothing to learn)')
        prefix = self.bos_ids + self.tokenizer.encode(self.prompt(record["instruction"],
                                                                  record.get("input") or ""))
        response = self.tokenizer.encode(record["output"]) + [self.eos_id]
        room = self.seq_length + 1 - len(prefix)  # response tokens that fit
        if len(response) <= room:
            return prefix, response
        if room < 1:
            raise BadLine(f"has a prompt of {len(prefix)} tokens, which leaves no room for the "
                          f"response within seq_length {self.seq_length} (+1 label token)")
        if self.cfg.too_long == "skip":
            raise BadLine(f"is {len(prefix) + len(response)} tokens long (prompt {len(prefix)}, "
                          f"response {len(response)} with EOS), more than seq_length "
                          f"{self.seq_length} + 1, and objective.too_long is 'skip' (set it to "
                          f"'truncate' to truncate responses instead)")
        return prefix, response[:room]

    def _conversation(self, record: Any) -> tuple[list[int], list[bool]]:
        """(ids, scored) of one conversation line: the chat template's ids and, for each, whether it
        belongs to an assistant turn."""
        from pentad.data.chat import ChatTemplateError, assistant_mask, check_messages

        if not isinstance(record, dict) or "messages" not in record:
            found = f"keys {', '.join(record) or 'none'}" if isinstance(record, dict) else type(record).__name__
            raise BadLine(f'is not a conversation {{"messages": [...]}} (found {found}); the corpus holds '
                          "conversations (its first line is one)")
        tools = record.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise BadLine(f'has a "tools" field that is not a list of objects (found {type(tools).__name__})')
        try:
            messages = check_messages(record["messages"])
            if not any(m.get("role") == "assistant" for m in messages):
                raise ChatTemplateError('"messages" has no assistant turn: nothing to learn')
            ids, scored = assistant_mask(self.tokenizer, messages, tools=tools)
        except ChatTemplateError as e:
            raise BadLine(f"holds a conversation that cannot be used: {e}") from None
        limit = self.seq_length + 1
        if len(ids) > limit:
            if self.cfg.too_long == "skip":
                raise BadLine(f'has "messages" of {len(ids)} tokens, more than seq_length {self.seq_length} + 1, '
                              "and objective.too_long is 'skip' (set it to 'truncate' to cut conversations at "
                              "their end instead)")
            ids, scored = ids[:limit], scored[:limit]
        if not any(scored[1:]):
            raise BadLine(f'has "messages" whose first assistant token comes after seq_length {self.seq_length} '
                          "+ 1 tokens: nothing to learn is left within the length")
        return ids, scored

    def build(self, items: list[Any], rng: np.random.Generator) -> Instances:
        examples = [item for item in items if item is not None]
        if self.conversations:
            out = Instances.from_sequences([ids for ids, _ in examples],
                                           split=[scored.index(True) for _, scored in examples])
            out.arrays["scored"] = Ragged.from_arrays([np.asarray(scored, dtype=np.uint8) for _, scored in examples],
                                                      "|u1", [])
            return out
        return Instances.from_sequences([prefix + response for prefix, response in examples],
                                        split=[len(prefix) for prefix, _ in examples])

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/segments/padding_mask/labels.lm [B,S] with S = longest stored example - 1."""
        from pentad.components.base import IGNORE_INDEX  # on first use; see objectives.base

        ids, valid = instances.padded(self.pad_id)
        inputs = ids[:, :-1].copy()
        real = valid[:, 1:]  # input j is real exactly when token j+1 (its label) exists
        inputs[~real] = self.pad_id
        if "scored" in instances.arrays:  # conversations: token j+1 is scored when it is an assistant's
            scored = np.zeros(valid.shape, dtype=bool)
            scored[valid] = instances.arrays["scored"].data.astype(bool)
            in_response = scored[:, 1:]
        else:  # token j+1 is a response token when j+1 >= split
            in_response = np.arange(1, ids.shape[1])[None, :] >= instances.fields["split"][:, None]
        labels = np.where(real & in_response, ids[:, 1:], IGNORE_INDEX).astype(np.int64)
        segments = (real & (np.arange(ids.shape[1] - 1)[None, :] >= instances.fields["split"][:, None]))
        return new_batch(tokens=to_batch_tensor(inputs),
                         segments=to_batch_tensor(segments.astype(np.int64)),
                         padding_mask=to_batch_tensor(~real), labels={"lm": to_batch_tensor(labels)})
