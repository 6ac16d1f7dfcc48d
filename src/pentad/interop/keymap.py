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
                                            [3H, H] (bias [3H]); the inverse splits it in three
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


class FuseQKV(Transform):
    """query, key, value [H, H] (bias [H]) <-> qkv [3H, H] (bias [3H]), rows in that order."""

    n_theirs = 3

    def to_ours(self, theirs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        shapes = {tuple(t.shape) for t in theirs}
        if len(shapes) != 1:
            raise ValueError(f"query/key/value shapes differ: {[tuple(t.shape) for t in theirs]}")
        return [torch.cat(theirs, dim=0)], None

    def to_theirs(self, ours: list[Tensor], extra: Tensor | None) -> list[Tensor]:
        fused = ours[0]
        if fused.shape[0] % 3:
            raise ValueError(f"fused qkv has {fused.shape[0]} rows, not a multiple of 3")
        return [part.clone() for part in fused.chunk(3, dim=0)]


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


def get_transform(name: str) -> Transform:
    """The transform a rule names (``leading_rows:N`` carries its parameter after the colon)."""
    base, _, param = name.partition(":")
    if base == "leading_rows":
        if not param.isdigit():
            raise ValueError(f"transform {name!r}: leading_rows needs a row count, e.g. leading_rows:2")
        return LeadingRows(int(param))
    table: dict[str, Transform] = {"copy": Copy(), "tied": Tied(), "shadow": Shadow(), "ignore": Ignore(),
                                   "fuse_qkv": FuseQKV(),
                                   "conv1d": Conv1D(), "seg_pad_row": LeadingRows(1)}
    if base not in table or param:
        raise ValueError(f"unknown key-map transform {name!r}; known: {', '.join(table)}, leading_rows:N")
    return table[base]


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
            extras[rule.ours[0]] = extra
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
            produced = transform.to_theirs([ours[k] for k in rule.ours], extras.get(rule.ours[0]))
        except ValueError as e:
            problems.append(f"{' + '.join(rule.ours)}: {e}")
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
