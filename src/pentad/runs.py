"""Run directories: what every command writes and reads back.

A run directory holds ``config.yaml`` (the resolved config), ``tokenizer/`` (its files and
``tokenizer.json``), ``metrics.jsonl``, ``checkpoints/`` and ``loss.png``; fine-tuning adds
``labels.json`` and ``best/``. Everything needed to resume, evaluate, infer or convert.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from pentad.config.loader import dump_config, validate_raw
from pentad.errors import UserError
from pentad.training.checkpoint import atomic_write_text, write_json

CONFIG = "config.yaml"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_CONFIG = "tokenizer.json"
TARGET_TOKENIZER_DIR = "target_tokenizer"


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_tokenizer(cfg: Any):
    """The tokenizer a config names, or None."""
    if cfg.tokenizer is None:
        return None
    from pentad.data.tokenizers import load_tokenizer as load

    return load(cfg.tokenizer)


def complete_vocab(cfg: Any, tokenizer) -> Any:
    """Set ``model.vocab_size`` from the tokenizer: the vocabulary decides the table size."""
    if tokenizer is None:
        return cfg
    size = tokenizer.vocab_size
    if cfg.model.vocab_size not in (None, size):
        info(f"model.vocab_size {cfg.model.vocab_size} -> {size} (from the tokenizer's vocabulary)")
    cfg.model.vocab_size = size
    return cfg


def prepare_run_dir(run_dir: Path, cfg: Any, tokenizer, extra: dict[str, Any] | None = None,
                    target_tokenizer: Any = None) -> None:
    """Create the run directory (or check a resumed one was made by the same config) and write
    ``config.yaml`` and the tokenizer files (and the target side's, for translation models with a
    separate target vocabulary: ``target_tokenizer/``)."""
    saved = run_dir / CONFIG
    text = dump_config(cfg)
    if saved.is_file():
        old = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
        new = yaml.safe_load(text)
        if old.get("model") != new.get("model"):
            raise UserError(f"run directory {run_dir} was made with a different model config; "
                            "choose another output directory, or delete it to start over")
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(saved, text)
    if tokenizer is not None:
        tok_dir = run_dir / TOKENIZER_DIR
        tok_dir.mkdir(exist_ok=True)
        write_json(tok_dir / TOKENIZER_CONFIG, tokenizer.save(tok_dir))
    if target_tokenizer is not None:
        tok_dir = run_dir / TARGET_TOKENIZER_DIR
        tok_dir.mkdir(exist_ok=True)
        write_json(tok_dir / TOKENIZER_CONFIG, target_tokenizer.save(tok_dir))
    for name, data in (extra or {}).items():
        write_json(run_dir / name, data)


def load_run(run_dir: Path) -> tuple[Any, Any]:
    """(config, tokenizer) of a run directory."""
    from pentad.data.tokenizers import load_tokenizer as load

    if not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} does not exist")
    saved = run_dir / CONFIG
    if not saved.is_file():
        raise UserError(f"{run_dir} is not a pentad run directory: it has no {CONFIG}")
    raw = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
    cfg = validate_raw(raw, {}, str(saved))
    tokenizer = None
    tok_cfg = run_dir / TOKENIZER_DIR / TOKENIZER_CONFIG
    if tok_cfg.is_file():
        tokenizer = load(json.loads(tok_cfg.read_text(encoding="utf-8")), base_dir=run_dir / TOKENIZER_DIR)
    return cfg, tokenizer


def load_target_tokenizer(run_dir: Path) -> Any:
    """The target-side tokenizer a translation run saved, or None (the run has one vocabulary)."""
    from pentad.data.tokenizers import load_tokenizer as load

    tok_cfg = Path(run_dir) / TARGET_TOKENIZER_DIR / TOKENIZER_CONFIG
    if not tok_cfg.is_file():
        return None
    return load(json.loads(tok_cfg.read_text(encoding="utf-8")), base_dir=Path(run_dir) / TARGET_TOKENIZER_DIR)


def preprocess_from_config(cfg: Any) -> dict[str, Any]:
    """``pentad preprocess``: the config's objective and tokenizer turn ``data.corpus`` into a
    token-shard dataset at ``data.output``."""
    from pentad.data.preprocess import preprocess
    from pentad.registry import OBJECTIVES

    missing = [k for k, v in (("data.corpus", cfg.data.corpus), ("data.output", cfg.data.output),
                              ("data.objective", cfg.data.objective), ("tokenizer", cfg.tokenizer)) if v is None]
    if missing:
        raise UserError(f"preprocess needs {', '.join(missing)} (set them in the config or as key=value overrides)")
    tokenizer = load_tokenizer(cfg)
    objective = OBJECTIVES.get(cfg.data.objective.type)(cfg.data.objective, tokenizer)
    manifest = preprocess(objective, tokenizer, cfg.tokenizer.model_dump(mode="json"), cfg.data.corpus,
                          cfg.data.output, workers=cfg.data.workers, on_bad_line=cfg.data.on_bad_line,
                          progress=cfg.train.progress, seed=cfg.train.seed)
    info(f"wrote {cfg.data.output}: {manifest.get('num_instances', '?'):,} instances, "
         f"{manifest.get('num_tokens', '?'):,} tokens")
    return manifest
