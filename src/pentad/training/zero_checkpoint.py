"""DeepSpeed's checkpoint files inside a pentad checkpoint: import, safety check, consolidation.

The ``deepspeed`` strategy writes DeepSpeed's own checkpoint into ``checkpoints/step-N/deepspeed/``
(tag ``zero``: model states and each rank's optimizer partition, ``torch.save`` files) beside
pentad's ``state.pt``. DeepSpeed reads those files with ``torch.load(weights_only=False)``, and
its converters (``ds_to_universal``) search the whole folder, sub-folders and any suffix, for names
they know; pentad never unpickles arbitrary objects, so :func:`check_files` first allows in
``deepspeed/`` only the files the strategy writes, by name (anything else is refused before
DeepSpeed looks), reads each state file with ``weights_only=True`` and an allow-list of the three
record classes DeepSpeed puts in them, and refuses parameter names that DeepSpeed's converter would
turn into paths outside its own folder.

:func:`read_weights` consolidates the partitions into the whole model's fp32 weights in one
process, without a launcher (DeepSpeed's ``zero_to_fp32``), for ``pentad export`` and ``init=``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from pentad.errors import UserError
from pentad.files import temporary_dir
from pentad.layout import DEEPSPEED

TAG = "zero"             # DeepSpeed's checkpoint tag (one DeepSpeed checkpoint per pentad checkpoint)
UNIVERSAL_TAG = "universal"
# what DeepSpeed (0.19) writes for the strategy, and all check_files lets it read: the recovery
# scripts it copies beside the tag (never run by pentad), and in the tag's folder each rank's model
# and optimizer states (stages 1-2: mp_rank_00_model_states.pt; stage 3: zero_pp_rank_R_mp_rank_00_
# model_states.pt; optimizer: [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt)
SCRIPTS = frozenset({"zero_to_fp32.py", "zero_to_torch.py"})
STATE_FILE = re.compile(r"(?:mp_rank_\d+_model|(?:bf16_)?zero_pp_rank_\d+_mp_rank_\d+_(?:model|optim))_states\.pt")
INSTALL_HINT = "pip install 'pentad[deepspeed]'"


def import_deepspeed(device: torch.device | None = None, why: str = "train.strategy=deepspeed") -> Any:
    """``import deepspeed``, telling it the accelerator first: DeepSpeed picks one at import
    (``DS_ACCELERATOR``), and on a machine without CUDA, or for a run on ``train.device=cpu``, it
    must be the CPU. A missing package is a UserError naming the extra."""
    if "DS_ACCELERATOR" not in os.environ and (
            (device is not None and device.type == "cpu") or not torch.cuda.is_available()):
        os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        import deepspeed
    except ImportError as e:
        raise UserError(f"{why} needs the DeepSpeed package, which is not installed ({e}): {INSTALL_HINT}") from None
    if os.environ.get("DS_ACCELERATOR") == "cpu":
        _skip_inference_op(deepspeed)
    return deepspeed


def _skip_inference_op(deepspeed: Any) -> None:
    """Keep DeepSpeed from compiling its shared-memory all-reduce op on the CPU.

    DeepSpeed's communication backend builds that op when it starts (a C++ compile of about 1.5
    minutes on 2 cores, at the first start on a machine), but only DeepSpeed's inference all-reduce
    uses it: training's collectives go through ``torch.distributed`` (gloo). DeepSpeed builds only the
    ops its table in ``deepspeed.ops`` lists as compatible (0.19), so the op is listed as not."""
    compatible = getattr(getattr(deepspeed, "ops", None), "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


def _record_classes() -> list[Any]:
    """The non-tensor classes DeepSpeed pickles into its checkpoint files (0.19): its loss scaler's
    settings, the ZeRO stage enum, and the address of a parameter's fragment in a flat partition."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def _unexpected(root: Path, path: Path) -> UserError:
    """The refusal of an entry of ``root`` the strategy does not write (of a folder: its first file;
    a link is named as it is, not followed)."""
    kind = "folder" if path.is_dir() else "file"
    if kind == "folder" and not path.is_symlink():
        for folder, names, files in os.walk(path):  # stops at the first file
            names.sort()
            if files:
                kind, path = "file", Path(folder) / min(files)
                break
    return UserError(
        f"DeepSpeed checkpoint {root} holds the {kind} {path}, which the deepspeed strategy does not write: "
        "DeepSpeed's loaders search this whole folder (sub-folders and any suffix) and unpickle what they "
        f"find, so pentad lets them read only {TAG}/ with DeepSpeed's state files (mp_rank_00_model_states.pt, "
        f"zero_pp_rank_0_mp_rank_00_optim_states.pt, ...) and {', '.join(sorted(SCRIPTS))}. Remove it if you "
        "put it there, or use an earlier checkpoint")


