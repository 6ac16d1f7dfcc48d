"""Fine-tuning procedures made of several runs: k-fold cross-validation (``train.folds``) and a grid
search over config values (``train.grid``).

Each fold and each trial is an ordinary fine-tuning run in its own directory under the run directory,
so every one of them can be inspected, resumed (running the same command again skips what finished
and resumes what did not) and used by ``pentad infer``. The caller passes the function that runs
one fine-tune (this module does not import the runner: the runner calls in here).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pentad import files, layout
from pentad.errors import UserError
from pentad.layout import CV, FOLDS_DIR, GRID, GRID_TABLE, OOF
from pentad.log import get_logger
from pentad.registry import TASKS

log = get_logger(__name__)


RunOne = Callable[[Any], dict[str, Any]]
Predict = Callable[[Path, Path, Path], Any]


def _refuse_launch(option: str) -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError(f"{option} runs its fine-tunes one after another in one process; it does not run under "
                        "a launcher (torchrun/deepspeed). Run each fold or trial as its own launched fine-tune, "
                        f"or run {option} without the launcher")


def _plain(cfg: Any, **updates: Any) -> Any:
    """A copy of ``cfg`` (a RunConfig) with ``train.*`` and top-level updates (dotted keys)."""
    from pentad.config.loader import set_path
    from pentad.run_config import validate_raw

    raw = cfg.model_dump(mode="json", exclude_none=False)
    for key, value in updates.items():
        set_path(raw, key.split("."), value, key)
    return validate_raw(raw, {}, "the run's config")


def _write_yaml(path: Path, cfg: Any) -> None:
    files.atomic_write_text(path, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True))


def _finished(run_dir: Path) -> dict[str, Any] | None:
    """The results of a fine-tune that ran to its end (None: not run, or stopped part-way)."""
    path = run_dir / layout.RESULTS
    if not path.is_file():
        return None
    results = json.loads(path.read_text(encoding="utf-8"))
    return None if "stopped_at" in results else results


# ------------------------------------------------------------------------------ cross-validation
def assign_folds(n: int, folds: int, seed: int) -> list[np.ndarray]:
    """The held-out example indices of each fold (sorted): a seeded shuffle dealt round-robin, so fold
    sizes differ by at most one."""
    order = np.random.default_rng([seed, 1729]).permutation(n)
    return [np.sort(order[k::folds]) for k in range(folds)]


def cross_validate(cfg: Any, run_one: RunOne, predict: Predict) -> dict[str, Any]:
    """K-fold cross-validation: the training input's examples (:meth:`Task.examples`) dealt into
    ``train.folds`` folds; fold k fine-tunes on the others in ``RUN/fold-k`` (its best model picked on
    fold k), then predicts fold k: the out-of-fold predictions, merged in ``RUN/oof_<predictions file>``.
    ``RUN/cv.json`` holds each fold's held-out (``dev``) and ``data.test`` scores with their mean and
    standard deviation; ``selection`` is the mean of the folds' model-selection scores."""
    _refuse_launch("train.folds")
    folds = cfg.train.folds
    task_cls = TASKS.get(cfg.task.type)
    sources = task_cls.sources(cfg.task, cfg.data)
    if sources.get("train") is None:
        raise UserError(f"train.folds: the {cfg.task.type} task has no training input in this config (a zero-shot "
                        "run trains nothing to cross-validate)")
    run_dir = Path(cfg.output)
    examples = task_cls.examples(sources["train"])
    if len(examples) < folds:
        raise UserError(f"train.folds={folds}, but {sources['train']} has only {len(examples)} example(s); use at "
                        f"most {len(examples)} folds")
    if cfg.data.dev is not None:
        log.info(f"note: data.dev ({cfg.data.dev}) is not used with train.folds: each fold picks its model on its "
                 "held-out part")
    held = assign_folds(len(examples), folds, cfg.train.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_yaml(run_dir / "search.yaml", cfg)
    log.info(f"cross-validation: {len(examples):,} examples of {sources['train']} in {folds} folds "
             f"({', '.join(str(len(h)) for h in held)} held out)")
    per_fold, oof_parts = [], []
    for k, heldout in enumerate(held, 1):
        fold_dir = run_dir / f"fold-{k}"
        keep = np.setdiff1d(np.arange(len(examples)), heldout)
        base = run_dir / FOLDS_DIR / f"fold-{k}"
        train_file = task_cls.write_examples(sources["train"], [examples[i] for i in keep], base.with_name(
            f"fold-{k}-train"))
        heldout_file = task_cls.write_examples(sources["train"], [examples[i] for i in heldout], base.with_name(
            f"fold-{k}-heldout"))
        fold_cfg = _plain(cfg, **{"train.folds": None, "train.grid": None, "output": str(fold_dir),
                                  "data.train": str(train_file), "data.dev": str(heldout_file)})
        results = None if cfg.train.overwrite else _finished(fold_dir)  # --overwrite: every fold afresh
        if results is None:
            log.info(f"fold {k} of {folds}: train {len(keep):,} examples, hold out {len(heldout):,} -> {fold_dir}")
            results = run_one(fold_cfg)
            if "stopped_at" in results:
                return {"stopped_at": {"fold": k, **results}}
        else:
            log.info(f"fold {k} of {folds}: finished earlier ({fold_dir})")
        oof = fold_dir / f"{OOF}_{task_cls.predictions_file}"
        predict(fold_dir, heldout_file, oof)
        oof_parts.append((heldout, oof))
        per_fold.append({"fold": k, "train_examples": int(len(keep)), "heldout_examples": int(len(heldout)),
                         **{key: results[key] for key in ("best_step", "selection", "dev", "test") if key in results}})
    merged = run_dir / f"{OOF}_{task_cls.predictions_file}"
    merge_predictions(oof_parts, merged, len(examples))
    summary: dict[str, Any] = {"folds": folds, "examples": len(examples), "per_fold": per_fold,
                               "oof_predictions": merged.name}
    for split in ("dev", "test"):
        rows = [f[split] for f in per_fold if split in f]
        if rows:
            names = [m for m in rows[0] if all(m in r for r in rows)]
            summary[f"{split}_mean"] = {m: float(np.mean([r[m] for r in rows])) for m in names}
            summary[f"{split}_std"] = {m: float(np.std([r[m] for r in rows])) for m in names}
    selections = [f["selection"] for f in per_fold if "selection" in f]
    summary["selection"] = float(np.mean(selections)) if selections else float("nan")
    files.write_json(run_dir / CV, summary)
    log.info(cv_table(summary))
    log.info(f"out-of-fold predictions: {merged}; summary: {run_dir / CV}")
    return summary


def cv_table(summary: dict[str, Any]) -> str:
    """The folds' held-out (and test) scores as a Markdown table, with the mean and standard deviation."""
    splits = [s for s in ("dev", "test") if f"{s}_mean" in summary]
    columns = [(s, m) for s in splits for m in summary[f"{s}_mean"]]
    shown = {"dev": "held-out", "test": "test"}
    lines = ["| fold | " + " | ".join(f"{shown[s]} {m}" for s, m in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for f in summary["per_fold"]:
        lines.append(f"| {f['fold']} | " + " | ".join(_num(f.get(s, {}).get(m)) for s, m in columns) + " |")
    lines.append("| mean ± std | " + " | ".join(
        f"{_num(summary[f'{s}_mean'][m])} ± {_num(summary[f'{s}_std'][m])}" for s, m in columns) + " |")
    return "\n".join(lines)


def _num(value: Any) -> str:
    return "" if value is None else f"{value:.4f}"


def merge_predictions(parts: list[tuple[np.ndarray, Path]], out: Path, total: int) -> None:
    """One file of the folds' prediction files: JSON objects (keyed by example id) merged; line files
    (TSV with one header line, JSON lines) put back in the training file's order when each has a line
    per held-out example, else (several lines per example, e.g. per question of a document) joined fold
    after fold (their lines carry the examples' ids)."""
    if out.suffix == ".json":
        merged: dict[str, Any] = {}
        for _, path in parts:
            merged.update(json.loads(path.read_text(encoding="utf-8")))
        files.atomic_write_text(out, json.dumps(merged, ensure_ascii=False, indent=1))
        return
    header = out.suffix == ".tsv"
    head, rows = None, []
    for _, path in parts:
        lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line]
        if header:
            head, lines = lines[0], lines[1:]
        rows.append(lines)
    if all(len(lines) == len(held) for (held, _), lines in zip(parts, rows, strict=True)):
        ordered: list[str] = [""] * total
        for (held, _), lines in zip(parts, rows, strict=True):
            for i, line in zip(held, lines, strict=True):
                ordered[int(i)] = line
        body = ordered
    else:
        body = [line for lines in rows for line in lines]
    files.atomic_write_text(out, "".join(line + "\n" for line in ([head] if head is not None else []) + body))


# ------------------------------------------------------------------------------------ grid search
def grid_trials(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values (the keys' order as given; the last key varies fastest)."""
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"train.grid: {key} must map to a non-empty list of values, found {values!r}")
        if key in ("output", "train.grid", "train.folds") or key.startswith("train.grid."):
            raise UserError(f"train.grid: {key} cannot be searched (the grid's runs are laid out under output)")
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def grid_search(cfg: Any, run_one: RunOne, finetune_or_cv: RunOne) -> dict[str, Any]:
    """One fine-tune (or cross-validation, with ``train.folds``) per combination of ``train.grid``, in
    ``RUN/grid/trial-N``; the best by dev score (the folds' mean held-out score with ``train.folds``) is
    named in ``RUN/grid.json`` and ``pentad infer RUN`` uses it. ``RUN/grid.tsv`` is the results
    table (also logged)."""
    _refuse_launch("train.grid")
    if cfg.train.folds is None and TASKS.get(cfg.task.type).sources(cfg.task, cfg.data).get("dev") is None:
        raise UserError("train.grid picks the best combination by its dev score: give data.dev, or set "
                        "train.folds to pick by cross-validation")
    trials = grid_trials(cfg.train.grid)
    run_dir = Path(cfg.output)
    configs = []
    for i, values in enumerate(trials, 1):
        updates = {"train.grid": None, "output": str(run_dir / "grid" / f"trial-{i}"), **values}
        try:
            configs.append(_plain(cfg, **updates))
        except UserError as e:  # every combination is checked before the first one runs
            raise UserError(f"train.grid, trial {i} ({_describe(values)}): {e}") from None
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_yaml(run_dir / "search.yaml", cfg)
    log.info(f"grid search: {len(trials)} combination(s) of {', '.join(cfg.train.grid)}")
    rows = []
    for i, (values, trial_cfg) in enumerate(zip(trials, configs, strict=True), 1):
        trial_dir = Path(trial_cfg.output)
        start = time.perf_counter()
        results = None if cfg.train.overwrite else \
            _finished_search(trial_dir) if trial_cfg.train.folds else _finished(trial_dir)
        if results is None:
            log.info(f"trial {i} of {len(trials)}: {_describe(values)} -> {trial_dir}")
            results = finetune_or_cv(trial_cfg)
            if "stopped_at" in results:
                return {"stopped_at": {"trial": i, **results}}
        rows.append({"trial": i, "dir": str(trial_dir.relative_to(run_dir)), "values": values,
                     "selection": results.get("selection", float("nan")),
                     "dev": results.get("dev_mean", results.get("dev", {})),
                     "test": results.get("test_mean", results.get("test", {})),
                     "seconds": round(time.perf_counter() - start, 1)})
    scored = [r for r in rows if not math.isnan(r["selection"])]
    if not scored:
        raise UserError("train.grid: no trial has a dev score to compare")
    best = max(scored, key=lambda r: r["selection"])  # the first of equals: the grid's order
    summary = {"keys": list(cfg.train.grid), "trials": rows, "best": best["trial"], "best_dir": best["dir"],
               "best_values": best["values"]}
    files.write_json(run_dir / GRID, summary)
    files.atomic_write_text(run_dir / GRID_TABLE, grid_tsv(summary))
    log.info(grid_table(summary))
    log.info(f"best: trial {best['trial']} ({_describe(best['values'])}), {run_dir / best['dir']}; "
             f"pentad infer {run_dir} uses it")
    return summary


def _finished_search(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / CV
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _describe(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _metric_columns(summary: dict[str, Any]) -> list[tuple[str, str]]:
    columns: list[tuple[str, str]] = []
    for split in ("dev", "test"):
        for row in summary["trials"]:
            for m in row[split]:
                if (split, m) not in columns:
                    columns.append((split, m))
    return columns


def grid_table(summary: dict[str, Any]) -> str:
    """The trials as a Markdown table (the best one marked)."""
    keys, columns = summary["keys"], _metric_columns(summary)
    lines = ["| trial | " + " | ".join(keys + [f"{s} {m}" for s, m in columns]) + " | seconds |",
             "|---|" + "---|" * (len(keys) + len(columns) + 1)]
    for row in summary["trials"]:
        mark = " (best)" if row["trial"] == summary["best"] else ""
        lines.append(f"| {row['trial']}{mark} | " + " | ".join(
            [str(row["values"][k]) for k in keys] + [_num(row[s].get(m)) for s, m in columns])
            + f" | {row['seconds']} |")
    return "\n".join(lines)


def grid_tsv(summary: dict[str, Any]) -> str:
    keys, columns = summary["keys"], _metric_columns(summary)
    out = ["\t".join(["trial", "dir", *keys, *(f"{s}_{m}" for s, m in columns), "selection", "seconds"])]
    for row in summary["trials"]:
        out.append("\t".join([str(row["trial"]), row["dir"], *(str(row["values"][k]) for k in keys),
                              *(_num(row[s].get(m)) for s, m in columns), _num(row["selection"]),
                              str(row["seconds"])]))
    return "\n".join(out) + "\n"


def resolve_model(model_dir: Path, quiet: bool = False) -> Path:
    """The run directory ``pentad infer --model`` means: a grid search's best trial for a grid's run
    directory; a cross-validation's run directory has one model per fold and is refused by name."""
    model_dir = Path(model_dir)
    if (model_dir / GRID).is_file() and not (model_dir / layout.CONFIG).is_file():
        best = json.loads((model_dir / GRID).read_text(encoding="utf-8"))
        chosen = model_dir / best["best_dir"]
        if not quiet:
            log.info(f"{model_dir} is a grid search: using its best trial, {chosen}")
        return resolve_model(chosen, quiet)
    if (model_dir / CV).is_file() and not (model_dir / layout.CONFIG).is_file():
        folds = json.loads((model_dir / CV).read_text(encoding="utf-8"))["folds"]
        raise UserError(f"{model_dir} is a cross-validation with one model per fold ({model_dir}/fold-1 .. "
                        f"fold-{folds}); give one of them as --model, or fine-tune once on the whole training "
                        "file for a single model")
    return model_dir
