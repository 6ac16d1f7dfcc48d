"""The layout of a run directory: every file and folder name in it, and the paths made from them
(ground floor: the standard library and ``pentad.files`` only). Every module that reads or writes a
run directory asks this one; none spells a name itself.

::

    RUN/
      config.yaml            the resolved run config                      CONFIG
      .lock                  the run lock (pentad.runs.RunLock)           LOCK
      metrics.jsonl          one JSON record per logged step              METRICS
      loss.png               the loss plot                                LOSS_PLOT
      events.out.tfevents.*  TensorBoard event files                      EVENTS_GLOB
      tokenizer/             the tokenizer's files                        TOKENIZER_DIR
        tokenizer.json       (a Hugging Face tokenizers file, when so)    TOKENIZER_CONFIG
      target_tokenizer/      a translation run's target-side tokenizer    TARGET_TOKENIZER_DIR
      checkpoints/           CHECKPOINTS
        step-00000100/       a checkpoint (checkpoint_dir)
          model.safetensors  its weights                                  WEIGHTS
          state.pt           optimizer, schedule, RNG and data position   STATE
          dcp/               or sharded weights (fsdp)                    DCP
          deepspeed/         or DeepSpeed's files (deepspeed)             DEEPSPEED
        latest               names the checkpoint to resume from          LATEST
      best/                  a fine-tuned run's best model on dev         BEST
        best.json            its step and metrics                         BEST_RECORD
      results.json           a finished fine-tuned run's scores           RESULTS
      labels.json            a task's fitted state (label map)            LABELS
      model.safetensors      an exported or converted model               WEIGHTS
      interop.json           what a conversion carried (source, notes)    INTEROP
      interop_extra.safetensors  source tensors pentad has no module for  INTEROP_EXTRA
      cv.json, grid.json, grid.tsv, folds/, oof_*   cross-validation and grid search
      compress.json, steps/  what pentad compress did, and its steps' runs
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pentad.files import is_temporary, temporary_dir

CONFIG = "config.yaml"
LOCK = ".lock"
METRICS = "metrics.jsonl"
LOSS_PLOT = "loss.png"
EVENTS_GLOB = "events.out.tfevents.*"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_CONFIG = "tokenizer.json"
TARGET_TOKENIZER_DIR = "target_tokenizer"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
WEIGHTS = "model.safetensors"
STATE = "state.pt"
DCP = "dcp"  # subdirectory of a torch.distributed.checkpoint checkpoint (fsdp)
DEEPSPEED = "deepspeed"  # DeepSpeed's files inside a checkpoint directory (train.strategy=deepspeed)
# The subdirectories of a sharded checkpoint, one per format (``pentad.training.checkpoint.SHARDED_FORMATS``
# holds their readers, in this order).
SHARDED_DIRS = (DCP, DEEPSPEED)
BEST = "best"
RESULTS = "results.json"
# The task's fitted state (Task.state): the label map of classification and tagging runs (the name
# predates other tasks; converted classifiers and exports read and carry it under this name).
LABELS = "labels.json"
INTEROP = "interop.json"
INTEROP_EXTRA = "interop_extra.safetensors"
BEST_RECORD = "best.json"  # in best/: the step and metrics of the best model
# cross-validation and grid search (pentad.tasks.search)
CV = "cv.json"
GRID = "grid.json"
GRID_TABLE = "grid.tsv"
OOF = "oof"  # out-of-fold predictions: RUN/oof_<the task's predictions file>
FOLDS_DIR = "folds"
# pentad compress: what it did, and the run directories of its steps
COMPRESSION_RECORD = "compress.json"
COMPRESSION_STEPS = "steps"

# What a run leaves that is worth keeping: removed by train.overwrite (--overwrite) before a fresh
# start, with the TensorBoard event files.
RUN_OUTPUTS = (CHECKPOINTS, BEST, RESULTS, METRICS, LOSS_PLOT, WEIGHTS)
# What a run directory holds besides its checkpoints that readers of a derived run (an export, a
# merge, a compression) need.
CARRIED = (CONFIG, TOKENIZER_DIR, TARGET_TOKENIZER_DIR, LABELS, INTEROP)
# What a run directory holds that its readers need: a file output inside an input run must not be one.
RUN_PARTS = frozenset({CONFIG, WEIGHTS, CHECKPOINTS, BEST, TOKENIZER_DIR, TARGET_TOKENIZER_DIR, LABELS, INTEROP,
                       METRICS, INTEROP_EXTRA, LOCK, COMPRESSION_STEPS})


# ------------------------------------------------------------------------------------- checkpoints
def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """``RUN/checkpoints/step-NNNNNNNN``."""
    return run_dir / CHECKPOINTS / f"step-{step:08d}"


def staging_dir(run_dir: Path, step: int) -> Path:
    """A new empty temporary directory beside the checkpoint of ``step`` (renamed into place by
    ``pentad.training.checkpoint.publish_checkpoint``; removed by :func:`remove_temporaries` if a
    run dies first)."""
    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    return temporary_dir(final.parent, f".{final.name}.")


def step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """``(step, directory)`` of every ``checkpoints/step-N`` directory, complete or not, oldest step first."""
    found = []
    for path in (run_dir / CHECKPOINTS).glob("step-*"):
        suffix = path.name[len("step-"):]
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints kept in a run directory, oldest first."""
    return [step for step, path in step_dirs(run_dir) if (path / STATE).is_file()]


