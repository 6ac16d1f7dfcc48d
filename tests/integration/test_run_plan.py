"""The run is resolved once: ``pentad pretrain`` and ``pentad finetune`` turn their config into a complete,
frozen plan before anything runs; ``--print-config`` prints that plan and the run's ``config.yaml`` records
it; nothing the run does afterwards can change it."""

from __future__ import annotations

import pytest
import yaml
from tests.integration.conftest import tiny

from pentad.assembly import load_config
from pentad.cli.main import main
from pentad.config.base import FrozenConfigError, FrozenDict, FrozenList, freeze
from pentad.config.loader import dump_config
from pentad.tasks.runner import plan_finetune
from pentad.training.pretrain import plan_pretrain


def test_a_frozen_config_refuses_every_change_at_every_depth():
    cfg = load_config("bert/tiny", ["train.grid={train.lr: [0.1, 0.01]}"])
    plan = freeze(cfg)
    assert dump_config(plan) == dump_config(cfg) and plan.frozen and plan.model.encoder.frozen
    assert plan == cfg and plan.model == cfg.model  # equal configs, whether frozen or not
    assert isinstance(plan.model.targets, FrozenList) and isinstance(plan.train.grid, FrozenDict)
    changes = [lambda: setattr(plan, "output", "elsewhere"), lambda: setattr(plan.train, "lr", 1.0),
               lambda: setattr(plan.model.encoder, "num_layers", 3), lambda: plan.model.targets.append(None),
               lambda: plan.model.targets.pop(), lambda: plan.train.grid.update({"train.seed": [1]}),
               lambda: plan.train.grid["train.lr"].append(0.5), lambda: delattr(plan.train, "lr")]
    for change in changes:
        with pytest.raises(FrozenConfigError, match="resolved and frozen"):
            change()
    assert dump_config(plan) == dump_config(cfg)  # nothing got through
    assert not cfg.frozen  # freezing copies; the config it came from is the caller's


def test_copies_of_a_frozen_config():
    plan = freeze(load_config("bert/tiny", []))
    heads = len(plan.model.targets)
    own = plan.model_copy(deep=True)  # a new config its maker owns
    own.train.lr = 0.5
    own.model.targets.append(own.model.targets[0])
    assert type(own.model.targets) is list and plan.train.lr != 0.5 and len(plan.model.targets) == heads
    shallow = plan.model_copy(update={"output": None})  # shares its sections with the plan: they stay frozen
    shallow.description = "changed"
    with pytest.raises(FrozenConfigError):
        shallow.train.lr = 0.5


