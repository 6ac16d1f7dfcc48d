"""Streams (``model.streams``, docs/streams.md): their config section, the modules of a second stream,
and running and pooling them; :mod:`pentad.model` and :mod:`pentad.builder` call in here.

A stream is an embedding slot, then an encoder, then a pooling of the encoder's states over the
stream's real positions. A model without a ``streams`` section has one stream: its ``embedding``
and ``encoder`` slots over the batch (a ViLT fuses text and image there, in one ``word_patch``
embedding). A model with a ``streams`` section has two, named by their keys, in order:

* the **first** reads the batch's own input through the model's ``embedding`` and ``encoder`` slots
  (so its parameters keep a one-stream model's names, and a BERT checkpoint initialises it as is);
* the **second** reads ``Batch.pair`` (and ``Batch.negative``, hard negatives) through the first
  stream's modules (``share: <first>``: siamese, SBERT) or its own embedding slot and encoder
  (``streams.<name>.embedding.*``, ``streams.<name>.encoder.*``: CLIP's image tower), a :class:`Stream`.

Targets say which streams they read (``targets[i].streams``): a pair target (``clr``,
``pair_cls``, ``cosine``) two of them, in the order it compares them (default: both, first to
second); a target over token states (``mlm``, ``lm``, ``cls``) the first stream, whose labels the
batch holds. Every stream must be read by some target.

Here, in order: the config (:class:`StreamConfigBase`; its ``embedding`` and ``encoder`` fields are
typed in :mod:`pentad.components.model_config`), reading it (:func:`stream_sizes`, :func:`pair_widths`,
...), its checks (:func:`stream_problems`), the modules (:class:`Stream`, :func:`build_streams`),
running a stream (:func:`run_stream`, the single place an encoder is called on embedded input, for a
one-stream model and for each stream alike) and the layout that runs and pools a two-stream model's
streams for its targets (:class:`StreamPlan`); :func:`stacked` runs inputs that share one stream's
modules as one batch. The former ``dual`` layout is rewritten on load by :mod:`pentad.config.dual_layout`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, Encoder, PooledPair, TargetOutput
from pentad.config.base import StrictModel
from pentad.config.sizes import SlotSizes
from pentad.layers.pooling import pool
from pentad.layers.pooling_kinds import PoolingKind
from pentad.registry import EMBEDDINGS, ENCODERS, TARGETS

STREAM_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
SIZE_FIELDS = ("hidden_size", "embedding_size", "vocab_size", "max_seq_length")
OWN_FIELDS = ("embedding", "encoder", *SIZE_FIELDS)


# ---------------------------------------------------------------------------------------- the config
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


def target_streams(cfg: Any, target: Any, pair: bool) -> tuple[str, ...]:
    """The streams ``target`` reads: its ``streams``, else both (a pair target) or the first."""
    names = stream_names(cfg)
    if target.streams is not None:
        return tuple(target.streams)
    if not names:
        return ()
    return names if pair else names[:1]


def pair_widths(cfg: Any, target: Any) -> tuple[int, int]:
    """(H0, H1): the widths of the two streams a pair target compares, in its order; (H, H) for a model
    without streams (the builder reports that mismatch)."""
    names = target_streams(cfg, target, True)
    if len(names) != 2 or any(n not in (getattr(cfg, "streams", None) or {}) for n in names):
        return cfg.hidden_size, cfg.hidden_size
    return stream_width(cfg, names[0]), stream_width(cfg, names[1])


def reads_pair(target: Any) -> bool:
    """Whether the target config ``target`` is of a kind that compares two streams (``clr``, ``pair_cls``, ...)."""
    return bool(getattr(TARGETS.get(target.type), "reads_pair", False))


# ---------------------------------------------------------------------------------------- checks
def stream_problems(cfg: Any) -> list[tuple[str, str]]:
    """(path, message) for every inconsistency of ``model.streams`` and the targets' stream reads."""
    problems: list[tuple[str, str]] = []
    names = stream_names(cfg)
    if not names:
        for i, target in enumerate(cfg.targets):
            if reads_pair(target):
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
        leads = [k for k in kinds if getattr(EMBEDDINGS.get(k), "defines_sequence", False)]
        if len(leads) != 1:
            problems.append((f"{where}.parts", f"found {len(leads)} parts that make the sequence among {kinds}; "
                             "a slot needs exactly one"))
        if sizes.vocab_size is None and any("tokens" in EMBEDDINGS.get(k).requires for k in kinds):
            problems.append((f"model.streams.{second}.vocab_size", "not set, and neither is model.vocab_size: the "
                             "stream's word embedding needs a vocabulary size"))
        if tail.embedding is not None:
            for i, part in enumerate(embedding.parts):
                problems += [(f"{where}.parts.{i}.{key}", msg) for key, msg in
                             getattr(part, "check", lambda m: [])(sizes)]
    if cfg.decoder is not None:
        problems.append(("model.decoder", "a model with streams has no decoder; remove it (or the streams)"))
    read: set[str] = set()
    pair_kinds = sorted(n for n, c in TARGETS.items() if getattr(c, "reads_pair", False))
    for i, target in enumerate(cfg.targets):
        pair = reads_pair(target)
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


# ----------------------------------------------------------------------------------- the modules
class Stream(nn.Module):
    """The own modules of a model's second stream: ``embedding`` (an embedding slot) and ``encoder``;
    their parameters read ``streams.<name>.embedding.*`` and ``streams.<name>.encoder.*``."""

    def __init__(self, embedding: nn.Module, encoder: Encoder):
        super().__init__()
        self.embedding = embedding
        self.encoder = encoder


# (slot config, the sizes it sees, the encoder config it feeds) -> an embedding slot; the builder's.
SlotFactory = Callable[[Any, Any, Any], nn.Module]


def build_streams(cfg: Any, embedding_slot: SlotFactory) -> tuple[dict[str, Stream], StreamPlan | None]:
    """The second stream's own modules (none when it shares the first's) and the layout of a model with
    ``model.streams``; ({}, None) for a one-stream model. ``embedding_slot`` builds an embedding slot
    (the builder's, which builds the model's own slots the same way)."""
    plan = StreamPlan.from_config(cfg)
    if plan is None or plan.shared:
        return {}, plan
    name = plan.second
    sizes = stream_sizes(cfg, name)
    encoder_cfg = stream_encoder(cfg, name)
    embedding = embedding_slot(stream_embedding(cfg, name), sizes, encoder_cfg)
    encoder = ENCODERS.get(encoder_cfg.type).from_config(encoder_cfg, sizes)
    return {name: Stream(embedding, encoder)}, plan


# ------------------------------------------------------------------------------ running a stream
# Batch fields inputs of one stream may be stacked on (every one is [B,S]); see stacked().
_TOKEN_FIELDS = ("tokens", "segments", "padding_mask", "positions")


def run_stream(embedding: Any, encoder: Encoder, batch: Batch, cache: Any = None,
               output_positions: int | None = None) -> tuple[Tensor, Tensor | None]:
    """``embedding`` (an embedding slot: ``Batch -> Embedded``) then ``encoder`` over ``batch``:
    (hidden [B,S,H], padding_mask [B,S] | None). ``output_positions`` n (the caller reads only the
    first n positions, e.g. :func:`pentad.components.base.leading_positions` of the heads that read
    this stream): hidden [B,n,H] and padding_mask [B,n]; an encoder that ``trims_positions`` skips
    work for the others, another one's output is cut."""
    embedded = embedding(batch)
    lengths = None
    if encoder.mask_kind == "prefix" and batch.segments is not None:
        # Prefix positions are segment 0 (and, with left padding, the padding before them).
        lengths = prefix_lengths(batch.segments, embedded.padding_mask)
    padding_mask = embedded.padding_mask
    if output_positions is None:
        return encoder(embedded.hidden, padding_mask, lengths, batch.positions, cache), padding_mask
    if encoder.trims_positions:
        hidden = encoder(embedded.hidden, padding_mask, lengths, batch.positions, cache,
                         output_positions=output_positions)
    else:
        hidden = encoder(embedded.hidden, padding_mask, lengths, batch.positions, cache)[:, :output_positions]
    return hidden, padding_mask[:, :output_positions] if padding_mask is not None else None


def prefix_lengths(segments: Tensor, padding_mask: Tensor | None) -> Tensor:
    """[B]: index of the first non-prefix position of each row (segment != 0 and not padding)."""
    after = segments != 0
    if padding_mask is not None:
        after = after & ~padding_mask[:, -segments.shape[1]:]
    seq = segments.shape[1]
    index = torch.arange(seq, device=segments.device).expand_as(segments)
    return torch.where(after, index, torch.full_like(index, seq)).min(dim=1).values


