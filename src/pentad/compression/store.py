"""Reading a run's model and writing a compressed run directory.

A compressed run is a run-like directory (as ``pentad export`` writes): ``model.safetensors``, the
``config.yaml`` whose ``model.compression`` records what was done (pruned block sizes, int8), the
tokenizer(s) and the task state. Every reader builds its model from that config (the builder applies
``model.compression`` before the weights are read), so ``pentad infer``, ``generate``, ``init=`` and
``--teacher`` take it like any run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from pentad.builder import build_model
from pentad.config.model import CompressionConfig
from pentad.outputs import check_apart, check_replaceable
from pentad.runs import load_run
from pentad.training import checkpoint as ckpt
from pentad.training.export import write_derived_run

COMPRESS_KEY = "pentad_compress"  # metadata of OUT/model.safetensors: where it came from, what was done


def load_run_model(run: Path) -> tuple[nn.Module, Any, Any]:
    """(model in eval mode with the run's best or latest weights, config, tokenizer) of ``run``."""
    run = Path(run)
    cfg, tokenizer = load_run(run)
    weights = ckpt.find_weights(run)
    model = build_model(cfg.model, training=False)
    ckpt.load_weights(model, ckpt.read_weights(weights), str(weights))
    return model.eval(), cfg, tokenizer


def check_output(run: Path, out: Path, overwrite: bool, option: str = "--output") -> None:
    """``out`` may receive a compressed run of ``run`` (apart from it; new, or ``overwrite``); call it
    holding ``out``'s :class:`~pentad.outputs.OutputLock`."""
    check_apart(out, option, [("run directory", run)])
    check_replaceable(out, option, overwrite, "compress")


def write_run(source: Path, out: Path, cfg: Any, model: nn.Module, record: dict[str, Any]) -> Path:
    """Write ``model`` with ``cfg`` (its ``model.compression`` already set) to the run-like directory
    ``out``, carrying the source run's tokenizer(s) and task state; replaced atomically."""
    return write_derived_run(source, out, cfg, lambda path: ckpt.save_weights(
        model, path, {COMPRESS_KEY: json.dumps(record)}))


def weights_bytes(model: nn.Module) -> int:
    """Bytes of the tensors a weights file of ``model`` holds (tied aliases once)."""
    return sum(t.numel() * t.element_size() for t in ckpt.weights_to_save(model).values())


def with_compression(cfg: Any, **changes: Any) -> Any:
    """A copy of the run config ``cfg`` whose ``model.compression`` has ``changes`` (and no ``train.lora``)."""
    new = cfg.model_copy(deep=True)
    current = new.model.compression.model_dump() if new.model.compression is not None else {}
    new.model.compression = CompressionConfig(**{**current, **changes})
    new.train.lora = None  # the weights written are whole (a LoRA run's adapters merged when read)
    return new


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for name, b in model.named_buffers() if name.endswith("weight_int8"))