def _parameter_names(state: Any) -> list[Any]:
    """The parameter names in a DeepSpeed state file that ``ds_to_universal`` makes folders of
    (model states' ``module``, ``param_shapes``, frozen and shared parameters, buffers; the
    optimizer's ``param_slice_mappings``)."""
    if not isinstance(state, dict):
        return []
    names: list[Any] = []
    for key in ("module", "frozen_param_shapes", "frozen_param_fragments", "shared_params"):
        if isinstance(state.get(key), dict):
            names += list(state[key])
    if isinstance(state.get("shared_params"), dict):
        names += list(state["shared_params"].values())
    if isinstance(state.get("buffer_names"), (list, tuple)):
        names += list(state["buffer_names"])
    optimizer = state.get("optimizer_state_dict")
    for groups in (state.get("param_shapes"),
                   optimizer.get("param_slice_mappings") if isinstance(optimizer, dict) else None):
        for group in groups if isinstance(groups, (list, tuple)) else []:
            if isinstance(group, dict):
                names += list(group)
    return names


def _is_plain_name(name: Any) -> bool:
    """Whether ``name`` stays one path component when DeepSpeed joins it to a folder."""
    return not isinstance(name, str) or (name not in ("", ".", "..") and "\0" not in name
                                         and os.path.basename(name) == name)


def check_files(checkpoint: Path) -> list[Path]:
    """Check the DeepSpeed folder of ``checkpoint`` (a pentad checkpoint directory) before DeepSpeed
    reads it: every entry must be one the strategy writes (:data:`SCRIPTS` beside the tag's folder,
    state files named as :data:`STATE_FILE` in it, no sub-folder); each state file is read with
    ``weights_only=True`` and DeepSpeed's record classes allowed, and its parameter names must be
    plain names. Anything else, or an unreadable file, is a UserError naming it. Returns the state files."""
    root = checkpoint / DEEPSPEED
    directory = root / TAG
    files = sorted(p for p in directory.iterdir() if STATE_FILE.fullmatch(p.name)) if directory.is_dir() else []
    if not files:
        raise UserError(f"checkpoint {checkpoint} has no DeepSpeed files in {DEEPSPEED}/{TAG}: it was not "
                        "written by the deepspeed strategy, or not completely")
    for path in sorted(root.iterdir()):
        if not ((path.name == TAG and path.is_dir()) or (path.name in SCRIPTS and path.is_file())):
            raise _unexpected(root, path)
    for path in sorted(directory.iterdir()):
        if not (STATE_FILE.fullmatch(path.name) and path.is_file()):
            raise _unexpected(root, path)
    allowed = _record_classes()
    for path in files:
        try:
            with torch.serialization.safe_globals(allowed):
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # noqa: BLE001 - any failure: not a file pentad will let DeepSpeed unpickle
            try:
                unsafe = [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(path)
                          if g not in {f"{c.__module__}.{c.__qualname__}" for c in allowed}]
            except Exception:  # noqa: BLE001 - not even a readable archive
                unsafe = []
            what = (f"it holds objects other than tensors and DeepSpeed's checkpoint records ({', '.join(unsafe)})"
                    if unsafe else f"it is truncated or corrupt ({type(e).__name__})")
            raise UserError(f"DeepSpeed checkpoint file {path} is not loaded: {what}; pentad never unpickles "
                            "arbitrary objects. Use an earlier checkpoint") from None
        odd = [n for n in _parameter_names(state) if not _is_plain_name(n)]
        if odd:
            raise UserError(f"DeepSpeed checkpoint file {path} is not loaded: it names a parameter {odd[0]!r}, "
                            "which is not a plain name (DeepSpeed's converter makes a folder of each parameter's "
                            "name, and this one leads outside it). Use an earlier checkpoint")
    return files


