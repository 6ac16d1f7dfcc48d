"""The ``deepspeed`` strategy's engine config (built from train.*, merged with a user JSON) and its
missing-package error. Needs no DeepSpeed: the engine itself is tested in tests/distributed."""

from __future__ import annotations

import json
import sys

import pytest

from pentad.errors import UserError
from pentad.training.config import TrainConfig
from pentad.training.strategies import STRATEGIES
from pentad.training.strategies.deepspeed import build_config, read_user_config
from pentad.training.zero_checkpoint import import_deepspeed


def _cfg(**kw) -> TrainConfig:
    return TrainConfig.model_validate({"batch_size": 8, "grad_accum": 2, "clip_grad_norm": 1.0, **kw})


def test_filled_from_train():
    config = build_config(_cfg(precision="bf16", deepspeed={"stage": 3}), world_size=2)
    assert config["train_batch_size"] == 16 and config["train_micro_batch_size_per_gpu"] == 4
    assert config["gradient_accumulation_steps"] == 2 and config["gradient_clipping"] == 1.0
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert config["zero_optimization"] == {"stage": 3}
    assert config["zero_allow_untested_optimizer"] is True and "zero_force_ds_cpu_optimizer" not in config
    plain = build_config(_cfg(clip_grad_norm=None), world_size=1)
    assert plain["gradient_clipping"] == 0.0 and plain["bf16"] == {"enabled": False}
    assert plain["zero_optimization"] == {"stage": 2}


def test_offload():
    config = build_config(_cfg(deepspeed={"stage": 3, "offload_optimizer": True, "offload_parameters": True}), 2)
    assert config["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                           "offload_param": {"device": "cpu"}}
    # pentad's torch AdamW steps the offloaded state: DeepSpeed must not insist on DeepSpeedCPUAdam
    assert config["zero_force_ds_cpu_optimizer"] is False
    # parameters are offloaded by stage 3 only
    assert "offload_param" not in build_config(_cfg(deepspeed={"stage": 2, "offload_parameters": True}), 2)[
        "zero_optimization"]


def test_user_config_adds_settings_and_may_repeat_or_defer():
    user = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2, "gradient_clipping": 1,
            "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "reduce_bucket_size": 1000,
                                                               "offload_optimizer": {"device": "nvme",
                                                                                     "nvme_path": "/x"}},
            "wall_clock_breakdown": False}
    config = build_config(_cfg(deepspeed={"offload_optimizer": True}), 2, user, "ds.json")
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["bf16"]["enabled"] is False
    assert config["zero_optimization"]["reduce_bucket_size"] == 1000
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "nvme", "nvme_path": "/x"}
    assert config["wall_clock_breakdown"] is False
    assert user["train_micro_batch_size_per_gpu"] == "auto"  # the caller's dict is left alone


@pytest.mark.parametrize("user, key, found, train_key", [
    ({"train_micro_batch_size_per_gpu": 3}, "train_micro_batch_size_per_gpu=3", "4", "train.batch_size"),
    ({"train_batch_size": 32}, "train_batch_size=32", "16", "train.batch_size"),
    ({"gradient_accumulation_steps": 4}, "gradient_accumulation_steps=4", "2", "train.grad_accum"),
    ({"gradient_clipping": 0.5}, "gradient_clipping=0.5", "1.0", "train.clip_grad_norm"),
    ({"bf16": {"enabled": True}}, "bf16.enabled=true", "false", "train.precision"),
    ({"fp16": {"enabled": True}}, "fp16.enabled=true", "false", "train.precision"),
    ({"zero_optimization": {"stage": 1}}, "zero_optimization.stage=1", "2", "train.deepspeed.stage"),
    ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
     "zero_optimization.offload_optimizer.device=\"cpu\"", "\"none\"", "train.deepspeed.offload_optimizer"),
])
def test_contradictions_name_key_file_values_and_setting(user, key, found, train_key):
    with pytest.raises(UserError) as e:
        build_config(_cfg(), 2, user, "conf/ds.json")
    message = str(e.value)
    assert f"the DeepSpeed config conf/ds.json sets {key}" in message
    assert f"pentad's config gives {found}" in message and f"change {train_key} to match" in message


@pytest.mark.parametrize("section", ["optimizer", "scheduler"])
def test_optimizer_and_schedule_are_pentads(section):
    with pytest.raises(UserError, match=f"has an '{section}' section: pentad trains with its own optimizer"):
        build_config(_cfg(), 2, {section: {"type": "AdamW"}}, "ds.json")


def test_read_user_config(tmp_path):
    good = tmp_path / "ds.json"
    good.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert read_user_config(good) == {"zero_optimization": {"stage": 2}}
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "stage": 2,\n}\n')
    with pytest.raises(UserError, match=r"bad.json: not valid JSON \(line 3"):
        read_user_config(bad)
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(UserError, match="expected a JSON object"):
        read_user_config(tmp_path / "list.json")
    with pytest.raises(UserError, match="no such file"):
        read_user_config(tmp_path / "missing.json")


def test_missing_deepspeed_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # what an uninstalled package looks like to import
    with pytest.raises(UserError, match=r"needs the DeepSpeed package, which is not installed: "
                                        r"pip install 'pentad\[deepspeed\]'"):
        STRATEGIES.get("deepspeed").check_installed()
    with pytest.raises(UserError, match=r"pip install 'pentad\[deepspeed\]'"):
        import_deepspeed()


def test_missing_deepspeed_stops_the_command_with_status_2(monkeypatch, tmp_path, capsys):
    from pentad.cli.main import main

    monkeypatch.setitem(sys.modules, "deepspeed", None)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    (tmp_path / "ds").mkdir()
    code = main(["pretrain", "--config", "bert/tiny", "tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}",
                 f"data.dataset={tmp_path / 'ds'}", f"output={tmp_path / 'run'}", "train.strategy=deepspeed"])
    assert code == 2
    assert "pip install 'pentad[deepspeed]'" in capsys.readouterr().err
