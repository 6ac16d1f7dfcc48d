"""Sharded (DCP) checkpoints read in one process: consolidation, the run-directory lookups, export,
and the refusals (a pickled object in the metadata, a missing file, fsdp without a launcher)."""

import pickle

import pytest
import torch
from tests.conftest import tiny_model_dict

from pentad import files, layout
from pentad.builder import build_model
from pentad.cli.main import main
from pentad.components.model_config import model_config_class
from pentad.errors import UserError
from pentad.training import checkpoint as ckpt


def make():
    return build_model(model_config_class().model_validate(tiny_model_dict()))


def write_dcp(checkpoint, model):
    """A checkpoint as the fsdp strategy writes it (here from one process, no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from pentad.training.config import TrainConfig
    from pentad.training.optim import build_optimizer

    optimizer = build_optimizer(model, TrainConfig())
    model_state, optim_state = get_state_dict(model, optimizer)
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(checkpoint / layout.DCP))
    aliases = [head for head, _ in model.tied]
    torch.save({"step": 3, ckpt.FORMAT_KEY: {"format": layout.DCP, "aliases": aliases, "world_size": 1}},
               checkpoint / layout.STATE)


def test_dcp_checkpoint_consolidates_to_the_weights_file_contents(tmp_path):
    model = make()
    write_dcp(tmp_path, model)
    tensors = ckpt.read_checkpoint_weights(tmp_path)
    expected = ckpt.weights_to_save(model)
    assert sorted(tensors) == sorted(expected)  # the tied head is stored once, as in model.safetensors
    assert all(torch.equal(tensors[k], expected[k]) for k in expected)
    assert layout.checkpoint_format(tmp_path) == "dcp" and ckpt.read_weights(tmp_path).keys() == tensors.keys()
    other = make()
    ckpt.load_weights(other, tensors, str(tmp_path))
    assert other.targets["mlm"].output.weight is other.embedding.word.weight


def test_run_directory_of_a_sharded_run_finds_its_latest_checkpoint(tmp_path):
    run = tmp_path / "run"
    step = layout.checkpoint_dir(run, 3)
    step.mkdir(parents=True)
    write_dcp(step, make())
    files.atomic_write_text(run / layout.CHECKPOINTS / layout.LATEST, step.name + "\n")
    assert ckpt.find_weights(run) == step and ckpt.find_weights(step) == step
    assert layout.checkpoint_steps(run) == [3]
    assert set(ckpt.read_weights(ckpt.find_weights(run))) == set(ckpt.weights_to_save(make()))


def test_metadata_with_a_foreign_object_is_refused_not_unpickled(tmp_path):
    write_dcp(tmp_path, make())
    # a .metadata that would call os.system when unpickled
    evil = b"cos\nsystem\n(S'echo pwned'\ntR."
    (tmp_path / layout.DCP / ".metadata").write_bytes(evil)
    with pytest.raises(UserError, match="unreadable .metadata.*os.system is not part"):
        ckpt.read_checkpoint_weights(tmp_path)
    # nor what DCP's metadata module imports (it imports os)
    (tmp_path / layout.DCP / ".metadata").write_bytes(b"ctorch.distributed.checkpoint.metadata\nos\n.")
    with pytest.raises(UserError, match="metadata.os is not part"):
        ckpt.read_checkpoint_weights(tmp_path)
    assert pickle.loads(pickle.dumps(1)) == 1  # (the module's own pickle use is untouched)


def test_truncated_shard_and_missing_metadata_are_user_errors(tmp_path):
    write_dcp(tmp_path, make())
    shard = next((tmp_path / layout.DCP).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(UserError, match="truncated or corrupt"):
        ckpt.read_checkpoint_weights(tmp_path)
    (tmp_path / layout.DCP / ".metadata").unlink()
    with pytest.raises(UserError, match="not completely written"):
        ckpt.read_checkpoint_weights(tmp_path)


def test_directory_without_weights_names_the_formats(tmp_path):
    with pytest.raises(UserError, match="model.safetensors or a sharded checkpoint \\(dcp/"):
        ckpt.read_checkpoint_weights(tmp_path)


def test_fsdp_without_a_launcher_says_how_to_launch(tmp_path, monkeypatch, capsys):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    status = main(["pretrain", "--config", "bert/tiny", f"data.dataset={tmp_path / 'ds'}",
                   f"output={tmp_path / 'run'}", "train.strategy=fsdp"])
    assert status == 2
    err = capsys.readouterr().err
    assert "train.strategy=fsdp runs under a launcher" in err and "torchrun --nproc_per_node=N -m pentad" in err


def test_single_strategy_resumes_a_dcp_checkpoint(tmp_path):
    from pentad.training.config import TrainConfig
    from pentad.training.distributed import Dist
    from pentad.training.optim import build_optimizer
    from pentad.training.strategies import STRATEGIES

    model = make()
    write_dcp(tmp_path, model)
    strategy = STRATEGIES.get("single")(TrainConfig(), Dist())
    strategy.setup(make(), lambda m: build_optimizer(m, TrainConfig()))
    state = strategy.load(tmp_path)
    assert state["step"] == 3 and ckpt.FORMAT_KEY not in state
    loaded = strategy.module.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    assert strategy.module.targets["mlm"].output.weight is strategy.module.embedding.word.weight