# ----------------------------------------------------------------------- a two-stream model's run
@dataclass(frozen=True)
class StreamPlan:
    """The layout of a two-stream model: the streams' names in order (the first reads the batch, the
    second ``Batch.pair`` and ``Batch.negative``), their poolings, whether the second runs through
    the first's modules, and which streams each target reads (in its order).

    Its methods run the streams of ``model``, a :class:`pentad.model.Model` (they read its
    ``embedding``, ``encoder``, ``streams`` and ``targets``); the model's stream methods call them."""

    names: tuple[str, str]
    pooling: dict[str, str]
    shared: bool
    reads: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Any) -> StreamPlan | None:
        """The plan of a model config with ``model.streams``; None for a one-stream model."""
        names = stream_names(cfg)
        if not names:
            return None
        reads = {t.target_name: target_streams(cfg, t, reads_pair(t)) for t in cfg.targets}
        return cls((names[0], names[1]), {n: cfg.streams[n].pooling for n in names}, shares(cfg), reads)

    @property
    def first(self) -> str:
        return self.names[0]

    @property
    def second(self) -> str:
        return self.names[1]

    def name(self, stream: int | str) -> str:
        """A stream's name from its name or its index (0: the first, 1: the second)."""
        if isinstance(stream, int):
            if stream not in (0, 1):
                raise ValueError(f"stream index {stream}: a model with streams has streams 0 and 1")
            return self.names[stream]
        if stream not in self.names:
            raise ValueError(f"no stream named '{stream}'; the streams are {', '.join(self.names)}")
        return stream

    def needed(self) -> set[str]:
        """The streams some target reads."""
        return {n for names in self.reads.values() for n in names}

    def slots(self, model: Any, stream: int | str) -> tuple[nn.Module, Encoder]:
        """(embedding slot, encoder) of a stream, by name or index: the model's own for the first
        stream and a shared second one, else the second stream's own modules."""
        name = self.name(stream)
        if name == self.first or self.shared:
            return model.embedding, model.encoder
        own = model.streams[name]
        return own.embedding, own.encoder

    def states(self, model: Any, batch: Batch, names: set[str] | None = None
               ) -> dict[str, tuple[Tensor, Tensor | None]]:
        """Token states (hidden [B,S,H], padding_mask) of the streams ``names`` (default: those the
        targets read): the first over ``batch``, the second over ``batch.pair`` and, under the key
        ``"negative"``, over ``batch.negative`` when it is set. Inputs of shared modules run as one
        stacked batch where their fields allow."""
        names = self.needed() if names is None else names
        inputs: dict[str, Batch] = {}
        if self.first in names:
            inputs[self.first] = batch
        if self.second in names:
            for key, part in (("pair", batch.pair), ("negative", batch.negative)):
                if part is not None and part.batch_size != batch.batch_size:
                    raise ValueError(f"batch.{key} has {part.batch_size} rows, the batch {batch.batch_size}; "
                                     f"stream '{self.second}' needs one {key} row per row")
            if batch.pair is None:
                raise ValueError(f"stream '{self.second}' reads its input from batch.pair, which is not set")
            inputs[self.second] = batch.pair
            if batch.negative is not None:
                inputs["negative"] = batch.negative
        keys, parts = list(inputs), list(inputs.values())
        merged = stacked(parts) if self.shared and len(parts) > 1 else None
        if merged is not None:
            hidden, mask = run_stream(model.embedding, model.encoder, merged[0])
            rows = batch.batch_size
            return {key: (hidden[i * rows:(i + 1) * rows, :length],
                          None if mask is None else mask[i * rows:(i + 1) * rows, :length])
                    for i, (key, length) in enumerate(zip(keys, merged[1]))}
        return {key: run_stream(*self.slots(model, self.second if key == "negative" else key), part)
                for key, part in inputs.items()}

    def pooled(self, states: dict[str, tuple[Tensor, Tensor | None]]) -> dict[str, Tensor]:
        """``states`` (of :meth:`states`) pooled [B,H] by each stream's pooling (hard negatives by the second's)."""
        return {key: pool(*value, self.pooling[self.second if key == "negative" else key])
                for key, value in states.items()}

    def pair(self, model: Any, batch: Batch) -> PooledPair:
        """Both streams, pooled: first [B,H0] from ``batch``, second [B,H1] from ``batch.pair`` (and its
        hard negatives from ``batch.negative``)."""
        pooled = self.pooled(self.states(model, batch, set(self.names)))
        return PooledPair(pooled[self.first], pooled[self.second], pooled.get("negative"))

    def encode(self, model: Any, batch: Batch, stream: int | str) -> Tensor:
        """One stream (by name or index) over ``batch`` alone (its own input, not ``batch.pair``), pooled [B,H]."""
        name = self.name(stream)
        return pool(*run_stream(*self.slots(model, name), batch), self.pooling[name])

    def forward(self, model: Any, batch: Batch) -> dict[str, TargetOutput]:
        """{target name: TargetOutput}: each of ``model.targets`` over the streams it reads, a pair target
        over a :class:`PooledPair` of them, another over the first stream's token states."""
        states = self.states(model, batch)
        pooled: dict[str, Tensor] | None = None
        out: dict[str, TargetOutput] = {}
        for name, target in model.targets.items():
            reads = self.reads[name]
            if target.reads_pair:
                pooled = self.pooled(states) if pooled is None else pooled
                negative = pooled.get("negative") if reads[1] == self.second else None
                out[name] = target(PooledPair(pooled[reads[0]], pooled[reads[1]], negative), batch)
            else:
                out[name] = target(states[reads[0]][0], batch)
        return out

    def requirements(self, model: Any) -> list[tuple[str, str]]:
        """(who, Batch field) for every field the second stream's modules read (from ``Batch.pair``),
        when a target reads it; for the builder's requirement check."""
        if self.second not in self.needed():
            return []
        embedding, encoder = self.slots(model, self.second)
        who = f"stream '{self.second}'"
        needs = [(f"{who} embedding part '{name}'", f"pair.{f}")
                 for name in embedding.part_names for f in getattr(embedding, name).requires]
        return needs + [(f"{who} encoder '{encoder.registry_name}'", f"pair.{f}")
                        for f in getattr(encoder, "requires", ())]

    def requirements_hint(self) -> str:
        """What to do when the data lacks the second stream's input."""
        return (f" Stream '{self.second}' reads its input from Batch.pair, which pair-aware data fills "
                "(for classification: task.pair_input=separate).")

    def describe(self, model: Any) -> str:
        """One line of the builder's ``summarize``: the streams, their modules, pooling and readers."""
        first, second = self.names
        if self.shared:
            other = f"{second} (Batch.pair) through {first}'s modules"
        else:
            own = model.streams[second]
            n = sum(p.numel() for p in own.parameters())
            other = (f"{second} (Batch.pair): embedding {'+'.join(own.embedding.part_names)}, encoder "
                     f"{own.encoder.registry_name} ({n:,})")
        readers = "; ".join(f"{t} reads {', '.join(names)}" for t, names in self.reads.items())
        return (f"streams: {first} (the embedding and encoder slots), {other}; pooling "
                f"{self.pooling[first]} / {self.pooling[second]}; {readers}")


