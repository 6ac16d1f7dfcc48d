"""Position information applied inside attention: rotary, T5 relative bias, ALiBi.

Learned and sinusoidal absolute positions are embedding parts (``components/embeddings``);
these three act on attention scores or on queries/keys. Each is a :class:`PositionScheme`, a small
module that the transformer stack receives built and asks once per forward for what every layer's
attention reads: an additive score bias, rotary tables, or both.
"""

from __future__ import annotations

import math
from typing import ClassVar, Protocol

import torch
from torch import Tensor, nn

from pentad.layers.block import Block, InitScheme


class PositionScheme(nn.Module):
    """A position signal inside attention. ``kind`` names it (``model.encoder.positions``);
    ``attribute`` is its module name in the stack (so ``relative_bias`` keeps T5's checkpoint key).

    Queries sit at positions ``offset`` .. ``offset + q_len - 1`` (``offset``: positions already in a
    key/value cache, an int or a 0-dim tensor for a static cache) and keys at 0 .. ``k_len - 1``.
    """

    kind: ClassVar[str]
    attribute: ClassVar[str]

    def bias(self, q_len: int, k_len: int, offset: int | Tensor, device: torch.device) -> Tensor | None:
        """An additive score bias [1, heads, q_len, k_len], or None."""
        return None

    def rotary(self, positions: Tensor | None, q_len: int, offset: int | Tensor, device: torch.device,
               dtype: torch.dtype, local: bool = False) -> tuple[Tensor, Tensor] | None:
        """(cos, sin) tables for the queries' positions (``positions`` [B|1, q_len] when given, e.g.
        left-padded generation), or None. ``local``: the tables of the sliding-window layers (a scheme
        may rotate them at a base of their own)."""
        return None

# ---- rotary (Su et al. 2021) -------------------------------------------------------------------


def rotary_cos_sin(positions: Tensor, dim: int, base: float = 10000.0,
                   dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos/sin tables for ``positions`` [B|1, S]: each [B|1, 1, S, dim] (broadcast over heads).

    Convention (Hugging Face / GPT-NeoX "rotate half"): dimension i is paired with i + dim/2, and
    the frequency of pair i is ``base^(-2i/dim)``. Meta's original LLaMA code (and TencentPretrain)
    pairs adjacent dimensions (2i, 2i+1) instead; the two are the same rotation after permuting the
    rows of the query and key projections, which is what weight conversion does.
    """
    inv_freq = base ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    return rotary_tables(positions, inv_freq, dtype=dtype)


def rotary_tables(positions: Tensor, inv_freq: Tensor, scale: float = 1.0,
                  dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos/sin tables [B|1, 1, S, 2 * len(inv_freq)] of ``positions`` [B|1, S] rotated at the
    frequencies ``inv_freq`` (one per dimension pair), both multiplied by ``scale`` when it is not 1."""
    angles = positions.float()[..., None] * inv_freq  # [B, S, dim/2]
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, S, dim]
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def rotary_inv_freq(dim: int, base: float | Tensor, device: torch.device | None = None) -> Tensor:
    """``1 / base^(2i/dim)`` for the pairs i of ``dim`` rotated dimensions (float32): the unscaled
    frequencies in the form the RoPE scaling kinds start from (``base`` a tensor for dynamic NTK)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` [B, heads, S, D]: ``x * cos + rotate_half(x) * sin`` on the first cos.shape[-1] dims."""
    rot = cos.shape[-1]
    x_rot, x_pass = (x, None) if rot == x.shape[-1] else (x[..., :rot], x[..., rot:])
    first, second = x_rot.chunk(2, dim=-1)
    rotated = x_rot * cos + torch.cat((-second, first), dim=-1) * sin
    return rotated if x_pass is None else torch.cat((rotated, x_pass), dim=-1)


class RotaryScaling(Protocol):
    """A RoPE scaling kind (``components/positions/rope_scaling.py``): the frequencies of ``dim``
    rotated dimensions at base ``base`` and the factor cos and sin are multiplied by.

    ``length_dependent`` kinds (dynamic NTK, LongRoPE) are given the sequence length seen, i.e. the
    last query position + 1 (cached positions included): an int or a 0-dim tensor, so that no value
    leaves the device; the others get None."""

    @property
    def length_dependent(self) -> bool: ...

    def frequencies(self, dim: int, base: float, length: int | Tensor | None,
                    device: torch.device) -> Tensor: ...

    def attention_scaling(self) -> float: ...


