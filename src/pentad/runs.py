"""Run directories: what every command writes and reads back.

A run directory holds ``config.yaml`` (the resolved config), ``tokenizer/`` (its files and
``tokenizer.json``), ``metrics.jsonl``, ``checkpoints/`` and ``loss.png``; fine-tuning adds
``labels.json`` and ``best/``. Everything needed to resume, evaluate, infer or convert. The names
are :mod:`pentad.layout`'s; this module locks, prepares and reads the directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from pentad.config.base import freeze
from pentad.config.loader import dump_config, read_config_file
from pentad.errors import UserError, clipped, shown
from pentad.files import LockBusy, atomic_write_text, record_holder, release_lock, take_lock, write_json
from pentad.layout import (
    BEST,
    CHECKPOINTS,
    CONFIG,
    EVENTS_GLOB,
    LATEST,
    LOCK,
    RESULTS,
    RUN_OUTPUTS,
    TARGET_TOKENIZER_DIR,
    TOKENIZER_CONFIG,
    TOKENIZER_DIR,
    latest_checkpoint,
    latest_problem,
    remove_temporaries,
)
from pentad.log import info, set_quiet  # (re-exported: callers use runs.info)
from pentad.outputs import OutputLock, check_apart
from pentad.run_config import validate_raw


class RunLock:
    """An exclusive lock on a run directory, held while a command writes into it.

    ``flock`` on ``RUN/.lock``: the kernel releases it when the holder exits or is killed (even
    by kill -9), so there are no stale locks to clear by hand; the file itself stays and holds the
    last holder's pid, host and command for the message a second process gets. Taking the lock
    also clears what an interrupted earlier run left half-written (safe only under the lock).
    On a system without ``fcntl`` the directory is not locked.
    """

    def __init__(self, run_dir: Path, command: str):
        self.run_dir = Path(run_dir)
        self.command = command
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._fd = take_lock(self.run_dir / LOCK, self.run_dir)
        except LockBusy as busy:
            raise UserError(f"run directory {self.run_dir} is in use by another pentad process "
                            f"({busy.holder('pentad ')}); two runs writing one directory would mix their "
                            "checkpoints and metrics. Wait for it to finish or stop it, or choose another output "
                            "directory.") from None
        if self._fd is None:
            return self
        record_holder(self._fd, self.command)
        for path in remove_temporaries(self.run_dir, keep=(LOCK,)):
            info(f"removed {path}, left by an interrupted earlier run")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            release_lock(self._fd)
            self._fd = None


@contextmanager
def main_rank_speaks() -> Iterator[None]:
    """Progress messages from the main rank of a launch only (``RANK`` unset or 0), for the work done
    before a :class:`~pentad.training.session.Session` connects the ranks (resolving the run)."""
    quiet = os.environ.get("RANK", "0") not in ("", "0")
    if quiet:
        set_quiet(True)
    try:
        yield
    finally:
        if quiet:
            set_quiet(False)


def check_inputs_exist(cfg: Any, keys: tuple[str, ...] = ("init", "data.dataset")) -> None:
    """UserError naming the first of ``keys`` (dotted paths of the run config) whose path is given but does not
    exist: the first real cause, before the errors that would follow from it (no tokenizer, no dataset
    manifest)."""
    for key in keys:
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part, None)
        if value is not None and not Path(value).exists():
            what = {"init": "a run directory or checkpoint file to initialise from",
                    "data.dataset": "the directory written by `pentad preprocess`"}.get(key, "a file")
            raise UserError(f"{key}={value} does not exist (expected {what})")


def load_tokenizer(cfg: Any):
    """The tokenizer a config names, or None."""
    if cfg.tokenizer is None:
        return None
    from pentad.data.tokenizers import load_tokenizer as load

    return load(cfg.tokenizer)


def complete_vocab(cfg: Any, tokenizer) -> Any:
    """Set ``model.vocab_size`` from the tokenizer: the vocabulary decides the table size, except that a
    model initialised from a run keeps that run's larger table (checkpoints pad their embedding past the
    tokenizer: Qwen3's 151,936 rows for 151,669 ids; the rows past the vocabulary are never read)."""
    if tokenizer is None:
        return cfg
    size = tokenizer.vocab_size
    if cfg.model.vocab_size is not None and cfg.model.vocab_size > size and _init_rows(cfg) == cfg.model.vocab_size:
        return cfg
    if cfg.model.vocab_size not in (None, size):
        info(f"model.vocab_size {cfg.model.vocab_size} -> {size} (from the tokenizer's vocabulary)")
    cfg.model.vocab_size = size
    return cfg


