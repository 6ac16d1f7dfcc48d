"""Tokenizers: text to token ids and back, for preprocessing, fine-tuning readers and generation.

Every tokenizer wraps a compiled library rather than re-implementing an algorithm in Python:
WordPiece, byte-level BPE, character and whitespace tokenizers run on the Rust ``tokenizers``
library; ``sentencepiece`` models run on the ``sentencepiece`` library. Each one is registered in
:data:`pentad.registry.TOKENIZERS` with a ``Config`` selected by ``type``:

- ``wordpiece``: BERT's BasicTokenizer + greedy WordPiece from a ``vocab.txt`` (one token per line,
  id = line number - 1), giving the same ids as Hugging Face ``BertTokenizer``.
- ``bpe``: GPT-2 byte-level BPE from ``vocab.json`` + ``merges.txt``, or from TencentPretrain's text
  form (``huggingface_gpt2_vocab.txt``, one token per line, + ``huggingface_gpt2_merges.txt``).
- ``char`` / ``space``: every non-space character / every whitespace-separated word is a token.
- ``sentencepiece``: a SentencePiece ``.model`` file.

Special tokens have seven roles (``pad unk cls sep mask bos eos``). Each tokenizer looks for the
usual token of each role in its vocabulary (``[PAD] [UNK] [CLS] [SEP] [MASK]`` for BERT-style
vocabularies, ``<|endoftext|>`` for GPT-2, the model's own ids for SentencePiece); a role with no
token of its own borrows its counterpart's (``cls`` <-> ``bos``, ``sep`` <-> ``eos``), and a
``special_tokens`` mapping in the config overrides any of them. As in Hugging Face tokenizers, the
special tokens of a Rust-backed tokenizer are recognised when they appear literally in the text
(``special_tokens_in_text: parse``, the default); ``split`` tokenizes such text like any other, as
TencentPretrain's tokenizers and Hugging Face's ``split_special_tokens=True`` do.

``encode`` never adds special tokens: objectives and tasks decide where ``[CLS]``/``[SEP]`` go.
"""

from __future__ import annotations

import abc
import hashlib
import itertools
import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import sentencepiece
import tokenizers as hf_tokenizers
from pydantic import AfterValidator, Field, ValidationError, model_serializer
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from pentad.config.base import StrictModel
from pentad.errors import ConfigError, ConfigProblem, UserError, closest
from pentad.files import atomic_open
from pentad.registry import TOKENIZERS

ROLES: tuple[str, ...] = ("pad", "unk", "cls", "sep", "mask", "bos", "eos")
"""The special-token roles, in the order they are reported."""

# A role with no token of its own borrows this one's (BERT vocabularies have no bos/eos, GPT-2 has
# no cls/sep); this is how TencentPretrain uses [CLS]/[SEP] as start/end of a generated sequence.
_COUNTERPART = {"cls": "bos", "bos": "cls", "sep": "eos", "eos": "sep"}

_BERT_SPECIALS: dict[str, tuple[str, ...]] = {
    "pad": ("[PAD]",),
    "unk": ("[UNK]",),
    "cls": ("[CLS]",),
    "sep": ("[SEP]",),
    "mask": ("[MASK]",),
}

_FINGERPRINT_FORMAT = 1  # bump when the fingerprint payload changes
CHAT_TEMPLATE = "chat_template"  # the config field and source name of the chat template file


def _check_roles(value: dict[str, str] | None) -> dict[str, str] | None:
    """Pydantic validator: every key of a ``special_tokens`` mapping must be a known role."""
    if value:
        unknown = [role for role in value if role not in ROLES]
        if unknown:
            raise ValueError(_unknown_roles_message(unknown))
    return value


def _unknown_roles_message(unknown: Sequence[str]) -> str:
    parts = []
    for role in unknown:
        hint = closest(role, ROLES)
        parts.append(f"'{role}'" + (f" (did you mean '{hint}'?)" if hint else ""))
    return f"unknown special-token role(s) {', '.join(parts)}; known roles: {', '.join(ROLES)}"


SpecialTokens = Annotated[
    dict[str, str] | None,
    AfterValidator(_check_roles),
    Field(description="Override role -> token string, e.g. {mask: '<mask>'}; roles: " + ", ".join(ROLES)),
]

ChatTemplateFile = Annotated[
    Path | None,
    Field(description="the chat template (pentad.data.chat): a .json file with a chat_template key (a Hugging Face "
                      "tokenizer_config.json will do) or a Jinja file; conversations are rendered with it"),
]


