"""Chat templates: conversations (lists of messages) to the text and token ids a chat model was trained on.

A chat template is a Jinja template, as Hugging Face tokenizers carry them (``chat_template`` in
``tokenizer_config.json``, or a ``chat_template.jinja`` file). A tokenizer config names one with
``chat_template: FILE``: a ``.json`` file holding a ``chat_template`` key (one template, or a list of
``{"name": ..., "template": ...}``: ``tokenizer_config.json`` itself will do) and optionally the special
tokens the template sees (``bos_token``, ``eos_token``, ... as ``tokenizer_config.json`` names them), or
any other file, whose text is the one template.

Rendering follows ``transformers``' ``apply_chat_template``: a sandboxed environment
(``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, loop controls, the
``{% generation %}`` block rendered as its body), the ``tojson`` filter without HTML escaping, the
globals ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` (which refuses names that begin
with an underscore); the context holds ``messages`` (keys whose value is None dropped, a message's
reasoning under ``reasoning_content`` and ``thinking`` alike), ``tools``, ``documents``,
``add_generation_prompt`` and the special tokens as ``<role>_token``. With several templates, the one
named ``tool_use`` serves conversations with tools when there is one, ``default`` the others. The text
is then encoded without added special tokens (the template writes them), which gives
``apply_chat_template``'s ids.

Training on the assistant turns (:func:`assistant_mask`) renders the conversation prefix by prefix:
the ids of the messages before each assistant turn with the generation prompt, then of the messages up
to the end of that turn; what lies between is the turn's tokens. Each of those must be a prefix of
the next and of the whole conversation, or the template rewrites earlier turns (some templates drop
the reasoning of earlier turns) and the turns cannot be found: an error says which.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pentad.errors import UserError

ROLES = ("system", "user", "assistant", "tool")
"""The message roles a conversation may hold."""

TOKEN_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(UserError):
    """A chat template that cannot be read or rendered, or a conversation it cannot take."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _environment() -> Any:
    """The sandboxed Jinja environment chat templates run in (see the module docstring)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.sandbox
    import jinja2.utils

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` marks the assistant's text in some templates; it
        renders as its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    def make_dict(*args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not store the attribute {name!r} on a "
                                                  "namespace (names beginning with '_' are refused)")

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (Jinja's own signature)
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: Any, value: Any) -> None:
            check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=make_dict,
                       namespace=Namespace)
    return env


def _plain(value: Any) -> Any:
    """``value`` rebuilt from JSON types (what a template may see), None-valued message keys kept."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for kind in (bool, str, int, float):  # a subclass (an enum member) as its base type's value
        if isinstance(value, kind):
            return kind(value)
    return f"<{type(value).__name__}>"


