"""The siamese task (TencentPretrain's run_classifier_siamese name): the classification task with two
streams, through ``pentad finetune`` / ``pentad infer`` on a dual model."""

from __future__ import annotations

import json

import pytest
from tests.integration.conftest import SENTENCES
from tests.integration.test_dual_finetune import SIZES, one_stream_bert

from pentad.cli.main import main


def run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Pairs of the toy sentences, label 1 when both sentences carry the same label (sentence i is
    labelled 1 - i % 2); dev pairs are unseen pairs of seen sentences."""
    root = tmp_path_factory.mktemp("siamese")
    train, dev = [], []
    for i, a in enumerate(SENTENCES):
        for j, b in enumerate(SENTENCES):
            (dev if (i + 2 * j) % 5 == 0 else train).append((int(i % 2 == j % 2), a, b))
    for name, rows in (("train", train), ("dev", dev)):
        (root / f"{name}.tsv").write_text("label\ttext_a\ttext_b\n" + "".join(f"{y}\t{a}\t{b}\n" for y, a, b in rows),
                                          encoding="utf-8")
    (root / "nolabel.tsv").write_text("text_a\ttext_b\n" + "".join(f"{a}\t{b}\n" for _, a, b in dev), encoding="utf-8")
    return root


def test_siamese_trains_and_infers_on_a_dual_model(english, pairs, tmp_path):
    bert = tmp_path / "bert.safetensors"
    one_stream_bert(english["vocab"], bert)
    out = tmp_path / "siamese"
    assert run("finetune", "--task", "siamese", "--config", "sbert/base", *SIZES,
               "tokenizer.type=wordpiece", f"tokenizer.vocab={english['vocab']}", f"init={bert}",
               f"data.train={pairs / 'train.tsv'}", f"data.dev={pairs / 'dev.tsv'}", f"output={out}",
               "train.epochs=10", "train.batch_size=16", "train.lr=2e-3", "train.progress=false") == 0
    from pentad.runs import load_run

    cfg, _ = load_run(out)
    assert cfg.task.type == "siamese" and cfg.task.pair_input == "separate"
    head = cfg.model.targets[0]
    assert head.type == "pair_cls" and head.name == "cls"
    assert list(head.features) == ["u", "v", "abs_diff"]  # the recipe's own task.pair_features are kept
    results = json.loads((out / "results.json").read_text())
    assert results["dev"]["accuracy"] >= 0.8  # chance is 0.5 (dev pairs are 40% positive)

    predictions = tmp_path / "pred.tsv"
    assert run("infer", "--task", "siamese", "--model", out, f"data.test={pairs / 'nolabel.tsv'}",
               "--output", predictions, "--probabilities") == 0
    lines = predictions.read_text().splitlines()
    assert lines[0] == "label\tprob_0\tprob_1" and len(lines) == 21


def test_siamese_defaults_and_refusals(english, pairs, tmp_path, capsys):
    import pentad.tasks  # noqa: F401 - registers the tasks
    from pentad.registry import TASKS

    cfg = TASKS.get("siamese").Config()
    assert cfg.pair_input == "separate" and cfg.pair_features == ["u", "v", "abs_diff", "product"]
    with pytest.raises(ValueError, match="pair_input"):
        TASKS.get("siamese").Config(pair_input="joint")
    # a one-stream model cannot take two streams: refused at build time, naming the problem
    assert run("finetune", "--task", "siamese", "--config", "bert/mini", "model.hidden_size=32",
               "model.encoder.num_layers=1", "model.encoder.num_heads=2", "model.encoder.ffn_size=64",
               "tokenizer.type=wordpiece", f"tokenizer.vocab={english['vocab']}", f"data.train={pairs / 'train.tsv'}",
               f"output={tmp_path / 'x'}", "train.progress=false") == 2
    assert "pair_cls" in capsys.readouterr().err
