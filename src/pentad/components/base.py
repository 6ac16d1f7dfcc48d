"""The contracts between the five slots: typed containers and base classes.

A model is ``embedding -> encoder -> (target embedding -> decoder) -> target``. Tensors travel
between slots in the small dataclasses below, never in positional tuples.

Conventions used everywhere:

* ``padding_mask`` is a bool tensor ``[B, S]`` that is **True at padding positions**.
* ``labels`` maps a target's name to its label tensor. Token-level labels use ``IGNORE_INDEX``
  (-100) at positions that are not scored.
* Segment ids are 0 for segment A (or the only segment) and 1 for segment B; padding is its
  own mask and never a segment id.
* Two-stream models (``model.streams``: SBERT, siamese, CLIP) read their second input from
  ``Batch.pair``, a Batch of its own; their pair targets get a :class:`PooledPair` instead of token
  states.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from pentad.layers.soft_labels import SoftLoss, soft_label_loss

IGNORE_INDEX = -100

# Fields of a Batch that hold model inputs (as opposed to labels).
BATCH_INPUT_FIELDS = ("tokens", "segments", "padding_mask", "positions", "decoder_tokens",
                      "decoder_segments", "decoder_padding_mask", "decoder_positions", "pixels", "patch_mask",
                      "audio", "audio_padding_mask")


@dataclass
class Batch:
    """A batch of model inputs and per-target labels.

    tokens [B,S] long; segments [B,S] long; padding_mask [B,S] bool (True = padding);
    positions [B,S] long (optional, defaults to 0..S-1); decoder_* the same for the decoder
    side; pixels [B,C,H,W]; patch_mask [B,N] bool (True: the image's patch n is masked, BEiT);
    audio [B,T,F] (feature frames) with audio_padding_mask [B,T] bool (True = a padding frame);
    labels: target name -> tensor.
    pair: the second stream of a two-stream model (text B of a sentence pair for SBERT, the
    image for CLIP): a Batch with the same row count whose own fields are [B,S'] (its labels are
    unused; labels live in the outer Batch). Its fields appear as ``pair.<field>`` in ``provided()``.
    negative: hard negatives for the second stream (supervised SimCSE's contradiction sentences):
    a Batch with the same row count, encoded like ``pair``; row i is a negative of row i (and, in
    contrastive heads, of every other row). Its fields appear as ``negative.<field>``.
    group_padding_mask [B,G] bool: set when each example is a group of G consecutive rows of the
    input fields (the choices of a multiple-choice question: tokens [B*G,S], example i's members are
    rows i*G .. i*G+G-1); True marks a padding member (a dummy choice, which a head must never pick).
    Labels stay one per example ([B]); ``batch_size`` counts examples and ``rows`` picks whole
    examples, so a distributed run splits a batch between questions, never inside one.
    """

    tokens: Tensor | None = None
    segments: Tensor | None = None
    padding_mask: Tensor | None = None
    positions: Tensor | None = None
    decoder_tokens: Tensor | None = None
    decoder_segments: Tensor | None = None
    decoder_padding_mask: Tensor | None = None
    decoder_positions: Tensor | None = None
    pixels: Tensor | None = None
    patch_mask: Tensor | None = None
    audio: Tensor | None = None
    audio_padding_mask: Tensor | None = None
    labels: dict[str, Tensor] = field(default_factory=dict)
    pair: Batch | None = None
    negative: Batch | None = None
    group_padding_mask: Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False, dtype: torch.dtype | None = None) -> Batch:
        """A copy with every tensor (the pair's included) moved to ``device``; ``dtype``: also cast the
        floating-point inputs (pixels, audio features), not the labels, for a model whose weights
        are in that dtype."""
        moved: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Batch):
                value = value.to(device, non_blocking=non_blocking, dtype=dtype)
            elif isinstance(value, Tensor):
                cast = dtype if dtype is not None and value.is_floating_point() else None
                value = value.to(device, dtype=cast, non_blocking=non_blocking)
            elif isinstance(value, dict):
                value = {k: v.to(device, non_blocking=non_blocking) for k, v in value.items()}
            moved[f.name] = value
        return Batch(**moved)

    def without_empty_padding(self) -> Batch:
        """This batch with padding masks that mark no position (all False) left out (None): the same
        batch for every slot, decided here on the host, so that attention on a GPU needs no device
        sync to find there is no padding and runs without a mask (SDPA's fastest kernels)."""
        changes: dict[str, Any] = {}
        for name in ("padding_mask", "decoder_padding_mask"):
            mask = getattr(self, name)
            if mask is not None and mask.device.type == "cpu" and not bool(mask.any()):
                changes[name] = None
        if self.pair is not None:
            changes["pair"] = self.pair.without_empty_padding()
        return replace(self, **changes) if changes else self

    def pin_memory(self) -> Batch:
        """A copy with every tensor in pinned (page-locked) host memory, whose copy to a GPU with
        ``non_blocking=True`` overlaps the work already queued there."""
        pinned: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (Tensor, Batch)):
                value = value.pin_memory()
            elif isinstance(value, dict):
                value = {k: v.pin_memory() for k, v in value.items()}
            pinned[f.name] = value
        return Batch(**pinned)

    def rows(self, index: Tensor) -> Batch:
        """The rows ``index`` (a 1-D long tensor) of every batch-major tensor, labels and pair included:
        the slice of a global batch that one rank of a distributed run trains on. With
        ``group_padding_mask``, ``index`` numbers examples and every member row of each is taken."""
        members = index
        if self.group_padding_mask is not None:
            size = self.group_padding_mask.shape[1]
            members = (index[:, None] * size + torch.arange(size, device=index.device)).reshape(-1)
        picked: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                value = value.index_select(0, (members if f.name in BATCH_INPUT_FIELDS else index).to(value.device))
            elif isinstance(value, Batch):
                value = value.rows(index)
            elif isinstance(value, dict):
                value = {k: v.index_select(0, index.to(v.device)) for k, v in value.items()}
            picked[f.name] = value
        return Batch(**picked)

    def provided(self) -> set[str]:
        """Names of the fields that are set; labels appear as ``labels.<target>``, the pair's
        input fields as ``pair.<field>`` and the hard negatives' as ``negative.<field>``."""
        names = {f for f in (*BATCH_INPUT_FIELDS, "group_padding_mask") if getattr(self, f) is not None}
        if self.pair is not None:
            names |= {f"pair.{f}" for f in BATCH_INPUT_FIELDS if getattr(self.pair, f) is not None}
        if self.negative is not None:
            names |= {f"negative.{f}" for f in BATCH_INPUT_FIELDS if getattr(self.negative, f) is not None}
        return names | {f"labels.{k}" for k in self.labels}

    def decoder_view(self) -> Batch:
        """The decoder side as a Batch whose ``tokens``/``segments``/``padding_mask``/``positions``
        are the ``decoder_*`` fields, so target-embedding parts read it like the embedding slot
        reads the encoder side."""
        return Batch(tokens=self.decoder_tokens, segments=self.decoder_segments,
                     padding_mask=self.decoder_padding_mask, positions=self.decoder_positions,
                     labels=self.labels)

    @property
    def batch_size(self) -> int:
        """The number of examples (of groups, when ``group_padding_mask`` is set)."""
        if self.group_padding_mask is not None:
            return int(self.group_padding_mask.shape[0])
        for name in BATCH_INPUT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                return int(value.shape[0])
        if self.pair is not None:
            return self.pair.batch_size
        raise ValueError("empty batch")


@dataclass
class Embedded:
    """Output of an embedding slot: hidden [B,S,H] and padding_mask [B,S] (True = padding) or None."""

    hidden: Tensor
    padding_mask: Tensor | None


@dataclass
class PooledPair:
    """What a two-stream model (``model.streams``) gives its pair targets in place of token states: one pooled
    vector per stream. first [B, H0] (stream 0: ``Batch.tokens`` ...), second [B, H1] (stream 1:
    ``Batch.pair``); H0 and H1 differ only when the streams have different widths (CLIP).
    negative [B, H1]: stream 1's vectors of ``Batch.negative`` (hard negatives), when the batch has them."""

    first: Tensor
    second: Tensor
    negative: Tensor | None = None


@dataclass
class TargetOutput:
    """Output of a target head.

    loss: scalar tensor (None at inference, when no labels are given);
    metrics: name -> scalar tensor, summed over the batch (e.g. ``correct``, ``count``), kept as
    tensors so the training loop never synchronises with the device except when logging;
    logits: the head's scores for inference (e.g. [B, num_labels]), when it produces them.
    """

    loss: Tensor | None
    metrics: dict[str, Tensor] = field(default_factory=dict)
    logits: Tensor | None = None


class ModelOutput(dict):
    """What a model's forward returns: target name -> :class:`TargetOutput` (a dict, so
    ``outputs["mlm"].loss`` reads as before), plus the auxiliary terms of its blocks.

    aux_losses: name -> scalar tensor, already weighted as configured (MoE load balancing
    ``moe_balance``, router z-loss ``moe_z``; summed over layers), added to the training loss
    and logged as ``<name>_loss``; aux_metrics: name -> scalar tensor averaged over the layers
    that report it (``moe_dropped``: the fraction of token-expert assignments over capacity),
    logged as ``aux_<name>``.
    """

    def __init__(self, targets: dict[str, TargetOutput] | None = None, aux_losses: dict[str, Tensor] | None = None,
                 aux_metrics: dict[str, Tensor] | None = None):
        super().__init__(targets or {})
        self.aux_losses: dict[str, Tensor] = dict(aux_losses or {})
        self.aux_metrics: dict[str, Tensor] = dict(aux_metrics or {})

    @property
    def targets(self) -> dict[str, TargetOutput]:
        return dict(self)


class EmbeddingPart(nn.Module):
    """One summand of the embedding slot (word, position, segment, image patches, ...).

    ``forward(batch, length) -> [B|1, S, E]``. ``requires`` lists the Batch fields it reads.
    ``defines_sequence``: the part makes the sequence the others add to (word: one position per
    token; patch: a CLS position then one per image patch), so its output fixes S; every slot has
    exactly one such part, computed first. The other parts receive ``length`` (that S) and need
    not read the field the sequence came from (a position table serves tokens and patches alike).
    ``max_positions``: how many positions an absolute position part covers (None: unlimited).
    """

    requires: ClassVar[tuple[str, ...]] = ()
    defines_sequence: ClassVar[bool] = False
    word_table: ClassVar[str | None] = None  # the parameter (below the part) holding a token table heads tie to
    max_positions: int | None = None
    registry_name: ClassVar[str]

    def forward(self, batch: Batch, length: int) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def padding_mask(self, batch: Batch, length: int) -> Tensor | None:
        """The padding mask [B, length] (True = padding) of the sequence this part defines (read only
        from the slot's sequence-defining part): ``batch.padding_mask`` by default (tokens); a part that
        changes lengths computes its own (speech frames after subsampling), or None (images)."""
        return batch.padding_mask

    def position_grid(self) -> tuple[int, int, int] | None:
        """For a part whose sequence is an image's patches: (leading positions before the patches, patch
        rows, patch columns), which lets a position table trained at another image size be resized
        (:meth:`pentad.model.EmbeddingSlot.adapt_checkpoint`); None for other sequences."""
        return None

    def initialise(self, std: float) -> None:
        """Fresh weights (the builder's initialisation): N(0, std) for a ``weight`` table (word,
        position, segment); parts with other parameters override this."""
        weight = getattr(self, "weight", None)
        if isinstance(weight, nn.Parameter):
            nn.init.normal_(weight, std=std)


class Encoder(nn.Module):
    """``forward(hidden [B,S,E], padding_mask [B,S] | None, prefix_lengths [B] | None,
    positions [B,S] | None, cache | None) -> [B,S,H]``.

    ``prefix_lengths`` is only read by encoders whose attention mask is ``prefix`` (prefix-LM):
    the first ``prefix_lengths[b]`` positions of row b attend to each other bidirectionally.
    ``positions`` feed in-attention position signals (rotary); default 0..S-1 (after the cache).
    ``cache`` (a ``pentad.layers.cache.KVCache``) enables incremental decoding: ``hidden`` holds
    only the new positions and ``padding_mask`` covers cached and new ones. Encoders that cannot
    decode incrementally raise ValueError when given a cache.

    Declared capabilities (read directly, never probed): ``mask_kind`` (``bidirectional``,
    ``causal`` or ``prefix``: which positions attend to which), ``supports_cache`` (incremental
    decoding with a KV cache), ``supports_static_cache`` (also with a pre-allocated
    :class:`~pentad.layers.cache.StaticKVCache`), ``trims_positions`` (``forward`` also takes ``output_positions=n``:
    the caller reads only the first n positions, [B,n,H] comes back, and the encoder may skip work
    for the others; :func:`pentad.components.stream.run_stream` cuts the output of the others).
    """

    registry_name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    mask_kind: str = "bidirectional"
    supports_cache: ClassVar[bool] = False
    supports_static_cache: bool = False
    trims_positions: ClassVar[bool] = False

    def forward(self, hidden: Tensor, padding_mask: Tensor | None, prefix_lengths: Tensor | None = None,
                positions: Tensor | None = None, cache: Any = None) -> Tensor:  # pragma: no cover
        raise NotImplementedError


class Decoder(nn.Module):
    """``forward(hidden [B,T,H], padding_mask [B,T] | None, memory [B,S,H], memory_padding_mask [B,S]
    | None, positions [B,T] | None, cache | None) -> [B,T,H]``: the target side of an
    encoder-decoder model, attending to the encoder output ``memory``. ``supports_cache`` and
    ``supports_static_cache`` as for
    :class:`Encoder`."""

    registry_name: ClassVar[str]
    supports_cache: ClassVar[bool] = False
    supports_static_cache: bool = False

    def forward(self, hidden: Tensor, padding_mask: Tensor | None, memory: Tensor | None,
                memory_padding_mask: Tensor | None, positions: Tensor | None = None,
                cache: Any = None) -> Tensor:  # pragma: no cover
        raise NotImplementedError


class Target(nn.Module):
    """A head with a loss: ``forward(hidden [B,S,H], batch) -> TargetOutput``.

    ``name`` is its key in ``batch.labels`` and the prefix of its parameters. A fine-tuning
    head is a target too, so pre-training and fine-tuning share class and parameter names.
    ``requires`` lists the Batch fields it reads (labels appear as ``labels.<name>``).
    ``reads_pair``: the head compares the two streams of a two-stream model, so ``hidden`` is a
    :class:`PooledPair` rather than [B,S,H] token states (and it reads the two streams its config names).
    """

    registry_name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    reads_pair: ClassVar[bool] = False

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def required_fields(self, training: bool = True) -> tuple[str, ...]:
        extra = (f"labels.{self.name}",) if training else ()
        return tuple(self.requires) + extra

    def positions_read(self) -> int | None:
        """How many leading positions of ``hidden`` [B,S,H] this head reads: n when it reads
        ``hidden[:, :n]`` alone (a classifier over the first, CLS, position: 1), None when it may read
        any. When every head of a model reads only leading positions, the encoder need not compute
        the others in its last layer (:func:`leading_positions`)."""
        return None

    def tie_to(self, weight: nn.Parameter) -> bool:
        """Share ``weight`` (the word embedding, [V, H]) as this head's output projection.

        Returns False when the head has no vocabulary projection to tie.
        """
        return False

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:  # pragma: no cover
        raise NotImplementedError

    def distill_positions(self, batch: Batch) -> Tensor | None:
        """Which distributions of this head's logits its loss scores, as a bool tensor of the logits'
        shape without the class dimension (e.g. [B,S] for token heads: True where a label is); None: all.
        The default soft-label loss averages over these, as the head's own loss does."""
        return None

    def distill_loss(self, student: TargetOutput, teacher: TargetOutput | None, batch: Batch, temperature: float,
                     kind: SoftLoss) -> Tensor | None:
        """The soft-label loss of this head's outputs (``student``) against a teacher's on the same batch
        (distillation; :func:`pentad.layers.soft_labels.soft_label_loss`, ``kind`` ``kl`` or ``mse``),
        averaged over the items the head's own loss averages over, so that the two mix with one weight.
        None: the head takes no soft labels (no logits while training, or logits that are not class
        scores). The default: the logits' last dimension holds the classes, scored where
        :meth:`distill_positions` says."""
        if student.logits is None or teacher is None or teacher.logits is None:
            return None
        return soft_label_loss(student.logits, teacher.logits, temperature, kind, rows=self.distill_positions(batch))


def leading_positions(targets: Iterable[Target]) -> int | None:
    """The leading positions that ``targets`` read together (the largest of their
    :meth:`Target.positions_read`), or None when one of them may read any position or there is none:
    the ``output_positions`` to run an encoder with when these heads are its only readers."""
    counts = [target.positions_read() for target in targets]
    if not counts or any(n is None for n in counts):
        return None
    return max(counts)