class _TokenizerConfig(StrictModel):
    """The base of the tokenizer configs: an unset ``chat_template`` is left out of what they write, so
    the records of tokenizers without one read as they did before the option."""

    @model_serializer(mode="wrap")
    def _without_unset_template(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("chat_template", 0) is None:
            del data["chat_template"]
        return data


PARSE, SPLIT = "parse", "split"
SpecialTokensInText = Annotated[
    Literal["parse", "split"],
    Field(description="a special token typed literally in the text ('[CLS]', '<|endoftext|>'): 'parse' makes it "
                      "the special id (Hugging Face's default); 'split' tokenizes it like any other text, as "
                      "TencentPretrain's tokenizers do (Hugging Face's split_special_tokens=True)"),
]


# --------------------------------------------------------------------------------------------
# File reading: every problem is a UserError naming the file (and line).


@dataclass(frozen=True)
class _Source:
    """One file a tokenizer was loaded from: where it was, and the exact bytes that were parsed.

    Keeping the bytes makes ``save`` and ``fingerprint`` describe what was loaded even if the
    file changes on disk afterwards.
    """

    path: Path
    data: bytes

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _read_source(path: Path, what: str, allow_empty: bool = False) -> _Source:
    if not path.exists():
        raise UserError(f"{what} file {path} does not exist; check the tokenizer config path.")
    if not path.is_file():
        raise UserError(f"{what} path {path} is not a file.")
    data = path.read_bytes()
    if not allow_empty and not data.strip():
        raise UserError(f"{what} file {path} is empty; expected at least one entry.")
    return _Source(path, data)


def _decode_utf8(source: _Source, what: str) -> str:
    try:
        # utf-8-sig: a byte-order mark is never part of the first token.
        return source.data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = source.data[: exc.start].count(b"\n") + 1
        raise UserError(
            f"{what} file {source.path}, line {line}: not valid UTF-8 (byte offset {exc.start})."
        ) from None


def _lines(text: str) -> list[str]:
    """Split on '\\n' only (not ``str.splitlines``): vocabularies hold tokens such as U+2028."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _parse_vocab_lines(source: _Source) -> dict[str, int]:
    """A ``vocab.txt``: one token per line, id = line number - 1."""
    vocab: dict[str, int] = {}
    for index, token in enumerate(_lines(_decode_utf8(source, "vocabulary"))):
        if token == "":
            raise UserError(
                f"vocabulary file {source.path}, line {index + 1}: the line is empty; every line "
                "must hold one token (a token's id is its line number minus one)."
            )
        if token in vocab:
            raise UserError(
                f"vocabulary file {source.path}, line {index + 1}: token {token!r} already appears "
                f"on line {vocab[token] + 1}; every token must appear once."
            )
        vocab[token] = index
    return vocab


def _parse_vocab_json(source: _Source) -> dict[str, int]:
    """A ``vocab.json``: an object mapping token -> id."""
    try:
        data = json.loads(_decode_utf8(source, "vocabulary"))
    except json.JSONDecodeError as exc:
        raise UserError(
            f"vocabulary file {source.path}, line {exc.lineno}: not valid JSON ({exc.msg})."
        ) from None
    if not isinstance(data, dict) or not data:
        raise UserError(
            f"vocabulary file {source.path}: expected a non-empty JSON object mapping token -> id, "
            f"found {type(data).__name__}{' (empty)' if not data else ''}."
        )
    seen: dict[int, str] = {}
    for token, index in data.items():
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise UserError(
                f"vocabulary file {source.path}: token {token!r} has id {index!r}; "
                "expected a non-negative integer."
            )
        if index in seen:
            raise UserError(
                f"vocabulary file {source.path}: tokens {seen[index]!r} and {token!r} share id {index}."
            )
        seen[index] = token
    return data


def _parse_vocab(source: _Source) -> dict[str, int]:
    """JSON for a ``.json`` file or one that parses as a JSON object; one token per line otherwise
    (a text vocabulary may well start with a '{' token)."""
    if source.path.suffix.lower() == ".json":
        return _parse_vocab_json(source)
    if source.data.lstrip()[:1] == b"{":
        try:
            if isinstance(json.loads(source.data.decode("utf-8-sig")), dict):
                return _parse_vocab_json(source)
        except (UnicodeDecodeError, json.JSONDecodeError):
            pass
    return _parse_vocab_lines(source)


def _parse_merges(source: _Source, vocab: Mapping[str, int], vocab_path: Path) -> list[tuple[str, str]]:
    """A ``merges.txt``: an optional ``#version`` line, then one ``left right`` pair per line."""
    merges: list[tuple[str, str]] = []
    for index, line in enumerate(_lines(_decode_utf8(source, "merges"))):
        if index == 0 and line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise UserError(
                f"merges file {source.path}, line {index + 1}: expected two tokens separated by one "
                f"space, found {line!r}."
            )
        for token in (parts[0], parts[1], parts[0] + parts[1]):
            if token not in vocab:
                raise UserError(
                    f"merges file {source.path}, line {index + 1}: the merge {line!r} uses token "
                    f"{token!r}, which is not in the vocabulary {vocab_path}."
                )
        merges.append((parts[0], parts[1]))
    return merges


def _resolve_path(path: Path | str, base_dir: Path | None) -> Path:
    path = Path(path).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path


def _validate_config(config_cls: type[StrictModel], data: Mapping[str, Any], name: str) -> StrictModel:
    """Validate a plain mapping; pydantic errors become one ConfigError listing all problems."""
    try:
        return config_cls.model_validate(dict(data))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(part) for part in err["loc"])
            suggestion = None
            if err["type"] == "extra_forbidden" and err["loc"]:
                suggestion = closest(str(err["loc"][-1]), config_cls.model_fields)
            received = repr(err["input"]) if err["type"] != "missing" else None
            problems.append(
                ConfigProblem(path=f"tokenizer.{loc}" if loc else "tokenizer", message=err["msg"],
                              received=received, suggestion=suggestion)
            )
        raise ConfigError(problems, header=f"invalid '{name}' tokenizer config") from None


def _as_id_list(ids: Any) -> list[int]:
    """Token ids from a list, numpy array or tensor, as Python ints."""
    values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    return [int(i) for i in values]


# --------------------------------------------------------------------------------------------
# The common interface.


