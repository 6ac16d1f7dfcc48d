"""``model.streams``: a model that reads two inputs, each through a named stream (docs/streams.md).

A stream is an embedding slot, then an encoder, then a pooling of the encoder's states over the
stream's real positions. A model without a ``streams`` section has one stream: its ``embedding``
and ``encoder`` slots over the batch (a ViLT fuses text and image there, in one ``word_patch``
embedding). A model with a ``streams`` section has two, named by their keys, in order:

* the **first** reads the batch's own input through the model's ``embedding`` and ``encoder`` slots
  (so its parameters keep a one-stream model's names, and a BERT checkpoint initialises it as is);
* the **second** reads ``Batch.pair`` (and ``Batch.negative``, hard negatives) through the first
  stream's modules (``share: <first>``: siamese, SBERT) or its own embedding slot and encoder
  (``streams.<name>.embedding.*``, ``streams.<name>.encoder.*``: CLIP's image tower).

Targets say which streams they read (``targets[i].streams``): a pair target (``clr``,
``pair_cls``, ``cosine``) two of them, in the order it compares them (default: both, first to
second); a target over token states (``mlm``, ``lm``, ``cls``) the first stream, whose labels the
batch holds. Every stream must be read by some target.

Before ``model.streams`` existed, a two-stream model was an encoder of type ``dual`` with
``stream_0`` / ``stream_1``; such configs (saved runs, old recipes) are rewritten on load
(:func:`from_dual_encoder`, with a notice) and their checkpoints' ``pair.*`` keys read as the second
stream's (:func:`legacy_key`).
"""

from __future__ import annotations

import re
import sys
from typing import Any

from pydantic import Field

from pentad.config.base import StrictModel
from pentad.config.sizes import SlotSizes
from pentad.layers.pooling_kinds import PoolingKind  # (no torch: reading a config needs none)

STREAM_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
SIZE_FIELDS = ("hidden_size", "embedding_size", "vocab_size", "max_seq_length")
OWN_FIELDS = ("embedding", "encoder", *SIZE_FIELDS)


class StreamConfigBase(StrictModel):
    """One stream of ``model.streams`` (its ``embedding`` and ``encoder`` fields are added where the
    model config is built, typed by the registries)."""

    share: str | None = Field(None, description="the name of the stream whose embedding and encoder this one "
                              "runs its input through (siamese, SBERT); only pooling may be set beside it")
    pooling: PoolingKind = Field("mean", description="how the stream's states become one vector: first, mean, "
                                 "max or last (over real positions only)")
    hidden_size: int | None = Field(None, ge=1, description="the second stream's width; default model.hidden_size")
    embedding_size: int | None = Field(None, ge=1, description="the second stream's embedding width; default "
                                       "model.embedding_size")
    vocab_size: int | None = Field(None, ge=1, description="the second stream's vocabulary; default "
                                   "model.vocab_size")
    max_seq_length: int | None = Field(None, ge=1, description="the second stream's longest input; default "
                                       "model.max_seq_length")


# --------------------------------------------------------------------------------- reading a config
def stream_names(cfg: Any) -> tuple[str, ...]:
    """The names of ``cfg``'s streams in order; () for a one-stream model."""
    return tuple(cfg.streams) if getattr(cfg, "streams", None) else ()


def second_stream(cfg: Any) -> tuple[str, Any]:
    """(name, config) of the second stream of a two-stream model config."""
    name = stream_names(cfg)[1]
    return name, cfg.streams[name]


def shares(cfg: Any) -> bool:
    """Whether the second stream runs through the first stream's modules."""
    return second_stream(cfg)[1].share is not None


def stream_sizes(cfg: Any, name: str) -> Any:
    """The model config as stream ``name`` sees it: a second stream of its own sees its own sizes."""
    stream = cfg.streams[name] if stream_names(cfg) else None
    if stream is None or stream.share is not None or name == stream_names(cfg)[0]:
        return cfg
    return SlotSizes(cfg, **{k: getattr(stream, k) for k in SIZE_FIELDS if getattr(stream, k) is not None})


def stream_embedding(cfg: Any, name: str) -> Any:
    """The embedding slot config of stream ``name`` (the model's unless a second stream has its own)."""
    stream = cfg.streams[name]
    return cfg.embedding if stream.share is not None or stream.embedding is None else stream.embedding


def stream_encoder(cfg: Any, name: str) -> Any:
    """The encoder config of stream ``name`` (the model's unless a second stream has its own)."""
    stream = cfg.streams[name]
    return cfg.encoder if stream.share is not None or stream.encoder is None else stream.encoder


def stream_width(cfg: Any, name: str) -> int:
    """The width of stream ``name``'s pooled vectors."""
    return stream_sizes(cfg, name).hidden_size


def target_streams(cfg: Any, target: Any, reads_pair: bool) -> tuple[str, ...]:
    """The streams ``target`` reads: its ``streams``, else both (a pair target) or the first."""
    names = stream_names(cfg)
    if target.streams is not None:
        return tuple(target.streams)
    if not names:
        return ()
    return names if reads_pair else names[:1]


