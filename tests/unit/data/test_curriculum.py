"""Sequence-length warm-up: the length schedule, cutting batches, and which objectives may be cut."""

from __future__ import annotations

import itertools

import pytest
import torch

from pentad.components.base import IGNORE_INDEX, Batch
from pentad.data.curriculum import LengthSchedule, check_objective, truncate
from pentad.errors import UserError
from pentad.registry import OBJECTIVES
from pentad.training.config import CurriculumConfig


def test_linear_schedule_grows_from_start_to_full_in_multiples():
    s = LengthSchedule(start_length=16, steps=10, full_length=64, multiple_of=8)
    lengths = [s.length(step) for step in range(12)]
    assert lengths[0] == 16 and lengths[10] == lengths[11] == 64
    assert lengths == sorted(lengths)
    assert all(length % 8 == 0 for length in lengths)
    # 16 + 48 * step / 10 rounded down to a multiple of 8
    assert lengths[:10] == [16, 16, 24, 24, 32, 40, 40, 48, 48, 56]


def test_step_schedule_holds_each_stage():
    s = LengthSchedule(start_length=8, steps=8, full_length=40, schedule="step", stages=4, multiple_of=8)
    assert [s.length(step) for step in range(10)] == [8, 8, 16, 16, 24, 24, 32, 32, 40, 40]


def test_rounding_never_goes_below_start_or_above_full():
    s = LengthSchedule(start_length=5, steps=4, full_length=30, multiple_of=16)
    assert [s.length(step) for step in range(5)] == [5, 5, 16, 16, 30]  # 11 -> 0 -> 5; 17, 23 -> 16


def test_micro_batches_of_a_step_share_its_length():
    s = LengthSchedule(start_length=8, steps=4, full_length=40, multiple_of=8, grad_accum=3)
    assert [s.length_of_batch(i) for i in range(12)] == [s.length(i // 3) for i in range(12)]
    assert s.length_of_batch(2) == 8 and s.length_of_batch(3) == s.length(1)


def test_start_length_not_shorter_than_full_is_refused():
    with pytest.raises(UserError, match=r"train\.curriculum\.start_length=64 is not shorter.*seq_length=64"):
        LengthSchedule.from_config(CurriculumConfig(start_length=64, steps=10), full_length=64)


def _batch(width: int = 10) -> Batch:
    tokens = torch.arange(2 * width).reshape(2, width)
    padding = torch.zeros(2, width, dtype=torch.bool)
    padding[1, 7:] = True
    lm = torch.where(padding, torch.full_like(tokens, IGNORE_INDEX), tokens + 1)
    bilm = torch.stack([lm, lm - 1], dim=-1)
    return Batch(tokens=tokens, segments=torch.zeros_like(tokens), padding_mask=padding,
                 positions=torch.arange(width).expand(2, width), labels={"lm": lm, "bilm": bilm})


def test_truncate_cuts_inputs_and_token_labels():
    batch = _batch()
    cut = truncate(batch, 4)
    for name in ("tokens", "segments", "padding_mask", "positions"):
        assert torch.equal(getattr(cut, name), getattr(batch, name)[:, :4])
        assert getattr(cut, name).is_contiguous()
    assert torch.equal(cut.labels["lm"], batch.labels["lm"][:, :4])
    assert torch.equal(cut.labels["bilm"], batch.labels["bilm"][:, :4])
    assert cut.labels["bilm"].shape == (2, 4, 2)
    assert truncate(batch, 10) is batch and truncate(batch, 50) is batch


def test_truncate_refuses_sequence_labels_and_decoder_fields():
    batch = _batch()
    batch.labels["sp"] = torch.tensor([0, 1])
    with pytest.raises(UserError, match=r"labels\.sp has shape \(2,\)"):
        truncate(batch, 4)
    seq2seq = Batch(tokens=torch.zeros(2, 8, dtype=torch.long), decoder_tokens=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(UserError, match="decoder_tokens"):
        truncate(seq2seq, 4)


def test_which_objectives_may_be_cut():
    import pentad.data.objectives  # noqa: F401  (registers objectives)

    allowed = {name for name in OBJECTIVES.names() if OBJECTIVES.get(name).truncation_refused is None}
    assert {"lm", "mlm", "bilm"} <= allowed
    assert not allowed & {"bert", "albert", "cls", "cls_mlm", "prefixlm", "t5", "bart", "mt", "gsg"}

    for name, key in (("bert", "labels.sp"), ("albert", "labels.sop"), ("t5", "decoder_tokens"),
                      ("cls", "labels.cls"), ("prefixlm", "labels.lm")):
        objective = OBJECTIVES.get(name).__new__(OBJECTIVES.get(name))  # its name is its class's
        with pytest.raises(UserError, match=rf"objective '{name}' cannot be trained on shortened.*{key}"):
            check_objective(objective)


def test_pretrain_batches_cut_each_batch_to_its_steps_length():
    from pentad.data.loader import PretrainBatches

    class Dataset:
        directory = "memory"

        def __len__(self):
            return 100

        def take(self, indices):
            return indices

    class Objective:
        def collate(self, instances, rng):
            return _batch(width=40)

    lengths = LengthSchedule(start_length=8, steps=4, full_length=40, multiple_of=8, grad_accum=2)
    batches = PretrainBatches(Dataset(), Objective(), batch_size=2, seed=1, lengths=lengths)
    widths = [b.tokens.shape[1] for b in itertools.islice(batches.iterate(0), 10)]
    assert widths == [8, 8, 16, 16, 24, 24, 32, 32, 40, 40]
    # resuming at micro-batch 5 (inside step 2) continues with the same lengths
    assert [b.tokens.shape[1] for b in itertools.islice(batches.iterate(5), 5)] == widths[5:]