class Tokenizer(abc.ABC):
    """Text <-> token ids. Subclasses are registered in ``TOKENIZERS`` with a ``Config``.

    Subclass constructors take the config's fields as keyword arguments (paths already resolved);
    ``from_config`` is the only place a config is read.
    """

    Config: ClassVar[type[StrictModel]]
    registry_name: ClassVar[str]
    _path_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self._sources: dict[str, _Source] = {}
        self._options: dict[str, Any] = {}
        self._special_tokens: dict[str, str | None] = dict.fromkeys(ROLES)
        self._special_ids: dict[str, int | None] = dict.fromkeys(ROLES)
        self._tables: tuple[np.ndarray, np.ndarray] | None = None

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_config(cls, cfg: StrictModel | Mapping[str, Any], base_dir: Path | None = None) -> Tokenizer:
        """Build from a config (or a plain dict); relative paths resolve against ``base_dir``."""
        if isinstance(cfg, Mapping):
            cfg = _validate_config(cls.Config, cfg, cls.registry_name)
        elif not isinstance(cfg, cls.Config):
            raise TypeError(f"{cls.__name__}.from_config expects {cls.Config.__name__}, got {type(cfg).__name__}")
        kwargs = {name: getattr(cfg, name) for name in type(cfg).model_fields if name != "type"}
        for name in cls._path_fields:
            kwargs[name] = _resolve_path(kwargs[name], base_dir)
        template = kwargs.pop(CHAT_TEMPLATE, None)
        tokenizer = cls(**kwargs)
        if template is not None:
            tokenizer.set_chat_template(_resolve_path(template, base_dir))
        return tokenizer

    def config(self) -> StrictModel:
        """The config that rebuilds this tokenizer (paths as they were loaded)."""
        paths = {name: source.path for name, source in self._sources.items()}
        return self.Config(**paths, **self._options)

    # -- the chat template (pentad.data.chat) ---------------------------------------------

    def set_chat_template(self, path: Path | str) -> None:
        """Read the chat template file ``path`` (a ``.json`` file with a ``chat_template`` key, or a
        Jinja file); it becomes part of this tokenizer's files, config and fingerprint."""
        from pentad.data.chat import ChatTemplate

        source = _read_source(Path(path), "chat template")
        ChatTemplate.parse(source.data, source.path)  # a problem shows now, naming the file
        self._sources[CHAT_TEMPLATE] = source
        self.__dict__.pop("_chat", None)

    @property
    def chat_template(self) -> Any:
        """The :class:`~pentad.data.chat.ChatTemplate` of this tokenizer, or None."""
        source = self._sources.get(CHAT_TEMPLATE)
        if source is None:
            return None
        if "_chat" not in self.__dict__:
            from pentad.data.chat import ChatTemplate

            self.__dict__["_chat"] = ChatTemplate.parse(source.data, source.path)
        return self.__dict__["_chat"]

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
                            tools: Any = None, tokenize: bool = True, **context: Any) -> list[int] | str:
        """The conversation ``messages`` rendered by the chat template: token ids (``tokenize``) or text,
        as ``transformers``' method of that name gives them."""
        from pentad.data import chat

        if tokenize:
            return chat.encode(self, messages, add_generation_prompt, tools, **context)
        return chat.render(self, messages, add_generation_prompt, tools, **context)

    def _set_special_tokens(
        self,
        candidates: Mapping[str, Sequence[str]],
        override: Mapping[str, str] | None,
        lookup: Callable[[str], int | None],
        origin: Path,
    ) -> None:
        """Pick one token per role: the override, else the first candidate in the vocabulary,
        else the counterpart role's token. Tokens named by the override must exist."""
        override = dict(override or {})
        unknown = [role for role in override if role not in ROLES]
        if unknown:
            raise UserError(f"tokenizer special_tokens: {_unknown_roles_message(unknown)}.")
        missing = [f"{role}={token!r}" for role, token in override.items() if lookup(token) is None]
        if missing:
            raise UserError(
                f"tokenizer special_tokens: {', '.join(missing)} not in the vocabulary {origin}; "
                "name tokens that the vocabulary contains."
            )
        chosen: dict[str, str | None] = {}
        for role in ROLES:
            if role in override:
                chosen[role] = override[role]
            else:
                present = [tok for tok in candidates.get(role, ()) if lookup(tok) is not None]
                chosen[role] = present[0] if present else None
        for role, other in _COUNTERPART.items():
            if chosen[role] is None and chosen[other] is not None and role not in override:
                chosen[role] = chosen[other]
        self._special_tokens = chosen
        self._special_ids = {role: None if tok is None else lookup(tok) for role, tok in chosen.items()}

    # -- the interface --------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids (largest id + 1): the size of the embedding table."""

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no special tokens are added."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` over many texts; subclasses use the library's batch path."""
        return [self.encode(text) for text in texts]

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[str]:
        """Token strings of ``text`` (the same tokens ``encode`` returns ids for)."""

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of :meth:`encode` and, for each, the characters of ``text`` it covers as
        ``(begin, end)`` (end exclusive), so that a span of tokens maps back to a substring of the text
        (span-extraction QA). Default: not available for this tokenizer."""
        raise UserError(f"the {self.registry_name} tokenizer does not give the character offsets of its tokens, "
                        "which this task needs to map tokens back to the text; use a wordpiece, bpe, char, space or "
                        "tokenizer_json tokenizer.")

    @abc.abstractmethod
    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of a sequence of ids (list, numpy array or 1-D tensor)."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """Id of ``token``, or None if it is not in the vocabulary."""

    @abc.abstractmethod
    def id_to_token(self, i: int) -> str:
        """Token of id ``i``; IndexError if ``i`` is not an id of this vocabulary."""

    def unknown_text(self, text: str) -> list[str]:
        """What of ``text`` lies outside the vocabulary: the pieces that encode to the unknown id
        although they are not literally the unknown token, in order of appearance, each once.

        A piece is a character that encodes to the unknown token by itself; where no single
        character does (a WordPiece word that cannot be split into the vocabulary's pieces, a word
        of a ``space`` vocabulary), it is the whole span the unknown token stands for. Empty when
        the tokenizer has no unknown token or nothing becomes it. Default (SentencePiece, which
        gives no offsets): the characters of ``text`` that alone encode to the unknown id."""
        unk = self.unk_id
        if unk is None or unk not in self.encode(text):
            return []
        found = [c for c in dict.fromkeys(text) if not c.isspace() and unk in self.encode(c)]
        return found or [" ".join(text.split())]

    # -- special tokens -------------------------------------------------------------------

    @property
    def special_tokens(self) -> dict[str, str | None]:
        """Role -> token string (None where the vocabulary has none)."""
        return dict(self._special_tokens)

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of all special tokens in use."""
        return frozenset(i for i in self._special_ids.values() if i is not None)

    @property
    def pad_id(self) -> int | None:
        return self._special_ids["pad"]

    @property
    def unk_id(self) -> int | None:
        return self._special_ids["unk"]

    @property
    def cls_id(self) -> int | None:
        return self._special_ids["cls"]

    @property
    def sep_id(self) -> int | None:
        return self._special_ids["sep"]

    @property
    def mask_id(self) -> int | None:
        return self._special_ids["mask"]

    @property
    def bos_id(self) -> int | None:
        return self._special_ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self._special_ids["eos"]

    # -- word boundaries (whole-word masking) ---------------------------------------------

    def _begins_word(self, i: int, token: str) -> bool:
        """Whether token ``i`` starts a new word by itself (default: every token is a word)."""
        return True

    def _ends_word(self, i: int, token: str) -> bool:
        """Whether the token after token ``i`` necessarily starts a new word."""
        return False

    def _boundary_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-id (begins_word [V], ends_word [V]) bool tables, built once on first use."""
        if self._tables is None:
            size = self.vocab_size
            begins = np.zeros(size, dtype=bool)
            ends = np.zeros(size, dtype=bool)
            for i in range(size):
                try:
                    token = self.id_to_token(i)
                except IndexError:
                    continue  # a gap in a JSON vocabulary
                begins[i] = self._begins_word(i, token)
                ends[i] = self._ends_word(i, token)
            special = list(self.special_ids)
            begins[special] = True  # a special token is a word of its own
            ends[special] = True
            self._tables = (begins, ends)
        return self._tables

    def word_starts(self, ids: Any) -> np.ndarray:
        """Whether each token starts a word, for whole-word masking.

        Args:
            ids: token ids ``[..., S]`` (list or array; the last axis is the sequence).

        Returns:
            bool array of the same shape. The first position is always True (nothing precedes
            it in the sequence); special tokens are words of their own.
        """
        array = np.asarray(ids, dtype=np.int64)
        begins, ends = self._boundary_tables()
        if array.size == 0:
            return np.zeros(array.shape, dtype=bool)
        if array.min() < 0 or array.max() >= len(begins):
            raise IndexError(f"token ids must lie in [0, {len(begins)}); found {array.min()}..{array.max()}")
        starts = begins[array]
        starts[..., 1:] |= ends[array[..., :-1]]
        starts[..., 0] = True
        return starts

    # -- identity and persistence ---------------------------------------------------------

    def fingerprint(self) -> str:
        """sha256 over the tokenizer type, its options and the bytes of its files.

        Paths do not enter it, so the same files give the same fingerprint on every machine.
        """
        options = self.config().model_dump(mode="json", exclude={*self._path_fields, CHAT_TEMPLATE})
        if options.get("special_tokens_in_text") == PARSE:  # the default: fingerprints from before the option
            del options["special_tokens_in_text"]
        payload = {
            "format": _FINGERPRINT_FORMAT,
            "options": options,
            "files": {name: source.sha256 for name, source in sorted(self._sources.items())},
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()

    def save(self, directory: Path) -> dict[str, Any]:
        """Write this tokenizer's files (the bytes that were loaded) into ``directory``.

        Returns:
            a config dict whose paths are relative to ``directory``:
            ``from_config(result, base_dir=directory)`` rebuilds this tokenizer, same fingerprint.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        cfg = self.config().model_dump(mode="json")
        # 'tokenizer.json' is the name a run directory gives this config itself (pentad.runs).
        used: set[str] = {"tokenizer.json"}
        for name in (*self._path_fields, *([CHAT_TEMPLATE] if CHAT_TEMPLATE in self._sources else [])):
            source = self._sources[name]
            filename = source.path.name
            if filename in used:  # two files with one name (vocab and merges both 'x.txt')
                filename = f"{name}-{filename}"
            used.add(filename)
            with atomic_open(directory / filename, binary=True) as f:
                f.write(source.data)
            cfg[name] = filename
        return cfg

    def __repr__(self) -> str:
        files = ", ".join(f"{k}={s.path}" for k, s in self._sources.items())
        return f"{type(self).__name__}({files}, vocab_size={self.vocab_size})"


