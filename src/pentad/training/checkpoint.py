"""Checkpoints: weights as safetensors, training state loaded with ``weights_only=True``,
everything written atomically (temp file, then rename), weight loading strict by default.

A checkpoint directory (``RUN/checkpoints/step-N``) holds ``state.pt`` (the trainer's state) and the
weights in one of these formats:

- ``model.safetensors``: the whole model in one file (``single``, ``ddp``; also ``best/`` and
  ``pentad export``), optimizer state in ``state.pt``;
- ``dcp/``: a ``torch.distributed.checkpoint`` directory of model and optimizer shards (``fsdp``),
  with the format's marker in ``state.pt`` (:data:`FORMAT_KEY`);
- ``deepspeed/``: DeepSpeed's own checkpoint of ZeRO partitions (``deepspeed``).

:func:`read_checkpoint_weights` returns the whole model's tensors from any of them in one process
(no process group), which is what ``pentad export``, ``init=``, ``convert`` and ``generate`` read.
A sharded format is one entry of :data:`SHARDED_FORMATS` (its subdirectory -> its reader).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from pentad.config.dual_layout import legacy_key
from pentad.errors import UserError, writing
from pentad.files import atomic_path, atomic_write_text
from pentad.layout import (
    BEST,
    CHECKPOINTS,
    DCP,
    DEEPSPEED,
    LATEST,
    RESULTS,
    STATE,
    WEIGHTS,
    checkpoint_dir,
    latest_checkpoint,
    sharded_format,
    staging_dir,
    step_dirs,
)
from pentad.model import Model
from pentad.training import lora

FORMAT_KEY = "checkpoint_format"  # in state.pt of a sharded checkpoint: {"format": ..., "aliases": [...], ...}


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in a (nested) state: about what writing it needs on disk."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def saved_part(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Of ``model``'s state dict ``tensors``, what its weights files hold: tied aliases left out (a tied
    head weight is stored once, under the embedding) and, for a LoRA model (``model.lora``), only the
    tensors that train (adapters, trained heads): the frozen rest is its base's."""
    aliases = {head for head, _ in getattr(model, "tied", [])}
    lora = getattr(model, "lora", None)
    return {k: v for k, v in tensors.items() if k not in aliases and (lora is None or k in lora.saved)}


def model_metadata(model: nn.Module) -> dict[str, str]:
    """Metadata a weights file of ``model`` carries: the LoRA record of a LoRA model (how to merge it)."""
    lora = getattr(model, "lora", None)
    return lora.metadata() if lora is not None else {}


def weights_to_save(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict as weights files hold it (:func:`saved_part`)."""
    return {k: v.detach().contiguous() for k, v in saved_part(model, model.state_dict()).items()}


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``model``'s weights to a safetensors file atomically."""
    save_tensors(weights_to_save(model), path, {**(metadata or {}), **model_metadata(model)})


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write named tensors to a safetensors file atomically (temp file, then rename)."""
    with atomic_path(path) as tmp:
        tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
        with writing(path, needed=_tensor_bytes(tensors)):
            save_file(tensors, tmp, metadata={"format": "pt", **(metadata or {})})


def read_weights(path: Path, merge_adapters: bool = True, base: Path | None = None,
                 _seen: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, or the whole model of a checkpoint directory in any
    format (:func:`read_checkpoint_weights`; what :func:`find_weights` returns for a sharded one).

    A LoRA run's file (adapters only, :mod:`pentad.training.lora`) is merged into its base's weights
    (read the same way: the base may be a LoRA run too) unless ``merge_adapters`` is false (resuming
    the run itself); ``base``: the base's weights instead of the path the adapters recorded."""
    if path.is_dir():
        return read_checkpoint_weights(path, merge_adapters, base)
    if not path.is_file():
        raise UserError(f"weights file {path} does not exist")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"weights file {path} is truncated or corrupt and cannot be read ({e}); "
                        "use an earlier checkpoint") from None
    if not merge_adapters or not any(lora.is_adapter_key(k) for k in tensors):
        return tensors
    return merge_adapters_into_base(tensors, path, base, _seen)


def adapter_record(path: Path) -> dict[str, Any] | None:
    """The LoRA record (:mod:`pentad.training.lora`) of a weights file's metadata, or of a sharded
    checkpoint directory's format marker; None when there is none."""
    if path.is_dir() and not (path / WEIGHTS).is_file():
        state = load_state(path) if (path / STATE).is_file() else {}
        marker = state.get(FORMAT_KEY) if isinstance(state.get(FORMAT_KEY), dict) else {}
        # fsdp keeps the weights' metadata in its format marker, deepspeed beside it
        raw = (marker.get("metadata") or state.get("weights_metadata") or {}).get(lora.METADATA_KEY)
    else:
        raw = read_metadata(path / WEIGHTS if path.is_dir() else path).get(lora.METADATA_KEY)
    return lora.parse_record(raw, str(path)) if raw is not None else None


