"""``pentad export RUN OUT``: one checkpoint of a run, whatever wrote it, as one weights file.

A checkpoint of an ``fsdp`` run is a directory of shards (``dcp/``, one file per rank), of a
``single`` or ``ddp`` run one ``model.safetensors``. Export consolidates the latest checkpoint (or
the one of ``step``) in this process, checks it against the run's model config and writes OUT as a
run-like directory: ``model.safetensors`` (tied aliases stored once, as every pentad weights file),
the run's ``config.yaml``, tokenizer(s) and labels. ``pentad finetune init=OUT``, ``pentad convert
pentad-to-hf OUT ...``, ``pentad generate`` and ``pentad infer`` read it like a run, and it loads
under the ``single`` strategy.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pentad import files, layout
from pentad.builder import build_model
from pentad.config.loader import dump_config
from pentad.errors import UserError, writing
from pentad.files import temporary_dir
from pentad.layout import CONFIG
from pentad.outputs import OutputLock, check_apart, check_replaceable
from pentad.runs import load_run
from pentad.training import checkpoint as ckpt


def write_derived_run(source: Path, out: Path, cfg: Any, write_weights: Callable[[Path], None],
                      leave_out: tuple[str, ...] = ()) -> Path:
    """Write a run directory derived from run ``source`` (merged, grown, compressed): the source's
    carried files (tokenizers, task state; not those named in ``leave_out``), ``cfg`` as its config and
    the weights file ``write_weights(path)`` writes. Staged beside ``out`` and renamed into place, so
    ``out`` is never half-written; an existing ``out`` is replaced only once all of it is written."""
    source, out = Path(source), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = temporary_dir(out.parent, f".{out.name}.")
    try:
        for name in layout.CARRIED:
            item = source / name
            if name == CONFIG or name in leave_out:
                continue
            if item.is_dir():
                shutil.copytree(item, staged / name)
            elif item.is_file():
                with writing(staged / name):
                    shutil.copy2(item, staged / name)
        files.atomic_write_text(staged / CONFIG, dump_config(cfg))
        write_weights(staged / layout.WEIGHTS)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staged, out)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return out
EXPORT_KEY = "pentad_export"


@dataclass
class Exported:
    out: Path
    step: int
    source: Path
    source_format: str
    tensors: int
    parameters: int
    bytes: int

    def render(self) -> str:
        return (f"exported step {self.step} of {self.source.parent.parent} ({self.source_format} checkpoint "
                f"{self.source.name}) to {self.out / layout.WEIGHTS}: {self.tensors} tensors, "
                f"{self.parameters:,} values, {self.bytes / 1e6:,.1f} MB")


def choose_checkpoint(run: Path, step: int | None) -> Path:
    """The checkpoint directory of ``step`` in ``run`` (default: the latest)."""
    kept = layout.checkpoint_steps(run)
    listing = ", ".join(map(str, kept)) if kept else "none"
    if step is not None:
        if step not in kept:
            raise UserError(f"--step {step}: {run} has no checkpoint of step {step} (kept checkpoints: {listing})")
        return layout.checkpoint_dir(run, step)
    latest = layout.latest_checkpoint(run)
    if latest is None:
        if (run / layout.WEIGHTS).is_file():
            raise UserError(f"{run} has no checkpoints but already holds its weights in one file, "
                            f"{run / layout.WEIGHTS}: use it as it is")
        raise UserError(f"{run} has no checkpoint to export ({layout.CHECKPOINTS}/{layout.LATEST} is missing; a run "
                        "saves one every train.save_every steps and at its end)")
    return latest


def export_run(run: Path, out: Path, step: int | None = None, overwrite: bool = False) -> Exported:
    """Consolidate a checkpoint of ``run`` into the run-like directory ``out`` (see the module docstring)."""
    run, out = Path(run), Path(out)
    check_apart(out, "OUT", [("run directory", run)])
    with OutputLock(out, "OUT", "pentad export"):  # from the checks to the last write
        return _export_run(run, out, step, overwrite)


def _export_run(run: Path, out: Path, step: int | None, overwrite: bool) -> Exported:
    cfg, _ = load_run(run)
    check_replaceable(out, "OUT", overwrite, "export")
    source = choose_checkpoint(run, step)
    fmt = layout.checkpoint_format(source) or "unknown"
    try:
        tensors = ckpt.read_checkpoint_weights(source)
    except FileNotFoundError as e:
        raise UserError(f"checkpoint {source} disappeared while it was read ({e}): is the run still training "
                        "and replacing its checkpoints? Export again, or name a kept step with --step") from None
    model = build_model(cfg.model, device="meta")
    ckpt.load_weights(model, tensors, str(source))  # strict: every weight present, with the run's shapes
    aliases = {head for head, _ in getattr(model, "tied", [])}
    tensors = {k: v for k, v in tensors.items() if k not in aliases}
    step_number = int(source.name[len("step-"):])
    record = {"run": str(run.resolve()), "step": step_number, "format": fmt}

    out.parent.mkdir(parents=True, exist_ok=True)
    staged = temporary_dir(out.parent, f".{out.name}.")
    try:
        for name in layout.CARRIED:
            item = run / name
            if item.is_dir():
                shutil.copytree(item, staged / name)
            elif item.is_file():
                with writing(staged / name):
                    shutil.copy2(item, staged / name)
        ckpt.save_tensors(tensors, staged / layout.WEIGHTS, {EXPORT_KEY: json.dumps(record)})
        if out.exists():
            shutil.rmtree(out)
        os.replace(staged, out)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return Exported(out=out, step=step_number, source=source, source_format=fmt, tensors=len(tensors),
                    parameters=sum(t.numel() for t in tensors.values()),
                    bytes=sum(t.numel() * t.element_size() for t in tensors.values()))
