"""Streamed ``pentad infer`` and ``pentad embed``: the input is read, predicted and written a window at a
time (the rows held at once never exceed a window, whatever the input's length), the output is the same,
byte for byte, as reading the input whole, and a bad line part way leaves no output file."""

from __future__ import annotations

import numpy as np
import pytest
from tests.integration.conftest import SENTENCES

from pentad.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(classification_run):
    return classification_run


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


# ------------------------------------------------------------------------- pentad embed
def test_embed_reads_embeds_and_writes_a_window_at_a_time(run, tmp_path, monkeypatch):
    from pentad.tasks import embed

    source = tmp_path / "lines.txt"
    source.write_text("".join(t + "\n" for t in texts(45)), encoding="utf-8")
    sizes = []
    call = embed.Embedder.__call__

    def counting(self, batch, *args, **kwargs):
        sizes.append(len(batch))
        return call(self, batch, *args, **kwargs)

    monkeypatch.setattr(embed.Embedder, "__call__", counting)
    monkeypatch.setattr(embed, "EMBED_WINDOW", 8, raising=False)
    described = embed.embed_file(run, source, tmp_path / "v.npy", batch_size=4, device="cpu")
    assert sizes == [8, 8, 8, 8, 8, 5]  # never more texts at once than a window
    assert described["count"] == 45 and np.load(tmp_path / "v.npy").shape == (45, 32)


def test_streamed_embeddings_equal_the_whole_input_byte_for_byte(run, tmp_path):
    """Vectors and pair similarities against embedding the whole input at once and writing it as before."""
    from pentad.tasks.embed import Embedder, cosine_rows, embed_file

    embedder = Embedder.from_run(run, device="cpu")
    lines = texts(37)
    source = tmp_path / "lines.txt"
    source.write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    np.save(tmp_path / "whole.npy", embedder(lines, 4).astype(np.float32))
    embed_file(run, source, tmp_path / "streamed.npy", batch_size=4, device="cpu", window=6)
    assert (tmp_path / "streamed.npy").read_bytes() == (tmp_path / "whole.npy").read_bytes()

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("text_a\ttext_b\tlabel\n" + "".join(f"{a}\t{b}\t{i % 5}\n" for i, (a, b) in
                                                      enumerate(zip(lines, reversed(lines)))), encoding="utf-8")
    cosines = cosine_rows(embedder(lines, 4), embedder(lines[::-1], 4))
    described = embed_file(run, pairs, tmp_path / "sim.tsv", batch_size=4, device="cpu", similarity=True,
                           window=6)
    assert (tmp_path / "sim.tsv").read_text() == "similarity\n" + "".join(f"{x:.6f}\n" for x in cosines)
    from pentad.tasks.correlation import spearman

    assert described["spearman"] == pytest.approx(spearman(cosines, np.arange(37) % 5))


def test_streamed_whitening_equals_the_covariance_of_all_vectors(run, tmp_path):
    """Whitening fitted from running sums over the windows (the raw vectors in a scratch file, removed
    after) equals the whitening computed from all vectors at once with np.cov, to rounding."""
    from pentad.tasks.embed import Embedder, embed_file

    lines = texts(60)
    source = tmp_path / "lines.txt"
    source.write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    raw = Embedder.from_run(run, device="cpu")(lines, 4).astype(np.float64)
    mean = raw.mean(axis=0)
    u, s, _ = np.linalg.svd(np.cov(raw - mean, rowvar=False))
    expected = (raw - mean) @ (u[:, :8] / np.sqrt(s[:8]))
    out = tmp_path / "out" / "white.npy"
    embed_file(run, source, out, whitening=True, whitening_dim=8, batch_size=4, device="cpu", window=8)
    white = np.load(out)
    # a direction's sign is the SVD's choice: compare up to it
    signs = np.sign((white * expected).sum(axis=0))
    assert np.allclose(white * signs, expected, atol=1e-4)
    assert sorted(p.name for p in out.parent.iterdir()) == ["white.json", "white.npy"]  # no scratch left
