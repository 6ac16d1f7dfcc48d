"""Key maps between pentad state dicts and foreign ones, written as data.

A key map is a list of rules ``(pentad templates, foreign templates[, transform])``. Templates hold
placeholders that a family fills in when it builds the map for one model: ``{layer}`` runs over the
encoder layers, ``{wb}`` over ``weight`` and ``bias``, and scalar ones such as ``{prefix}`` (the
foreign base-model prefix, e.g. ``bert.``) or ``{mlm}`` (the pentad target's name) are substituted.
The transform field may hold placeholders too (``leading_rows:{offset}``).

A foreign template ending in ``?`` is *optional*: an import consumes it when it is present (a
buffer or a tied duplicate that some checkpoints carry) and an export never writes it.

Most rules copy one tensor. The few that need code are named transforms:

===================  =====================  ============================================================
name                 pentad : foreign       what it does (import direction; the export does the inverse)
===================  =====================  ============================================================
``copy``             1 : 1                  the same tensor
``fuse_qkv``         1 : 3                  concatenate query, key, value rows into pentad's ``qkv``
                                            [3H, H] (bias [3H]); the inverse splits it in three.
                                            ``fuse_qkv:A:K`` with A query heads and K key/value heads
                                            (grouped-query attention: k and v have K/A of q's rows);
                                            ``fuse_qkv:A:K:meta`` also moves q and k from Meta's
                                            interleaved rotary layout to pentad's rotate-half one
``fuse_kv``          1 : 2                  key and value rows into a cross-attention's ``kv``
``heads_qkv:A``      1 : 1                  a fused projection whose rows are grouped per head
                                            ([q_h; k_h; v_h] for each of the A heads: BLOOM) <->
                                            pentad's [q; k; v]
``head_parts:A:S:T``  1 : 1                  a projection whose rows are grouped per head, [S rows; T rows]
                                            for each of the A heads (DeepSeek's ``kv_b_proj``: keys, then
                                            values) <-> pentad's [all heads' S rows; all heads' T rows]
``rope_rows:A:P:R``  1 : 1                  a projection of A heads of P + R rows each whose last R rows per
                                            head are rotary dimensions in interleaved pairs (2i, 2i+1)
                                            (DeepSeek's ``rope_interleave``) <-> the rotate-half layout
                                            (i, i + R/2) pentad rotates; the P rows stay
``stack_experts``    1 : N                  N per-expert matrices (``experts.E.w1.weight``, each [F, H]) <->
                                            pentad's stacked expert tensor [N, F, H]; the export unstacks
``row_vector``       1 : 1                  a [1, N] table (BART's ``final_logits_bias``) <-> [N]
``leading_ones:N``   1 : 1                  a tensor with N leading size-1 dimensions (ViT's ``cls_token``
                                            [1, 1, H], ``position_embeddings`` [1, P, H]) <-> without them
``rotate_rows:N``    1 : 1                  a table whose first N rows pentad keeps last (the padding
                                            row of TencentPretrain's segment table, when pentad keeps all
                                            three rows: pentad segment ids 0/1 then read its rows 1/2)
``sinusoidal:P:D``   0 : 1                  a fixed sinusoidal table [P, D] that the foreign model stores
                                            as a parameter (Pegasus) and pentad computes: checked on
                                            import, kept as an extra, recomputed on export without one
``sinusoidal:P:D:t2t`` 0 : 1                the same with tensor2tensor's spacing (10000^(i/(D/2 - 1)):
                                            Whisper's encoder positions)
``qkv_bias_no_k``    1 : 2                  query and value biases (Whisper has no key bias) <-> pentad's
                                            ``qkv`` bias [3H], whose key third is zero on import; the
                                            export drops it: a key bias adds the same amount to every
                                            score of a query, which the softmax ignores, so dropping it
                                            is exact
``kv_bias_no_k``     1 : 1                  the value bias <-> a cross-attention's ``kv`` bias [2H] (key
                                            half zero on import, dropped on export, as above)
``conv1d``           1 : 1                  transpose: GPT-2's ``Conv1D`` stores [in, out], ``nn.Linear``
                                            [out, in]
``leading_rows:N``   1 : 1                  drop the first N rows of a table (TencentPretrain's padding
                                            segment row, RoBERTa's two unused position rows); they are
                                            kept as an *extra* tensor so the export can restore them
                                            (zeros when there is none)
``seg_pad_row``      1 : 1                  ``leading_rows:1``, the name for TencentPretrain's 3-row
                                            segment table (pad, A, B) <-> pentad's 2 rows (A, B)
``tied``             1 : 1                  the foreign key is a second name of a tensor another rule
                                            maps (a tied output layer); an import checks the two are
                                            equal, an export writes the copy
``shadow``           1 : 1                  a foreign parameter its model never reads, beside the one it
                                            does (HF 5 keeps ``cls.predictions.bias`` apart from the
                                            decoder bias once embeddings are untied): kept as an extra
                                            when it differs, else re-created from the pentad tensor
``ignore``           0 : n                  foreign buffers that hold no learned data (``position_ids``,
                                            GPT-2's causal-mask ``attn.bias``); consumed, never written
===================  =====================  ============================================================

The export direction is *computed* from the same rules (:func:`to_foreign`); nothing is written
twice by hand. Both directions check that every source tensor is consumed and every target tensor
produced with the right shape, and report all problems at once in one :class:`UserError`.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pentad.errors import UserError

WB = ("weight", "bias")
"""Values of the ``{wb}`` placeholder: a Linear or LayerNorm has both."""

OPTIONAL = "?"


@dataclass(frozen=True)
class Rule:
    """One entry of a key map: pentad key(s) <-> foreign key(s) through a named transform."""

    ours: tuple[str, ...]
    theirs: tuple[str, ...]
    transform: str = "copy"


RuleSpec = tuple[Any, ...]
"""A rule as written in a family's table: ``(ours, theirs)`` or ``(ours, theirs, transform)``;
``ours`` and ``theirs`` are one template or a tuple of templates."""


def _as_tuple(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def expand(specs: Iterable[RuleSpec], **values: Any) -> list[Rule]:
    """Concrete rules from templates.

    ``values`` maps placeholder names to a string (substituted) or to a sequence / range (the rule
    is repeated for each element, e.g. ``layer=range(12)``, ``wb=WB``). A placeholder a template
    uses but ``values`` lacks is a programming error (KeyError).
    """
    rules: list[Rule] = []
    for spec in specs:
        ours, theirs = _as_tuple(spec[0]), _as_tuple(spec[1])
        transform = spec[2] if len(spec) > 2 else "copy"
        used = set().union(*(_fields(t) for t in (*ours, *theirs, transform)))
        missing = used - set(values)
        if missing:
            raise KeyError(f"key-map template needs placeholder(s) {sorted(missing)}: {spec}")
        loops = sorted(n for n in used if not isinstance(values[n], (str, int)))
        fixed = {n: values[n] for n in used if n not in loops}
        for combo in itertools.product(*(values[n] for n in loops)):
            names = {**fixed, **dict(zip(loops, combo))}
            rules.append(Rule(tuple(t.format(**names) for t in ours), tuple(t.format(**names) for t in theirs),
                              transform.format(**names)))
    return rules


# ------------------------------------------------------------------------------------ transforms
class Transform:
    """Converts the tensors of one rule. ``n_ours`` / ``n_theirs``: arity (None = any)."""

    n_ours: int | None = 1
    n_theirs: int | None = 1

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        """(pentad tensors, extra tensor kept for the way back or None). ValueError on bad shapes."""
        return [theirs[0]], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        return [ours[0]]


class Copy(Transform):
    pass


class Tied(Transform):
    """Handled by the mapper: the foreign tensor is a duplicate of another rule's tensor."""

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        return [ours[0].clone()]  # a copy: safetensors refuses two names for one storage