def merge_adapters_into_base(tensors: dict[str, torch.Tensor], path: Path, base: Path | None = None,
                             _seen: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """A LoRA run's saved ``tensors`` (read from ``path``) merged into its base's weights, which are read
    with :func:`read_weights` (from ``base`` when given, else from where the adapters' record says)."""
    record = adapter_record(path)
    if record is None:
        raise UserError(f"{path} holds LoRA adapters but not the record of how they apply "
                        f"({lora.METADATA_KEY} in its metadata)")
    base_path = Path(base) if base is not None else Path(record["base"])
    if str(path.resolve()) in _seen or len(_seen) > 16:
        raise UserError(f"the LoRA adapters in {path} lead back to themselves through their bases: "
                        + " -> ".join(_seen))
    if not base_path.exists():
        raise UserError(f"the LoRA adapters in {path} were trained on the base weights {base_path}, which do not "
                        "exist any more: put them back, or give their new place with `pentad merge-lora RUN "
                        "--base PATH`")
    base_tensors = read_weights(find_weights(base_path), _seen=(*_seen, str(path.resolve())))
    return lora.merge(base_tensors, tensors, record, str(path))


def check_adapter_base(model: nn.Module, path: Path) -> None:
    """Before a LoRA model (``model.lora``) resumes from ``path`` (a weights file or a sharded checkpoint
    directory, :func:`adapter_record`): the adapters there must
    have been trained on the base the model was just built on (a base trained further or replaced since
    is a UserError, not a silent change of course)."""
    own = getattr(model, "lora", None)
    saved = adapter_record(path) if own is not None else None
    if saved is None:
        return
    if saved.get("base_fingerprint") != own.record.get("base_fingerprint"):
        raise UserError(f"the LoRA adapters in {path} were trained on other base weights than init= holds now "
                        f"({own.record.get('base')}): was the base run trained further, or replaced? Resume with "
                        "the base they were trained on, or start a new run")


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
                 new_heads: tuple[str, ...] = (), drop_heads: bool = False, check_only: bool = False,
                 adapt: bool = False) -> list[str]:
    """Copy ``tensors`` into ``model``, strictly.

    Every model weight must be present with the right shape and every tensor must be used, else a
    UserError lists missing / unexpected / mis-shaped keys per slot. ``new_heads``: target names
    whose weights may be missing (a new, freshly initialised head). ``drop_heads``: tensors of
    targets the model does not have (pre-training heads when fine-tuning) are dropped, not errors.
    ``check_only``: only the checks (for a model whose weights are loaded otherwise, e.g. sharded).
    ``adapt``: first let the model adapt the tensors where that is well defined (an image position
    table trained at another resolution is interpolated: ``Model.adapt_checkpoint``), as when
    fine-tuning from a pre-trained run. Returns notes on what was allowed (new heads, dropped heads,
    adapted tables).
    """
    adapted_notes: list[str] = []
    plan = getattr(model, "stream_plan", None)
    if plan is not None and any(key.startswith("pair.") for key in tensors):
        # A checkpoint of the former dual layout: its second stream under pair.*.
        tensors = {legacy_key(key, plan.second): value for key, value in tensors.items()}
        adapted_notes.append(f"pair.embedding.* / pair.encoder.* (the former dual layout) read as "
                             f"streams.{plan.second}.*")
    if adapt and isinstance(model, Model):
        tensors = dict(tensors)
        adapted_notes += model.adapt_checkpoint(tensors)
    aliases = {head for head, _ in getattr(model, "tied", [])}
    own = {k: v for k, v in model.state_dict().items() if k not in aliases}
    adapted = getattr(model, "lora", None)  # a LoRA model: its frozen base weights may be left out
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
            if adapted is not None and key not in adapted.saved:
                continue
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
    if check_only:
        return notes
    with torch.no_grad():
        for key, param in own.items():
            if key in tensors:
                param.copy_(tensors[key])
    notes += adapted_notes
    if fresh:
        notes.append(f"new head(s) initialised from scratch: {', '.join(sorted(fresh))}")
    if dropped:
        notes.append(f"pre-training head(s) not used: {', '.join(sorted(dropped))}")
    return notes


# ------------------------------------------------------------------------------- checkpoints
def write_checkpoint_files(directory: Path, model: nn.Module, state: dict[str, Any],
                           metadata: dict[str, str] | None = None) -> None:
    """Write ``model``'s weights (``model.safetensors``) and ``state`` (``state.pt``) into ``directory``."""
    with writing(directory, needed=_tensor_bytes(weights_to_save(model)) + _tensor_bytes(state)):
        save_weights(model, directory / WEIGHTS, metadata)
        torch.save(state, directory / STATE)