# --------------------------------------------------------------------------------------------
# Tokenizers on the Rust `tokenizers` library.


class _RustTokenizer(Tokenizer):
    """Shared implementation for tokenizers backed by a ``tokenizers.Tokenizer``."""

    _backend: hf_tokenizers.Tokenizer
    _size: int
    # unknown_text: report the characters that are unknown by themselves (False: whole tokens)
    _unknown_by_character: ClassVar[bool] = True

    def _attach(self, backend: hf_tokenizers.Tokenizer, vocab: Mapping[str, int]) -> None:
        self._backend = backend
        self._size = max(vocab.values()) + 1

    def _register_special_tokens(self, in_text: str = PARSE) -> None:
        """Make the chosen special tokens atomic: matched in raw text before normalisation and
        splitting (as Hugging Face does), skippable in ``decode``. ``in_text`` "split": literal
        special tokens in the text are not matched but tokenized like the text around them."""
        tokens = sorted({tok for tok in self._special_tokens.values() if tok is not None})
        self._backend.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in tokens])
        self._backend.encode_special_tokens = in_text == SPLIT
        self._options["special_tokens_in_text"] = in_text

    def __setstate__(self, state: dict[str, Any]) -> None:
        # The backend pickles as its JSON form, which does not hold encode_special_tokens.
        self.__dict__.update(state)
        self._backend.encode_special_tokens = self._options.get("special_tokens_in_text") == SPLIT

    @property
    def vocab_size(self) -> int:
        return self._size

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast skips offsets; the batch runs in parallel in Rust.
        encodings = self._backend.encode_batch_fast(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def tokenize(self, text: str) -> list[str]:
        return self._backend.encode(text, add_special_tokens=False).tokens

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        encoding = self._backend.encode(text, add_special_tokens=False)
        return encoding.ids, [(int(b), int(e)) for b, e in encoding.offsets]

    def unknown_text(self, text: str) -> list[str]:
        unk = self.unk_id
        if unk is None:
            return []
        ids, offsets = self.encode_with_offsets(text)
        if unk not in ids:
            return []
        literal = self._special_tokens["unk"]
        found: dict[str, None] = {}
        for index, (begin, end) in zip(ids, offsets):
            span = text[begin:end]
            if index != unk or span == literal:
                continue
            chars = [c for c in span if unk in self.encode(c)] if self._unknown_by_character else []
            for piece in chars or [span]:
                found.setdefault(piece)
        return list(found)

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        values = _as_id_list(ids)
        bad = [i for i in values if not 0 <= i < self._size]
        if bad:
            raise IndexError(f"cannot decode ids {bad[:5]}: ids must lie in [0, {self._size})")
        return self._backend.decode(values, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, i: int) -> str:
        token = self._backend.id_to_token(int(i)) if 0 <= int(i) < self._size else None
        if token is None:
            raise IndexError(f"id {i} is not in the vocabulary (size {self._size})")
        return token


def _require_unk(tokenizer: Tokenizer, origin: Path) -> str:
    unk = tokenizer.special_tokens["unk"]
    if unk is None:
        raise UserError(
            f"vocabulary file {origin} has no unknown token ('[UNK]'), which {tokenizer.registry_name} "
            "tokenization needs for out-of-vocabulary text; add it to the vocabulary or name the "
            "vocabulary's unknown token with special_tokens: {unk: ...}."
        )
    return unk


# Pieces of text that BERT tokenization encodes independently (see WordPieceTokenizer): a CJK
# Unified Ideograph (main block and extension A, which lower-casing and NFD leave alone), or a run of
# other characters up to a space or such an ideograph. Without split_cjk, runs between spaces.
_CJK = "\u3400-\u4dbf\u4e00-\u9fff"
_CJK_PIECES = re.compile(f"[{_CJK}]|[^ {_CJK}]+")
_SPACE_PIECES = re.compile("[^ ]+")
PIECE_CACHE_SIZE = 1 << 18  # distinct pieces kept per tokenizer (a few tens of MB at most)


class WordPieceConfig(_TokenizerConfig):
    """Config of the ``wordpiece`` tokenizer."""

    type: Literal["wordpiece"] = "wordpiece"
    vocab: Path = Field(description="vocab.txt: one token per line, id = line number - 1")
    lowercase: bool = Field(True, description="lower-case the text (uncased models)")
    split_cjk: bool = Field(True, description="make every CJK character a word of its own")
    strip_accents: bool | None = Field(None, description="strip accents; None follows lowercase")
    max_input_chars_per_word: int = Field(100, gt=0, description="longer words become unk")
    special_tokens: SpecialTokens = None
    special_tokens_in_text: SpecialTokensInText = PARSE
    chat_template: ChatTemplateFile = None


@TOKENIZERS.register("wordpiece")
class WordPieceTokenizer(_RustTokenizer):
    """BERT tokenization: text cleanup, optional lower-casing and accent stripping, CJK characters
    split apart, whitespace/punctuation splitting, then greedy longest-match WordPiece.

    Gives the ids of Hugging Face ``BertTokenizer`` built from the same ``vocab.txt``.
    """

    Config = WordPieceConfig
    _path_fields = ("vocab",)

    def __init__(
        self,
        vocab: Path,
        lowercase: bool = True,
        split_cjk: bool = True,
        strip_accents: bool | None = None,
        max_input_chars_per_word: int = 100,
        special_tokens: Mapping[str, str] | None = None,
        special_tokens_in_text: str = PARSE,
    ) -> None:
        super().__init__()
        source = _read_source(Path(vocab), "vocabulary")
        table = _parse_vocab(source)
        self._sources = {"vocab": source}
        self._options = {
            "lowercase": lowercase, "split_cjk": split_cjk, "strip_accents": strip_accents,
            "max_input_chars_per_word": max_input_chars_per_word,
            "special_tokens": dict(special_tokens) if special_tokens else None,
        }
        self._set_special_tokens(_BERT_SPECIALS, special_tokens, table.get, source.path)
        unk = _require_unk(self, source.path)
        backend = hf_tokenizers.Tokenizer(
            models.WordPiece(vocab=dict(table), unk_token=unk, max_input_chars_per_word=max_input_chars_per_word)
        )
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=split_cjk, strip_accents=strip_accents, lowercase=lowercase
        )
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        self._attach(backend, table)
        self._register_special_tokens(special_tokens_in_text)
        self._piece_ids: dict[str, list[int]] = {}

    def _begins_word(self, i: int, token: str) -> bool:
        return not token.startswith("##")

    # -- the piece cache ------------------------------------------------------------------
    # BERT tokenization never joins text across a space, nor (with split_cjk) across a CJK
    # ideograph, which becomes a word of its own; and its normaliser works character by character
    # (cleanup, lower-casing, NFD and dropping combining marks, which never reorder across a space or
    # an ideograph). So the ids of a text are the ids of its pieces, cut at those characters, one
    # after the other. Real text repeats its pieces (every Chinese character is one), so
    # ``encode_batch`` looks pieces up in a dictionary filled by the Rust tokenizer, which then
    # sees each distinct piece once: 2-6x less CPU time on Chinese text, the same ids (tested
    # against the Rust tokenizer on corpora and on random Unicode). A special token is matched in
    # raw text within its piece; texts that contain one with a space or an ideograph inside go to
    # the Rust tokenizer whole.

    def _piece_pattern(self) -> re.Pattern[str]:
        return _CJK_PIECES if self._options["split_cjk"] else _SPACE_PIECES

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = list(texts)
        pattern = self._piece_pattern()
        # Special tokens that span a cut (a space or an ideograph inside them) must be seen whole.
        literal = [t for t in {t for t in self._special_tokens.values() if t is not None}
                   if pattern.fullmatch(t) is None] if self._options["special_tokens_in_text"] == PARSE else []
        findall = pattern.findall
        cache = self.__dict__.setdefault("_piece_ids", {})  # (absent from tokenizers pickled before it)
        whole: list[int] = []  # texts the Rust tokenizer encodes whole
        pieces: list[list[str] | None] = []
        missing: dict[str, None] = {}
        for i, text in enumerate(texts):
            if literal and any(token in text for token in literal):
                whole.append(i)
                pieces.append(None)
                continue
            cut = findall(text)
            pieces.append(cut)
            for piece in cut:
                if piece not in cache:
                    missing[piece] = None
        lookup = cache
        if missing:
            new = list(missing)
            encoded = self._backend.encode_batch_fast(new, add_special_tokens=False)
            found = dict(zip(new, (e.ids for e in encoded)))
            room = max(PIECE_CACHE_SIZE - len(cache), 0)
            if room >= len(found):
                cache.update(found)
            else:  # the cache takes what fits; this batch's other new pieces are looked up aside
                cache.update(itertools.islice(found.items(), room))
                lookup = {**cache, **found}
        out: list[list[int]] = []
        for cut in pieces:
            ids: list[int] = []
            if cut is not None:
                extend = ids.extend
                for piece in cut:
                    extend(lookup[piece])
            out.append(ids)
        if whole:
            for i, ids in zip(whole, super().encode_batch([texts[i] for i in whole])):
                out[i] = ids
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_piece_ids"] = {}  # a worker fills its own
        return state


