"""The registry of the Hugging Face model families pentad converts, read from their declarations.

Every module of this package that defines ``FAMILY`` (an :class:`~pentad.interop.hf.HFFamily`) is a
family; adding one is adding its module, nothing else. Detection and dispatch ask the declarations:
:func:`family_for` (``model_type`` of config.json, or ``--family``), :func:`guess_layout` (the
family whose :class:`~pentad.interop.hf.KeyLayout` a checkpoint's tensor names have) and
:func:`guess_family` (the family whose :meth:`~pentad.interop.hf.HFFamily.describes` accepts a
pentad model; a family that narrows another, as Qwen2 narrows LLaMA, wins over it). Kept apart
from the package's shared helpers (``pentad.interop.hf``), which every family module imports, so
that no family module is imported by a module it imports.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Any

from pentad.errors import UserError, closest
from pentad.interop import hf
from pentad.interop.hf import HFFamily


@cache
def registered() -> dict[str, HFFamily]:
    """Module name -> the family it declares, for every family module of the package (sorted by name)."""
    found: dict[str, HFFamily] = {}
    for info in sorted(pkgutil.iter_modules(hf.__path__), key=lambda m: m.name):
        if info.name == __name__.rsplit(".", 1)[-1]:
            continue
        module = importlib.import_module(f"{hf.__name__}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if isinstance(family, HFFamily):
            found[info.name] = family
    return found


def families() -> dict[str, HFFamily]:
    """model_type -> family (``xlm-roberta`` is the RoBERTa family)."""
    return {model_type: family for family in registered().values() for model_type in family.model_types}


def family_names() -> list[str]:
    """Every ``model_type`` pentad converts, sorted (the values ``--family`` takes)."""
    return sorted(families())


def family_for(model_type: str | None, requested: str | None, label: str) -> HFFamily:
    """The family of a checkpoint whose ``config.json`` says ``model_type`` (``--family`` = requested)."""
    table = families()
    for name in (requested, model_type):
        if name is not None and name not in table:
            hint = closest(name, table)
            what = "--family" if name == requested else f"{label}: model_type"
            raise UserError(f"{what} '{name}' is not a model family pentad converts; supported: "
                            f"{', '.join(sorted(table))}" + (f" (did you mean '{hint}'?)" if hint else "") + ".")
    if requested is not None and model_type is not None and table[requested] is not table[model_type]:
        raise UserError(f"{label} holds a '{model_type}' model, not '{requested}': drop --family or pass "
                        f"--family {model_type}.")
    name = model_type or requested
    if name is None:
        raise UserError(f"{label} has no 'model_type' key; pass --family ({', '.join(sorted(table))}).")
    return table[name]


def guess_layout(keys: set[str] | dict[str, Any]) -> str | None:
    """The family whose key layout a set of tensor names has, for error messages (None: unknown; a
    bare BERT or RoBERTa encoder, ``embeddings....``, could be either)."""
    marked = sorted((f for f in registered().values() if f.layout is not None), key=lambda f: (f.layout.rank, f.name))
    for family in marked:
        if family.layout is not None and family.layout.matches(keys):
            return family.name
    return None


def describing(model_cfg: Any) -> list[str]:
    """The families whose :meth:`~pentad.interop.hf.HFFamily.describes` accepts a pentad model, less
    those that another accepting family narrows (``HFFamily.narrows``: Qwen2 is LLaMA with biased
    query/key/value projections, so a model both describe is Qwen2's), sorted."""
    found = {f.name: f for f in registered().values() if f.describes(model_cfg)}
    narrowed = {name for family in found.values() for name in family.narrows}
    return sorted(set(found) - narrowed)


def guess_family(model_cfg: Any) -> str:
    """The HF family a pentad model belongs to (``--family`` overrides it): the one family left by
    :func:`describing`."""
    found = describing(model_cfg)
    if len(found) != 1:  # the families' declarations overlap or leave a gap: a bug, not a user error
        raise RuntimeError(f"{len(found)} Hugging Face families describe this model ({', '.join(found) or 'none'}); "
                           "exactly one must")
    return found[0]
