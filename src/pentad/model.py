"""The five-slot composite: embedding -> encoder -> (target embedding -> decoder) -> targets."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pentad.components.base import (
    Batch,
    Embedded,
    EmbeddingPart,
    Encoder,
    ModelOutput,
    PooledPair,
    Target,
    TargetOutput,
    leading_positions,
)
from pentad.components.norms import make_norm
from pentad.components.stream import Stream, StreamPlan, run_stream
from pentad.layers.block import Block
from pentad.layers.cache import KVCache
from pentad.layers.dropout import Dropout
from pentad.layers.moe import MoE


class EmbeddingSlot(nn.Module):
    """Sums its parts ([B,S,E] each), then a norm (optional; ``norm_kind`` as in ``make_norm``; a
    second one after it with ``second_norm``, TencentPretrain's dual-stream LN after LN), dropout,
    and a projection E -> H when the embedding width E differs from the hidden size (ALBERT's
    factorised embedding).

    Parts are registered under their names, so parameters read ``embedding.word.weight``.
    The padding mask is the sequence-defining part's (``EmbeddingPart.padding_mask``): the Batch's for tokens.
    """

    def __init__(self, parts: dict[str, EmbeddingPart], hidden_size: int, norm: bool = True,
                 layer_norm_eps: float = 1e-12, dropout: float = 0.1, embedding_size: int | None = None,
                 project: bool = True, norm_kind: str = "layernorm", second_norm: bool = False):
        super().__init__()
        self.part_names = list(parts)
        for name, part in parts.items():
            self.add_module(name, part)
        width = embedding_size or hidden_size
        self.norm = make_norm(norm_kind, width, layer_norm_eps) if norm else None
        # LN after LN (TencentPretrain's DualEmbedding stream norm), for converted checkpoints.
        self.second_norm = make_norm(norm_kind, width, layer_norm_eps) if norm and second_norm else None
        self.dropout = Dropout(dropout)
        # Recurrent/convolutional encoders read the embedding width directly (TencentPretrain layout).
        self.project = nn.Linear(width, hidden_size) if project and width != hidden_size else None

    def parts(self) -> list[EmbeddingPart]:
        return [getattr(self, name) for name in self.part_names]

    def word_table_name(self) -> str | None:
        """The name (below the slot) of the token table output heads tie to: the ``word`` part's
        ``word.weight``, or that of another part holding word vectors (``word_patch.word.weight``)."""
        for name in self.part_names:
            path = getattr(self, name).word_table
            if path is not None:
                return f"{name}.{path}"
        return None

    def word_embedding_weight(self) -> nn.Parameter | None:
        """The token table output heads tie to, if this slot has one (see :meth:`word_table_name`)."""
        name = self.word_table_name()
        return None if name is None else self.get_parameter(name)

    def adapt_checkpoint(self, prefix: str, tensors: dict[str, Tensor]) -> list[str]:
        """Resize, in ``tensors``, a learned position table trained on another image size to this slot's
        patch grid (``prefix``: the slot's name and a dot): the leading rows (CLS) are kept and the grid
        rows are interpolated bicubically, as ViT fine-tuning at a new resolution does (Dosovitskiy et
        al. 2021, section 3.2). Returns notes for the user; other tables are left to the strict check."""
        lead = next(part for part in self.parts() if part.defines_sequence)
        grid = lead.position_grid()
        notes: list[str] = []
        if grid is None:
            return notes
        first, rows, cols = grid
        for name in self.part_names:
            key = f"{prefix}{name}.weight"
            own = getattr(getattr(self, name), "weight", None)
            if getattr(self, name).max_positions is None:  # only absolute position tables
                continue
            if key not in tensors or own is None or tensors[key].shape == own.shape:
                continue
            old = tensors[key]
            side = int(round((old.shape[0] - first) ** 0.5))
            if old.dim() != 2 or old.shape[1] != own.shape[1] or side * side != old.shape[0] - first:
                continue  # not a square grid of positions: the strict check reports it
            table = old[first:].reshape(1, side, side, -1).permute(0, 3, 1, 2).float()
            resized = nn.functional.interpolate(table, size=(rows, cols), mode="bicubic", align_corners=False)
            resized = resized.permute(0, 2, 3, 1).reshape(rows * cols, -1).to(old.dtype)
            needed = first + rows * cols
            if needed > own.shape[0]:
                continue
            merged = own.detach().clone()
            merged[:first] = old[:first]
            merged[first:needed] = resized
            tensors[key] = merged
            notes.append(f"{key}: positions of a {side}x{side} patch grid interpolated to {rows}x{cols}")
        return notes

    def forward(self, batch: Batch) -> Embedded:
        parts = self.parts()
        # The part that defines the sequence runs first; the sum keeps the configured order.
        lead = next(i for i, part in enumerate(parts) if part.defines_sequence)
        first = parts[lead](batch, None)
        length = first.shape[1]
        hidden = None
        for i, part in enumerate(parts):
            out = first if i == lead else part(batch, length)
            hidden = out if hidden is None else hidden + out
        if self.norm is not None:
            hidden = self.norm(hidden)
        if self.second_norm is not None:
            hidden = self.second_norm(hidden)
        hidden = self.dropout(hidden)
        if self.project is not None:
            hidden = self.project(hidden)
        return Embedded(hidden, parts[lead].padding_mask(batch, length))


class Model(nn.Module):
    """A model assembled by ``pentad.builder.build_model``.

    ``forward(batch) -> {target name: TargetOutput}``; ``encode(batch) -> (hidden [B,S,H], padding_mask)``;
    ``decode(batch, memory, memory_padding_mask) -> [B,T,H]`` for encoder-decoder models.
    Targets read the decoder output when there is a decoder, else the encoder output.

    A two-stream model (``model.streams``, docs/streams.md) has a ``stream_plan``: its first stream
    is the embedding and encoder slots over the batch, its second reads ``Batch.pair`` (and hard
    negatives, ``Batch.negative``) through those same modules (shared) or its own
    (``streams[name]``, a :class:`~pentad.components.stream.Stream`). Each target reads the streams
    the plan gives it: a pair target a :class:`PooledPair` of two pooled streams, another the first
    stream's token states; the plan runs them (:mod:`pentad.components.stream`). ``encode`` still
    gives the first stream's token states.
    """

    def __init__(self, embedding: EmbeddingSlot, encoder: Encoder, targets: dict[str, Target],
                 target_embedding: EmbeddingSlot | None = None, decoder: nn.Module | None = None,
                 streams: dict[str, Stream] | None = None, stream_plan: StreamPlan | None = None):
        super().__init__()
        self.embedding = embedding
        self.encoder = encoder
        # Registered where a dual model's second stream was, so modules initialise in the same order.
        self.streams = nn.ModuleDict(streams) if streams else None
        self.stream_plan = stream_plan
        self.target_embedding = target_embedding
        self.decoder = decoder
        self.targets = nn.ModuleDict(targets)
        self.tied: list[tuple[str, str]] = []  # (head parameter, shared parameter) declared by the builder
        # forward computes, in the encoder's last layer, only the leading positions the heads read
        # (Target.positions_read: a ViT's CLS); True keeps every position, for callers that watch the
        # layers' states through hooks (distillation's LayerTap).
        self.all_positions = False
        self._aux_blocks: list[Block] | None = None  # found at the first forward

    def blocks(self) -> list[nn.Module]:
        """The repeated blocks of every stack (transformer layers, CNN blocks; encoder, decoder and
        second stream), in module order: the units that sharding strategies shard one by one and
        activation checkpointing recomputes. A block shared by several places is listed once."""
        found: list[nn.Module] = []
        seen: set[int] = set()
        for name, module in self.named_modules():
            if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] == "layers":
                for block in module:
                    if id(block) not in seen:
                        seen.add(id(block))
                        found.append(block)
        return found

    def encode(self, batch: Batch, cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        """Embedding and encoder. With ``cache`` (decoder-only generation) ``batch.tokens`` holds the
        new positions only and ``batch.padding_mask`` covers cached and new positions."""
        return run_stream(self.embedding, self.encoder, batch, cache)

    def _plan(self) -> StreamPlan:
        if self.stream_plan is None:
            raise ValueError("this model has one stream (its config has no model.streams section)")
        return self.stream_plan

    def stream_slots(self, stream: int | str) -> tuple[EmbeddingSlot, Encoder]:
        """(embedding slot, encoder) of a stream, by name or index (:meth:`StreamPlan.slots`)."""
        return self._plan().slots(self, stream)

    def stream_states(self, batch: Batch, names: set[str] | None = None
                      ) -> dict[str, tuple[Tensor, Tensor | None]]:
        """Token states of the streams ``names`` (default: those the targets read; :meth:`StreamPlan.states`)."""
        return self._plan().states(self, batch, names)

    def encode_pair(self, batch: Batch) -> PooledPair:
        """Both streams of a two-stream model, pooled: first [B,H0] from ``batch``, second [B,H1]
        from ``batch.pair`` (and its hard negatives from ``batch.negative``)."""
        return self._plan().pair(self, batch)

    def encode_stream(self, batch: Batch, stream: int | str) -> Tensor:
        """One stream (by name or index) over ``batch`` alone (its own input, not ``batch.pair``),
        pooled [B,H]: texts and images encoded separately, as retrieval and zero-shot need."""
        return self._plan().encode(self, batch, stream)

    def adapt_checkpoint(self, tensors: dict[str, Tensor]) -> list[str]:
        """Adapt ``tensors`` (a checkpoint about to be loaded) where a slot can (image position tables
        at another resolution: :meth:`EmbeddingSlot.adapt_checkpoint`); returns notes."""
        notes = self.embedding.adapt_checkpoint("embedding.", tensors)
        for name, own in (self.streams or {}).items():
            notes += own.embedding.adapt_checkpoint(f"streams.{name}.embedding.", tensors)
        return notes

    def decode(self, batch: Batch, memory: Tensor | None, memory_padding_mask: Tensor | None,
               cache: KVCache | None = None) -> Tensor:
        """Target embedding of ``batch.decoder_*`` and the decoder over ``memory`` [B,S,H]."""
        if self.decoder is None or self.target_embedding is None:
            raise ValueError("this model has no decoder")
        view = batch.decoder_view()
        embedded = self.target_embedding(view)
        return self.decoder(embedded.hidden, embedded.padding_mask, memory, memory_padding_mask,
                            view.positions, cache)

    def forward(self, batch: Batch) -> ModelOutput:
        """{target name: TargetOutput}, with the blocks' auxiliary losses and metrics of this forward."""
        if self.stream_plan is not None:
            return self._output(self.stream_plan.forward(self, batch))
        if self.decoder is not None:
            hidden, padding_mask = self.encode(batch)
            hidden = self.decode(batch, hidden, padding_mask)
        else:
            keep = None if self.all_positions else leading_positions(self.targets.values())
            hidden, padding_mask = run_stream(self.embedding, self.encoder, batch, output_positions=keep)
        return self._output({name: target(hidden, batch) for name, target in self.targets.items()})

    def _output(self, targets: dict[str, TargetOutput]) -> ModelOutput:
        if self._aux_blocks is None:
            self._aux_blocks = [m for m in self.modules() if isinstance(m, Block) and m.has_aux]
        if not self._aux_blocks:
            return ModelOutput(targets)
        losses: dict[str, Tensor] = {}
        metrics: dict[str, list[Tensor]] = {}
        for block in self._aux_blocks:
            block_losses, block_metrics = block.pop_aux()
            for name, value in block_losses.items():
                losses[name] = losses[name] + value if name in losses else value
            for name, value in block_metrics.items():
                metrics.setdefault(name, []).append(value)
        return ModelOutput(targets, losses, {k: torch.stack(v).mean() for k, v in metrics.items()})


def total_loss(outputs: dict[str, TargetOutput]) -> Tensor:
    """Sum of the targets' losses (several targets train jointly, e.g. BERT's mlm + sp), plus the
    auxiliary losses of a :class:`ModelOutput` (MoE load balancing, router z-loss)."""
    losses = [out.loss for out in outputs.values() if out.loss is not None]
    if not losses:
        raise ValueError("no target returned a loss: the batch has no labels")
    loss = torch.stack(losses).sum() if len(losses) > 1 else losses[0]
    return loss + aux_loss(outputs) if isinstance(outputs, ModelOutput) and outputs.aux_losses else loss


def aux_loss(outputs: dict[str, TargetOutput]) -> Tensor | float:
    """The sum of a model output's auxiliary losses (0.0 when it has none)."""
    values = list(outputs.aux_losses.values()) if isinstance(outputs, ModelOutput) else []
    if not values:
        return 0.0
    return torch.stack(values).sum() if len(values) > 1 else values[0]


def count_active_parameters(model: nn.Module) -> int:
    """Parameters one token passes through: the unique total less, in each mixture of experts, the
    experts a token does not use (N - k of N; expert choice: k is the mean experts per token).
    Equals ``count_parameters`` for a model without experts."""
    total = count_parameters(model)
    for module in model.modules():
        if isinstance(module, MoE):
            per_expert = sum(p.numel() for p in module.experts.parameters()) // module.num_experts
            total -= per_expert * (module.num_experts - module.top_k)
    return total


def count_parameters(model: nn.Module) -> int:
    """Unique parameters: a tied weight counts once."""
    seen: dict[int, int] = {}
    for p in model.parameters():  # parameters() already yields each shared Parameter once
        seen[id(p)] = p.numel()
    return sum(seen.values())