def _byte_to_char() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the other bytes
    (controls, space, ...) for the characters from U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


# Characters that stand for an ASCII whitespace byte (' ' is 'Ġ', '\n' is 'Ċ', ...).
_BYTE_LEVEL_SPACES = frozenset(_byte_to_char()[b] for b in range(128) if chr(b).isspace())


class BPEConfig(_TokenizerConfig):
    """Config of the ``bpe`` tokenizer."""

    type: Literal["bpe"] = "bpe"
    vocab: Path = Field(description="vocab.json, or a text file with one token per line")
    merges: Path = Field(description="merges.txt: '#version' line, then one 'left right' pair per line")
    lowercase: bool = Field(False, description="lower-case the text first (vocabularies trained lower-cased)")
    add_prefix_space: bool = Field(False, description="treat the text as if it began with a space")
    special_tokens: SpecialTokens = None
    special_tokens_in_text: SpecialTokensInText = PARSE
    chat_template: ChatTemplateFile = None


@TOKENIZERS.register("bpe")
class ByteLevelBPETokenizer(_RustTokenizer):
    """GPT-2 byte-level BPE: the text's UTF-8 bytes, split by GPT-2's regex, merged by rank.

    The vocabulary is ``vocab.json`` (token -> id) or a text file with one token per line
    (id = line number - 1, TencentPretrain's ``huggingface_gpt2_vocab.txt``). Special tokens:
    ``<|endoftext|>`` is bos and eos (and so cls and sep); ``<pad>``, ``<mask>`` and ``<unk>`` are
    used when the vocabulary has them (RoBERTa's does).
    """

    Config = BPEConfig
    _path_fields = ("vocab", "merges")
    _candidates: ClassVar[dict[str, tuple[str, ...]]] = {
        "bos": ("<|endoftext|>",),
        "eos": ("<|endoftext|>",),
        "pad": ("<pad>",),
        "mask": ("<mask>",),
        "unk": ("<unk>",),
    }

    def __init__(
        self,
        vocab: Path,
        merges: Path,
        lowercase: bool = False,
        add_prefix_space: bool = False,
        special_tokens: Mapping[str, str] | None = None,
        special_tokens_in_text: str = PARSE,
    ) -> None:
        super().__init__()
        vocab_source = _read_source(Path(vocab), "vocabulary")
        table = _parse_vocab(vocab_source)
        # No merges is legitimate: a vocabulary of the 256 byte symbols and nothing more.
        merges_src = _read_source(Path(merges), "merges", allow_empty=True)
        merge_list = _parse_merges(merges_src, table, vocab_source.path)
        self._sources = {"vocab": vocab_source, "merges": merges_src}
        self._options = {
            "lowercase": lowercase, "add_prefix_space": add_prefix_space,
            "special_tokens": dict(special_tokens) if special_tokens else None,
        }
        backend = hf_tokenizers.Tokenizer(models.BPE(vocab=dict(table), merges=merge_list, fuse_unk=False))
        if lowercase:
            backend.normalizer = normalizers.Lowercase()
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        self._attach(backend, table)
        self._set_special_tokens(self._candidates, special_tokens, table.get, vocab_source.path)
        self._register_special_tokens(special_tokens_in_text)

    def _begins_word(self, i: int, token: str) -> bool:
        return token[:1] in _BYTE_LEVEL_SPACES

    def _ends_word(self, i: int, token: str) -> bool:
        return token[-1:] in _BYTE_LEVEL_SPACES