def publish_checkpoint(run_dir: Path, step: int, staged: Path, keep: int = 2) -> Path:
    """Rename a complete staged checkpoint into ``checkpoints/step-N``, point ``latest`` at it and
    keep only the newest ``keep`` checkpoints."""
    final = checkpoint_dir(run_dir, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staged, final)
    atomic_write_text(run_dir / CHECKPOINTS / LATEST, final.name + "\n")
    # oldest first by step, not by name (step-9 sorts after step-10 as text); the checkpoint just
    # written is never removed, whatever the steps of the others (latest must not dangle)
    others = [path for _, path in step_dirs(run_dir) if path != final]
    for old in others[:max(0, len(others) - (keep - 1))]:
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
    """Weights of a run directory (its best or latest checkpoint), a checkpoint dir, or a file: a
    safetensors file, or a checkpoint directory whose weights are sharded (``dcp/``: an fsdp run);
    :func:`read_weights` reads either."""
    if path.is_file():
        return path
    if not path.exists():
        raise UserError(f"{path} does not exist (expected a run directory, checkpoint or .safetensors file)")
    for candidate in (path / WEIGHTS, path / BEST / WEIGHTS):
        if candidate.is_file():
            return candidate
    if sharded_format(path) is not None:
        return path
    latest = latest_checkpoint(path)
    if latest is not None:
        _check_missing_best(path, latest)
        return latest if sharded_format(latest) is not None and not (latest / WEIGHTS).is_file() \
            else latest / WEIGHTS
    raise UserError(f"{path} holds no weights: expected {WEIGHTS}, best/{WEIGHTS}, checkpoints/{LATEST} or a "
                    f"sharded checkpoint ({', '.join(f'{d}/' for d in SHARDED_FORMATS)})")


def _check_missing_best(run_dir: Path, latest: Path) -> None:
    """A finished fine-tuned run (``results.json``) whose best model is missing is not silently read from
    its latest checkpoint, which is another model unless it is of the best step (then a note says so)."""
    results = run_dir / RESULTS
    if not results.is_file():
        return
    try:
        best_step = json.loads(results.read_text(encoding="utf-8")).get("best_step")
    except (OSError, ValueError, AttributeError):
        best_step = None
    step = int(latest.name[len("step-"):]) if latest.name[len("step-"):].isdigit() else None
    if best_step is not None and best_step == step:
        from pentad.log import info

        info(f"note: {run_dir / BEST} is missing; reading the latest checkpoint, {latest.name}, which is of the "
             f"best step ({best_step}) in {results}")
        return
    raise UserError(f"{run_dir} is a fine-tuned run whose best model, {run_dir / BEST / WEIGHTS} (step {best_step} "
                    f"in {results}), is missing; its latest checkpoint, {latest.name}, is another model, and reading "
                    f"it instead would not be the model the run's results describe. Put {BEST}/ back, or name the "
                    f"checkpoint to use it as it is: {latest}")


# ------------------------------------------------------------------------------- sharded checkpoints
def read_checkpoint_weights(checkpoint: Path, merge_adapters: bool = True, base: Path | None = None
                            ) -> dict[str, torch.Tensor]:
    """The whole model's tensors of a checkpoint directory, whatever wrote it, consolidated in this
    process: ``model.safetensors``, or a sharded format of :data:`SHARDED_FORMATS`. Tied aliases are
    left out, as in ``model.safetensors`` (:func:`weights_to_save`); LoRA adapters are merged into
    their base (or ``base``) unless ``merge_adapters`` is false (:func:`read_weights`)."""
    if (checkpoint / WEIGHTS).is_file():
        return read_weights(checkpoint / WEIGHTS, merge_adapters, base)
    name = sharded_format(checkpoint)
    if name is None:
        raise UserError(f"{checkpoint} holds no weights: expected {WEIGHTS} or a sharded checkpoint "
                        f"({', '.join(f'{d}/' for d in SHARDED_FORMATS)})")
    tensors = SHARDED_FORMATS[name](checkpoint)
    if merge_adapters and any(lora.is_adapter_key(k) for k in tensors):
        return merge_adapters_into_base(tensors, checkpoint, base)
    return tensors


def format_marker(checkpoint: Path) -> dict[str, Any]:
    """The format record a sharded checkpoint keeps in its ``state.pt`` ({} when there is none)."""
    if not (checkpoint / STATE).is_file():
        return {}
    marker = load_state(checkpoint).get(FORMAT_KEY)
    return marker if isinstance(marker, dict) else {}


