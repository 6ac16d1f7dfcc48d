"""pentad.tasks.embed: BERT-whitening's maths, pooled vectors equal to the model's own pooled output,
reading text and pair files with clear errors, row cosines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.conftest import tiny_model_dict

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.tasks.embed import Embedder, Whitening, cosine_rows, read_texts


@pytest.fixture()
def wordpiece(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "dog", "ran", "a", "mat", "on"]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def correlated(n: int = 500, width: int = 6, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, width)) @ rng.normal(size=(width, width)) + rng.normal(size=width) * 3


# ------------------------------------------------------------------------- whitening
def test_whitened_vectors_have_zero_mean_and_identity_covariance():
    x = correlated()
    assert np.abs(np.cov(x, rowvar=False) - np.eye(6)).max() > 0.5  # far from white before
    white = Whitening.fit(x).apply(x)
    assert white.shape == (500, 6)
    assert np.allclose(white.mean(axis=0), 0.0, atol=1e-5)
    assert np.allclose(np.cov(white, rowvar=False), np.eye(6), atol=1e-4)


def test_whitening_keeps_the_directions_of_largest_variance():
    x = correlated()
    full, reduced = Whitening.fit(x), Whitening.fit(x, dim=2)
    kept = reduced.apply(x)
    assert kept.shape == (500, 2) and np.allclose(np.cov(kept, rowvar=False), np.eye(2), atol=1e-4)
    assert np.allclose(kept, full.apply(x)[:, :2], atol=1e-4)  # the first columns of the full whitening
    # the dropped directions are those of least variance of the centred data
    eigenvalues = np.linalg.eigvalsh(np.cov(x, rowvar=False))[::-1]
    projected = (x - x.mean(axis=0)) @ (reduced.transform * np.sqrt(eigenvalues[:2]))
    assert np.allclose(projected.var(axis=0, ddof=1), eigenvalues[:2], rtol=1e-6)


def test_whitening_drops_directions_without_variance():
    x = correlated()
    x[:, -1] = -x[:, :-1].sum(axis=1) + 1.0  # every vector in one hyperplane, as after LayerNorm
    white = Whitening.fit(x)
    assert white.transform.shape == (6, 5)
    assert np.allclose(np.cov(white.apply(x), rowvar=False), np.eye(5), atol=1e-4)
    with pytest.raises(UserError, match=r"whitening to 6 dimensions needs 6 directions .* have 5"):
        Whitening.fit(x, dim=6)
    with pytest.raises(UserError, match=r"--whitening-dim 7 is out of range"):
        Whitening.fit(x, dim=7)
    with pytest.raises(UserError, match="at least 2 vectors"):
        Whitening.fit(x[:1])


def test_cosine_rows():
    a, b = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]), np.array([[0.0, 2.0], [2.0, 2.0], [1.0, 0.0]])
    assert cosine_rows(a, b).tolist() == pytest.approx([0.0, 1.0, 0.0])


# ------------------------------------------------------------------------- pooling
@pytest.mark.parametrize("pooling", ["first", "mean", "max", "last"])
def test_pooled_vectors_equal_the_two_stream_models_pooled_output(wordpiece, pooling):
    model_dict = tiny_model_dict(vocab_size=13, targets=[{"type": "clr"}])
    model_dict["streams"] = {"text_a": {"pooling": pooling}, "text_b": {"share": "text_a", "pooling": pooling}}
    torch.manual_seed(0)
    model = build_model(model_config_class().model_validate(model_dict)).eval()
    texts = ["the cat sat on the mat", "a dog", "the dog ran on a mat"]
    embedder = Embedder(model, wordpiece, 16, pooling, torch.device("cpu"))
    vectors = embedder(texts, batch_size=2)
    ids = embedder.encode(texts)
    assert ids[1].tolist() == [2, 10, 8, 3]
    width = max(len(x) for x in ids)
    tokens = torch.tensor([list(x) + [0] * (width - len(x)) for x in ids])
    mask = tokens == 0
    batch = Batch(tokens=tokens, segments=torch.zeros_like(tokens), padding_mask=mask,
                  pair=Batch(tokens=tokens, segments=torch.zeros_like(tokens), padding_mask=mask))
    with torch.no_grad():
        pooled = model.encode_pair(batch)
    assert vectors.shape == (3, 32) and np.allclose(vectors, pooled.first.numpy(), atol=1e-5)
    # batching does not change a vector (padding is ignored)
    assert np.allclose(embedder(texts[1:2])[0], vectors[1], atol=1e-5)


def test_pooling_of_a_one_stream_run(wordpiece):
    torch.manual_seed(0)
    model = build_model(model_config_class().model_validate(tiny_model_dict(vocab_size=13))).eval()
    vectors = Embedder(model, wordpiece, 16, "mean", torch.device("cpu"))(["the cat sat", "a dog"])
    with torch.no_grad():
        tokens = torch.tensor([[2, 10, 8, 3]])
        hidden, _ = model.encode(Batch(tokens=tokens, segments=torch.zeros_like(tokens),
                                       padding_mask=torch.zeros(1, 4, dtype=torch.bool)))
    assert np.allclose(vectors[1], hidden[0].mean(dim=0).numpy(), atol=1e-5)
    assert F.cosine_similarity(torch.from_numpy(vectors[:1]), torch.from_numpy(vectors[1:])).abs() < 1.0
    with pytest.raises(UserError, match="unknown pooling 'sum'"):
        Embedder(model, wordpiece, 16, "sum", torch.device("cpu"))  # type: ignore[arg-type]


# ------------------------------------------------------------------------- reading
def test_reads_lines_tsvs_and_pairs(tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("the cat\na dog ran\n", encoding="utf-8")
    assert read_texts(lines).text_a == ["the cat", "a dog ran"]
    tsv = tmp_path / "x.tsv"
    tsv.write_text("label\ttext_a\n1\tthe cat\n0\ta dog\n", encoding="utf-8")
    assert read_texts(tsv).text_a == ["the cat", "a dog"]
    pairs = tmp_path / "p.tsv"
    pairs.write_text("text_a\ttext_b\tlabel\nthe cat\ta cat\t4.5\na dog\tthe mat\t0\n", encoding="utf-8")
    read = read_texts(pairs, pairs=True)
    assert read.text_b == ["a cat", "the mat"] and read.labels.tolist() == [4.5, 0.0]


@pytest.mark.parametrize("text, pairs, message", [
    ("the cat\n\na dog\n", False, r"bad.txt, line 2: the line is empty"),
    ("\n\n", False, r"has no text"),
    ("the cat\n", True, r"bad.txt, line 1: --similarity reads pairs from a TSV"),
    ("text_a\tlabel\nthe cat\t1\n", True, r"--similarity needs a text_b column"),
    ("text_a\ttext_b\tlabel\nthe cat\ta dog\thigh\n", True, r"bad.txt, line 2: label 'high' is not a number"),
    ("text_a\ttext_b\nthe cat\n", True, r"bad.txt, line 2: the line has 1 tab-separated field"),
    ("text_a\ttext_b\nthe cat\t\n", True, r"bad.txt, line 2: the text_b field is empty"),
])
def test_bad_inputs_are_named(tmp_path, text, pairs, message):
    path = tmp_path / "bad.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=message):
        read_texts(path, pairs=pairs)
