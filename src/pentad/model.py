"""The five-slot composite: embedding -> encoder -> (target embedding -> decoder) -> targets."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pentad.components.base import Batch, Embedded, EmbeddingPart, Encoder, Target, TargetOutput


class EmbeddingSlot(nn.Module):
    """Sums its parts ([B,S,H] each), then LayerNorm (optional) and dropout.

    Parts are registered under their names, so parameters read ``embedding.word.weight``.
    The padding mask passes through from the Batch.
    """

    def __init__(self, parts: dict[str, EmbeddingPart], hidden_size: int, norm: bool = True,
                 layer_norm_eps: float = 1e-12, dropout: float = 0.1):
        super().__init__()
        self.part_names = list(parts)
        for name, part in parts.items():
            self.add_module(name, part)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps) if norm else None
        self.dropout = nn.Dropout(dropout)

    def parts(self) -> list[EmbeddingPart]:
        return [getattr(self, name) for name in self.part_names]

    def word_embedding_weight(self) -> nn.Parameter | None:
        """The token table output heads tie to, if this slot has a ``word`` part."""
        word = getattr(self, "word", None)
        return getattr(word, "weight", None)

    def forward(self, batch: Batch) -> Embedded:
        parts = self.parts()
        hidden = parts[0](batch)
        for part in parts[1:]:
            hidden = hidden + part(batch)
        if self.norm is not None:
            hidden = self.norm(hidden)
        return Embedded(self.dropout(hidden), batch.padding_mask)


class Model(nn.Module):
    """A model assembled by ``pentad.builder.build_model``.

    ``forward(batch) -> {target name: TargetOutput}``; ``encode(batch) -> (hidden [B,S,H], padding_mask)``.
    """

    def __init__(self, embedding: EmbeddingSlot, encoder: Encoder, targets: dict[str, Target],
                 target_embedding: EmbeddingSlot | None = None, decoder: nn.Module | None = None):
        super().__init__()
        self.embedding = embedding
        self.encoder = encoder
        self.target_embedding = target_embedding
        self.decoder = decoder
        self.targets = nn.ModuleDict(targets)
        self.tied: list[tuple[str, str]] = []  # (head parameter, shared parameter) declared by the builder

    def encode(self, batch: Batch) -> tuple[Tensor, Tensor | None]:
        embedded = self.embedding(batch)
        prefix_lengths = None
        if getattr(self.encoder, "mask_kind", None) == "prefix":
            in_prefix = batch.segments == 0
            if embedded.padding_mask is not None:
                in_prefix = in_prefix & ~embedded.padding_mask
            prefix_lengths = in_prefix.sum(dim=1)
        hidden = self.encoder(embedded.hidden, embedded.padding_mask, prefix_lengths)
        return hidden, embedded.padding_mask

    def forward(self, batch: Batch) -> dict[str, TargetOutput]:
        hidden, _ = self.encode(batch)
        return {name: target(hidden, batch) for name, target in self.targets.items()}


def total_loss(outputs: dict[str, TargetOutput]) -> Tensor:
    """Sum of the targets' losses (several targets train jointly, e.g. BERT's mlm + sp)."""
    losses = [out.loss for out in outputs.values() if out.loss is not None]
    if not losses:
        raise ValueError("no target returned a loss: the batch has no labels")
    return torch.stack(losses).sum() if len(losses) > 1 else losses[0]


def count_parameters(model: nn.Module) -> int:
    """Unique parameters: a tied weight counts once."""
    seen: dict[int, int] = {}
    for p in model.parameters():  # parameters() already yields each shared Parameter once
        seen[id(p)] = p.numel()
    return sum(seen.values())