class Rotary(PositionScheme):
    """Rotary embeddings (RoPE): the first ``rotary_dim`` dimensions of each query and key head
    rotated by position (:func:`rotary_cos_sin`); no parameters. ``scaling`` (a :class:`RotaryScaling`)
    replaces the frequencies and scales the tables (linear, dynamic NTK, YaRN, Llama 3, LongRoPE);
    without it the tables are those of :func:`rotary_cos_sin`. ``local_base``: the sliding-window
    layers' tables are unscaled at this base instead (Gemma 3: 10,000 locally, 1,000,000 with
    scaling globally); None: the same tables in every layer."""

    kind = "rotary"
    attribute = "rotary"

    def __init__(self, rotary_dim: int, rotary_base: float = 10000.0, scaling: RotaryScaling | None = None,
                 local_base: float | None = None):
        super().__init__()
        self.rotary_dim, self.rotary_base, self.scaling = rotary_dim, rotary_base, scaling
        self.local_base = local_base

    def rotary(self, positions: Tensor | None, q_len: int, offset: int | Tensor, device: torch.device,
               dtype: torch.dtype, local: bool = False) -> tuple[Tensor, Tensor]:
        length: int | Tensor | None = None
        if local and self.local_base is not None:
            if positions is None:
                positions = (torch.arange(q_len, device=device) + offset)[None]
            return rotary_cos_sin(positions, self.rotary_dim, self.local_base, dtype=dtype)
        if positions is None:
            positions = (torch.arange(q_len, device=device) + offset)[None]
            if self.scaling is not None and self.scaling.length_dependent:
                length = offset + q_len
        elif self.scaling is not None and self.scaling.length_dependent:
            length = positions.max() + 1
        if self.scaling is None:
            return rotary_cos_sin(positions, self.rotary_dim, self.rotary_base, dtype=dtype)
        inv_freq = self.scaling.frequencies(self.rotary_dim, self.rotary_base, length, positions.device)
        return rotary_tables(positions, inv_freq, self.scaling.attention_scaling(), dtype=dtype)

    def extra_repr(self) -> str:
        scaling = "" if self.scaling is None else f", scaling={self.scaling!r}"
        local = "" if self.local_base is None else f", local_base={self.local_base:g}"
        return f"rotary_dim={self.rotary_dim}, rotary_base={self.rotary_base:g}{scaling}{local}"


# ---- T5 relative position bias (Raffel et al. 2020) -------------------------------------------


def relative_buckets(relative: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """Bucket index of each relative position (key - query).

    Half the buckets (all of them when causal) are exact for small distances; the rest grow
    logarithmically up to ``max_distance``, beyond which everything shares the last bucket.
    Bidirectional buckets give positive offsets (keys after the query) their own half.
    """
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    large = max_exact + (
        torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class RelativePositionBias(PositionScheme, Block):
    """Learned scalar bias per (bucket, head): ``weight`` [num_buckets, num_heads] (T5; ``bidirectional``
    in an encoder, one-directional in a causal stack).

    forward(q_len, k_len, offset) -> [1, heads, q_len, k_len]; query i sits at position offset + i
    (``offset`` = positions already in a key/value cache: an int, or a 0-dim tensor for a static
    cache) and key j at position j.
    """

    kind = "relative"
    attribute = "relative_bias"

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True):
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.weight = nn.Parameter(torch.empty(num_buckets, num_heads))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, q_len: int, k_len: int, offset: int | Tensor = 0) -> Tensor:
        device = self.weight.device
        query = (torch.arange(q_len, device=device) + offset)[:, None]
        key = torch.arange(k_len, device=device)[None, :]
        buckets = relative_buckets(key - query, self.bidirectional, self.num_buckets, self.max_distance)
        return nn.functional.embedding(buckets, self.weight).permute(2, 0, 1).unsqueeze(0)

    def bias(self, q_len: int, k_len: int, offset: int | Tensor, device: torch.device) -> Tensor:
        return self(q_len, k_len, offset)

    def reset_parameters(self, std: float = 0.02, scheme: InitScheme = "normal") -> None:
        """N(0, std); ``t5``: N(0, heads^-1/2)."""
        nn.init.normal_(self.weight, std=std if scheme == "normal" else self.weight.shape[1] ** -0.5)


# ---- ALiBi (Press et al. 2022) -------------------------------------------------------------------


def alibi_slopes(num_heads: int) -> Tensor:
    """Per-head slopes: the geometric sequence 2^(-8/n), 2^(-16/n), ... for the nearest power of two
    n <= heads, then every other slope of the sequence for 2n to fill the remaining heads (as in the
    paper's reference code and BLOOM)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-8.0 / closest)
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest < num_heads:
        extra_base = 2.0 ** (-4.0 / closest)
        slopes += [extra_base ** (i + 1) for i in range(0, 2 * (num_heads - closest), 2)]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(num_heads: int, q_len: int, k_len: int, offset: int | Tensor = 0, causal: bool = True,
               device: torch.device | None = None) -> Tensor:
    """[1, heads, q_len, k_len] additive bias ``-slope * distance(query, key)``.

    Causal: distance = query - key (keys after the query are masked anyway); bidirectional:
    |query - key|. Adding a per-query constant does not change a softmax, so this equals BLOOM's
    ``slope * key_position`` form.
    """
    query = (torch.arange(q_len, device=device) + offset)[:, None]
    key = torch.arange(k_len, device=device)[None, :]
    distance = (query - key).float()
    distance = distance.clamp(min=0) if causal else distance.abs()
    return -(alibi_slopes(num_heads).to(device)[:, None, None] * distance).unsqueeze(0)


class ALiBi(PositionScheme):
    """ALiBi: a per-head linear distance penalty on the scores (:func:`alibi_bias`); ``causal`` in a
    causal stack; no parameters."""

    kind = "alibi"
    attribute = "alibi"

    def __init__(self, num_heads: int, causal: bool = True):
        super().__init__()
        self.num_heads, self.causal = num_heads, causal

    def bias(self, q_len: int, k_len: int, offset: int | Tensor, device: torch.device) -> Tensor:
        return alibi_bias(self.num_heads, q_len, k_len, offset, causal=self.causal, device=device)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, causal={self.causal}"