def test_pretrain_plan_is_complete_and_frozen(english, bert_dataset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config("bert/tiny", [*tiny(english["vocab"]), f"data.dataset={bert_dataset}", "output=run"])
    plan = plan_pretrain(cfg)
    assert plan.cfg.frozen and plan.cfg.model.vocab_size == plan.tokenizer.vocab_size
    assert plan.cfg.output == tmp_path / "run"  # absolute
    assert plan.objective is not None and plan.cfg.model.vocab_size != cfg.model.vocab_size  # (180, 30522)
    assert not cfg.frozen and cfg.output.name == "run" and not cfg.output.is_absolute()  # the input is untouched
    with pytest.raises(FrozenConfigError):
        plan.cfg.model.vocab_size = 7


def test_finetune_plan_has_the_task_heads(english, tmp_path):
    cfg = load_config("bert/tiny", [*tiny(english["vocab"]), "task.type=classification",
                                    f"data.train={english['train']}", f"output={tmp_path / 'run'}"])
    plan = plan_finetune(cfg)
    heads = plan.cfg.model.targets
    assert [h.type for h in heads] == ["cls"] and heads[0].num_labels == 2
    assert plan.cfg.train.adam_bias_correction is False  # fine-tuning's own default
    assert plan.task is not None and plan.cfg.frozen


def test_print_config_is_what_the_run_records(english, tmp_path, capsys):
    """``--print-config`` shows the run exactly as its ``config.yaml`` will record it: the task's heads,
    the vocabulary size from the tokenizer, absolute paths, fine-tuning's defaults."""
    out = tmp_path / "run"
    args = ["finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
            f"data.train={english['train']}", "train.epochs=1", "train.threads=1", f"output={out}"]
    assert main([*args, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert not out.exists()  # printing runs nothing
    assert main(args) == 0
    assert (out / "config.yaml").read_text(encoding="utf-8") == printed
    model = yaml.safe_load(printed)["model"]
    assert model["targets"][0]["num_labels"] == 2 and model["vocab_size"] is not None


def test_pretrain_print_config_resolves_what_it_can(english, tmp_path, capsys):
    # no dataset and no output: nothing to run, but the plan so far (vocabulary from the tokenizer)
    assert main(["pretrain", "--config", "bert/tiny", *tiny(english["vocab"]), "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["vocab_size"] is not None and printed["data"]["dataset"] is None


def test_init_run_rebuilds_its_model(english, classification_run, tmp_path, capsys):
    """``init=RUN`` with no model in the config takes the run's model (sizes, tokenizer), as
    ``from_pretrained`` does; fine-tuning's own train defaults still apply; ``model.*`` overrides apply on
    top of the run's model."""
    out = tmp_path / "again"
    assert main(["finetune", "--task", "classification", f"init={classification_run}", f"data.train={english['train']}",
                 "train.epochs=1", "train.batch_size=8", "train.progress=false", "train.threads=1",
                 "model.encoder.dropout=0.0", f"output={out}"]) == 0
    recorded = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    first = yaml.safe_load((classification_run / "config.yaml").read_text(encoding="utf-8"))
    assert recorded["model"]["hidden_size"] == first["model"]["hidden_size"] == 32
    assert recorded["model"]["encoder"]["num_layers"] == first["model"]["encoder"]["num_layers"]
    assert recorded["model"]["encoder"]["dropout"] == 0.0 != first["model"]["encoder"]["dropout"]
    assert recorded["tokenizer"] == first["tokenizer"]
    assert recorded["train"]["adam_bias_correction"] is False


def test_init_run_with_another_model_names_the_keys(english, classification_run, tmp_path, capsys):
    # bert/tiny's own sizes (hidden 128, ffn 512) against the run's (32, 64)
    assert main(["finetune", "--task", "classification", "--config", "bert/tiny", f"init={classification_run}",
                 f"data.train={english['train']}", "train.progress=false", f"output={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "is a run with another model" in err and "model.hidden_size: 128 here, 32 in the run" in err
    assert "model.encoder.ffn_size: 512 here, 64 in the run" in err and "takes that run's model" in err


def test_a_dataset_describes_itself(english, bert_dataset, tmp_path, capsys):
    """``pretrain data.dataset=DIR`` with a config that gives only the model: the objective (with its
    sequence length) and the tokenizer come from the dataset's manifest; an override that contradicts the
    dataset names the key and both values."""
    model = load_config("bert/tiny", tiny(english["vocab"])).model.model_dump(mode="json")
    config = tmp_path / "model.yaml"
    config.write_text(yaml.safe_dump({"model": model}), encoding="utf-8")
    out = tmp_path / "run"
    args = ["pretrain", "--config", str(config), f"data.dataset={bert_dataset}", "train.steps=2",
            "train.batch_size=8", "train.progress=false", "train.threads=1", "train.tensorboard=false"]
    assert main([*args, f"output={out}"]) == 0
    recorded = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    manifest = yaml.safe_load((bert_dataset / "manifest.json").read_text(encoding="utf-8"))
    assert recorded["data"]["objective"]["type"] == "bert" and recorded["data"]["objective"]["seq_length"] == 32
    assert recorded["tokenizer"]["vocab"] == manifest["tokenizer"]["config"]["vocab"]
    assert main([*args, f"output={tmp_path / 'other'}", "data.objective.seq_length=48"]) == 2
    assert "objective.seq_length: dataset 32, config 48" in capsys.readouterr().err
    # a run and a dataset say everything: no config at all
    again = ["pretrain", f"init={out}", f"data.dataset={bert_dataset}", f"output={tmp_path / 'again'}",
             *args[4:]]
    assert main(again) == 0
    again_cfg = yaml.safe_load((tmp_path / "again" / "config.yaml").read_text(encoding="utf-8"))
    assert again_cfg["model"] == recorded["model"]


def test_errors_name_the_first_real_cause(english, tmp_path, capsys):
    """A missing init or dataset is reported as such, not as what follows from it (no tokenizer, no model)."""
    missing = tmp_path / "nowhere"
    assert main(["finetune", "--task", "classification", f"init={missing}", f"data.train={english['train']}",
                 f"output={tmp_path / 'ft'}"]) == 2
    assert f"init={missing} does not exist" in capsys.readouterr().err
    assert main(["finetune", "--task", "classification", "--config", "bert/tiny", f"init={missing}",
                 f"data.train={english['train']}", f"output={tmp_path / 'ft'}"]) == 2
    assert f"init={missing} does not exist" in capsys.readouterr().err
    assert main(["pretrain", "--config", "bert/tiny", f"data.dataset={missing}", f"output={tmp_path / 'pt'}"]) == 2
    assert f"data.dataset={missing} does not exist" in capsys.readouterr().err
