"""``pentad evaluate``: a fine-tuned run's task metrics on a labelled file, checked against the same
metrics computed here from ``pentad infer``'s predictions and the file's labels; and its input errors."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from pentad.cli.main import main


def _labels(path) -> list[str]:
    """The first column of a TSV with a header line (the labels of english's files, the predictions)."""
    return [line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines()[1:]]


def _accuracy_and_macro_f1(predicted: list[str], gold: list[str]) -> dict[str, float]:
    f1s = []
    for c in sorted(set(predicted) | set(gold)):
        tp = sum(p == c and g == c for p, g in zip(predicted, gold))
        fp = sum(p == c and g != c for p, g in zip(predicted, gold))
        fn = sum(p != c and g == c for p, g in zip(predicted, gold))
        f1s.append(2 * tp / (2 * tp + fp + fn))
    return {"accuracy": sum(p == g for p, g in zip(predicted, gold)) / len(gold), "macro_f1": sum(f1s) / len(f1s)}


@pytest.mark.parametrize("split", ["test", "skewed"])
def test_evaluate_gives_the_metrics_of_the_predictions(classification_run, english, tmp_path, capsys, split):
    if split == "skewed":  # test.tsv's texts, 7 of 10 labelled 1: scores apart from a balanced file's
        texts = [line.split("\t")[1] for line in english["test"].read_text(encoding="utf-8").splitlines()[1:]]
        path = tmp_path / "skewed.tsv"
        path.write_text("label\ttext_a\n" + "".join(f"{int(i < 7)}\t{t}\n" for i, t in enumerate(texts)),
                        encoding="utf-8")
    else:
        path = english[split]
    pred = tmp_path / "pred.tsv"
    assert main(["infer", "--model", str(classification_run), f"data.test={path}", "--output", str(pred)]) == 0
    expected = _accuracy_and_macro_f1(_labels(pred), _labels(path))
    capsys.readouterr()
    out = tmp_path / "metrics.json"
    assert main(["evaluate", "--model", str(classification_run), f"data.test={path}", "--output", str(out),
                 "--batch-size", "7"]) == 0
    printed = capsys.readouterr().out.splitlines()
    metrics = json.loads(out.read_text(encoding="utf-8"))
    assert list(metrics) == ["accuracy", "macro_f1"]
    assert metrics == pytest.approx(expected, abs=1e-12)
    assert printed[0] == f"{path}:"
    assert printed[1:] == [f"  accuracy  {expected['accuracy']:.4f}", f"  macro_f1  {expected['macro_f1']:.4f}"]
    # the default batch size (fine-tuning's evaluation batches), no --output: printed only
    assert main(["evaluate", "--task", "classification", "--model", str(classification_run),
                 f"data.test={path}"]) == 0
    assert capsys.readouterr().out.splitlines() == printed


def _fails(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_evaluate_input_errors(classification_run, english, tmp_path, capsys):
    run = ["evaluate", "--model", str(classification_run)]
    err = _fails(capsys, [*run, f"data.test={english['nolabel']}"])
    assert str(english["nolabel"]) in err and "no 'label' column" in err and "Traceback" not in err
    missing = tmp_path / "missing.tsv"
    err = _fails(capsys, [*run, f"data.test={missing}"])
    assert f"data.test={missing} does not exist" in err
    assert "needs the labelled input file: data.test=FILE" in _fails(capsys, run)
    assert "not 'data.dev=x.tsv'" in _fails(capsys, [*run, "data.dev=x.tsv"])
    err = _fails(capsys, [*run, f"data.test.a={english['test']}"])
    assert "data.test.NAME=FILE is for a task that reads one file per dataset" in err
    err = _fails(capsys, [*run, "--task", "ner", f"data.test={english['test']}"])
    assert "--task ner does not match the run" in err
    taken = tmp_path / "taken.json"
    taken.write_text("{}", encoding="utf-8")
    err = _fails(capsys, [*run, f"data.test={english['test']}", "--output", str(taken)])
    assert f"--output {taken} already exists" in err and taken.read_text(encoding="utf-8") == "{}"

    # a run directory whose config has no task (a pre-training run) is not a fine-tuned run
    plain = tmp_path / "plain"
    shutil.copytree(classification_run, plain)
    cfg = yaml.safe_load((plain / "config.yaml").read_text(encoding="utf-8"))
    del cfg["task"]
    (plain / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    err = _fails(capsys, ["evaluate", "--model", str(plain), f"data.test={english['test']}"])
    assert f"{plain} is not a fine-tuned run" in err
    err = _fails(capsys, ["evaluate", "--model", str(tmp_path / "nowhere"), f"data.test={english['test']}"])
    assert f"run directory {tmp_path / 'nowhere'} does not exist" in err