class Shadow(Transform):
    """Handled by the mapper on import; on export the kept extra, else a copy of the tensor."""

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        if extra is not None and tuple(extra.shape) == tuple(ours[0].shape):
            return [extra.to(ours[0].dtype)]
        return [ours[0].clone()]


class Ignore(Transform):
    n_ours = 0
    n_theirs = None

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        return [], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        return []


def _rotary_to_half(rows: Tensor, heads: int) -> Tensor:
    """Rows of a query/key projection from Meta's interleaved rotary layout (each head's dimension
    pairs (2i, 2i+1) rotate together) to the rotate-half layout (pairs (i, i + D/2)) pentad and
    Hugging Face use: within each head, even rows first, then odd rows. Weight [A*D, H] or bias [A*D]."""
    rest = tuple(rows.shape[1:])
    if rows.shape[0] % (2 * heads):
        raise ValueError(f"{rows.shape[0]} rows do not split into {heads} heads of an even size")
    size = rows.shape[0] // heads
    return rows.reshape(heads, size // 2, 2, *rest).transpose(1, 2).reshape(rows.shape).contiguous()


def _rotary_to_interleaved(rows: Tensor, heads: int) -> Tensor:
    """The inverse of :func:`_rotary_to_half`."""
    rest = tuple(rows.shape[1:])
    size = rows.shape[0] // heads
    return rows.reshape(heads, 2, size // 2, *rest).transpose(1, 2).reshape(rows.shape).contiguous()


class FuseQKV(Transform):
    """query, key, value (weight [rows, H], bias [rows]) <-> pentad's fused ``qkv``, rows [q; k; v].

    Without head counts the three parts have equal sizes. With ``heads`` / ``kv_heads``, k and v
    each have ``kv_heads / heads`` of q's rows (grouped-query attention). ``meta`` converts q and k
    between Meta's interleaved rotary layout (TencentPretrain's LLaMA) and pentad's rotate-half one.
    """

    n_theirs = 3

    def __init__(self, heads: int | None = None, kv_heads: int | None = None, meta: bool = False):
        self.heads, self.kv_heads, self.meta = heads, kv_heads, meta

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        q, k, v = theirs
        shapes = [tuple(t.shape) for t in theirs]
        if k.shape != v.shape or q.shape[1:] != k.shape[1:]:
            raise ValueError(f"query/key/value shapes do not fit together: {shapes}")
        if self.heads is None and q.shape != k.shape:
            raise ValueError(f"query/key/value shapes differ: {shapes}")
        if self.heads is not None and q.shape[0] * self.kv_heads != k.shape[0] * self.heads:
            raise ValueError(f"query/key/value shapes {shapes} do not fit {self.heads} query and "
                             f"{self.kv_heads} key/value heads")
        if self.meta:
            q, k = _rotary_to_half(q, self.heads or 1), _rotary_to_half(k, self.kv_heads or 1)
        return [torch.cat([q, k, v], dim=0)], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        fused = ours[0]
        heads, kv_heads = self.heads or 1, self.kv_heads or 1
        total = heads + 2 * kv_heads
        if fused.shape[0] % total:
            raise ValueError(f"fused qkv has {fused.shape[0]} rows, which do not split into {heads} query and "
                             f"2 x {kv_heads} key/value parts")
        unit = fused.shape[0] // total
        q, k, v = (part.clone() for part in fused.split((heads * unit, kv_heads * unit, kv_heads * unit), dim=0))
        if self.meta:
            q, k = _rotary_to_interleaved(q, heads), _rotary_to_interleaved(k, kv_heads)
        return [q, k, v]


class FuseKV(Transform):
    """key, value [rows, H] (bias [rows]) <-> a cross-attention's ``kv`` [2 rows, H], rows [k; v]."""

    n_theirs = 2

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        if theirs[0].shape != theirs[1].shape:
            raise ValueError(f"key/value shapes differ: {[tuple(t.shape) for t in theirs]}")
        return [torch.cat(theirs, dim=0)], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        if ours[0].shape[0] % 2:
            raise ValueError(f"fused kv has {ours[0].shape[0]} rows, not a multiple of 2")
        return [part.clone() for part in ours[0].chunk(2, dim=0)]


class StackExperts(Transform):
    """N per-expert tensors, each [rows, cols] <-> one stacked [N, rows, cols] (mixture of experts)."""

    n_theirs = None

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        if len({tuple(t.shape) for t in theirs}) != 1:
            raise ValueError(f"expert shapes differ: {sorted({tuple(t.shape) for t in theirs})}")
        return [torch.stack(theirs)], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        return [part.clone() for part in ours[0].unbind(0)]


class HeadsQKV(Transform):
    """One fused projection whose rows are grouped per head, [q_h; k_h; v_h] for h = 0..A-1
    (BLOOM's ``query_key_value``), <-> pentad's [q; k; v]."""

    def __init__(self, heads: int):
        self.heads = heads

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        t = theirs[0]
        if t.shape[0] % (3 * self.heads):
            raise ValueError(f"{t.shape[0]} rows do not split into {self.heads} heads of query, key and value")
        rest = tuple(t.shape[1:])
        return [t.reshape(self.heads, 3, -1, *rest).transpose(0, 1).reshape(t.shape).contiguous()], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        t = ours[0]
        if t.shape[0] % (3 * self.heads):
            raise ValueError(f"{t.shape[0]} rows do not split into {self.heads} heads of query, key and value")
        rest = tuple(t.shape[1:])
        return [t.reshape(3, self.heads, -1, *rest).transpose(0, 1).reshape(t.shape).contiguous()]


class HeadParts(Transform):
    """A projection whose rows are grouped per head, [S rows; T rows] for each of ``heads`` heads, <->
    [every head's S rows; every head's T rows] (weight [rows, in] or bias [rows])."""

    def __init__(self, heads: int, first: int, second: int):
        self.heads, self.first, self.second = heads, first, second

    def _check(self, t: Tensor) -> None:
        if t.shape[0] != self.heads * (self.first + self.second):
            raise ValueError(f"{t.shape[0]} rows are not {self.heads} heads of {self.first} + {self.second}")

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        t = theirs[0]
        self._check(t)
        parts = t.reshape(self.heads, self.first + self.second, *t.shape[1:]).split((self.first, self.second), 1)
        return [torch.cat([p.reshape(-1, *t.shape[1:]) for p in parts]).contiguous()], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        t = ours[0]
        self._check(t)
        first, second = t.split((self.heads * self.first, self.heads * self.second))
        rest = tuple(t.shape[1:])
        grouped = torch.cat([first.reshape(self.heads, self.first, *rest),
                             second.reshape(self.heads, self.second, *rest)], dim=1)
        return [grouped.reshape(t.shape).contiguous()]


class RopeRows(Transform):
    """``heads`` heads of ``passed`` + ``rotary`` rows each, the rotary rows of each head moved between the
    interleaved-pair layout (foreign) and rotate-half (pentad); the passed rows unchanged."""

    def __init__(self, heads: int, passed: int, rotary: int):
        self.heads, self.passed, self.rotary = heads, passed, rotary

    def _move(self, t: Tensor, convert: Any) -> Tensor:
        if t.shape[0] != self.heads * (self.passed + self.rotary) or self.rotary % 2:
            raise ValueError(f"{t.shape[0]} rows are not {self.heads} heads of {self.passed} + {self.rotary} "
                             "(an even number of rotary rows)")
        rest = tuple(t.shape[1:])
        heads = t.reshape(self.heads, self.passed + self.rotary, *rest)
        passed, rotary = heads.split((self.passed, self.rotary), dim=1)
        rotary = convert(rotary.reshape(self.heads * self.rotary, *rest), self.heads)
        return torch.cat([passed, rotary.reshape(self.heads, self.rotary, *rest)], dim=1).reshape(t.shape).contiguous()

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        return [self._move(theirs[0], _rotary_to_half)], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        return [self._move(ours[0], _rotary_to_interleaved)]


class RowVector(Transform):
    """A foreign [1, N] tensor (BART's ``final_logits_bias`` buffer) <-> pentad's [N]."""

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        if theirs[0].dim() != 2 or theirs[0].shape[0] != 1:
            raise ValueError(f"expected a [1, N] tensor, found shape {tuple(theirs[0].shape)}")
        return [theirs[0][0].clone()], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        return [ours[0].unsqueeze(0).clone()]


class LeadingOnes(Transform):
    """A foreign tensor with ``n`` leading size-1 dimensions <-> pentad's tensor without them."""

    def __init__(self, n: int):
        self.n = n

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        t = theirs[0]
        if t.dim() <= self.n or any(size != 1 for size in t.shape[:self.n]):
            raise ValueError(f"expected {self.n} leading dimension(s) of size 1, found shape {tuple(t.shape)}")
        return [t.reshape(t.shape[self.n:]).clone()], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        return [ours[0].reshape((1,) * self.n + tuple(ours[0].shape)).clone()]


class RotateRows(Transform):
    """pentad's row i is the foreign row (i + n) mod rows: the first n foreign rows go last."""

    def __init__(self, n: int):
        self.n = n

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        if theirs[0].dim() != 2 or theirs[0].shape[0] <= self.n:
            raise ValueError(f"expected a table with more than {self.n} rows, found shape {tuple(theirs[0].shape)}")
        return [torch.roll(theirs[0], -self.n, dims=0)], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        return [torch.roll(ours[0], self.n, dims=0)]


class Sinusoidal(Transform):
    """A fixed sinusoidal position table [P, D] (sines in the first half of the dimensions, cosines
    in the second: Pegasus, Marian) that the foreign model stores and pentad computes.

    Import: the stored table must equal the computed one (else the two models would differ); it is
    kept as an extra so the way back is bit for bit. Export: the extra, else the computed table.
    """

    n_ours = 0

    def __init__(self, positions: int, dim: int, spacing: str = "vaswani"):
        self.positions, self.dim, self.spacing = positions, dim, spacing

    def table(self) -> Tensor:
        from pentad.components.embeddings.sinusoidal import sinusoidal_table

        return sinusoidal_table(self.positions, self.dim, interleave=False, spacing=self.spacing)

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        stored = theirs[0]
        if tuple(stored.shape) != (self.positions, self.dim):
            raise ValueError(f"expected a sinusoidal table of shape {(self.positions, self.dim)}, found "
                             f"{tuple(stored.shape)}")
        worst = float((stored.double() - self.table().double()).abs().max()) if stored.numel() else 0.0
        if worst > 1e-5:
            raise ValueError(f"differs from the sinusoidal table pentad computes by up to {worst:.2e} (a "
                             "trained or differently laid-out position table, which pentad cannot hold)")
        return [], stored.clone()

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        if extra is not None and tuple(extra.shape) == (self.positions, self.dim):
            return [extra]
        return [self.table()]


class KeyBiasFree(Transform):
    """A fused projection's bias whose key part the foreign model does not have (Whisper's ``k_proj``
    has no bias): ``parts`` 3 (q, k, v: the foreign q and v biases) or 2 (k, v: the foreign v bias).
    The key part is zero on import and dropped on export (it shifts all of a query's scores alike)."""

    def __init__(self, parts: int):
        self.parts = parts
        self.n_theirs = parts - 1

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        if any(t.dim() != 1 or t.shape != theirs[0].shape for t in theirs):
            raise ValueError(f"expected {len(theirs)} bias vectors of one size, found shapes "
                             f"{[tuple(t.shape) for t in theirs]}")
        zero = torch.zeros_like(theirs[0])
        ordered = [theirs[0], zero, theirs[1]] if self.parts == 3 else [zero, theirs[0]]
        return [torch.cat(ordered)], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        chunks = [c.clone() for c in ours[0].chunk(self.parts)]
        return [chunks[0], chunks[2]] if self.parts == 3 else [chunks[1]]


class Conv1D(Transform):
    """GPT-2's ``Conv1D`` weight [in, out] <-> ``nn.Linear`` weight [out, in]."""

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        if theirs[0].dim() != 2:
            raise ValueError(f"expected a 2-D Conv1D weight, found shape {tuple(theirs[0].shape)}")
        return [theirs[0].t().contiguous()], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        return [ours[0].t().contiguous()]


class LeadingRows(Transform):
    """A foreign table with ``n`` extra leading rows; pentad's table starts at row ``n``."""

    def __init__(self, n: int):
        self.n = n

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        table = theirs[0]
        if table.dim() != 2 or table.shape[0] <= self.n:
            raise ValueError(f"expected a table with more than {self.n} rows, found shape {tuple(table.shape)}")
        return [table[self.n:].clone()], (table[: self.n].clone() if self.n else None)

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        table = ours[0]
        if not self.n:
            return [table]
        if extra is None or tuple(extra.shape) != (self.n, table.shape[1]):
            extra = torch.zeros(self.n, table.shape[1], dtype=table.dtype)
        return [torch.cat([extra.to(table.dtype), table], dim=0)]


class GatedConvPair(Transform):
    """TencentPretrain's gated CNN keeps a convolution and its gate as two ``Conv2d`` (and two extra
    ``[1, H, 1, 1]`` biases); pentad keeps them as one ``Conv1d`` with rows [values; gates].

    kind ``first``: weights [H, 1, k, E] (kernel k x E over the embedding) <-> [2H, E, k];
    ``conv``: weights [H, H, k, 1] <-> [2H, H, k]; ``bias``: [H] twice <-> [2H];
    ``extra``: [1, H, 1, 1] twice <-> [2H].
    """

    n_theirs = 2

    def __init__(self, kind: str):
        self.kind = kind

    def _one(self, t: Tensor) -> Tensor:
        if self.kind == "first":
            if t.dim() != 4 or t.shape[1] != 1:
                raise ValueError(f"expected a [H, 1, k, E] convolution, found shape {tuple(t.shape)}")
            return t[:, 0].transpose(1, 2)
        if self.kind == "conv":
            if t.dim() != 4 or t.shape[3] != 1:
                raise ValueError(f"expected a [H, H, k, 1] convolution, found shape {tuple(t.shape)}")
            return t[..., 0]
        if self.kind == "extra":
            if t.dim() != 4 or t.shape[0] != 1 or t.shape[2:] != (1, 1):
                raise ValueError(f"expected a [1, H, 1, 1] bias, found shape {tuple(t.shape)}")
            return t.reshape(-1)
        return t

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        value, gate = (self._one(t) for t in theirs)
        if value.shape != gate.shape:
            raise ValueError(f"convolution and gate shapes differ: {[tuple(t.shape) for t in theirs]}")
        return [torch.cat([value, gate], dim=0).contiguous()], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        out = []
        for part in ours[0].chunk(2, dim=0):
            if self.kind == "first":
                part = part.transpose(1, 2)[:, None]
            elif self.kind == "conv":
                part = part[..., None]
            elif self.kind == "extra":
                part = part.reshape(1, -1, 1, 1)
            out.append(part.contiguous().clone())
        return out


def get_transform(name: str) -> Transform:
    """The transform a rule names; parameters follow colons (``leading_rows:2``, ``fuse_qkv:32:8``)."""
    base, *params = name.split(":")
    if base in ("leading_rows", "rotate_rows", "heads_qkv", "sinusoidal", "leading_ones") or \
            (base == "fuse_qkv" and params):
        numbers = [p for p in params if p.isdigit()]
        flags = [p for p in params if not p.isdigit()]
        wanted = {"leading_rows": 1, "rotate_rows": 1, "heads_qkv": 1, "sinusoidal": 2, "fuse_qkv": 2,
                  "leading_ones": 1}[base]
        flag = {"fuse_qkv": "meta", "sinusoidal": "t2t"}.get(base)
        if len(numbers) != wanted or (flags and flags != [flag]):
            raise ValueError(f"transform {name!r}: {base} takes {wanted} count(s)"
                             + (f" and optionally ':{flag}'" if flag else ""))
        n = [int(p) for p in numbers]
        if base == "leading_rows":
            return LeadingRows(n[0])
        if base == "rotate_rows":
            return RotateRows(n[0])
        if base == "leading_ones":
            return LeadingOnes(n[0])
        if base == "heads_qkv":
            return HeadsQKV(n[0])
        if base == "sinusoidal":
            return Sinusoidal(n[0], n[1], "tensor2tensor" if flags else "vaswani")
        return FuseQKV(n[0], n[1], meta=bool(flags))
    if base in ("head_parts", "rope_rows"):
        if len(params) != 3 or not all(p.isdigit() for p in params):
            raise ValueError(f"transform {name!r}: {base} takes 3 counts")
        a, b, c = (int(p) for p in params)
        return HeadParts(a, b, c) if base == "head_parts" else RopeRows(a, b, c)
    if base == "gated_conv" and params in (["first"], ["conv"], ["bias"], ["extra"]):
        return GatedConvPair(params[0])
    table: dict[str, Transform] = {"copy": Copy(), "tied": Tied(), "shadow": Shadow(), "ignore": Ignore(),
                                   "fuse_qkv": FuseQKV(), "fuse_kv": FuseKV(), "row_vector": RowVector(),
                                   "conv1d": Conv1D(), "seg_pad_row": LeadingRows(1), "stack_experts": StackExperts(),
                                   "qkv_bias_no_k": KeyBiasFree(3), "kv_bias_no_k": KeyBiasFree(2)}
    if base not in table or params:
        raise ValueError(f"unknown key-map transform {name!r}; known: {', '.join(table)}, leading_rows:N, "
                         "leading_ones:N, rotate_rows:N, heads_qkv:A, fuse_qkv:A:K[:meta], sinusoidal:P:D[:t2t], "
                         "head_parts:A:S:T, rope_rows:A:P:R, "
                         "gated_conv:first|conv|bias|extra")
    return table[base]


def extra_key(rule: Rule) -> str:
    """The key an extra tensor of ``rule`` is kept under: its first pentad key, or its first foreign
    key for a rule with no pentad tensor (a stored fixed table)."""
    return rule.ours[0] if rule.ours else rule.theirs[0].rstrip(OPTIONAL)


def check_rules(rules: Sequence[Rule]) -> None:
    """Programming checks: arities match the transforms, no pentad key produced twice."""
    produced: set[str] = set()
    for rule in rules:
        t = get_transform(rule.transform)
        if (t.n_ours is not None and len(rule.ours) != t.n_ours) or (
                t.n_theirs is not None and len(rule.theirs) != t.n_theirs):
            raise ValueError(f"rule {rule} does not fit transform {rule.transform!r}")
        if isinstance(t, Ignore) and not all(k.endswith(OPTIONAL) for k in rule.theirs):
            raise ValueError(f"rule {rule}: ignored keys must be optional (end in '?')")
        if isinstance(t, (Tied, Shadow, Ignore)):
            continue
        for key in rule.ours:
            if key in produced:
                raise ValueError(f"pentad key {key} is produced by two rules")
            produced.add(key)


# ---------------------------------------------------------------------------------------- mapping
def _shown(items: Sequence[str], limit: int = 6) -> str:
    text = ", ".join(items[:limit])
    return text + (f", ... and {len(items) - limit} more" if len(items) > limit else "")


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def to_pentad(foreign: Mapping[str, Tensor], rules: Sequence[Rule], expected: Mapping[str, Sequence[int]], *,
              source: str, layout: str, synthesize: Iterable[str] = ()) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Map a foreign state dict onto pentad keys.

    expected: pentad key -> shape of the model the config builds (tied aliases excluded).
    synthesize: pentad keys the foreign model has no tensor for (a head the foreign architecture
    lacks); they are filled with zeros and must be reported by the caller.
    Returns (pentad tensors, extras keyed by the rule's first pentad key). Raises one UserError
    listing missing, unused and mis-shaped tensors.
    """
    check_rules(rules)
    consumed: set[str] = set()
    out: dict[str, Tensor] = {}
    origin: dict[str, tuple[str, ...]] = {}
    extras: dict[str, Tensor] = {}
    missing: list[str] = []
    problems: list[str] = []
    required = 0
    ties: list[tuple[str, str, Tensor]] = []
    shadows: list[tuple[str, str, Tensor]] = []
    for rule in rules:
        transform = get_transform(rule.transform)
        keys = [(k[:-1], True) if k.endswith(OPTIONAL) else (k, False) for k in rule.theirs]
        required += sum(not opt for _, opt in keys)
        absent = [k for k, opt in keys if not opt and k not in foreign]
        if absent:
            missing += absent
            continue
        present = [(k, foreign[k]) for k, _ in keys if k in foreign]
        consumed.update(k for k, _ in present)
        if not present or isinstance(transform, Ignore):
            continue
        if isinstance(transform, (Tied, Shadow)):
            (ties if isinstance(transform, Tied) else shadows).append((rule.ours[0], present[0][0], present[0][1]))
            continue
        try:
            produced, extra = transform.to_ours([t for _, t in present])
        except ValueError as e:
            problems.append(f"{' + '.join(k for k, _ in present)}: {e}")
            continue
        for key, tensor in zip(rule.ours, produced):
            out[key] = tensor
            origin[key] = tuple(k for k, _ in present)
        if extra is not None:
            extras[extra_key(rule)] = extra
    for ours_key, theirs_key, tensor in ties:
        if ours_key in out and (_shape(out[ours_key]) != _shape(tensor) or not torch.equal(out[ours_key], tensor)):
            problems.append(f"{theirs_key} must be the same tensor as {' + '.join(origin[ours_key])} "
                            "(the config ties them) but it differs")
    for ours_key, _, tensor in shadows:
        if ours_key in out and (_shape(out[ours_key]) != _shape(tensor) or not torch.equal(out[ours_key], tensor)):
            if ours_key in extras:
                raise ValueError(f"two extras for {ours_key}")  # a key-map design error
            extras[ours_key] = tensor  # kept, so the way back writes it unchanged
    for key in synthesize:
        if key in expected and key not in out:
            dtype = next(iter(foreign.values())).dtype if foreign else torch.float32
            out[key] = torch.zeros(tuple(expected[key]), dtype=dtype)
            origin[key] = ("<zeros>",)
    unused = sorted(set(foreign) - consumed)
    for key, tensor in out.items():
        if key in expected and _shape(tensor) != tuple(expected[key]):
            shapes = ", ".join(f"{k} {_shape(foreign[k])}" if k in foreign else k for k in origin[key])
            problems.append(f"{shapes} -> pentad {key} needs {tuple(expected[key])}, got {_shape(tensor)}")
    not_produced = sorted(k for k in expected if k not in out)
    stray = sorted(k for k in out if k not in expected)
    sections: list[str] = []
    if missing:
        sections.append(f"{len(missing)} tensor(s) missing: {_shown(sorted(missing))}")
    if problems:
        sections.append(f"{len(problems)} tensor(s) of the wrong shape or value: {_shown(problems, 4)}")
    if unused:
        sections.append(f"{len(unused)} tensor(s) with no place in the pentad model: {_shown(unused)}")
    if not_produced and not missing:
        sections.append(f"pentad weights left without a source: {_shown(not_produced)}")
    if stray:
        sections.append(f"the key map produced weights the pentad model does not have: {_shown(stray)}")
    if sections:
        head = f"cannot convert {source} ({layout} layout) to pentad"
        if required and len(missing) > required // 2:
            head += (f": it does not look like a {layout} checkpoint ({len(missing)} of the {required} "
                     "tensors the layout needs are missing; is it another model family?)")
        raise UserError(head + ": " + "; ".join(sections) + ".")
    return out, extras


def to_foreign(ours: Mapping[str, Tensor], rules: Sequence[Rule], *, source: str, layout: str,
               extras: Mapping[str, Tensor] | None = None, omit: Iterable[str] = ()) -> dict[str, Tensor]:
    """The inverse of :func:`to_pentad`, computed from the same rules.

    omit: pentad keys to leave out (heads the foreign architecture does not have); a rule whose
    pentad keys are all omitted writes nothing. Every other pentad tensor must be used by a rule.
    """
    check_rules(rules)
    extras = extras or {}
    omitted = set(omit)
    used: set[str] = set()
    out: dict[str, Tensor] = {}
    missing: list[str] = []
    problems: list[str] = []
    for rule in rules:
        transform = get_transform(rule.transform)
        if isinstance(transform, Ignore):
            continue
        if rule.ours and all(k in omitted for k in rule.ours):
            used.update(rule.ours)
            continue
        absent = [k for k in rule.ours if k not in ours]
        if absent:
            missing += absent
            continue
        used.update(rule.ours)
        try:
            produced = transform.to_theirs([ours[k] for k in rule.ours], extras.get(extra_key(rule)))
        except ValueError as e:
            problems.append(f"{' + '.join(rule.ours) or ' + '.join(rule.theirs)}: {e}")
            continue
        for key, tensor in zip(rule.theirs, produced):
            if not key.endswith(OPTIONAL):
                out[key] = tensor
    unused = sorted(set(ours) - used - omitted)
    sections = []
    if missing:
        sections.append(f"{len(missing)} pentad weight(s) missing: {_shown(sorted(set(missing)))}")
    if problems:
        sections.append(f"{len(problems)} weight(s) of the wrong shape: {_shown(problems, 4)}")
    if unused:
        sections.append(f"{len(unused)} pentad weight(s) with no place in the {layout} layout: {_shown(unused)}")
    if sections:
        raise UserError(f"cannot convert {source} to the {layout} layout: " + "; ".join(sections) + ".")
    return out
