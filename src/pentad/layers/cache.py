"""Key/value caches for incremental decoding.

A cache holds, per layer, the keys and values of the positions already processed, so a decoding
step runs the layers on the new tokens only. Buffers grow by doubling (amortised O(1) appends,
no re-allocation every step); a static cache (:class:`StaticKVCache`) allocates buffers of the
final length once and writes them in place at a position tensor, for compiled and CUDA-graph
decoding. Cross-attention keys/values of an encoder-decoder model are computed
once from the encoder output and kept beside them. Multi-head latent attention (DeepSeek-V2/V3)
caches one latent row per position instead of keys and values (:meth:`LayerCache.append_latent`).

A layer with a sliding window W (``Attention.window``) needs, for every later query, only the last
W - 1 positions: :class:`KVCache` gives it a :class:`RollingLayerCache`, which keeps those alone
(memory O(W) whatever the length generated), and the stack's mask for such layers starts at the first
key kept (``KVCache.rolls``). A static cache keeps every position and its mask hides the keys
outside the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """One layer's cache: self-attention k/v [B, kv_heads, T, D] and optional cross-attention k/v, or
    (latent attention) one latent row per position [B, 1, T, D] in place of keys and values."""

    keys: Tensor | None = None
    values: Tensor | None = None
    length: int = 0
    cross_keys: Tensor | None = None
    cross_values: Tensor | None = None
    latent: Tensor | None = None

    def append_latent(self, x: Tensor) -> Tensor:
        """Store the new positions' latent rows x [B, 1, q, D] (multi-head latent attention: the
        compressed key/value and the rotary key, from which every head's keys and values follow);
        return all cached rows [B, 1, length, D]."""
        if self.keys is not None or self.values is not None:
            raise ValueError("this layer's cache holds keys and values: a latent-attention layer cannot share it")
        new = x.shape[2]
        if self.latent is None:
            self.latent = x.new_empty(x.shape[0], x.shape[1], max(16, new), x.shape[3])
        elif self.length + new > self.latent.shape[2]:
            self.latent = _grow(self.latent, max(2 * self.latent.shape[2], self.length + new), self.length)
        self.latent[:, :, self.length:self.length + new] = x
        self.length += new
        return self.latent[:, :, :self.length]

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

    def store_cross(self, k: Tensor, v: Tensor) -> None:
        """Keep the cross-attention keys/values [B, kv_heads, m, D] computed from the encoder memory
        on the first decoder step; later steps read them instead of projecting the memory again."""
        self.cross_keys, self.cross_values = k, v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search re-ranks hypotheses every step)."""
        for name in CACHED:
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index))


CACHED = ("keys", "values", "cross_keys", "cross_values", "latent")
"""The tensors a layer's cache may hold (each [B, heads, positions, D])."""