def pair_widths(cfg: Any, target: Any) -> tuple[int, int]:
    """(H0, H1): the widths of the two streams a pair target compares, in its order; (H, H) for a model
    without streams (the builder reports that mismatch)."""
    names = target_streams(cfg, target, True)
    if len(names) != 2 or any(n not in (getattr(cfg, "streams", None) or {}) for n in names):
        return cfg.hidden_size, cfg.hidden_size
    return stream_width(cfg, names[0]), stream_width(cfg, names[1])


# ---------------------------------------------------------------------------------------- checks
def stream_problems(cfg: Any, registries: Any) -> list[tuple[str, str]]:
    """(path, message) for every inconsistency of ``model.streams`` and the targets' stream reads.
    ``registries``: (ENCODERS, TARGETS, EMBEDDINGS), passed in so this module stays below them."""
    encoders, targets, embeddings = registries
    problems: list[tuple[str, str]] = []
    names = stream_names(cfg)
    if not names:
        for i, target in enumerate(cfg.targets):
            if getattr(targets.get(target.type), "reads_pair", False):
                problems.append((f"model.targets.{i}.type", f"'{target.type}' compares two streams, but the model "
                                 "has one: add a model.streams section (docs/streams.md)"))
            elif target.streams is not None:
                problems.append((f"model.targets.{i}.streams", "set, but the model has no streams section: "
                                 "a one-stream model's targets read its one stream"))
        return problems
    if len(names) != 2:
        problems.append(("model.streams", f"found {len(names)} streams ({', '.join(names)}); a model with streams "
                         "has two: the first reads the batch through model.embedding and model.encoder, the second "
                         "reads Batch.pair. A model with one input needs no streams section (ViLT's fused text and "
                         "image is one embedding slot with a word_patch part)"))
        return problems
    first, second = names
    for name in names:
        if not STREAM_NAME.match(name):
            problems.append((f"model.streams.{name}", "a stream name is lower-case letters, digits and "
                             "underscores, starting with a letter or underscore"))
    head = cfg.streams[first]
    for key in ("share", *OWN_FIELDS):
        if getattr(head, key) is not None:
            problems.append((f"model.streams.{first}.{key}", "set on the first stream, which is the model's own "
                             "embedding and encoder slots: set model.embedding / model.encoder / model.hidden_size "
                             "instead, or give the second stream its own"))
    tail = cfg.streams[second]
    if tail.share is not None:
        if tail.share != first:
            problems.append((f"model.streams.{second}.share", f"'{tail.share}' is not the first stream; the "
                             f"second stream can share the first's modules only (share: {first})"))
        for key in OWN_FIELDS:
            if getattr(tail, key) is not None:
                problems.append((f"model.streams.{second}.{key}", f"set, but the stream shares '{first}''s "
                                 "embedding and encoder (only its pooling may differ); remove it, or remove "
                                 "share to give the stream its own"))
    else:
        sizes = stream_sizes(cfg, second)
        encoder = stream_encoder(cfg, second)
        where = f"model.streams.{second}.encoder" if tail.encoder is not None else f"model.streams.{second}"
        problems += [(f"{where}.{key}", msg) for key, msg in getattr(encoder, "check", lambda m: [])(sizes)]
        embedding = stream_embedding(cfg, second)
        where = f"model.streams.{second}.embedding" if tail.embedding is not None else f"model.streams.{second}"
        kinds = [p.type for p in embedding.parts]
        for i, kind in enumerate(kinds):
            if kind in kinds[:i]:
                problems.append((f"{where}.parts.{i}", f"embedding part '{kind}' appears twice"))
        leads = [k for k in kinds if getattr(embeddings.get(k), "defines_sequence", False)]
        if len(leads) != 1:
            problems.append((f"{where}.parts", f"found {len(leads)} parts that make the sequence among {kinds}; "
                             "a slot needs exactly one"))
        if sizes.vocab_size is None and any("tokens" in embeddings.get(k).requires for k in kinds):
            problems.append((f"model.streams.{second}.vocab_size", "not set, and neither is model.vocab_size: the "
                             "stream's word embedding needs a vocabulary size"))
        if tail.embedding is not None:
            for i, part in enumerate(embedding.parts):
                problems += [(f"{where}.parts.{i}.{key}", msg) for key, msg in
                             getattr(part, "check", lambda m: [])(sizes)]
    if cfg.decoder is not None:
        problems.append(("model.decoder", "a model with streams has no decoder; remove it (or the streams)"))
    read: set[str] = set()
    pair_kinds = sorted(n for n, c in targets.items() if getattr(c, "reads_pair", False))
    for i, target in enumerate(cfg.targets):
        pair = bool(getattr(targets.get(target.type), "reads_pair", False))
        wanted = target_streams(cfg, target, pair)
        unknown = [n for n in wanted if n not in names]
        if unknown:
            problems.append((f"model.targets.{i}.streams", f"no stream named {', '.join(map(repr, unknown))}; the "
                             f"streams are {', '.join(names)}"))
            continue
        read |= set(wanted)
        if pair and (len(wanted) != 2 or wanted[0] == wanted[1]):
            problems.append((f"model.targets.{i}.streams", f"'{target.type}' compares two different streams; "
                             f"found {list(wanted)}"))
        elif not pair and list(wanted) != [first]:
            problems.append((f"model.targets.{i}.streams", f"'{target.type}' reads token states and labels of the "
                             f"batch's own input, i.e. the first stream ('{first}'); found {list(wanted)}. To "
                             f"compare the streams use a pair target ({', '.join(pair_kinds)})"))
    for name in names:
        if name not in read:
            problems.append((f"model.streams.{name}", f"no target reads stream '{name}'; a stream's work would be "
                             f"thrown away. Give a pair target (e.g. {', '.join(pair_kinds)}; for classification "
                             "set task.pair_input=separate) or remove the streams section"))
    return problems