def _init_rows(cfg: Any) -> int | None:
    """``model.vocab_size`` of the run ``cfg.init`` names (None without one)."""
    init = getattr(cfg, "init", None)
    saved = Path(init) / CONFIG if init is not None else None
    if saved is None or not saved.is_file():
        return None
    model = read_config_file(saved, "run config").get("model")
    rows = model.get("vocab_size") if isinstance(model, dict) else None
    return rows if isinstance(rows, int) else None


# train.* keys that do not change the course of training: they may differ when a run is resumed
FREE_TRAIN_KEYS = frozenset({"progress", "progress_every_s", "log_every", "threads", "device", "save_every",
                             "save_minutes", "keep_checkpoints", "stop_at", "resume_from", "allow_changes",
                             "eval_every",
                             "tensorboard", "plot", "peak_tflops", "strategy", "dist_backend", "dist_timeout",
                             "activation_checkpointing", "compile",
                             "deepspeed", "overwrite", "on_nonfinite", "max_skipped_steps"})
# data.* keys that do
GUARDED_DATA_KEYS = ("dataset", "train", "dev", "objective")


def absolute_paths(cfg: Any) -> Any:
    """Make every path of a config absolute (in place: run on the copy a run resolves), so that the
    ``config.yaml`` of a run works from any directory. Symbolic links are kept as given; paths that
    are absolute already are not touched."""
    from pydantic import BaseModel

    def visit(node: Any) -> Any:
        if isinstance(node, Path):
            return Path(os.path.abspath(node.expanduser()))
        if isinstance(node, BaseModel):
            for name in type(node).model_fields:
                value = getattr(node, name)
                new = visit(value)
                if new is not value and new != value:
                    setattr(node, name, new)
            return node
        if isinstance(node, list):
            for i, item in enumerate(node):
                new = visit(item)
                if new is not item and new != item:
                    node[i] = new
        return node

    return visit(cfg)


def flatten(data: Any, prefix: str) -> dict[str, Any]:
    """``data`` (nested mappings) as ``{dotted key: value}`` under ``prefix``."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}"))
        return out
    return {prefix: data}


def _guarded(raw: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide a run's course, flattened to dotted keys."""
    out: dict[str, Any] = {}
    for key, value in (raw.get("train") or {}).items():
        if key not in FREE_TRAIN_KEYS:
            out.update(flatten(value, f"train.{key}"))
    data = raw.get("data") or {}
    for key in GUARDED_DATA_KEYS:
        out.update(flatten(data.get(key), f"data.{key}"))
    for key in ("init", "task", "tokenizer"):
        out.update(flatten(raw.get(key), key))
    return out


def _same(old: Any, new: Any) -> bool:
    if old == new:
        return True
    # a path that an older run stored relative to where it ran
    return (isinstance(old, str) and isinstance(new, str) and os.path.isabs(new)
            and os.path.abspath(os.path.expanduser(old)) == new)


def _schema_difference(key: str, raw: dict[str, Any]) -> bool:
    """Whether ``key`` is missing from ``raw`` although its section is there: a setting that one pentad
    version has and another has not (its default keeps the older behaviour), not a change by the user."""
    node: Any = raw
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return isinstance(node, dict) and parts[-1] not in node


def config_changes(old: dict[str, Any], new: dict[str, Any], unused: tuple[str, ...] = ()
                   ) -> dict[str, tuple[Any, Any]]:
    """``key: (old, new)`` for each setting that changes the course of training; ``unused``: keys (or
    sections) the command does not read (``train.epochs`` when pre-training), never a change."""
    a, b = _guarded(old), _guarded(new)
    changes = {}
    for key in sorted(set(a) | set(b)):
        if any(key == u or key.startswith(u + ".") for u in unused):
            continue
        if (key not in a and _schema_difference(key, old)) or (key not in b and _schema_difference(key, new)):
            continue
        if not _same(a.get(key), b.get(key)):
            changes[key] = (a.get(key), b.get(key))
    return changes


def _resumable(run_dir: Path, cfg: Any) -> bool:
    return cfg.train.resume_from is not None or latest_checkpoint(run_dir) is not None


