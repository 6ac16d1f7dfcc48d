"""The student of ``pentad compress --distill layers=N``: the teacher run's model with N encoder layers,
each initialised from its mapped teacher layer (student layer i <- teacher layer ``layer_map[i]``, by
default evenly spaced with the last on the last), embeddings and heads copied; written as a run-like
directory that the distillation fine-tuning starts from (``init=``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from pentad.builder import build_model
from pentad.compression.store import check_output, load_run_model, write_run
from pentad.errors import UserError
from pentad.training.config import DistillConfig
from pentad.training.distill import default_layer_map, transformer_layers

LAYER_KEY = re.compile(r"^encoder\.layers\.(\d+)\.(.*)$")


@dataclass
class Student:
    out: Path
    layers: int
    teacher_layers: int
    layer_map: list[int]
    parameters: tuple[int, int]  # (student, teacher)

    def render(self) -> str:
        return (f"student of {self.layers} layers from the teacher's {self.teacher_layers} (layers "
                f"{self.layer_map}), {self.parameters[1]:,} -> {self.parameters[0]:,} parameters: {self.out}")


def make_student(run: Path, out: Path, layers: int, layer_map: list[int] | None = None,
                 overwrite: bool = False) -> Student:
    """Write the initial student of ``run`` with ``layers`` encoder layers to ``out`` (module docstring)."""
    run, out = Path(run), Path(out)
    check_output(run, out, overwrite)
    teacher, cfg, _ = load_run_model(run)
    transformer_layers(teacher)  # a transformer encoder, else a UserError
    if cfg.model.compression is not None:
        raise UserError(f"{run} is compressed already (model.compression is set): distil from the uncompressed run")
    if getattr(cfg.model.encoder, "share_layers", False):
        raise UserError(f"{run} shares one layer across its encoder (share_layers): there are no layers to "
                        "choose a student's from; give the student the same model and fewer steps instead")
    total = cfg.model.encoder.num_layers
    if not 1 <= layers < total:
        raise UserError(f"--distill layers={layers}: the student needs at least 1 and fewer layers than the teacher "
                        f"{run} ({total})")
    layer_map = list(layer_map) if layer_map is not None else default_layer_map(layers, total)
    if len(layer_map) != layers or not all(0 <= j < total for j in layer_map):
        raise UserError(f"--distill map {layer_map}: expected {layers} teacher layers, each 0 to {total - 1}")
    student_cfg = cfg.model_copy(deep=True)
    student_cfg.model = type(cfg.model).model_validate(
        {**cfg.model.model_dump(), "encoder": {**cfg.model.encoder.model_dump(), "num_layers": layers}})
    student_cfg.train.distill = DistillConfig()
    student_cfg.train.lora = None  # whole weights (a LoRA teacher's adapters are merged when read)
    student = build_model(student_cfg.model, training=False)
    source = teacher.state_dict()
    with torch.no_grad():
        for key, value in student.state_dict().items():
            match = LAYER_KEY.match(key)
            value.copy_(source[f"encoder.layers.{layer_map[int(match.group(1))]}.{match.group(2)}"] if match
                        else source[key])
    write_run(run, out, student_cfg, student, {"step": "student", "source": str(run.resolve()),
                                               "layer_map": layer_map})
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    return Student(out, layers, total, layer_map, (count(student), count(teacher)))
