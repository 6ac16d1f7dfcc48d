"""DeepSpeed checkpoint files are checked before DeepSpeed unpickles them."""

from __future__ import annotations

import pytest
import torch

from pentad.errors import UserError
from pentad.training import zero_checkpoint as zero

pytest.importorskip("deepspeed")


class Odd:
    """Any class: unpickling it would run its code."""


def _files(tmp_path, payload):
    directory = tmp_path / "step-00000005" / zero.DIRECTORY / zero.TAG
    directory.mkdir(parents=True)
    torch.save(payload, directory / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    return tmp_path / "step-00000005"


def test_deepspeeds_own_records_pass(tmp_path):
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    checkpoint = _files(tmp_path, {"zero_stage": ZeroStageEnum.weights, "flat": torch.zeros(3),
                                   "mappings": {"w": fragment_address(numel=3, start=0)}})
    assert [p.name for p in zero.check_files(checkpoint)] == ["zero_pp_rank_0_mp_rank_00_optim_states.pt"]


def test_other_objects_are_refused_before_deepspeed_reads_them(tmp_path):
    checkpoint = _files(tmp_path, {"flat": torch.zeros(3), "odd": Odd()})
    with pytest.raises(UserError, match=r"optim_states.pt is not loaded: it holds objects other than tensors and "
                                        r"DeepSpeed's checkpoint records \([\w.]*test_zero_checkpoint.Odd\)"):
        zero.check_files(checkpoint)


def test_truncated_and_missing_files(tmp_path):
    checkpoint = _files(tmp_path, {"flat": torch.zeros(3)})
    path = checkpoint / zero.DIRECTORY / zero.TAG / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UserError, match="is truncated or corrupt"):
        zero.check_files(checkpoint)
    with pytest.raises(UserError, match="has no DeepSpeed files in deepspeed/zero"):
        zero.check_files(tmp_path / "elsewhere")
