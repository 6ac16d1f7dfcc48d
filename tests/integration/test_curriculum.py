"""Sequence-length warm-up through the CLI: the logged length follows the schedule, the batches are cut
to it, a run stopped mid-warm-up resumes at the same lengths and losses as one that never stopped, and
objectives whose labels a cut would falsify are refused."""

from __future__ import annotations

import pytest
from tests.integration.conftest import tiny

from pentad.cli.main import main
from pentad.training.trainer import MetricsLog

CURRICULUM = ["train.curriculum.start_length=8", "train.curriculum.steps=4", "train.curriculum.multiple_of=8"]


def run(*argv: object) -> int:
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def lm_dataset(english, tmp_path_factory):
    dataset = tmp_path_factory.mktemp("curriculum") / "ds"
    assert run("preprocess", "--config", "gpt2/tiny", *tiny(english["vocab"]), f"data.corpus={english['docs']}",
               f"data.output={dataset}") == 0
    return dataset


@pytest.mark.heavy  # four short pre-training runs: ~20 s on 2 shared cores
def test_length_warm_up_is_logged_and_resumes_exactly(english, lm_dataset, tmp_path):
    common = ["--config", "gpt2/tiny", *tiny(english["vocab"]), *CURRICULUM, f"data.dataset={lm_dataset}",
              "train.steps=6", "train.save_every=2", "train.tensorboard=false", "train.threads=1"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run("pretrain", *common, f"output={straight}") == 0
    records = MetricsLog(straight / "metrics.jsonl").read()
    # 8 + 24 * step / 4 rounded down to a multiple of 8: 8, 14 -> 8, 20 -> 16, 26 -> 24; full (32) from step 4
    assert [r["seq_length"] for r in records] == [8, 8, 16, 24, 32, 32]
    # stopped at step 3, inside the warm-up: the resumed run cuts its batches as the uninterrupted one did
    assert run("pretrain", *common, f"output={split}", "train.stop_at=3") == 0
    assert run("pretrain", *common, f"output={split}") == 0
    resumed = MetricsLog(split / "metrics.jsonl").read()
    assert [r["seq_length"] for r in resumed] == [r["seq_length"] for r in records]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in records]
    # without the curriculum the first step trains on full-length batches: another loss, no length logged
    plain = tmp_path / "plain"
    assert run("pretrain", *[a for a in common if a not in CURRICULUM], "train.steps=1", f"output={plain}") == 0
    assert MetricsLog(plain / "metrics.jsonl").read()[0]["loss"] != records[0]["loss"]
    assert "seq_length" not in MetricsLog(plain / "metrics.jsonl").read()[0]


def test_objectives_that_cannot_be_cut_are_refused_but_may_be_ordered(english, tmp_path, capsys):
    base = tiny(english["vocab"])
    dataset = tmp_path / "bert"
    assert run("preprocess", "--config", "bert/tiny", *base, f"data.corpus={english['bert']}",
               f"data.output={dataset}") == 0
    capsys.readouterr()
    assert run("pretrain", "--config", "bert/tiny", *base, *CURRICULUM, f"data.dataset={dataset}", "train.steps=2",
               f"output={tmp_path / 'run'}") != 0
    err = capsys.readouterr().err
    assert "train.curriculum: objective 'bert' cannot be trained on shortened sequences" in err
    assert "labels.sp" in err
    # difficulty ordering alone (no length warm-up) cuts nothing, so any objective may use it
    ordered = tmp_path / "ordered"
    assert run("pretrain", "--config", "bert/tiny", *base, f"data.dataset={dataset}", "train.steps=2",
               "train.curriculum.start_length=null", "train.curriculum.shortest_first=2", "train.tensorboard=false",
               f"output={ordered}") == 0
    assert "the first 2 steps take the 16 shortest instances" in capsys.readouterr().err
    assert all("seq_length" not in r for r in MetricsLog(ordered / "metrics.jsonl").read())


def test_finetune_refuses_curriculum(english, tmp_path, capsys):
    assert run("finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]), *CURRICULUM,
               f"data.train={english['train']}", f"data.dev={english['dev']}", f"output={tmp_path / 'ft'}") != 0
    assert "train.curriculum (sequence-length warm-up) is a pre-training option" in capsys.readouterr().err
