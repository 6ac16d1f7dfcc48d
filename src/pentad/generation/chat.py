"""Chat: replies to conversations through the tokenizer's chat template (``pentad chat``, ``pentad
generate --chat``).

A conversation's prompt is the template applied with the generation prompt (:mod:`pentad.data.chat`),
used as it is: no BOS or other framing is added, the template writes its own. A reply ends at the
tokenizer's end token (EOS, else SEP), as every generation does; what it holds is the assistant's
message. :class:`ChatSession` keeps the history of one conversation turn after turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from pentad.data import chat
from pentad.errors import UserError
from pentad.generation.config import GenerationConfig, GenerationInputError
from pentad.generation.session import position_limit
from pentad.generation.text import Completion, TextGenerator


class ConversationTooLong(GenerationInputError):
    """A conversation whose prompt and reply do not fit in the model's positions."""


def check_chat_model(generator: TextGenerator, label: str = "the model") -> None:
    """A UserError unless the model is decoder-only and its tokenizer has a chat template."""
    if generator.model.decoder is not None:
        raise UserError(f"{label} is an encoder-decoder model; chat continues a conversation's text, which needs a "
                        "decoder-only (causal) language model")
    chat.require_template(generator.tokenizer, f"the tokenizer of {label}")


def prompt_ids(generator: TextGenerator, messages: Sequence[Mapping[str, Any]], tools: Any = None) -> list[int]:
    """The ids of ``messages`` with the template's generation prompt: where the assistant's reply begins."""
    return chat.encode(generator.tokenizer, messages, add_generation_prompt=True, tools=tools)


def check_length(generator: TextGenerator, ids: Sequence[int], config: GenerationConfig, where: str) -> None:
    """ConversationTooLong (naming ``where``) when ``ids`` plus the reply exceed the model's positions."""
    limit = position_limit(generator.model.embedding)
    need = len(ids) + config.max_new_tokens - 1
    if limit is not None and need > limit:
        raise ConversationTooLong(
            f"{where}: the conversation is {len(ids)} tokens with the generation prompt and a reply of up to "
            f"max_new_tokens {config.max_new_tokens} needs {need} positions; the model has {limit}. Shorten the "
            "conversation (drop early turns) or ask for fewer new tokens")


def replies(generator: TextGenerator, conversations: Sequence[Sequence[Mapping[str, Any]]],
            config: GenerationConfig | None = None, *, tools: Sequence[Any] | None = None,
            origins: Sequence[str] | None = None, batch_size: int = 8, stop_strings: Sequence[str] = (),
            **overrides: Any) -> list[list[Completion]]:
    """The assistant's next message in each conversation (``num_return_sequences`` each); ``tools``: one
    list (or None) per conversation; ``origins``: where each came from, for errors."""
    cfg = generator.config(config, **overrides)
    tools = list(tools) if tools is not None else [None] * len(conversations)
    origins = list(origins) if origins is not None else [f"conversation {i + 1}" for i in range(len(conversations))]
    prompts = []
    for messages, tool_list, where in zip(conversations, tools, origins):
        ids = prompt_ids(generator, messages, tool_list)
        check_length(generator, ids, cfg, where)
        prompts.append(ids)
    return generator.generate_ids(prompts, cfg, stop_strings=stop_strings, batch_size=batch_size)


class ChatSession:
    """One conversation with a model: each :meth:`send` adds the user's message and the model's reply to
    the history; :meth:`reset` forgets them (a ``system`` message stays). With sampling, one generator
    seeded once serves every turn, so a seeded session replays exactly."""

    def __init__(self, generator: TextGenerator, config: GenerationConfig | None = None, *,
                 system: str | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
                 stop_strings: Sequence[str] = (), label: str = "the model"):
        check_chat_model(generator, label)
        self.generator = generator
        self.config = generator.config(config)
        self.system, self.tools, self.stop_strings = system, list(tools) if tools else None, list(stop_strings)
        self.rng: torch.Generator | None = None
        if self.config.do_sample and self.config.seed is not None:
            device = next(generator.model.parameters()).device
            self.rng = torch.Generator(device=device).manual_seed(self.config.seed)
        self.history: list[dict[str, Any]] = []
        self.reset()

    def reset(self) -> None:
        self.history = [{"role": "system", "content": self.system}] if self.system else []

    def send(self, text: str, on_text: Callable[[str], None] | None = None) -> Completion:
        """The model's reply to the user's ``text`` (streamed to ``on_text`` piece by piece when given).
        A conversation that no longer fits raises ConversationTooLong and leaves the history as it was."""
        messages = [*self.history, {"role": "user", "content": text}]
        ids = prompt_ids(self.generator, messages, self.tools)
        check_length(self.generator, ids, self.config, "this turn")
        if on_text is not None:
            completion = self.generator.stream_ids(ids, on_text, self.config, stop_strings=self.stop_strings,
                                                   generator=self.rng)
        else:
            (completion,), = self.generator.generate_ids([ids], self.config, stop_strings=self.stop_strings,
                                                         generator=self.rng)
        self.history = [*messages, {"role": "assistant", "content": completion.text}]
        return completion