def pointed_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint directory ``checkpoints/latest`` names, or None when it is missing or names none."""
    pointer = run_dir / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return None
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    path = run_dir / CHECKPOINTS / name
    return path if name and "/" not in name and path.is_dir() else None


def sharded_format(checkpoint: Path) -> str | None:
    """The sharded format of a checkpoint directory (one of :data:`SHARDED_DIRS`), or None."""
    return next((name for name in SHARDED_DIRS if (checkpoint / name).is_dir()), None)


def checkpoint_format(checkpoint: Path) -> str | None:
    """``"safetensors"``, a sharded format (``"dcp"``, ...) or None (no weights) of a checkpoint directory."""
    if (checkpoint / WEIGHTS).is_file():
        return "safetensors"
    return sharded_format(checkpoint)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a run resumes from: the one ``checkpoints/latest`` names, or, when that pointer
    is missing or names no directory (:func:`latest_problem` says which), the newest complete
    checkpoint by step (state and weights present); None when there is none."""
    pointed = pointed_checkpoint(run_dir)
    if pointed is not None:
        return pointed
    complete = [path for _, path in step_dirs(run_dir)
                if (path / STATE).is_file() and checkpoint_format(path) is not None]
    return complete[-1] if complete else None


def latest_problem(run_dir: Path) -> str | None:
    """What is wrong with the ``checkpoints/latest`` pointer of a run directory with checkpoints
    (missing, or naming a checkpoint that is not there), or None when it is fine."""
    if not step_dirs(run_dir) or pointed_checkpoint(run_dir) is not None:
        return None
    pointer = run_dir / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return f"{pointer} is missing"
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return f"{pointer} cannot be read"
    return f"{pointer} names {name!r}, which is not a checkpoint directory there"


def remove_temporaries(run_dir: Path, keep: tuple[str, ...] = ()) -> list[Path]:
    """Delete what an interrupted atomic write left behind in a run directory (``checkpoints/.step-*``
    directories, ``.NAME.XXXX`` temporary files: :func:`pentad.files.is_temporary`); returns what was
    removed. ``keep`` lists hidden names that are not temporaries (the run lock); ``.NAME.lock`` files
    (the lock of an output being written, ``pentad.outputs``) are kept too.
    Call it only while holding the run directory's lock: a running writer's files look the same.
    """
    removed = []
    for directory in (run_dir, run_dir / CHECKPOINTS, run_dir / BEST, run_dir / TOKENIZER_DIR,
                      run_dir / TARGET_TOKENIZER_DIR):
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if not is_temporary(entry.name) or entry.name in keep:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed
