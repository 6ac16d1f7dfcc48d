import json
import shutil

import pytest
import torch
from tests.conftest import tiny_model_dict

from pentad import layout
from pentad.builder import build_model
from pentad.components.model_config import model_config_class
from pentad.errors import UserError
from pentad.training import checkpoint as ckpt


def make(**over):
    return build_model(model_config_class().model_validate(tiny_model_dict(**over)))


def test_weights_round_trip_bitwise_and_tied_stored_once(tmp_path):
    model = make()
    path = tmp_path / "m.safetensors"
    ckpt.save_weights(model, path)
    tensors = ckpt.read_weights(path)
    assert "targets.mlm.output.weight" not in tensors  # tied to embedding.word.weight
    other = make()
    ckpt.load_weights(other, tensors, str(path))
    for (k, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), k
    assert other.targets["mlm"].output.weight is other.embedding.word.weight


def test_weights_of_another_config_are_listed_per_slot(tmp_path):
    path = tmp_path / "m.safetensors"
    ckpt.save_weights(make(), path)
    bigger = make(hidden_size=64, encoder={"type": "transformer", "num_layers": 3, "num_heads": 4})
    with pytest.raises(UserError) as info:
        ckpt.load_weights(bigger, ckpt.read_weights(path), str(path))
    text = str(info.value)
    assert "another config" in text and "embedding:" in text and "encoder:" in text
    assert "mis-shaped (norm" not in text
    assert "5 mis-shaped (embedding.norm.bias" in text and "missing (encoder.layers.2" in text


def test_new_head_must_be_named(tmp_path):
    path = tmp_path / "m.safetensors"
    ckpt.save_weights(make(), path)
    cls_model = make(targets=[{"type": "cls", "num_labels": 3}])
    with pytest.raises(UserError, match=r"missing \(targets.cls"):
        ckpt.load_weights(cls_model, ckpt.read_weights(path), str(path), drop_heads=True)
    notes = ckpt.load_weights(cls_model, ckpt.read_weights(path), str(path), new_heads=("cls",), drop_heads=True)
    assert any("cls" in n for n in notes) and any("mlm" in n for n in notes)
    with pytest.raises(UserError, match=r"unexpected \(targets.mlm"):
        ckpt.load_weights(cls_model, ckpt.read_weights(path), str(path), new_heads=("cls",))


def test_truncated_files_are_clear_errors(tmp_path):
    model = make()
    final = ckpt.save_checkpoint(tmp_path, 5, model, {"step": 5, "rng": torch.get_rng_state()})
    weights = final / layout.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(UserError, match="truncated or corrupt"):
        ckpt.read_weights(weights)
    state = final / layout.STATE
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(UserError, match="truncated or corrupt"):
        ckpt.load_state(final)


def test_checkpoints_rotate_and_latest_points_at_the_newest(tmp_path):
    model = make()
    for step in (1, 2, 3):
        ckpt.save_checkpoint(tmp_path, step, model, {"step": step}, keep=2)
    assert layout.latest_checkpoint(tmp_path).name == "step-00000003"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-00000002", "step-00000003"]
    assert ckpt.find_weights(tmp_path) == tmp_path / "checkpoints" / "step-00000003" / layout.WEIGHTS
    assert not list((tmp_path / "checkpoints").glob(".*"))  # no temp leftovers


def test_rotation_orders_by_step_and_keeps_the_checkpoint_just_written(tmp_path):
    model = make()
    written = ckpt.save_checkpoint(tmp_path, 9, model, {"step": 9}, keep=3)
    # checkpoints named without padding (as other tools and older runs name them): step-9 sorts after step-10 as text
    for step in (9, 10):
        shutil.copytree(written, tmp_path / "checkpoints" / f"step-{step}")
    shutil.rmtree(written)
    ckpt.save_checkpoint(tmp_path, 100, model, {"step": 100}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-00000100", "step-10"]
    assert layout.latest_checkpoint(tmp_path).name == "step-00000100" and layout.checkpoint_steps(tmp_path) == [10, 100]
    # a later checkpoint left from another course never makes rotation delete the one just written
    ckpt.save_checkpoint(tmp_path, 50, model, {"step": 50}, keep=1)
    assert [p.name for p in (tmp_path / "checkpoints").glob("step-*")] == ["step-00000050"]
    assert layout.latest_checkpoint(tmp_path).name == "step-00000050"


def test_missing_or_dangling_latest_falls_back_to_the_newest_complete_checkpoint(tmp_path):
    model = make()
    for step in (2, 4):
        ckpt.save_checkpoint(tmp_path, step, model, {"step": step}, keep=3)
    (tmp_path / "checkpoints" / "step-00000006").mkdir()  # not complete (no state, no weights): never chosen
    pointer = tmp_path / "checkpoints" / layout.LATEST
    assert layout.latest_problem(tmp_path) is None
    pointer.unlink()
    assert layout.latest_checkpoint(tmp_path).name == "step-00000004"
    assert "latest is missing" in layout.latest_problem(tmp_path)
    pointer.write_text("step-00000008\n")
    assert layout.latest_checkpoint(tmp_path).name == "step-00000004"
    assert "names 'step-00000008', which is not a checkpoint directory" in layout.latest_problem(tmp_path)
    assert ckpt.find_weights(tmp_path) == tmp_path / "checkpoints" / "step-00000004" / layout.WEIGHTS


class Evil:
    """A class that is not on torch's allow-list of loadable types."""


def test_state_refuses_arbitrary_objects(tmp_path):
    torch.save({"x": Evil()}, tmp_path / layout.STATE)
    with pytest.raises(UserError):
        ckpt.load_state(tmp_path)


def test_a_finished_fine_tune_without_its_best_model_is_not_read_from_another_checkpoint(tmp_path, capsys):
    model = make()
    for step in (2, 4):
        ckpt.save_checkpoint(tmp_path, step, model, {"step": step}, keep=3)
    latest = tmp_path / "checkpoints" / "step-00000004" / layout.WEIGHTS
    assert ckpt.find_weights(tmp_path) == latest  # no results: a pre-training run, its latest checkpoint
    (tmp_path / layout.RESULTS).write_text(json.dumps({"best_step": 2}))
    with pytest.raises(UserError, match=r"best model, .*best/model.safetensors \(step 2 in .*results.json\), is "
                                        r"missing; its latest checkpoint, step-00000004, is another model"):
        ckpt.find_weights(tmp_path)
    assert ckpt.find_weights(tmp_path / "checkpoints" / "step-00000004") == latest  # named: used as it is
    (tmp_path / layout.RESULTS).write_text(json.dumps({"best_step": 4}))
    assert ckpt.find_weights(tmp_path) == latest
    assert "best is missing; reading the latest checkpoint, step-00000004, which is of the best step" in \
        capsys.readouterr().err
    ckpt.save_weights(model, tmp_path / layout.BEST / layout.WEIGHTS)
    assert ckpt.find_weights(tmp_path) == tmp_path / layout.BEST / layout.WEIGHTS
