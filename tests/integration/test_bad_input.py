"""Every listed kind of bad input ends with a clear message and exit status 2, never a traceback."""

from __future__ import annotations

import pytest
from tests.integration.conftest import tiny

from pentad.cli.main import main


def fails(capsys, *argv, match: str) -> str:
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    assert match in err, err
    return err


def test_unknown_config_key(capsys):
    err = fails(capsys, "validate", "bert/tiny", "model.encoder.num_layer=2", match="model.encoder.num_layer")
    assert "did you mean 'num_layers'" in err


def test_unknown_module_name(capsys):
    err = fails(capsys, "validate", "bert/tiny", "model.encoder.type=transfomer", match="unknown encoder name")
    assert "did you mean 'transformer'" in err


def test_heads_not_dividing_hidden_size(capsys):
    fails(capsys, "validate", "bert/tiny", "model.encoder.num_heads=3", match="not divisible by num_heads 3")


DEEPSPEED = {"gradient_accumulation_steps": 1, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 100,
             "optimizer": {"type": "Adam", "params": {"lr": 2e-5, "weight_decay": 1e-2}},
             "fp16": {"enabled": True, "loss_scale": 0}, "zero_optimization": {"stage": 2},
             "wall_clock_breakdown": False}


@pytest.mark.parametrize("command", ["validate", "validate --config", "pretrain --config", "preprocess --config"])
def test_deepspeed_config_given_as_model_config(capsys, tmp_path, command):
    """TencentPretrain's --deepspeed_config JSON where the model config belongs: one paragraph that
    says what it is and what to give, not one "unknown key" line per DeepSpeed key."""
    import json

    path = tmp_path / "deepspeed_config.json"
    path.write_text(json.dumps(DEEPSPEED))
    err = fails(capsys, *command.split(), path, match=f"{path} is a DeepSpeed config")
    assert "unknown key" not in err and len(err.strip().splitlines()) == 1
    assert "not a model config" in err and "DeepSpeed support is planned: train.strategy" in err
    assert "models/bert/base_config.json" in err  # what to give instead
    assert "train_micro_batch_size_per_gpu 4 -> train.batch_size=4" in err and "train.lr=2e-05" in err


def test_deepspeed_detection_leaves_model_configs_alone():
    from pentad.config.loader import is_deepspeed_config

    assert is_deepspeed_config(DEEPSPEED) and is_deepspeed_config({"zero_optimization": {"stage": 3}})
    assert is_deepspeed_config({"fp16": {"enabled": True}, "optimizer": {"type": "Adam"}})
    assert not is_deepspeed_config({"fp16": {"enabled": True}})  # one key shared with other formats: not enough
    assert not is_deepspeed_config({"model": {}, "train_batch_size": 8})  # a pentad run config (its own error)
    assert not is_deepspeed_config({"layers_num": 2, "encoder": "transformer", "fp16": True, "optimizer": "adamw"})


def _preprocess(english, tmp_path, corpus, *extra):
    return ("preprocess", "--config", "bert/tiny", *tiny(english["vocab"]), f"data.corpus={corpus}",
            f"data.output={tmp_path / 'ds'}", *extra)


def test_missing_corpus(capsys, english, tmp_path):
    fails(capsys, *_preprocess(english, tmp_path, tmp_path / "nope.txt"), match="nope.txt")


