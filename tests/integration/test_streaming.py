"""Streamed ``pentad infer`` and ``pentad embed``: the input is read, predicted and written a window at a
time (the rows held at once never exceed a window, whatever the input's length), the output is the same,
byte for byte, as reading the input whole, and a bad line part way leaves no output file."""

from __future__ import annotations

import pytest
from tests.integration.conftest import SENTENCES, tiny

from pentad.cli.main import main
from pentad.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(english, tmp_path_factory):
    out = tmp_path_factory.mktemp("stream") / "ft"
    assert main(["finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
                 f"data.train={english['train']}", "train.epochs=1", f"output={out}"]) == 0
    return out


def texts(n: int) -> list[str]:
    """``n`` distinct-ish texts of varied length (so that padding differs between batches)."""
    return [" ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(1 + i % 3)) for i in range(n)]


def tsv(path, n: int):
    path.write_text("text_a\n" + "".join(t + "\n" for t in texts(n)), encoding="utf-8")
    return path


class Counter:
    """Counts the rows parsed from the input and the instances handed to each predict call, recording
    how many rows had been parsed when each window was predicted."""

    def __init__(self, monkeypatch, module, name: str):
        self.parsed = 0
        self.calls: list[tuple[int, int]] = []  # (instances predicted, rows parsed by then)
        import pentad.data.tsv as tsv_module

        split_row = tsv_module.split_row

        def counting_split(*args, **kwargs):
            self.parsed += 1
            return split_row(*args, **kwargs)

        monkeypatch.setattr(tsv_module, "split_row", counting_split)
        predict = getattr(module, name).predict

        def counting_predict(task, model, instances, *args, **kwargs):
            self.calls.append((len(instances), self.parsed))
            return predict(task, model, instances, *args, **kwargs)

        monkeypatch.setattr(getattr(module, name), "predict", counting_predict)


def test_infer_reads_predicts_and_writes_a_window_at_a_time(run, tmp_path, monkeypatch):
    from pentad.tasks import classification, runner

    source = tsv(tmp_path / "in.tsv", 45)
    counter = Counter(monkeypatch, classification, "ClassificationTask")
    monkeypatch.setattr(runner, "INFER_WINDOW", 8, raising=False)
    out = runner.infer(run, source, tmp_path / "streamed.tsv", probabilities=True, batch_size=4)
    # 8 rows a window (two batches of 4): six windows of 8 and one of 5; when a window is predicted no row
    # beyond it has been parsed, so the rows held never exceed a window
    assert [n for n, _ in counter.calls] == [8, 8, 8, 8, 8, 5]
    assert all(parsed <= sum(n for n, _ in counter.calls[:i + 1]) for i, (_, parsed) in
               enumerate(counter.calls))
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 46 and lines[0].startswith("label\tprob_")


def test_streamed_predictions_equal_the_whole_input_byte_for_byte(run, tmp_path):
    """The streamed output against the whole-input path (read everything, predict, write_predictions)."""
    import torch

    from pentad.builder import build_model
    from pentad.registry import TASKS
    from pentad.runs import load_run
    from pentad.tasks.runner import infer, read_task_state
    from pentad.training import checkpoint as ckpt

    source = tsv(tmp_path / "in.tsv", 37)
    cfg, tokenizer = load_run(run)
    task = TASKS.get(cfg.task.type)(cfg.task, tokenizer, cfg.data.objective.seq_length, read_task_state(run))
    task.bind(cfg)
    model = build_model(cfg.model, provided=task.provides, training=False)
    ckpt.load_weights(model, ckpt.read_weights(ckpt.find_weights(run)), str(run))
    for probabilities in (False, True):
        whole = tmp_path / f"whole{probabilities}.tsv"
        instances = task.read(source, with_labels=False)
        task.write_predictions(whole, task.predict(model, instances, 4, torch.device("cpu")), instances,
                               probabilities)
        streamed = infer(run, source, tmp_path / f"streamed{probabilities}.tsv", probabilities, batch_size=4,
                         window=6, device_choice="cpu")
        assert streamed.read_bytes() == whole.read_bytes()


def test_a_bad_line_part_way_leaves_no_predictions_file(run, tmp_path):
    from pentad.tasks.runner import infer

    source = tmp_path / "bad.tsv"
    source.write_text("text_a\n" + "".join(t + "\n" for t in texts(20)) + "a\tstray field\n", encoding="utf-8")
    out = tmp_path / "predictions.tsv"
    with pytest.raises(UserError, match=r"bad.tsv, line 22: the line has 2 tab-separated field"):
        infer(run, source, out, batch_size=4, window=4)
    assert not out.exists() and list(tmp_path.iterdir()) == [source]  # nor a temporary file left behind
