"""Fine-tuning defaults (``task.defaults``): the values ``pentad finetune`` gives the ``train`` and ``task``
keys that the config file and the overrides leave unset.

A fine-tune starts from trained weights with a fresh head and runs for a few hundred steps, so some of
pre-training's defaults do not suit it; and a TencentPretrain user reproducing a number needs the
settings of TencentPretrain's ``finetune/run_*.py`` scripts, which differ from pentad's in a handful of
places (bench/RESULTS.md, "Classification fine-tuning beside TencentPretrain"). Each set is a table of
key -> value; a key set anywhere, even to the shared value, is kept, and the run's ``config.yaml`` (and
``--print-config``) records the values that ran. Task keys apply to the tasks that declare them
(``truncation`` to classification; ``boundary_tokens``, ``pad_tag`` and ``crf_reduction`` to ner). Documented in
docs/tasks.md, "Fine-tuning defaults".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pentad import layout
from pentad.log import info


@dataclass(frozen=True)
class FinetuneDefaults:
    """One set of fine-tuning defaults: ``train.*`` and ``task.*`` values, each with the reason shown in
    docs/tasks.md."""

    train: dict[str, Any]
    task: dict[str, Any] = field(default_factory=dict)


# pentad's: AdamW without bias correction, as BERT's original code and TencentPretrain's scripts
# (its early steps are several times larger, so a short fine-tune learns from its first steps).
PENTAD = FinetuneDefaults(train={"adam_bias_correction": False})

# TencentPretrain's finetune/run_classifier.py (run_ner.py, run_c3.py and run_cmrc.py share its optimizer,
# schedule and training loop): no clipping, a head without dropout in torch's default initialisation,
# LambdaLR warmup from lr 0 sized train.warmup x (int(examples x epochs / batch) + 1), the example list
# shuffled by Python's random each epoch; [CLS] text [SEP] cut at seq_length; NER: the characters alone,
# with a [PAD] tag as the last class and the CRF's loss a mean per sentence.
TENCENTPRETRAIN = FinetuneDefaults(
    train={"adam_bias_correction": False, "clip_grad_norm": None, "schedule_convention": "tencentpretrain",
           "data_order": "tencentpretrain"},
    task={"head_dropout": 0.0, "head_init": "torch", "truncation": "end", "boundary_tokens": False, "pad_tag": True,
          "crf_reduction": "sequence"})

SETS = {"pentad": PENTAD, "tencentpretrain": TENCENTPRETRAIN}


def detect(cfg: Any) -> tuple[str, str]:
    """(the defaults ``task.defaults=auto`` means for ``cfg``, why): ``tencentpretrain`` when the config was
    imported from a TencentPretrain file, or ``init`` is a run whose config was (a converted TencentPretrain
    checkpoint, a run pre-trained from a TencentPretrain config) or holds a conversion from TencentPretrain;
    else ``pentad``."""
    if getattr(cfg, "imported_from", None) == "tencentpretrain":
        return "tencentpretrain", "the config was imported from a TencentPretrain file"
    init = Path(cfg.init) if cfg.init is not None else None
    if init is not None and init.is_dir():
        if _interop_kind(init / layout.INTEROP) == "tencentpretrain":
            return "tencentpretrain", f"init {init} is a converted TencentPretrain checkpoint"
        if _imported_from(init / layout.CONFIG) == "tencentpretrain":
            return "tencentpretrain", f"init {init} was trained from a TencentPretrain config"
    return "pentad", ""


def _interop_kind(path: Path) -> str | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None  # no conversion record (a bad one is reported where the run is read)
    source = record.get("source") if isinstance(record, dict) else None
    return source.get("kind") if isinstance(source, dict) else None


def _imported_from(path: Path) -> str | None:
    from pentad.config.loader import read_config_file
    from pentad.errors import UserError

    if not path.is_file():
        return None
    try:
        raw = read_config_file(path, "run config")
    except UserError:
        return None  # reported where the run is read
    return raw.get("imported_from") if isinstance(raw, dict) else None


def apply(cfg: Any) -> Any:
    """``cfg`` (an unfrozen run config) with its fine-tuning defaults for the keys left unset: without a
    task, pentad's ``train`` defaults; with one, the set ``task.defaults`` names (``auto`` resolved by
    :func:`detect` and recorded, with a log line saying why when it is not pentad's)."""
    chosen = "pentad"
    if cfg.task is not None:
        chosen = cfg.task.defaults
        if chosen == "auto":
            chosen, why = detect(cfg)
            if chosen != "pentad":
                info(f"task.defaults: {chosen} ({why}; task.defaults=pentad for pentad's)")
    values = SETS[chosen]
    cfg.train = _fill(cfg.train, values.train)
    if cfg.task is not None:
        cfg.task = _fill(cfg.task, {"defaults": chosen, **values.task}, force=("defaults",))
    return cfg


def _fill(section: Any, values: dict[str, Any], force: tuple[str, ...] = ()) -> Any:
    """``section`` with ``values`` for the keys it declares and was not given (and for ``force`` keys)."""
    fields = type(section).model_fields
    unset = {key: value for key, value in values.items() if key in fields
             and (key in force or key not in section.model_fields_set)}
    return section.model_copy(update=unset) if unset else section
