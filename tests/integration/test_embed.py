"""``pentad embed`` on a tiny fine-tuned run: vectors (.npy) with a JSON description, whitening,
pair similarities with their correlation to labels, and outputs never replaced silently."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.integration.conftest import SENTENCES

from pentad.cli.main import main
from pentad.tasks.correlation import spearman
from pentad.tasks.embed import Whitening, cosine_rows


@pytest.fixture(scope="module")
def run(classification_run):
    return classification_run


def test_vectors_and_their_description(run, english, tmp_path, capsys):
    assert main(["embed", str(run), "--input", str(english["nolabel"])]) == 0  # default RUN/embeddings.npy
    described = json.loads(capsys.readouterr().out)
    vectors = np.load(run / "embeddings.npy")
    assert vectors.shape == (10, 32) and vectors.dtype == np.float32
    assert described == json.loads((run / "embeddings.json").read_text())
    assert described["pooling"] == "mean" and described["dim"] == 32 and described["count"] == 10
    assert described["whitening"] is None and described["run"] == str(run.resolve())
    # one text per line gives the same vectors as the TSV's text_a column
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(line + "\n" for line in english["nolabel"].read_text().splitlines()[1:]))
    assert main(["embed", str(run), "--input", str(lines), "--output", str(tmp_path / "v.npy")]) == 0
    assert np.allclose(np.load(tmp_path / "v.npy"), vectors, atol=1e-6)
    # first-token pooling differs
    assert main(["embed", str(run), "--input", str(lines), "--output", str(tmp_path / "f.npy"), "--pooling",
                 "first"]) == 0
    assert not np.allclose(np.load(tmp_path / "f.npy"), vectors, atol=1e-3)


def test_whitening_on_the_input_or_another_file(run, english, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{a} {b}\n" for a in SENTENCES for b in SENTENCES))  # 100 texts
    out = tmp_path / "white.npy"
    assert main(["embed", str(run), "--input", str(corpus), "--output", str(out), "--whitening",
                 "--whitening-dim", "8"]) == 0
    white = np.load(out)
    assert white.shape == (100, 8) and np.allclose(np.cov(white, rowvar=False), np.eye(8), atol=1e-3)
    assert json.loads(capsys.readouterr().out)["whitening"] == {"fit_on": "input", "dim": 8}
    out2 = tmp_path / "white2.npy"
    assert main(["embed", str(run), "--input", str(english["nolabel"]), "--output", str(out2), "--whitening",
                 "--whitening-dim", "8", "--whitening-fit", str(corpus)]) == 0
    assert json.loads(capsys.readouterr().out)["whitening"]["fit_on"] == str(corpus.resolve())
    # = the whitening fitted on the corpus's plain vectors, applied to the input's plain vectors
    for name, path in (("corpus", corpus), ("input", english["nolabel"])):
        assert main(["embed", str(run), "--input", str(path), "--output", str(tmp_path / f"{name}.npy")]) == 0
    fitted = Whitening.fit(np.load(tmp_path / "corpus.npy"), dim=8)
    assert np.allclose(np.load(out2), fitted.apply(np.load(tmp_path / "input.npy")), atol=1e-4)
    assert np.allclose(fitted.apply(np.load(tmp_path / "corpus.npy")), white, atol=1e-4)


def test_similarity_of_pairs_with_labels(run, english, tmp_path, capsys):
    pairs = tmp_path / "pairs.tsv"
    rows = [(SENTENCES[i], SENTENCES[(i * 3) % 10], float(i % 3)) for i in range(10)]
    pairs.write_text("label\ttext_a\ttext_b\n" + "".join(f"{y}\t{a}\t{b}\n" for a, b, y in rows))
    out = tmp_path / "sim.tsv"
    assert main(["embed", str(run), "--input", str(pairs), "--similarity", "--output", str(out)]) == 0
    described = json.loads(capsys.readouterr().out)
    lines = out.read_text().splitlines()
    assert lines[0] == "similarity" and len(lines) == 11
    similarity = np.array([float(x) for x in lines[1:]])
    # the cosines of the vectors pentad embed writes for each side
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("".join(r[0] + "\n" for r in rows))
    b.write_text("".join(r[1] + "\n" for r in rows))
    for side in (a, b):
        assert main(["embed", str(run), "--input", str(side), "--output", str(side.with_suffix(".npy"))]) == 0
    expected = cosine_rows(np.load(a.with_suffix(".npy")), np.load(b.with_suffix(".npy")))
    assert np.allclose(similarity, expected, atol=1e-5)
    assert similarity[0] == pytest.approx(1.0, abs=1e-5)  # the same sentence on both sides
    labels = np.array([r[2] for r in rows])
    assert described["spearman"] == pytest.approx(spearman(expected, labels), abs=1e-3)
    assert json.loads(out.with_suffix(".json").read_text())["what"] == "similarity"


def test_outputs_are_never_replaced_silently_and_bad_options_are_named(run, english, tmp_path, capsys):
    out = tmp_path / "v.npy"
    assert main(["embed", str(run), "--input", str(english["nolabel"]), "--output", str(out)]) == 0
    capsys.readouterr()
    for argv, message in [
        ([], "already exists; pass --overwrite"),
        (["--whitening-dim", "4"], "--whitening-dim is set without --whitening"),
        (["--whitening", "--whitening-dim", "40", "--overwrite"], "--whitening-dim 40 is out of range"),
        (["--similarity", "--overwrite"], "nolabel.tsv, line 1: --similarity needs a text_b column"),
    ]:
        assert main(["embed", str(run), "--input", str(english["nolabel"]), "--output", str(out), *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert main(["embed", str(run), "--input", str(english["nolabel"]), "--output", str(tmp_path / "v.txt")]) == 2
    assert "ending in .npy" in capsys.readouterr().err
    assert main(["embed", str(run), "--input", str(english["nolabel"]), "--output", str(out), "--overwrite"]) == 0