def _dcp_reader(directory: Path) -> Any:
    """A ``FileSystemReader`` whose metadata is unpickled with an allow-list of DCP's own record
    classes (DCP pickles its ``.metadata``; pentad never unpickles arbitrary objects)."""
    import pickle

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            allowed = (
                (module == "torch.distributed.checkpoint.metadata" and not name.startswith("__"))
                or (module, name) in {("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
                                      ("torch", "Size"), ("torch.serialization", "_get_layout"),
                                      ("collections", "OrderedDict")}
                or (module == "pathlib" and name in {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"})
                or (module == "torch" and isinstance(getattr(torch, name, None),
                                                     (torch.dtype, torch.layout, torch.memory_format))))
            value = super().find_class(module, name) if allowed else None
            # from the metadata module, only its record classes (dataclasses, enums), not what it imports
            if value is None or (module.endswith(".metadata") and not (
                    isinstance(value, type) and value.__module__ == module)):
                raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")
            return value

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            rank = kwargs.get("rank")
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            with open(Path(self.path) / name, "rb") as f:
                metadata = Unpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(directory))


def _dcp_planner() -> Any:
    """DCP's default load planner, reading non-tensor values with ``weights_only=True``."""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafePlanner()


def load_dcp(state: dict[str, Any], checkpoint: Path, no_dist: bool = False) -> None:
    """Fill ``state`` (nested dicts of tensors, sharded or not) in place from the ``dcp/`` directory of
    ``checkpoint``; what is not there, or a corrupt file, is a UserError. Every rank calls it (or one
    process, ``no_dist``); DCP reads the parts each rank's shards need, whatever world size wrote them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    directory = checkpoint / DCP
    if not (directory / ".metadata").is_file():
        raise UserError(f"checkpoint {checkpoint} has no {DCP}/.metadata: it was not completely written")
    try:
        with warnings.catch_warnings():  # one process on purpose (DCP warns that it assumes so)
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=_dcp_reader(directory), planner=_dcp_planner(), no_dist=no_dist)
    except CheckpointException as e:  # DCP gathers every rank's failure into one
        causes = [failure[0] for failure in e.failures.values()] or [e]
        raise _dcp_error(directory, causes[0]) from None
    except Exception as e:  # noqa: BLE001 - sorted out by _dcp_error (re-raised when not a file problem)
        raise _dcp_error(directory, e) from None


def _dcp_error(directory: Path, error: BaseException) -> BaseException:
    """A UserError for an unreadable or mismatched DCP checkpoint; any other error as it is."""
    import pickle

    text = str(error).splitlines()[0][:300] if str(error) else ""
    if isinstance(error, (pickle.UnpicklingError, EOFError, OSError)) or "PytorchStreamReader" in str(error):
        return UserError(f"sharded checkpoint {directory} is truncated or corrupt and cannot be read "
                         f"({type(error).__name__}: {text}); use an earlier checkpoint")
    if isinstance(error, (RuntimeError, ValueError, KeyError, AssertionError)) and any(
            key in str(error) for key in ("Missing key", "mismatch", "does not match")):
        return UserError(f"sharded checkpoint {directory} does not match this model and optimizer (was it "
                         f"trained with another config?): {text}")
    return error


def read_dcp_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The whole model of a DCP checkpoint (``dcp/``), consolidated in this process on the CPU."""
    import pickle

    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    directory = checkpoint / DCP
    if not (directory / ".metadata").is_file():
        raise UserError(f"checkpoint {checkpoint} has no {DCP}/.metadata: it was not completely written")
    aliases = set(format_marker(checkpoint).get("aliases", []))
    try:
        metadata = _dcp_reader(directory).read_metadata()
    except (pickle.UnpicklingError, EOFError, OSError) as e:
        raise UserError(f"sharded checkpoint {directory} has an unreadable .metadata ({type(e).__name__}: "
                        f"{e}); use an earlier checkpoint") from None
    tensors = {key[len("model."):]: torch.empty(tuple(item.size), dtype=item.properties.dtype)
               for key, item in metadata.state_dict_metadata.items()
               if key.startswith("model.") and isinstance(item, TensorStorageMetadata)}
    tensors = {k: v for k, v in tensors.items() if k not in aliases}
    if not tensors:
        raise UserError(f"sharded checkpoint {directory} holds no model weights")
    load_dcp({"model": tensors}, checkpoint, no_dist=True)
    return tensors


def read_deepspeed_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The whole model of a ``deepspeed`` checkpoint (``deepspeed/``: ZeRO partitions), consolidated
    in this process (:func:`pentad.training.zero_checkpoint.read_weights`; needs the DeepSpeed package)."""
    from pentad.training import zero_checkpoint

    return zero_checkpoint.read_weights(checkpoint)


# Sharded checkpoint formats: the subdirectory of a checkpoint that holds them -> a reader of the whole
# model's tensors from the checkpoint directory (in one process; tied aliases left out). Another
# engine's format is one more entry here.
SHARDED_FORMATS: dict[str, Callable[[Path], dict[str, torch.Tensor]]] = {
    DCP: read_dcp_weights, DEEPSPEED: read_deepspeed_weights}