class _WordLevelTokenizer(_RustTokenizer):
    """Shared loader of the ``char`` and ``space`` tokenizers: a vocabulary lookup after a
    pre-tokenizer, out-of-vocabulary pieces becoming the unknown token."""

    _path_fields = ("vocab",)

    def __init__(self, vocab: Path, special_tokens: Mapping[str, str] | None = None,
                 special_tokens_in_text: str = PARSE) -> None:
        super().__init__()
        source = _read_source(Path(vocab), "vocabulary")
        table = _parse_vocab(source)
        self._sources = {"vocab": source}
        self._options = {"special_tokens": dict(special_tokens) if special_tokens else None}
        self._set_special_tokens(_BERT_SPECIALS, special_tokens, table.get, source.path)
        unk = _require_unk(self, source.path)
        backend = hf_tokenizers.Tokenizer(models.WordLevel(vocab=dict(table), unk_token=unk))
        self._configure(backend)
        self._attach(backend, table)
        self._register_special_tokens(special_tokens_in_text)

    @abc.abstractmethod
    def _configure(self, backend: hf_tokenizers.Tokenizer) -> None:
        """Set the pre-tokenizer and decoder."""


class CharConfig(_TokenizerConfig):
    """Config of the ``char`` tokenizer."""

    type: Literal["char"] = "char"
    vocab: Path = Field(description="vocab.txt: one token per line, id = line number - 1")
    special_tokens: SpecialTokens = None
    special_tokens_in_text: SpecialTokensInText = PARSE
    chat_template: ChatTemplateFile = None