def earlier_results(run_dir: Path) -> list[str]:
    """The outputs of an earlier run in ``run_dir`` (checkpoints, the best model, results) as short
    descriptions; [] when there are none (a new directory, or an attempt that never saved)."""
    found = []
    checkpoints = run_dir / CHECKPOINTS
    if checkpoints.is_dir():
        names = sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".") or p.name == LATEST)
        if names:
            found.append(f"checkpoints/ ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})")
    if (run_dir / BEST).is_dir() and any((run_dir / BEST).iterdir()):
        found.append(f"{BEST}/")
    if (run_dir / RESULTS).is_file():
        found.append(RESULTS)
    return found


def clear_run_outputs(run_dir: Path) -> list[str]:
    """``train.overwrite``: delete what an earlier run wrote in ``run_dir`` (:data:`RUN_OUTPUTS` and event
    files; the config and tokenizer are written again); returns the names removed."""
    import shutil

    removed = []
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    for path in run_dir.glob(EVENTS_GLOB):
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def prepare_run_dir(run_dir: Path, cfg: Any, tokenizer, extra: dict[str, Any] | None = None,
                    target_tokenizer: Any = None, unused: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    """Create the run directory (or check a resumed one was made by the same config) and write
    ``config.yaml`` (paths made absolute) and the tokenizer files (and the target side's, for
    translation models with a separate target vocabulary: ``target_tokenizer/``).

    When the directory holds a checkpoint to resume, settings that change the course of training
    (``train.*`` but progress, logging, saving and device keys; ``data`` files and objective;
    ``init``, ``task``, ``tokenizer``) must be the run's: a change is an error listing each one, unless
    ``train.allow_changes`` accepts them; ``unused`` names keys the command does not read. Returns the
    accepted changes (``key: (old, new)``).
    ``cfg`` is not changed (a run's is frozen); what is recorded is a copy with every path absolute.
    """

    saved = run_dir / CONFIG
    # resume_from and overwrite are one-off instructions, not settings of the run: a later command reusing
    # this config.yaml must not go back to that step again (discarding the checkpoints made since), nor
    # delete the run it resumes
    recorded = absolute_paths(cfg.model_copy(deep=True))
    recorded.train.resume_from = None
    recorded.train.overwrite = False
    text = dump_config(recorded)
    changes: dict[str, tuple[Any, Any]] = {}
    if cfg.train.overwrite:
        if cfg.train.resume_from is not None:
            raise UserError(f"train.overwrite (--overwrite) starts {run_dir} afresh, deleting its checkpoints, and "
                            f"train.resume_from={cfg.train.resume_from} resumes one of them: give one or the other")
        removed = clear_run_outputs(run_dir) if run_dir.is_dir() else []
        if removed:
            info(f"--overwrite: removed the earlier run's {', '.join(removed)} from {run_dir}; starting afresh")
    elif not _resumable(run_dir, cfg) and earlier_results(run_dir):
        problem = latest_problem(run_dir)
        raise UserError(f"run directory {run_dir} holds an earlier run ({', '.join(earlier_results(run_dir))}) but "
                        f"no complete checkpoint to resume from"
                        + (f" ({problem})" if problem else "")
                        + ": starting again from step 0 would replace its results. Put its checkpoint back to "
                        "resume it, choose another output directory, or pass --overwrite (train.overwrite=true) "
                        "to delete them and start afresh")
    if saved.is_file() and not cfg.train.overwrite:
        old = read_config_file(saved, "run config")
        new = yaml.safe_load(text)
        if old.get("model") != new.get("model"):
            raise UserError(f"run directory {run_dir} was made with a different model config; "
                            "choose another output directory, or delete it to start over")
        if _resumable(run_dir, cfg):
            changes = config_changes(old, new, unused)
        if changes and not cfg.train.allow_changes:
            listed = "; ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items())
            hint = ""
            if any(k in changes for k in ("train.steps", "train.epochs")):
                hint = (" To train a finished run further, train.allow_changes=true re-sizes the learning-rate "
                        "schedule to the new length (with warmup or decay the rate jumps); init=RUN in a new "
                        "output directory starts a fresh schedule from its weights instead.")
            raise UserError(f"run directory {run_dir} has a checkpoint to resume, made with other settings, and "
                            f"resuming would silently change its course: {listed}. Resume with the run's "
                            f"settings (they are in {saved}), choose another output directory, or add "
                            f"train.allow_changes=true to resume with the new values (recorded in "
                            f"metrics.jsonl).{hint}")
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
    return changes


def _show(value: Any) -> str:
    return "(unset)" if value is None else shown(value) if isinstance(value, (list, dict)) else clipped(str(value))


def load_run(run_dir: Path) -> tuple[Any, Any]:
    """(config, tokenizer) of a run directory; the config frozen (:func:`pentad.config.base.freeze`:
    derive a copy to change it)."""
    from pentad.data.tokenizers import load_tokenizer as load

    if not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} does not exist")
    saved = run_dir / CONFIG
    if not saved.is_file():
        raise UserError(f"{run_dir} is not a pentad run directory: it has no {CONFIG}")
    raw = read_config_file(saved, "run config")
    cfg = freeze(validate_raw(raw, {}, str(saved)))  # a run's config is what it was: read, never changed
    tokenizer = None
    tok_cfg = run_dir / TOKENIZER_DIR / TOKENIZER_CONFIG
    if tok_cfg.is_file():
        tokenizer = load(_tokenizer_record(tok_cfg), base_dir=run_dir / TOKENIZER_DIR)
    elif cfg.tokenizer is not None:  # the run saved its tokenizer there: the folder was lost
        raise UserError(f"run directory {run_dir} has no {TOKENIZER_DIR}/{TOKENIZER_CONFIG}, though its config names "
                        f"a tokenizer ({cfg.tokenizer.type}): the run's {TOKENIZER_DIR}/ folder was deleted or not "
                        "copied with it. Copy it back from the original run directory.")
    return cfg, tokenizer


