"""The Hugging Face model families pentad converts, by ``model_type``.

Kept apart from the package's shared helpers (``pentad.interop.hf``), which every family module
imports, so that no family module is imported by a module it imports.
"""

from __future__ import annotations

from pentad.errors import UserError, closest
from pentad.interop.hf import (
    HFFamily,
    albert,
    bart,
    bert,
    bloom,
    clip,
    gpt2,
    llama,
    mixtral,
    pegasus,
    qwen2_moe,
    roberta,
    speech2text,
    switch,
    t5,
    vilt,
    vit,
    whisper,
)


def families() -> dict[str, HFFamily]:
    """model_type -> family (``xlm-roberta`` is the RoBERTa family)."""
    table: dict[str, HFFamily] = {}
    for family in (bert.FAMILY, roberta.FAMILY, gpt2.FAMILY, albert.FAMILY, t5.FAMILY, bart.FAMILY, pegasus.FAMILY,
                   llama.FAMILY, mixtral.FAMILY, qwen2_moe.FAMILY, bloom.FAMILY, switch.FAMILY, vit.FAMILY,
                   clip.FAMILY, vilt.FAMILY, whisper.FAMILY, speech2text.FAMILY):
        for model_type in family.model_types:
            table[model_type] = family
    return table


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
