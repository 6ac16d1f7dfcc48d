"""DeepSpeed's checkpoint files inside a pentad checkpoint: import, safety check, consolidation.

The ``deepspeed`` strategy writes DeepSpeed's own checkpoint into ``checkpoints/step-N/deepspeed/``
(tag ``zero``: model states and each rank's optimizer partition, ``torch.save`` files) beside
pentad's ``state.pt``. DeepSpeed reads those files with ``torch.load(weights_only=False)``; pentad
never unpickles arbitrary objects, so every file is first read with ``weights_only=True`` and an
allow-list of the three record classes DeepSpeed puts in them (:func:`check_files`): a file with
anything else is refused before DeepSpeed opens it.

:func:`read_weights` consolidates the partitions into the whole model's fp32 weights in one
process, without a launcher (DeepSpeed's ``zero_to_fp32``), for ``pentad export`` and ``init=``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from pentad.errors import UserError

DIRECTORY = "deepspeed"  # DeepSpeed's files inside a pentad checkpoint directory
TAG = "zero"             # DeepSpeed's checkpoint tag (one DeepSpeed checkpoint per pentad checkpoint)
UNIVERSAL_TAG = "universal"
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
    return deepspeed


def _record_classes() -> list[Any]:
    """The non-tensor classes DeepSpeed pickles into its checkpoint files (0.19): its loss scaler's
    settings, the ZeRO stage enum, and the address of a parameter's fragment in a flat partition."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def check_files(checkpoint: Path) -> list[Path]:
    """Read every DeepSpeed file of ``checkpoint`` (a pentad checkpoint directory) with
    ``weights_only=True`` and DeepSpeed's record classes allowed; a file holding any other object,
    or an unreadable one, is a UserError. Returns the files."""
    directory = checkpoint / DIRECTORY / TAG
    files = sorted(directory.glob("*.pt"))
    if not files:
        raise UserError(f"checkpoint {checkpoint} has no DeepSpeed files in {DIRECTORY}/{TAG}: it was not "
                        "written by the deepspeed strategy, or not completely")
    allowed = _record_classes()
    for path in files:
        try:
            with torch.serialization.safe_globals(allowed):
                torch.load(path, map_location="cpu", weights_only=True, mmap=True)
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
        tensors = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint / DIRECTORY), tag=TAG)
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
    args = argparse.Namespace(input_folder=str(checkpoint / DIRECTORY / TAG), output_folder=str(out),
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
    import tempfile

    staged = Path(tempfile.mkdtemp(dir=checkpoint.parent, prefix=f".{checkpoint.name}.universal."))
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