@TOKENIZERS.register("char")
class CharTokenizer(_WordLevelTokenizer):
    """Every non-whitespace character is a token (Chinese character models); decode joins them."""

    Config = CharConfig

    def _configure(self, backend: hf_tokenizers.Tokenizer) -> None:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), behavior="isolated")]
        )
        backend.decoder = decoders.Fuse()


class SpaceConfig(_TokenizerConfig):
    """Config of the ``space`` tokenizer."""

    type: Literal["space"] = "space"
    vocab: Path = Field(description="vocab.txt: one token per line, id = line number - 1")
    special_tokens: SpecialTokens = None
    special_tokens_in_text: SpecialTokensInText = PARSE
    chat_template: ChatTemplateFile = None


@TOKENIZERS.register("space")
class SpaceTokenizer(_WordLevelTokenizer):
    """Every whitespace-separated word is a token (pre-segmented text); decode joins with spaces."""

    Config = SpaceConfig
    _unknown_by_character = False  # a word is the unit: its characters alone are not tokens

    def _configure(self, backend: hf_tokenizers.Tokenizer) -> None:
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()


# --------------------------------------------------------------------------------------------
# SentencePiece.


class SentencePieceConfig(_TokenizerConfig):
    """Config of the ``sentencepiece`` tokenizer."""

    type: Literal["sentencepiece"] = "sentencepiece"
    model: Path = Field(description="a SentencePiece .model file")
    lowercase: bool = Field(False, description="lower-case the text first (ALBERT's do_lower_case)")
    strip_accents: bool = Field(False, description="NFKD-decompose and drop combining marks first (ALBERT without "
                                "keep_accents)")
    replace_quotes: bool = Field(False, description="turn `` and '' into \" first (ALBERT)")
    special_tokens: SpecialTokens = None
    chat_template: ChatTemplateFile = None


