"""Checkpoints: weights as safetensors, training state loaded with ``weights_only=True``,
everything written atomically (temp file, then rename), weight loading strict by default."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from pentad.errors import UserError, writing

WEIGHTS = "model.safetensors"
STATE = "state.pt"
CHECKPOINTS = "checkpoints"
LATEST = "latest"


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in a (nested) state: about what writing it needs on disk."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def weights_to_save(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without tied aliases (a tied head weight is stored once, under the embedding)."""
    aliases = {head for head, _ in getattr(model, "tied", [])}
    return {k: v.detach().contiguous() for k, v in model.state_dict().items() if k not in aliases}


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``model``'s weights to a safetensors file atomically."""
    save_tensors(weights_to_save(model), path, metadata)


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write named tensors to a safetensors file atomically (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
        with writing(path, needed=_tensor_bytes(tensors)):
            save_file(tensors, tmp, metadata={"format": "pt", **(metadata or {})})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise UserError(f"weights file {path} does not exist")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"weights file {path} is truncated or corrupt and cannot be read ({e}); "
                        "use an earlier checkpoint") from None


def read_metadata(path: Path) -> dict[str, str]:
    """The string metadata of a safetensors file (without reading its tensors)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"weights file {path} is truncated or corrupt and cannot be read ({e})") from None


def read_torch_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A ``torch.save``d state dict (``.bin``), loaded with ``weights_only=True``: never unpickles
    arbitrary objects. Accepts a ``{"state_dict": ...}`` wrapper and DDP's ``module.`` key prefix."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure means an unreadable or unsafe file
        raise UserError(f"{path} cannot be read as a PyTorch state dict with weights_only=True "
                        f"({type(e).__name__}: {e}); pentad never unpickles arbitrary objects.") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path} does not hold a state dict (a mapping of names to tensors).")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return dict(state)


def _slot(key: str) -> str:
    parts = key.split(".")
    return ".".join(parts[:2]) if parts[0] in ("targets",) else parts[0]


def load_weights(model: nn.Module, tensors: dict[str, torch.Tensor], source: str,
                 new_heads: tuple[str, ...] = (), drop_heads: bool = False) -> list[str]:
    """Copy ``tensors`` into ``model``, strictly.

    Every model weight must be present with the right shape and every tensor must be used, else a
    UserError lists missing / unexpected / mis-shaped keys per slot. ``new_heads``: target names
    whose weights may be missing (a new, freshly initialised head). ``drop_heads``: tensors of
    targets the model does not have (pre-training heads when fine-tuning) are dropped, not errors.
    Returns notes on what was allowed (new heads, dropped heads).
    """
    aliases = {head for head, _ in getattr(model, "tied", [])}
    own = {k: v for k, v in model.state_dict().items() if k not in aliases}
    problems: dict[str, list[str]] = defaultdict(list)
    notes: list[str] = []
    new_prefixes = tuple(f"targets.{h}." for h in new_heads)
    target_names = {k.split(".")[1] for k in own if k.startswith("targets.")}
    dropped: set[str] = set()
    for key, value in tensors.items():
        if key in aliases:
            continue
        if key not in own:
            if drop_heads and key.startswith("targets.") and key.split(".")[1] not in target_names:
                dropped.add(key.split(".")[1])
                continue
            problems[_slot(key)].append(f"unexpected {key} {tuple(value.shape)}")
        elif tuple(own[key].shape) != tuple(value.shape):
            problems[_slot(key)].append(f"mis-shaped {key}: checkpoint {tuple(value.shape)}, "
                                        f"model {tuple(own[key].shape)}")
    fresh: set[str] = set()
    for key, value in own.items():
        if key not in tensors:
            if key.startswith(new_prefixes):
                fresh.add(key.split(".")[1])
            else:
                problems[_slot(key)].append(f"missing {key} {tuple(value.shape)}")
    if problems:
        lines = []
        for slot, items in sorted(problems.items()):
            groups = []
            for kind in ("missing", "unexpected", "mis-shaped"):
                found = [i[len(kind) + 1:] for i in items if i.startswith(kind + " ")]
                if found:
                    shown = "; ".join(found[:4]) + (f"; ... {len(found) - 4} more" if len(found) > 4 else "")
                    groups.append(f"{len(found)} {kind} ({shown})")
            lines.append(f"{slot}: " + ", ".join(groups))
        raise UserError(f"weights in {source} do not match the model (was it trained with another config?): "
                        + " | ".join(lines))
    with torch.no_grad():
        for key, param in own.items():
            if key in tensors:
                param.copy_(tensors[key])
    if fresh:
        notes.append(f"new head(s) initialised from scratch: {', '.join(sorted(fresh))}")
    if dropped:
        notes.append(f"pre-training head(s) not used: {', '.join(sorted(dropped))}")
    return notes


# ------------------------------------------------------------------------------- checkpoints
def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{step:08d}"


def write_checkpoint_files(directory: Path, model: nn.Module, state: dict[str, Any],
                           metadata: dict[str, str] | None = None) -> None:
    """Write ``model``'s weights (``model.safetensors``) and ``state`` (``state.pt``) into ``directory``."""
    with writing(directory, needed=_tensor_bytes(weights_to_save(model)) + _tensor_bytes(state)):
        save_weights(model, directory / WEIGHTS, metadata)
        torch.save(state, directory / STATE)


