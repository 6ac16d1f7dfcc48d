"""``pentad merge-lora RUN --output OUT``: a LoRA run's adapters folded into its base weights.

OUT is a plain run directory: ``model.safetensors`` (the base with ``W += alpha/rank * B A`` on every
adapted block of rows, and the run's trained heads), the run's ``config.yaml`` without ``train.lora``,
its tokenizer(s) and task state. ``pentad infer``, ``generate``, ``export``, ``convert pentad-to-hf``
and ``init=OUT`` read it like any run, without the base.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pentad import layout
from pentad.builder import build_model
from pentad.errors import UserError
from pentad.outputs import OutputLock, check_apart, check_replaceable
from pentad.runs import load_run
from pentad.training import checkpoint as ckpt
from pentad.training import lora
from pentad.training.export import write_derived_run

MERGED_KEY = "pentad_merged_lora"  # metadata of OUT/model.safetensors: where it came from


@dataclass
class Merged:
    out: Path
    source: Path
    base: str
    modules: int
    rank: int
    tensors: int
    bytes: int

    def render(self) -> str:
        return (f"merged the LoRA adapters of {self.source} (rank {self.rank}, {self.modules} projection(s)) into "
                f"their base {self.base}: wrote {self.out / layout.WEIGHTS}, {self.tensors} tensors, "
                f"{self.bytes / 1e6:,.1f} MB")


def merge_run(run: Path, out: Path, base: Path | None = None, overwrite: bool = False) -> Merged:
    """Write the merged model of the LoRA run ``run`` (its best model, else its latest checkpoint) to
    ``out`` (see the module docstring). ``base``: the base weights, when they moved since training."""
    run, out = Path(run), Path(out)
    check_apart(out, "--output", [("run directory", run), ("--base", base)])
    with OutputLock(out, "--output", "pentad merge-lora"):  # from the checks to the last write
        return _merge_run(run, out, base, overwrite)


def _merge_run(run: Path, out: Path, base: Path | None, overwrite: bool) -> Merged:
    cfg, _ = load_run(run)
    if cfg.train.lora is None:
        raise UserError(f"{run} is not a LoRA run (its config has no train.lora): its weights are whole already; "
                        "`pentad export` writes them as one file")
    check_replaceable(out, "--output", overwrite, "merge-lora")
    source = ckpt.find_weights(run)
    record = ckpt.adapter_record(source)
    if record is None:
        raise UserError(f"{source} holds no LoRA adapters (no {lora.METADATA_KEY} record in its metadata)")
    check_apart(out, "--output", [("base weights", base or record.get("base"))])
    tensors = ckpt.read_weights(source, base=base)
    model = build_model(cfg.model, device="meta")
    ckpt.load_weights(model, tensors, str(source), check_only=True)  # every weight present, the run's shapes
    aliases = {head for head, _ in getattr(model, "tied", [])}
    tensors = {k: v for k, v in tensors.items() if k not in aliases}
    merged_cfg = cfg.model_copy(deep=True)
    merged_cfg.train.lora = None
    info = {"run": str(run.resolve()), "weights": str(source.resolve()), "base": str(base or record["base"]),
            "rank": record.get("rank"), "alpha": record.get("alpha"), "modules": len(record["modules"])}

    write_derived_run(run, out, merged_cfg, lambda path: ckpt.save_tensors(
        tensors, path, {MERGED_KEY: json.dumps(info)}))
    return Merged(out=out, source=source, base=info["base"], modules=len(record["modules"]),
                  rank=int(record.get("rank", 0)), tensors=len(tensors),
                  bytes=sum(t.numel() * t.element_size() for t in tensors.values()))