def _messages_for_template(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the template receives them: keys whose value is None dropped, and a message's
    reasoning under both ``reasoning_content`` and ``thinking``."""
    out = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"a chat message must be an object with \"role\" and \"content\", found "
                                    f"{type(message).__name__}")
        plain = {k: v for k, v in _plain(message).items() if v is not None}
        reasoning = next((plain[k] for k in REASONING_KEYS if k in plain), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        out.append(plain)
    return out


class ChatTemplate:
    """The chat template(s) of a tokenizer, read from ``path`` (see the module docstring).

    ``templates``: name -> Jinja source (``default`` for a lone template); ``special_tokens``: the
    ``<role>_token`` values the file names (None when it names none: the tokenizer's are used).
    """

    def __init__(self, templates: Mapping[str, str], path: Path | str,
                 special_tokens: Mapping[str, str] | None = None):
        if not templates:
            raise ChatTemplateError(f"chat template file {path} holds no template")
        self.templates = dict(templates)
        self.path = Path(path)
        self.special_tokens = dict(special_tokens) if special_tokens is not None else None
        self._compiled: dict[str, Any] = {}

    @classmethod
    def parse(cls, data: bytes, path: Path | str) -> ChatTemplate:
        """A template file's bytes: JSON (``.json``) with a ``chat_template`` key, else the template's text."""
        path = Path(path)
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ChatTemplateError(f"chat template file {path} is not UTF-8 text (byte {e.start})") from None
        if path.suffix.lower() != ".json":
            if not text.strip():
                raise ChatTemplateError(f"chat template file {path} is empty; expected a Jinja chat template")
            return cls({"default": text}, path)
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise ChatTemplateError(f"chat template file {path}, line {e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict) or "chat_template" not in record:
            found = f"keys {', '.join(record) or 'none'}" if isinstance(record, dict) else type(record).__name__
            raise ChatTemplateError(f"chat template file {path}: expected a JSON object with a \"chat_template\" key "
                                    f"(a template, or a list of {{\"name\", \"template\"}}), found {found}")
        value = record["chat_template"]
        templates: dict[str, str] = {}
        if isinstance(value, str):
            templates["default"] = value
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                        and isinstance(item.get("template"), str)):
                    raise ChatTemplateError(f"chat template file {path}: chat_template[{i}] must be an object with "
                                            f"string \"name\" and \"template\", found {json.dumps(item)[:80]}")
                templates[item["name"]] = item["template"]
        elif isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            templates.update(value)
        else:
            raise ChatTemplateError(f"chat template file {path}: \"chat_template\" must be a string or a list of "
                                    f"{{\"name\", \"template\"}} objects, found {type(value).__name__}")
        named = {f"{role}_token": _token_text(record.get(f"{role}_token")) for role in TOKEN_ROLES}
        special = {k: v for k, v in named.items() if v is not None}
        return cls(templates, path, special or None)

    def to_json(self) -> dict[str, Any]:
        """The file form of these templates (the ``.json`` form :meth:`parse` reads)."""
        value: Any = (self.templates["default"] if list(self.templates) == ["default"]
                      else [{"name": k, "template": v} for k, v in self.templates.items()])
        return {"chat_template": value, **(self.special_tokens or {})}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_compiled": {}}  # compiled templates are rebuilt where they are used

    def select(self, name: str | None = None, tools: Any = None) -> str:
        """The name of the template to use: ``name``, else ``tool_use`` (with tools) or ``default``."""
        if name is not None:
            if name not in self.templates:
                raise ChatTemplateError(f"chat template file {self.path} has no template named {name!r}; it has "
                                        f"{', '.join(sorted(self.templates))}")
            return name
        if tools is not None and "tool_use" in self.templates:
            return "tool_use"
        if "default" in self.templates:
            return "default"
        raise ChatTemplateError(f"chat template file {self.path} holds several templates "
                                f"({', '.join(sorted(self.templates))}) and none is named 'default'; name the one "
                                "to use")

    def _template(self, name: str) -> Any:
        import jinja2

        if name not in self._compiled:
            try:
                self._compiled[name] = _environment().from_string(self.templates[name])
            except jinja2.TemplateSyntaxError as e:
                raise ChatTemplateError(f"chat template file {self.path} (template '{name}'), line {e.lineno}: "
                                        f"not a valid Jinja template ({e.message})") from None
        return self._compiled[name]

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False,
               tools: Sequence[Mapping[str, Any]] | None = None, documents: Sequence[Mapping[str, Any]] | None = None,
               special_tokens: Mapping[str, str] | None = None, name: str | None = None,
               **context: Any) -> str:
        """The text of a conversation. ``special_tokens``: ``<role>_token`` values (the file's, when it
        names some, take their place); ``context``: more variables for the template."""
        import jinja2

        chosen = self.select(name, tools)
        template = self._template(chosen)
        tokens = dict(self.special_tokens if self.special_tokens is not None else special_tokens or {})
        variables = {**tokens, **_plain(context)}
        try:
            return template.render(messages=_messages_for_template(messages), tools=_plain(tools),
                                   documents=_plain(documents), add_generation_prompt=add_generation_prompt,
                                   **variables)
        except jinja2.TemplateError as e:
            where = f", line {e.lineno}" if isinstance(e, jinja2.TemplateSyntaxError) and e.lineno else ""
            raise ChatTemplateError(f"chat template file {self.path} (template '{chosen}'){where} failed to render "
                                    f"this conversation: {e.message or type(e).__name__}") from None


def special_token_context(tokenizer: Any) -> dict[str, str]:
    """``<role>_token`` -> token of each special-token role the tokenizer has."""
    tokens = tokenizer.special_tokens
    return {f"{role}_token": tokens[role] for role in TOKEN_ROLES if tokens.get(role) is not None}


def require_template(tokenizer: Any, label: str = "the tokenizer") -> ChatTemplate:
    template = tokenizer.chat_template
    if template is None:
        raise ChatTemplateError(
            f"{label} has no chat template: add one to the tokenizer config (tokenizer.chat_template: FILE, a "
            "Jinja file or a tokenizer_config.json with a chat_template); a model converted from Hugging Face "
            "keeps the template of its tokenizer_config.json or chat_template.jinja")
    return template


def render(tokenizer: Any, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
           tools: Any = None, **context: Any) -> str:
    """The tokenizer's chat template applied to ``messages`` (text)."""
    return require_template(tokenizer).render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                              special_tokens=special_token_context(tokenizer), **context)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """The ids of a rendered conversation, the special tokens the template wrote included. Rust-backed
    tokenizers find them in the text themselves; a SentencePiece model never matches its control pieces
    (``<s>``) in text, so the text is cut at the special tokens (longest first) and the pieces between
    are encoded one by one, as a ``transformers`` tokenizer with those added tokens does."""
    if getattr(tokenizer, "registry_name", None) != "sentencepiece":
        return tokenizer.encode(text)
    specials = sorted({t for t in tokenizer.special_tokens.values() if t}, key=len, reverse=True)
    if not specials:
        return tokenizer.encode(text)
    ids: list[int] = []
    for i, piece in enumerate(re.split("(" + "|".join(map(re.escape, specials)) + ")", text)):
        if i % 2:
            ids.append(int(tokenizer.token_to_id(piece)))
        elif piece:
            ids += tokenizer.encode(piece)
    return ids


def encode(tokenizer: Any, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
           tools: Any = None, **context: Any) -> list[int]:
    """The token ids of :func:`render`'s text (no special tokens added: the template writes them)."""
    return encode_text(tokenizer, render(tokenizer, messages, add_generation_prompt, tools, **context))


def check_messages(messages: Any, field: str = "messages") -> list[dict[str, Any]]:
    """``messages`` checked: a non-empty list of objects with a known ``role``; ``content`` a string (or
    a list of content parts) where present; an assistant turn with content or tool calls. A problem is a
    ChatTemplateError naming the field (``messages[2].role``)."""
    if not isinstance(messages, list) or not messages:
        found = "an empty list" if isinstance(messages, list) else type(messages).__name__
        raise ChatTemplateError(f'"{field}" must be a non-empty list of messages, found {found}')
    for i, message in enumerate(messages):
        at = f"{field}[{i}]"
        if not isinstance(message, dict):
            raise ChatTemplateError(f'{at} must be an object {{"role": ..., "content": ...}}, found '
                                    f"{type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"{at}.role is {json.dumps(role)}; expected one of {', '.join(ROLES)}")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ChatTemplateError(f"{at}.content must be a string (or a list of content parts), found "
                                    f"{type(content).__name__}")
        if role == "assistant":
            empty = content is None or (isinstance(content, str) and not content.strip()) or content == []
            if empty and not message.get("tool_calls"):
                raise ChatTemplateError(f"{at} is an empty assistant turn (no content and no tool_calls): nothing "
                                        "to learn or to show; remove it or give its text")
    return messages


def _is_prefix(short: Sequence[int], long: Sequence[int]) -> bool:
    return len(short) <= len(long) and list(long[:len(short)]) == list(short)


def assistant_mask(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Any = None,
                   **context: Any) -> tuple[list[int], list[bool]]:
    """(ids of the whole conversation, for each id whether it belongs to an assistant turn), found by
    rendering prefix by prefix (see the module docstring)."""
    template = require_template(tokenizer)
    tokens = special_token_context(tokenizer)

    def ids(upto: int, prompt: bool) -> list[int]:
        text = template.render(messages[:upto], add_generation_prompt=prompt, tools=tools, special_tokens=tokens,
                               **context)
        return encode_text(tokenizer, text)

    full = ids(len(messages), False)
    mask = [False] * len(full)
    done = 0  # ids known to be a prefix of ``full``
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = ids(i, True)
        after = ids(i + 1, False)
        for what, part in ((f"the messages before messages[{i}] with the generation prompt", before),
                           (f"the messages up to messages[{i}]", after)):
            if not _is_prefix(part, full) or len(part) < done:
                raise ChatTemplateError(
                    f"chat template file {template.path}: the tokens of {what} are not the start of the "
                    "conversation's tokens, so the assistant turn's tokens cannot be told apart (the template "
                    "renders earlier turns differently once later ones follow, e.g. dropping their reasoning); "
                    "train on such conversations one assistant turn at a time")
            done = len(part)
        for j in range(len(before), len(after)):
            mask[j] = True
    return full, mask
