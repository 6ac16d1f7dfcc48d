"""DeepSpeed checkpoint files are checked before DeepSpeed unpickles them."""

from __future__ import annotations

import pytest
import torch

from pentad import layout
from pentad.errors import UserError
from pentad.training import zero_checkpoint as zero

pytest.importorskip("deepspeed")


class Odd:
    """Any class: unpickling it would run its code."""


def _files(tmp_path, payload):
    directory = tmp_path / "step-00000005" / layout.DEEPSPEED / zero.TAG
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
    path = checkpoint / layout.DEEPSPEED / zero.TAG / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UserError, match="is truncated or corrupt"):
        zero.check_files(checkpoint)
    with pytest.raises(UserError, match="has no DeepSpeed files in deepspeed/zero"):
        zero.check_files(tmp_path / "elsewhere")


class Marker:
    """A crafted record: unpickling it creates the file ``path`` (as any code could run)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        from pathlib import Path

        return Path.touch, (Path(self.path),)


def _clean(directory, name="zero_pp_rank_0_mp_rank_00_optim_states.pt"):
    # enough of a ZeRO-2 optimizer file for DeepSpeed's converter to go on and search the folder
    torch.save({"optimizer_state_dict": {"zero_stage": 2}}, directory / name)


def test_a_pickle_anywhere_in_the_tree_is_refused_before_deepspeed_reads_it(tmp_path):
    # DeepSpeed's ds_to_universal (resuming under single or ddp, or on another number of ranks) walks
    # the whole folder and unpickles every file whose name starts with mp_rank_, in any sub-folder,
    # with any suffix: such a file is refused by name, and its code never runs
    checkpoint = tmp_path / "step-00000005"
    directory = checkpoint / layout.DEEPSPEED / zero.TAG
    (directory / "nested").mkdir(parents=True)
    _clean(directory)
    marker = tmp_path / "ran"
    torch.save({"module": Marker(marker)}, directory / "nested" / "mp_rank_00_model_states.bin")
    with pytest.raises(UserError, match=r"holds the file \S+/zero/nested/mp_rank_00_model_states\.bin, which the "
                                        r"deepspeed strategy does not write"):
        zero.read_adam_states(checkpoint, [])
    with pytest.raises(UserError, match=r"holds the file \S+/nested/mp_rank_00_model_states\.bin"):
        zero.read_weights(checkpoint)  # pentad export, init=, convert, generate
    assert not marker.exists()
    with pytest.raises(UserError, match="holds the folder .*/zero/nested, which"):  # the folder itself, too
        (directory / "nested" / "mp_rank_00_model_states.bin").unlink()
        zero.check_files(checkpoint)
    assert not marker.exists() and not list(tmp_path.glob(".*universal*"))


@pytest.mark.parametrize("entry", ["zero/mp_rank_00_model_states.pt.old", "zero/.mp_rank_01_model_states.pt",
                                   "zero/layer_01-model_00-model_states.pt", "zero/notes.pt", "latest",
                                   "universal/"])
def test_every_entry_deepspeed_does_not_write_is_refused_by_name(tmp_path, entry):
    checkpoint = tmp_path / "step-00000005"
    directory = checkpoint / layout.DEEPSPEED / zero.TAG
    directory.mkdir(parents=True)
    _clean(directory)
    path = checkpoint / layout.DEEPSPEED / entry
    if entry.endswith("/"):
        path.mkdir()
    else:
        torch.save({"flat": torch.zeros(2)}, path)  # even a clean file: DeepSpeed has no business with it
    with pytest.raises(UserError, match=f"holds the (file|folder) {path.as_posix().rstrip('/')}, which the "
                                        "deepspeed strategy does not write.*Remove it if you put it there"):
        zero.check_files(checkpoint)


def test_what_deepspeed_writes_passes(tmp_path):
    checkpoint = tmp_path / "step-00000005"
    directory = checkpoint / layout.DEEPSPEED / zero.TAG
    directory.mkdir(parents=True)
    names = ["bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt",
             "zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    for name in names:
        torch.save({"module": {"encoder.weight": torch.zeros(2)},
                    "param_shapes": [{"encoder.weight": torch.Size([2])}]}, directory / name)
    for script in zero.SCRIPTS:  # DeepSpeed's recovery scripts, copied beside the tag
        (checkpoint / layout.DEEPSPEED / script).write_text("# a script\n")
    assert [p.name for p in zero.check_files(checkpoint)] == names


@pytest.mark.parametrize("state", [
    {"module": {"../../outside": torch.zeros(2)}},
    {"param_shapes": [{"/an/absolute/name": torch.Size([2])}]},
    {"optimizer_state_dict": {"param_slice_mappings": [{"a/../../b": torch.zeros(1)}]}},
    {"shared_params": {"head.weight": ".."}},
])
def test_parameter_names_that_lead_outside_deepspeeds_folder_are_refused(tmp_path, state):
    # ds_to_universal makes a folder of each parameter's name, writes its fragments there and
    # unpickles what it finds there (exp_avg.*): a name with a path in it would reach anywhere
    checkpoint = _files(tmp_path, state)
    with pytest.raises(UserError, match=r"optim_states\.pt is not loaded: it names a parameter '[^']*', which is "
                                        r"not a plain name"):
        zero.check_files(checkpoint)


def test_a_link_to_a_folder_is_refused_without_following_it(tmp_path):
    checkpoint = _files(tmp_path, {"flat": torch.zeros(3)})
    (checkpoint / layout.DEEPSPEED / zero.TAG / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(UserError, match=r"holds the folder \S+/zero/elsewhere, which the deepspeed strategy"):
        zero.check_files(checkpoint)