# ------------------------------------------------------------------------------------- legacy form
_warned: set[str] = set()


def default_names(second_embedding: Any) -> tuple[str, str]:
    """The names an imported or legacy two-stream config gets: (text, image) when the second stream
    embeds images (a ``patch`` part), else (text_a, text_b), after the pair columns of a TSV."""
    parts = second_embedding.get("parts", []) if isinstance(second_embedding, dict) else []
    kinds = [p if isinstance(p, str) else p.get("type") if isinstance(p, dict) else None for p in parts]
    return ("text", "image") if any(k in ("patch", "masked_patch") for k in kinds) else ("text_a", "text_b")


def from_dual_encoder(model: dict[str, Any]) -> dict[str, Any]:
    """A model config dict whose encoder is the former ``dual`` pseudo-encoder, rewritten to
    ``model.streams`` (anything else is returned as it is). Keys the old form refused (e.g. sizes on a
    tied stream) are carried over, so the new checks name them."""
    encoder = model.get("encoder")
    if not isinstance(encoder, dict) or encoder.get("type") != "dual":
        return model
    known = {"type", "tie", "stream_0", "stream_1"}
    if set(encoder) - known:
        return model  # let validation report the unknown key at model.encoder
    zero = dict(encoder.get("stream_0") or {})
    one = {k: v for k, v in dict(encoder.get("stream_1") or {}).items() if v is not None}
    names = default_names(one.get("embedding", model.get("embedding")))
    pooling = zero.pop("pooling", "mean")
    first: dict[str, Any] = {"pooling": pooling, **{k: v for k, v in zero.items() if k != "encoder"}}
    second: dict[str, Any] = {"pooling": one.pop("pooling", None) or pooling}
    if encoder.get("tie", True):
        second["share"] = names[0]
    second.update(one)
    out = {k: v for k, v in model.items() if k != "encoder"}
    out["encoder"] = zero.get("encoder")
    out["streams"] = {names[0]: first, names[1]: second}
    if "dual" not in _warned:
        _warned.add("dual")
        print(f"pentad: notice: model.encoder type 'dual' (stream_0 / stream_1) is now model.streams "
              f"({names[0]}, {names[1]}); the config was rewritten on load and its checkpoints' pair.* keys read as "
              f"streams.{names[1]}.* (docs/streams.md)", file=sys.stderr, flush=True)
    return out


def legacy_overrides(raw: dict[str, Any], overrides: list[str]) -> list[str]:
    """Overrides written for the former ``dual`` layout (``model.encoder.stream_0.encoder.X``,
    ``model.encoder.stream_0.pooling``, ``model.encoder.stream_1.X``) rewritten to ``model.streams``
    when ``raw`` (the config file) has a streams section; other overrides unchanged."""
    model = raw.get("model") if isinstance(raw, dict) else None
    streams = model.get("streams") if isinstance(model, dict) else None
    if not isinstance(streams, dict) or len(streams) != 2:
        return list(overrides)
    first, second = list(streams)
    prefixes = (("model.encoder.stream_0.encoder.", "model.encoder."),
                ("model.encoder.stream_0.", f"model.streams.{first}."),
                ("model.encoder.stream_1.", f"model.streams.{second}."))
    out = []
    for text in overrides:
        key, sep, value = text.partition("=")
        for old, new in prefixes:
            if key.startswith(old):
                print(f"pentad: notice: override {key} names the former dual layout; read as "
                      f"{new}{key[len(old):]} (docs/streams.md)", file=sys.stderr, flush=True)
                key = new + key[len(old):]
                break
        out.append(key + sep + value)
    return out


def legacy_key(key: str, second: str) -> str:
    """A checkpoint key of the former dual layout (``pair.embedding.*``, ``pair.encoder.*``) under the
    second stream's name; other keys unchanged."""
    for part in ("embedding.", "encoder."):
        if key.startswith("pair." + part):
            return f"streams.{second}.{key[len('pair.'):]}"
    return key