class RollingLayerCache(LayerCache):
    """One layer's cache for sliding-window attention of ``window`` W positions: after each append it
    keeps the keys/values of the last W - 1 positions alone (what a later query can still see: itself
    and the W - 1 before it). ``append`` returns the kept positions followed by the new ones, i.e. the
    positions max(0, length - W + 1) .. length + new - 1; ``length`` counts every position processed.

    The buffers hold up to 2 W positions (more while one append brings more): the kept columns are
    ``start`` .. ``end`` - 1 and new ones are written after them, so they move only when the buffer is
    full (about once every W steps: amortised O(1) per position)."""

    def __init__(self, window: int):
        super().__init__()
        if window < 1:
            raise ValueError(f"a sliding window holds at least 1 position, got {window}")
        self.window, self.start, self.end = window, 0, 0

    @property
    def kept(self) -> int:
        """Positions whose keys/values are held."""
        return self.end - self.start

    def append_values(self, v: Tensor) -> Tensor:
        raise ValueError("a rolling (sliding-window) cache cannot serve attention-weight reuse")

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        new = k.shape[2]
        keys, values = self.keys, self.values
        if keys is None or values is None or self.end + new > keys.shape[2]:
            keys, values = self._move(max(2 * self.window, self.kept + new), k, v)
        keys[:, :, self.end:self.end + new] = k
        values[:, :, self.end:self.end + new] = v
        first, self.end = self.start, self.end + new
        self.length += new
        out = keys[:, :, first:self.end], values[:, :, first:self.end]
        self.start = max(self.start, self.end - (self.window - 1))
        if keys.shape[2] > 2 * self.window:  # after a long prompt: back to the window's size
            self._move(2 * self.window, k, v)
        return out

    def _move(self, capacity: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """New buffers of ``capacity`` positions holding the kept ones first (the old buffers stay
        alive for as long as a returned view reads them); returns them."""
        keys = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
        values = v.new_empty(v.shape[0], v.shape[1], capacity, v.shape[3])
        kept = self.kept
        if kept and self.keys is not None and self.values is not None:
            keys[:, :, :kept] = self.keys[:, :, self.start:self.end]
            values[:, :, :kept] = self.values[:, :, self.start:self.end]
        self.keys, self.values, self.start, self.end = keys, values, 0, kept
        return keys, values


def _grow(buffer: Tensor, capacity: int, used: int) -> Tensor:
    bigger = buffer.new_empty(buffer.shape[0], buffer.shape[1], capacity, buffer.shape[3])
    bigger[:, :, :used] = buffer[:, :, :used]
    return bigger


@dataclass
class KVCache:
    """Caches of every layer of one stack (the decoder-only encoder, or a decoder)."""

    layers: list[LayerCache] = field(default_factory=list)
    # Declared kind: a static cache (StaticKVCache) has fixed-size buffers read whole by attention;
    # a rolling one keeps only the last window - 1 positions of a sliding-window layer.
    static: ClassVar[bool] = False
    rolls: ClassVar[bool] = True
    capacity: ClassVar[int | None] = None

    def layer(self, index: int, window: int | None = None) -> LayerCache:
        """Layer ``index``'s cache, made on first use: a :class:`RollingLayerCache` for a layer with a
        sliding ``window``, else one that keeps every position."""
        while len(self.layers) <= index:
            self.layers.append(LayerCache())
        if window is not None and not isinstance(self.layers[index], RollingLayerCache):
            if self.layers[index].length:
                raise ValueError(f"layer {index}'s cache holds every position; it cannot start rolling")
            self.layers[index] = RollingLayerCache(window)
        return self.layers[index]

    @property
    def length(self) -> int:
        """Positions already processed (0 before the first step)."""
        return self.layers[0].length if self.layers else 0

    @property
    def offset(self) -> int | Tensor:
        """Position of the first new query: an int here, the position tensor in a static cache."""
        return self.length

    def advance(self, count: int) -> None:
        """Called by the stack after a forward of ``count`` new positions (a dynamic cache counts
        them as it appends)."""

    def reorder(self, index: Tensor) -> None:
        for layer in self.layers:
            layer.reorder(index)

    def memory_bytes(self) -> int:
        total = 0
        for layer in self.layers:
            for t in (getattr(layer, name) for name in CACHED):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total


class StaticLayerCache(LayerCache):
    """One layer's static cache: k/v buffers [B, kv_heads, capacity, D] allocated once, on the first
    write, and written in place at the stack's position tensor (``index_copy_``), so a compiled or
    CUDA-graph-captured step sees fixed addresses and no changing Python int. Attention reads the
    whole buffer; the stack's mask hides the positions not yet written."""

    def __init__(self, capacity: int, position: Tensor):
        super().__init__()
        self.capacity, self.position = capacity, position

    def append_values(self, v: Tensor) -> Tensor:
        raise ValueError("a static key/value cache cannot serve attention-weight reuse (a layer that caches "
                         "values alone); generate with cache='dynamic'")

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' k/v [B, h, q, D] at ``position``..``position + q - 1``; return the
        whole buffers [B, h, capacity, D]."""
        if self.keys is None:
            self.keys = k.new_zeros(k.shape[0], k.shape[1], self.capacity, k.shape[3])
            self.values = v.new_zeros(v.shape[0], v.shape[1], self.capacity, v.shape[3])
            mark_static_address(self.keys)
            mark_static_address(self.values)
        index = self.position + torch.arange(k.shape[2], device=k.device)
        self.keys.index_copy_(2, index, k)
        self.values.index_copy_(2, index, v)
        return self.keys, self.values

    def append_latent(self, x: Tensor) -> Tensor:
        """Write the new positions' latent rows x [B, 1, q, D] at ``position``..; return the whole buffer
        [B, 1, capacity, D]."""
        if self.latent is None:
            self.latent = x.new_zeros(x.shape[0], x.shape[1], self.capacity, x.shape[3])
            mark_static_address(self.latent)
        self.latent.index_copy_(2, self.position + torch.arange(x.shape[2], device=x.device), x)
        return self.latent

    def store_cross(self, k: Tensor, v: Tensor) -> None:
        """Keep the cross-attention keys/values, marked as static addresses: every later (compiled)
        step reads these very tensors, so CUDA graphs need not copy them into the graph on each replay."""
        mark_static_address(k)
        mark_static_address(v)
        super().store_cross(k, v)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index``. The same number of rows (beam search re-ranking) is copied in
        place: the buffers keep their addresses (a compiled or captured step reads them). Another
        number (``expand``: copies of each prompt, before the first step) allocates new buffers."""
        for name in CACHED:
            value = getattr(self, name)
            if value is None:
                continue
            if value.shape[0] == index.shape[0]:
                value.copy_(value.index_select(0, index))
            else:
                value = value.index_select(0, index)
                mark_static_address(value)
                setattr(self, name, value)


def mark_static_address(tensor: Tensor) -> None:
    """Tell torch.compile the tensor's address never changes: CUDA graphs then read it (or capture
    writes to it) in place instead of copying it into the graph's own input buffer on every replay.
    (``mark_static_address`` records this as a ``_dynamo_static_input_type`` attribute on the tensor.)"""
    torch._dynamo.mark_static_address(tensor)


class StaticKVCache(KVCache):
    """Caches of every layer with buffers of a fixed ``capacity`` (prompt + new tokens) and one
    position tensor (0-dim long, the next position to write) shared by the layers. The stack runs
    attention over all ``capacity`` keys with a mask from ``position`` (:attr:`offset`) and advances
    it in place after each forward (:meth:`advance`). ``length`` reads the tensor (a host sync):
    for bookkeeping outside a decoding step only."""

    static = True
    rolls = False

    def __init__(self, capacity: int, device: torch.device | str | None = None):
        super().__init__()
        if capacity < 1:
            raise ValueError(f"a static cache needs a capacity of at least 1 position, got {capacity}")
        self.capacity = capacity
        self.position = torch.zeros((), dtype=torch.long, device=device)
        mark_static_address(self.position)

    def layer(self, index: int, window: int | None = None) -> LayerCache:
        """Layer ``index``'s cache; a sliding-window layer's too keeps every position (the mask hides
        those outside the window), so that all layers write at the one position tensor."""
        while len(self.layers) <= index:
            self.layers.append(StaticLayerCache(self.capacity, self.position))
        return self.layers[index]

    @property
    def length(self) -> int:
        return int(self.position)

    @property
    def offset(self) -> Tensor:
        return self.position

    def advance(self, count: int) -> None:
        self.position.add_(count)
