"""Sequence-length warm-up (``train.curriculum``): early steps train on shorter sequences.

Step ``s`` of a run trains on its batches cut to their first ``length(s)`` positions; the length
grows from ``start_length`` to the objective's ``seq_length`` over ``steps`` steps, linearly or in
equal stages, rounded down to a multiple of ``multiple_of``. The length is a pure function of the
step, and the step of a micro-batch is its index divided by ``grad_accum``, so a run resumed from a
checkpoint (which records the micro-batches consumed) cuts every later batch exactly as an
uninterrupted run does.

Cutting keeps what an objective means only when every label is a label of a position: an objective
says so by leaving :attr:`~pentad.data.objectives.base.Objective.truncation_refused` at None (lm, mlm,
bilm). The others name the field that a shorter length would make wrong (next-sentence labels of a
second segment that the cut removes, decoder targets, prompt-only prefixes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pentad.errors import UserError

if TYPE_CHECKING:
    from pentad.components.base import Batch

# [B, S] input fields that are cut with the sequence; token-level labels ([B, S, ...]) are cut too.
CUT_FIELDS = ("tokens", "segments", "padding_mask", "positions")
# Fields a cut batch must not have: their positions are not the encoder's (or there are none).
UNCUT_FIELDS = ("decoder_tokens", "decoder_segments", "decoder_padding_mask", "decoder_positions", "pixels",
                "audio", "pair", "negative", "group_padding_mask")


@dataclass(frozen=True)
class LengthSchedule:
    """The curriculum's length of each step (and of each micro-batch, ``grad_accum`` per step)."""

    start_length: int
    steps: int
    full_length: int
    schedule: str = "linear"
    stages: int = 4
    multiple_of: int = 8
    grad_accum: int = 1

    @classmethod
    def from_config(cls, cfg: Any, full_length: int, grad_accum: int = 1) -> LengthSchedule | None:
        """From ``train.curriculum`` (a CurriculumConfig) and the objective's ``seq_length``; None without a
        length warm-up (``start_length`` null)."""
        if cfg.start_length is None:
            return None
        if cfg.start_length >= full_length:
            raise UserError(
                f"train.curriculum.start_length={cfg.start_length} is not shorter than the sequences it warms "
                f"up to (data.objective.seq_length={full_length}): nothing would be shortened. Use a "
                f"start_length below {full_length}, or remove train.curriculum")
        return cls(cfg.start_length, cfg.steps, full_length, cfg.schedule, cfg.stages, cfg.multiple_of, grad_accum)

    def length(self, step: int) -> int:
        """The sequence length of step ``step`` (0-based: the step being trained)."""
        if step >= self.steps:
            return self.full_length
        span = self.full_length - self.start_length
        if self.schedule == "step":
            stage = step * self.stages // self.steps
            raw = self.start_length + span * stage // self.stages
        else:
            raw = self.start_length + span * step // self.steps
        rounded = raw // self.multiple_of * self.multiple_of
        return min(self.full_length, max(self.start_length, rounded))

    def length_of_batch(self, index: int) -> int:
        """The length of micro-batch ``index`` (0-based count since the start of training)."""
        return self.length(index // self.grad_accum)

    def describe(self) -> str:
        return (f"curriculum: sequence length {self.start_length} -> {self.full_length} over {self.steps:,} steps "
                f"({self.schedule}" + (f", {self.stages} stages" if self.schedule == "step" else "")
                + f", multiples of {self.multiple_of})")


def check_objective(objective: Any) -> None:
    """UserError when ``train.curriculum`` cannot shorten this objective's batches (and why)."""
    reason = getattr(type(objective), "truncation_refused", "it does not declare that its batches may be cut")
    if reason is not None:
        raise UserError(f"train.curriculum: objective '{objective.name}' cannot be trained on shortened sequences: "
                        f"{reason}. Sequence-length warm-up works with the lm, mlm and bilm objectives; remove "
                        "train.curriculum for this one")


def truncate(batch: Batch, length: int) -> Batch:
    """``batch`` cut to its first ``length`` positions: tokens, segments, padding_mask, positions and every
    token-level label (``[B, S, ...]``). A batch no longer than ``length`` is returned as it is."""
    ref = batch.tokens
    if ref is None or ref.shape[1] <= length:
        return batch
    width = ref.shape[1]
    present = [name for name in UNCUT_FIELDS if getattr(batch, name) is not None]
    if present:
        raise UserError(f"train.curriculum: a batch with {', '.join(present)} cannot be cut to a shorter length "
                        "(only tokens, segments, padding_mask, positions and token labels can)")
    changes: dict[str, Any] = {name: getattr(batch, name)[:, :length].contiguous() for name in CUT_FIELDS
                               if getattr(batch, name) is not None}
    labels = {}
    for name, label in batch.labels.items():
        if label.dim() < 2 or label.shape[1] != width:
            raise UserError(f"train.curriculum: labels.{name} has shape {tuple(label.shape)}, not one label per "
                            f"position ([batch, {width}, ...]); a shorter sequence would keep labels of text it cut")
        labels[name] = label[:, :length].contiguous()
    changes["labels"] = labels
    return replace(batch, **changes)