def stacked(parts: list[Batch]) -> tuple[Batch, list[int]] | None:
    """Inputs of one stream's modules (the first stream's input, the second's, hard negatives) as one
    Batch of their rows stacked in order, right-padded to the longest length, and each input's own
    length: the same states as one pass each, since every encoder ignores padding. None when they
    cannot be stacked (fields other than [B,S] token fields)."""
    has = [name for name in _TOKEN_FIELDS if getattr(parts[0], name) is not None]
    if not has or any(has != [name for name in _TOKEN_FIELDS if getattr(p, name) is not None] for p in parts):
        return None
    if any(getattr(x, name) is not None for x in parts for name in ("decoder_tokens", "pixels", "audio")):
        return None
    refs = [getattr(p, has[0]) for p in parts]
    width = max(ref.shape[1] for ref in refs)
    merged: dict[str, Tensor] = {}
    for name in _TOKEN_FIELDS:
        values = [getattr(p, name) for p in parts]
        if name == "padding_mask":
            # Without a mask an input has no padding; the added columns are padding.
            values = [torch.zeros(ref.shape, dtype=torch.bool, device=ref.device) if v is None else v
                      for v, ref in zip(values, refs)]
        elif values[0] is None:
            continue
        fill = name == "padding_mask"
        merged[name] = torch.cat([_pad_right(v, width, fill) for v in values])
    return Batch(**merged), [ref.shape[1] for ref in refs]


def _pad_right(x: Tensor, width: int, value: bool | int) -> Tensor:
    """[B,S] -> [B,width], new columns set to ``value``."""
    if x.shape[1] == width:
        return x
    return torch.cat([x, x.new_full((x.shape[0], width - x.shape[1]), value)], dim=1)