def staging_dir(run_dir: Path, step: int) -> Path:
    """A new empty temporary directory beside the checkpoint of ``step`` (renamed into place by
    :func:`publish_checkpoint`; removed by :func:`remove_temporaries` if a run dies first)."""
    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))


def publish_checkpoint(run_dir: Path, step: int, staged: Path, keep: int = 2) -> Path:
    """Rename a complete staged checkpoint into ``checkpoints/step-N``, point ``latest`` at it and
    keep only the newest ``keep`` checkpoints."""
    final = checkpoint_dir(run_dir, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staged, final)
    atomic_write_text(run_dir / CHECKPOINTS / LATEST, final.name + "\n")
    existing = sorted(p for p in (run_dir / CHECKPOINTS).glob("step-*") if p.is_dir())
    for old in existing[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, state: dict[str, Any],
                    keep: int = 2, metadata: dict[str, str] | None = None) -> Path:
    """Write weights + state into ``checkpoints/step-N`` atomically, point ``latest`` at it,
    and keep only the newest ``keep`` checkpoints (one process; the Trainer goes through its strategy)."""
    tmp = staging_dir(run_dir, step)
    try:
        write_checkpoint_files(tmp, model, state, metadata)
        return publish_checkpoint(run_dir, step, tmp, keep)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints kept in a run directory, oldest first."""
    steps = []
    for path in (run_dir / CHECKPOINTS).glob("step-*"):
        suffix = path.name[len("step-"):]
        if path.is_dir() and suffix.isdigit() and (path / STATE).is_file():
            steps.append(int(suffix))
    return sorted(steps)


def remove_temporaries(run_dir: Path, keep: tuple[str, ...] = ()) -> list[Path]:
    """Delete what an interrupted atomic write left behind in a run directory (``checkpoints/.step-*``
    directories, ``.NAME.XXXX`` temporary files); returns what was removed.

    Every temporary pentad writes is named ``.`` + the final name + ``.`` + a random part, so a
    hidden name with a second dot is one; ``keep`` lists hidden names that are not (the run lock).
    Call it only while holding the run directory's lock: a running writer's files look the same.
    """
    removed = []
    for directory in (run_dir, run_dir / CHECKPOINTS, run_dir / "best", run_dir / "tokenizer",
                      run_dir / "target_tokenizer"):
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            name = entry.name
            if not name.startswith(".") or "." not in name[1:] or name in keep:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return None
    path = run_dir / CHECKPOINTS / pointer.read_text().strip()
    return path if path.is_dir() else None


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The training state (optimizer, schedule, RNG, data position); never unpickles objects."""
    path = checkpoint / STATE
    if not path.is_file():
        raise UserError(f"checkpoint {checkpoint} has no {STATE}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure here means an unreadable file
        raise UserError(f"training state {path} is truncated or corrupt and cannot be read "
                        f"({type(e).__name__}); use an earlier checkpoint") from None


def find_weights(path: Path) -> Path:
    """Weights of a run directory (its best or latest checkpoint), a checkpoint dir, or a file."""
    if path.is_file():
        return path
    if not path.exists():
        raise UserError(f"{path} does not exist (expected a run directory, checkpoint or .safetensors file)")
    for candidate in (path / WEIGHTS, path / "best" / WEIGHTS):
        if candidate.is_file():
            return candidate
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest / WEIGHTS
    raise UserError(f"{path} holds no weights: expected {WEIGHTS}, best/{WEIGHTS} or checkpoints/{LATEST}")


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