def test_empty_corpus(capsys, english, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    fails(capsys, *_preprocess(english, tmp_path, tmp_path / "empty.txt"), match="empty")


def test_non_utf8_corpus_names_the_line_and_can_skip(capsys, english, tmp_path):
    corpus = tmp_path / "bad.txt"
    good = english["docs"].read_bytes().splitlines()
    corpus.write_bytes(b"\n".join(good[:3] + [b"caf\xe9 au lait"] + good[3:]) + b"\n")
    fails(capsys, *_preprocess(english, tmp_path, corpus, "data.objective=mlm", "model.targets=[mlm]"),
          match="line 4")
    assert main([str(a) for a in _preprocess(english, tmp_path, corpus, "data.objective=mlm",
                                               "model.targets=[mlm]", "data.on_bad_line=skip")]) == 0
    assert "skip" in capsys.readouterr().err


def test_vocab_without_mask_for_mlm(capsys, english, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(t for t in english["vocab"].read_text().splitlines() if t != "[MASK]") + "\n")
    fails(capsys, "preprocess", "--config", "bert/tiny", *tiny(vocab), f"data.corpus={english['bert']}",
          f"data.output={tmp_path / 'ds'}", match="[MASK]")


@pytest.mark.parametrize("content,match", [
    ("1\tgood film\n0\tbad film\n", "header"),
    ("label\ttext_a\n1\tgood film\textra column\n", "line 2"),
])
def test_bad_tsv(capsys, english, tmp_path, content, match):
    train = tmp_path / "train.tsv"
    train.write_text(content)
    fails(capsys, "finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
          f"data.train={train}", f"output={tmp_path / 'ft'}", match=match)


def test_label_out_of_range(capsys, english, tmp_path):
    dev = tmp_path / "dev.tsv"
    dev.write_text("label\ttext_a\n0\tgood\n7\tbad\n")
    fails(capsys, "finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
          f"data.train={english['train']}", f"data.dev={dev}", f"output={tmp_path / 'ft'}", match="line 3")


@pytest.fixture(scope="module")
def pretrained(english, tmp_path_factory):
    root = tmp_path_factory.mktemp("pre")
    base = tiny(english["vocab"])
    assert main(["preprocess", "--config", "bert/tiny", *base, f"data.corpus={english['bert']}",
                 f"data.output={root / 'ds'}"]) == 0
    assert main(["pretrain", "--config", "bert/tiny", *base, f"data.dataset={root / 'ds'}", "train.steps=2",
                 f"output={root / 'run'}"]) == 0
    return root / "run"


def test_checkpoint_from_another_config(capsys, english, tmp_path, pretrained):
    err = fails(capsys, "finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
                "model.hidden_size=64", f"init={pretrained}", f"data.train={english['train']}",
                f"output={tmp_path / 'ft'}", match="another config")
    assert "mis-shaped" in err


def test_truncated_checkpoint(capsys, english, tmp_path, pretrained):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(pretrained, copy)
    weights = next((copy / "checkpoints").glob("step-*/model.safetensors"))
    weights.write_bytes(weights.read_bytes()[:500])
    fails(capsys, "finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
          f"init={copy}", f"data.train={english['train']}", f"output={tmp_path / 'ft'}",
          match="truncated or corrupt")


def test_vocab_build_refuses_an_existing_vocabulary(capsys, english, tmp_path):
    out = tmp_path / "vocab"
    out.mkdir()
    (out / "vocab.txt").write_text("[PAD]\n")
    fails(capsys, "vocab", "build", "--corpus", english["docs"], "--vocab-size", "100", "--output", out,
          match=f"vocabulary output directory {out} already exists and is not empty")
    assert (out / "vocab.txt").read_text() == "[PAD]\n"


def _finetune(english, tmp_path, train, *extra):
    return ("finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
            f"data.train={train}", f"output={tmp_path / 'ft'}", *extra)


def test_stray_training_label_is_an_error_not_an_eight_class_head(capsys, english, tmp_path):
    train = tmp_path / "train.tsv"
    lines = english["train"].read_text().splitlines()
    train.write_text("\n".join(lines[:6] + ["7\ta stray label"] + lines[6:]) + "\n")
    err = fails(capsys, *_finetune(english, tmp_path, train), match=f"{train}: integer labels are class ids")
    assert "label 7 (line 7) does" in err and "task.num_labels=8" in err
    assert not (tmp_path / "ft" / "config.yaml").exists()


@pytest.mark.parametrize("split", ["train", "dev"])
def test_empty_text_is_an_error_in_training_and_dev_alike(capsys, english, tmp_path, split):
    bad = tmp_path / f"{split}.tsv"
    lines = english[split].read_text().splitlines()
    bad.write_text("\n".join(lines[:3] + ["1\t"] + lines[3:]) + "\n")
    files = {"train": english["train"], "dev": english["dev"], split: bad}
    fails(capsys, *_finetune(english, tmp_path, files["train"], f"data.dev={files['dev']}"),
          match=f"{bad}, line 4: the line has an empty text_a field")


def test_finetune_says_that_train_steps_is_not_its_length(capsys, english, tmp_path):
    assert main([str(a) for a in _finetune(english, tmp_path, english["train"], "train.steps=3",
                                           "train.epochs=1")]) == 0
    err = capsys.readouterr().err
    assert "train.steps=3 is not used by fine-tuning, whose length is train.epochs: 1 epoch(s) of 5 steps" in err
    assert main([str(a) for a in _finetune(english, tmp_path / "again", english["train"], "train.epochs=1")]) == 0
    assert "train.steps" not in capsys.readouterr().err


def test_pretrain_says_that_train_epochs_is_not_its_length(capsys, english, pretrained, tmp_path):
    dataset = pretrained.parent / "ds"
    assert main(["pretrain", "--config", "bert/tiny", *tiny(english["vocab"]), f"data.dataset={dataset}",
                 "train.steps=1", "train.epochs=2", f"output={tmp_path / 'run'}"]) == 0
    assert "train.epochs=2 is not used by pre-training, whose length is train.steps (1 steps)" in \
        capsys.readouterr().err


def test_init_from_a_compressed_run_says_so(capsys, english, tmp_path, pretrained):
    """A quantized run's weights fit only a quantized model: the message says what the init run is and what
    to do, not "trained with another config?"."""
    quantized = tmp_path / "int8"
    assert main(["compress", str(pretrained), "--out", str(quantized), "--quantize", "int8"]) == 0
    capsys.readouterr()
    err = fails(capsys, "finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
                f"init={quantized}", f"data.train={english['train']}", f"output={tmp_path / 'ft'}",
                match=f"init={quantized} is a compressed run (quantized to int8; model.compression in "
                      f"{quantized / 'config.yaml'})")
    assert "another config" not in err and "initialise from the run it was quantized from" in err


def test_a_hostile_run_config_is_refused_by_every_reader(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text('model: !!python/object/apply:os.system ["echo run"]\n')
    for argv in (["generate", run, "--prompt", "x"], ["infer", "--model", run, f"data.test={run}"],
                 ["export", run, tmp_path / "out"], ["compress", run, "--out", tmp_path / "c", "--quantize", "int8"]):
        fails(capsys, *argv, match=f"run config {run / 'config.yaml'}, line 1 column 8: invalid YAML")
