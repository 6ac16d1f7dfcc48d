"""Key/value caches for incremental decoding.

A cache holds, per layer, the keys and values of the positions already processed, so a decoding
step runs the layers on the new tokens only. Buffers grow by doubling (amortised O(1) appends,
no re-allocation every step). Cross-attention keys/values of an encoder-decoder model are computed
once from the encoder output and kept beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """One layer's cache: self-attention k/v [B, kv_heads, T, D] and optional cross-attention k/v."""

    keys: Tensor | None = None
    values: Tensor | None = None
    length: int = 0
    cross_keys: Tensor | None = None
    cross_values: Tensor | None = None

    def append_values(self, v: Tensor) -> Tensor:
        """Store the new positions' values alone (a layer that reuses the previous layer's attention
        probabilities has no keys); return all cached values [B, h, length, D]."""
        if self.keys is not None:
            raise ValueError("this layer's cache holds keys: it computed its own attention before, so it "
                             "cannot switch to reusing probabilities within one cache")
        new = v.shape[2]
        if self.values is None:
            self.values = v.new_empty(v.shape[0], v.shape[1], max(16, new), v.shape[3])
        elif self.length + new > self.values.shape[2]:
            self.values = _grow(self.values, max(2 * self.values.shape[2], self.length + new), self.length)
        self.values[:, :, self.length:self.length + new] = v
        self.length += new
        return self.values[:, :, :self.length]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new positions' k/v [B, h, q, D]; return all cached k/v [B, h, length, D]."""
        new = k.shape[2]
        if self.keys is None and self.values is not None:
            raise ValueError("this layer's cache holds values only: it reused the previous layer's attention "
                             "probabilities before, so it cannot switch to computing its own within one cache")
        if self.keys is None:
            capacity = max(16, new)
            self.keys = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
            self.values = v.new_empty(v.shape[0], v.shape[1], capacity, v.shape[3])
        elif self.length + new > self.keys.shape[2]:
            capacity = max(2 * self.keys.shape[2], self.length + new)
            self.keys = _grow(self.keys, capacity, self.length)
            self.values = _grow(self.values, capacity, self.length)
        self.keys[:, :, self.length:self.length + new] = k
        self.values[:, :, self.length:self.length + new] = v
        self.length += new
        return self.keys[:, :, :self.length], self.values[:, :, :self.length]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search re-ranks hypotheses every step)."""
        for name in ("keys", "values", "cross_keys", "cross_values"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index))


def _grow(buffer: Tensor, capacity: int, used: int) -> Tensor:
    bigger = buffer.new_empty(buffer.shape[0], buffer.shape[1], capacity, buffer.shape[3])
    bigger[:, :, :used] = buffer[:, :, :used]
    return bigger


@dataclass
class KVCache:
    """Caches of every layer of one stack (the decoder-only encoder, or a decoder)."""

    layers: list[LayerCache] = field(default_factory=list)

    def layer(self, index: int) -> LayerCache:
        while len(self.layers) <= index:
            self.layers.append(LayerCache())
        return self.layers[index]

    @property
    def length(self) -> int:
        """Positions already processed (0 before the first step)."""
        return self.layers[0].length if self.layers else 0

    def reorder(self, index: Tensor) -> None:
        for layer in self.layers:
            layer.reorder(index)

    def memory_bytes(self) -> int:
        total = 0
        for layer in self.layers:
            for t in (layer.keys, layer.values, layer.cross_keys, layer.cross_values):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total