@TOKENIZERS.register("sentencepiece")
class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (unigram or BPE). pad/unk/bos/eos are the model's own ids; cls, sep
    and mask are ``[CLS]``/``<cls>``, ``[SEP]``/``<sep>``, ``[MASK]``/``<mask>`` when the model has
    such pieces, cls/sep falling back to bos/eos."""

    Config = SentencePieceConfig
    _path_fields = ("model",)

    def __init__(self, model: Path, lowercase: bool = False, strip_accents: bool = False, replace_quotes: bool = False,
                 special_tokens: Mapping[str, str] | None = None) -> None:
        super().__init__()
        source = _read_source(Path(model), "SentencePiece model")
        self._sources = {"model": source}
        self._options = {"lowercase": lowercase, "strip_accents": strip_accents, "replace_quotes": replace_quotes,
                         "special_tokens": dict(special_tokens) if special_tokens else None}
        self._normalise = lowercase or strip_accents or replace_quotes
        self._processor = self._load(source)
        sp = self._processor
        own = {"pad": sp.pad_id(), "unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id()}
        candidates: dict[str, tuple[str, ...]] = {
            "pad": ("[PAD]", "<pad>"), "cls": ("[CLS]", "<cls>"),
            "sep": ("[SEP]", "<sep>"), "mask": ("[MASK]", "<mask>"),
        }
        for role, index in own.items():
            if index >= 0:  # sentencepiece reports -1 for a disabled id
                candidates[role] = (sp.id_to_piece(index), *candidates.get(role, ()))
        self._set_special_tokens(candidates, special_tokens, self.token_to_id, source.path)

    @staticmethod
    def _load(source: _Source) -> sentencepiece.SentencePieceProcessor:
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(source.data)
        except (RuntimeError, OSError, TypeError) as exc:
            raise UserError(f"SentencePiece model file {source.path} could not be read: {exc}") from None
        return processor

    def __getstate__(self) -> dict[str, Any]:
        # Rebuild the processor from the kept bytes in the receiving process (DataLoader workers).
        state = dict(self.__dict__)
        state.pop("_processor")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._processor = self._load(self._sources["model"])

    @property
    def vocab_size(self) -> int:
        return self._processor.get_piece_size()

    def _prepare(self, text: str) -> str:
        """The text normalisation ALBERT's tokenizer applies before SentencePiece, in its order:
        quotes, then accents (NFKD, combining marks dropped), then lower case."""
        if not self._normalise:
            return text
        opts = self._options
        if opts["replace_quotes"]:
            text = text.replace("``", '"').replace("''", '"')
        if opts["strip_accents"]:
            text = "".join(c for c in unicodedata.normalize("NFKD", text) if unicodedata.category(c) != "Mn")
        if opts["lowercase"]:
            text = text.lower()
        return text

    def encode(self, text: str) -> list[int]:
        return self._processor.encode(self._prepare(text), out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._processor.encode([self._prepare(t) for t in texts], out_type=int)

    def tokenize(self, text: str) -> list[str]:
        return self._processor.encode(self._prepare(text), out_type=str)

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        values = _as_id_list(ids)
        size = self.vocab_size
        bad = [i for i in values if not 0 <= i < size]
        if bad:
            raise IndexError(f"cannot decode ids {bad[:5]}: ids must lie in [0, {size})")
        if skip_special_tokens:
            special = self.special_ids
            values = [i for i in values if i not in special]
        return self._processor.decode(values)

    def token_to_id(self, token: str) -> int | None:
        # piece_to_id answers unk for a missing piece; check the round trip instead.
        index = self._processor.piece_to_id(token)
        return index if self._processor.id_to_piece(index) == token else None

    def id_to_token(self, i: int) -> str:
        if not 0 <= int(i) < self.vocab_size:
            raise IndexError(f"id {i} is not in the vocabulary (size {self.vocab_size})")
        return self._processor.id_to_piece(int(i))

    def _begins_word(self, i: int, token: str) -> bool:
        sp = self._processor
        return token.startswith("\u2581") or sp.is_control(i) or sp.is_unknown(i)

    def _ends_word(self, i: int, token: str) -> bool:
        return bool(self._processor.is_control(i))


# --------------------------------------------------------------------------------------------
# A Hugging Face tokenizer.json, used as it is.


class TokenizerJsonConfig(_TokenizerConfig):
    """Config of the ``tokenizer_json`` tokenizer."""

    type: Literal["tokenizer_json"] = "tokenizer_json"
    file: Path = Field(description="a Hugging Face tokenizer.json (any model, normaliser and pre-tokenizer)")
    special_tokens: SpecialTokens = None
    special_tokens_in_text: SpecialTokensInText = PARSE
    chat_template: ChatTemplateFile = None


@TOKENIZERS.register("tokenizer_json")
class TokenizerJsonTokenizer(_RustTokenizer):
    """Any ``tokenizer.json`` run by the ``tokenizers`` library exactly as written (BLOOM's byte-level
    BPE with its own pre-tokenizer, and other fast-only tokenizers). Its post-processor is not
    applied: special tokens are added by pentad's objectives and tasks, as for every tokenizer.
    Special tokens: the usual spellings when the vocabulary has them (``<unk>``, ``<pad>``,
    ``<s>``/``</s>`` as bos/eos and cls/sep, ``[CLS]``..., ``<mask>``), or ``special_tokens``.
    """

    Config = TokenizerJsonConfig
    _path_fields = ("file",)
    _candidates: ClassVar[dict[str, tuple[str, ...]]] = {
        "pad": ("<pad>", "[PAD]"), "unk": ("<unk>", "[UNK]"), "mask": ("<mask>", "[MASK]"),
        "bos": ("<s>", "<|endoftext|>", "<|begin_of_text|>"), "eos": ("</s>", "<|endoftext|>", "<|end_of_text|>"),
        "cls": ("[CLS]", "<s>", "<cls>"), "sep": ("[SEP]", "</s>", "<sep>"),
    }

    def __init__(self, file: Path, special_tokens: Mapping[str, str] | None = None,
                 special_tokens_in_text: str = PARSE) -> None:
        super().__init__()
        source = _read_source(Path(file), "tokenizer.json")
        try:
            backend = hf_tokenizers.Tokenizer.from_str(_decode_utf8(source, "tokenizer.json"))
        except Exception as exc:  # the library raises a plain Exception for malformed files
            raise UserError(f"tokenizer.json file {source.path} could not be read by the tokenizers library: "
                            f"{exc}") from None
        self._sources = {"file": source}
        self._options = {"special_tokens": dict(special_tokens) if special_tokens else None}
        vocab = backend.get_vocab(with_added_tokens=True)
        self._attach(backend, vocab)
        self._set_special_tokens(self._candidates, special_tokens, vocab.get, source.path)
        self._register_special_tokens(special_tokens_in_text)


# --------------------------------------------------------------------------------------------


def load_tokenizer(cfg: StrictModel | Mapping[str, Any], base_dir: Path | None = None) -> Tokenizer:
    """Build the tokenizer a config names (a Config object or a plain dict with ``type``).

    Relative paths resolve against ``base_dir`` (e.g. the run directory a tokenizer was saved to).
    """
    if isinstance(cfg, Mapping):
        name = cfg.get("type")
        if name is None:
            raise UserError(
                f"tokenizer config has no 'type' key; expected one of {', '.join(TOKENIZERS.names())} "
                f"(received keys: {', '.join(map(str, cfg)) or 'none'})."
            )
    else:
        name = getattr(cfg, "type", None)
        if name is None:
            raise TypeError(f"load_tokenizer expects a tokenizer config or a dict, got {type(cfg).__name__}")
    return TOKENIZERS.get(str(name)).from_config(cfg, base_dir)