def _tokenizer_record(path: Path) -> dict[str, Any]:
    """The tokenizer description a run saved (``tokenizer/tokenizer.json``); an error for a corrupt one."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UserError(f"{path} is corrupt ({clipped(str(e), 200)}); copy the run's "
                        f"{TOKENIZER_DIR}/ folder back from the original run directory") from None
    if not isinstance(record, dict):
        raise UserError(f"{path} is corrupt: expected a JSON object describing the tokenizer, found "
                        f"{type(record).__name__}; copy the run's {TOKENIZER_DIR}/ folder back from the original "
                        "run directory")
    return record


def load_target_tokenizer(run_dir: Path) -> Any:
    """The target-side tokenizer a translation run saved, or None (the run has one vocabulary)."""
    from pentad.data.tokenizers import load_tokenizer as load

    tok_cfg = Path(run_dir) / TARGET_TOKENIZER_DIR / TOKENIZER_CONFIG
    if not tok_cfg.is_file():
        return None
    return load(_tokenizer_record(tok_cfg), base_dir=Path(run_dir) / TARGET_TOKENIZER_DIR)


def preprocess_from_config(cfg: Any) -> dict[str, Any]:
    """``pentad preprocess``: the config's objective and tokenizer turn ``data.corpus`` into a
    token-shard dataset at ``data.output``."""
    from pentad.data.objectives.vision import ImageObjective
    from pentad.data.preprocess import preprocess
    from pentad.registry import OBJECTIVES

    needs = cfg.data.objective is None or OBJECTIVES.get(cfg.data.objective.type).needs_tokenizer
    missing = [k for k, v in (("data.corpus", cfg.data.corpus), ("data.output", cfg.data.output),
                              ("data.objective", cfg.data.objective), ("tokenizer", cfg.tokenizer if needs else 0))
               if v is None]
    if missing:
        raise UserError(f"preprocess needs {', '.join(missing)} (set them in the config or as key=value overrides)")
    tokenizer = load_tokenizer(cfg) if cfg.tokenizer is not None else None
    objective = OBJECTIVES.get(cfg.data.objective.type)(cfg.data.objective, tokenizer)
    if isinstance(objective, ImageObjective):
        objective.max_pixels = cfg.data.max_image_pixels
    tok_config = cfg.tokenizer.model_dump(mode="json") if cfg.tokenizer is not None else None
    check_apart(cfg.data.output, "data.output=", [("data.corpus", cfg.data.corpus)])
    with OutputLock(cfg.data.output, "data.output=", "pentad preprocess"):  # its checks and its writes
        manifest = preprocess(objective, tokenizer, tok_config, cfg.data.corpus,
                              cfg.data.output, workers=cfg.data.workers, on_bad_line=cfg.data.on_bad_line,
                              progress=cfg.train.progress, seed=cfg.train.seed)
    info(f"wrote {cfg.data.output}: {manifest.get('num_instances', '?'):,} instances, "
         f"{manifest.get('num_tokens', '?'):,} tokens")
    return manifest