def read_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The whole model's fp32 weights of a ``deepspeed`` checkpoint, consolidated from its ZeRO
    partitions in this process (DeepSpeed's ``zero_to_fp32``; any stage, any number of ranks).
    Parameters shared by two names (tied weights) are returned once, under the first name."""
    import contextlib
    import io

    import_deepspeed(why=f"reading the DeepSpeed checkpoint {checkpoint}")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    files = check_files(checkpoint)
    shared: set[str] = set()
    for path in files:
        if path.name.endswith("model_states.pt"):
            with torch.serialization.safe_globals(_record_classes()):
                states = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            shared |= set((states.get("shared_params") or {}).keys())
            break
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its progress
        tensors = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint / DEEPSPEED), tag=TAG)
    return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items() if k not in shared}


def to_universal(checkpoint: Path, out: Path) -> None:
    """Convert the DeepSpeed checkpoint of ``checkpoint`` into DeepSpeed's universal format in
    ``out`` (every parameter's fp32 value and optimizer state whole, loadable on any number of
    ranks; ``deepspeed.checkpoint.ds_to_universal``), in this process."""
    import argparse
    import contextlib
    import io

    import_deepspeed(why=f"resharding the DeepSpeed checkpoint {checkpoint}")
    from deepspeed.checkpoint import ds_to_universal

    check_files(checkpoint)
    args = argparse.Namespace(input_folder=str(checkpoint / DEEPSPEED / TAG), output_folder=str(out),
                              num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False, strict=True,
                              inject_missing_state=True)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its progress
        ds_to_universal.main(args)


def read_adam_states(checkpoint: Path, names: list[str]) -> tuple[torch.Tensor, dict[str, dict[str, torch.Tensor]]]:
    """Adam's step and each named parameter's whole moments (``exp_avg``, ``exp_avg_sq``) of a
    ``deepspeed`` checkpoint, in this process: for a strategy that keeps the whole optimizer state
    (``single``, ``ddp``) resuming a ``deepspeed`` run. Converted through DeepSpeed's universal
    checkpoint in a temporary directory beside the checkpoint; every file read with ``weights_only=True``."""
    import shutil

    staged = temporary_dir(checkpoint.parent, f".{checkpoint.name}.universal.")
    try:
        to_universal(checkpoint, staged / UNIVERSAL_TAG)
        root = staged / UNIVERSAL_TAG / "zero"
        # ZeRO-1/2 keep a step per parameter (step.pt), ZeRO-3 one per partition (optimizer_state.pt)
        steps = [torch.load(path, map_location="cpu", weights_only=True) for path in root.glob("*/step.pt")]
        if not steps:
            with torch.serialization.safe_globals(_record_classes()):
                common = torch.load(root / "optimizer_state.pt", map_location="cpu", weights_only=True)
            state = (common.get("optimizer_state_dict") or {}).get("state") or {}
            steps = [s["step"] for s in state.values() if "step" in s]
        if not steps:
            raise UserError(f"DeepSpeed checkpoint {checkpoint} holds no optimizer step (was it saved before the "
                            "first step?)")
        moments: dict[str, dict[str, torch.Tensor]] = {}
        for name in names:
            moments[name] = {}
            for key in ("exp_avg", "exp_avg_sq"):
                path = root / name / f"{key}.pt"
                if not path.is_file():
                    raise UserError(f"DeepSpeed checkpoint {checkpoint} has no {key} for {name}: it was written "
                                    "for another model")
                value = torch.load(path, map_location="cpu", weights_only=True)
                moments[name][key] = value["param"] if isinstance(value, dict) else value
        return torch.as_tensor(max(float(s) for s in steps), dtype=torch.float32), moments
    finally:
        shutil.rmtree(staged, ignore_errors=True)
