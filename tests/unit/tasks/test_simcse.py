"""The simcse task: rank correlation against hand-computed values, reading TencentPretrain's SimCSE
TSVs with clear errors, batches of each mode, the two-stream model (one shared tower) it fine-tunes, and
its predictions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.conftest import tiny_model_dict

from pentad.builder import build_model
from pentad.components.model_config import model_config_class
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.tasks.correlation import average_ranks, pearson, spearman
from pentad.tasks.simcse import SimcseTask, SimcseTaskConfig


@pytest.fixture()
def wordpiece(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "dog", "ran", "a", "mat", "on"]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def task(tokenizer, **cfg) -> SimcseTask:
    return SimcseTask(SimcseTaskConfig(**cfg), tokenizer, 16)


# ------------------------------------------------------------------------- metrics
def test_average_ranks_share_ties():
    assert average_ranks(np.array([10.0, 30.0, 20.0, 30.0])).tolist() == [1.0, 3.5, 2.0, 3.5]
    assert average_ranks(np.array([5.0, 5.0, 5.0])).tolist() == [2.0, 2.0, 2.0]


def test_spearman_and_pearson_against_hand_computed_values():
    # ranks of y with a tie: [1, 2, 3.5, 5, 3.5]; sum dx*dy = 8, sum dx^2 = 10, sum dy^2 = 9.5
    x, y = np.array([1, 2, 3, 4, 5.0]), np.array([5, 6, 7, 8, 7.0])
    assert spearman(x, y) == pytest.approx(8 / np.sqrt(95))
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert spearman(x, x ** 3) == pytest.approx(1.0) and spearman(x, -x) == pytest.approx(-1.0)
    assert pearson(x, np.ones(5)) == 0.0  # undefined for a constant: reported as no correlation


# ------------------------------------------------------------------------- reading
def test_reads_unsupervised_supervised_and_pair_files(wordpiece, tmp_path):
    t = task(wordpiece)
    unsup = t.read(write(tmp_path / "u.tsv", "text_a\nthe cat sat\na dog ran\n"))
    assert len(unsup) == 2 and unsup.text_b is None and unsup.labels is None
    assert unsup.text_a.sequence(0).tolist() == [2, 5, 6, 7, 3]
    sup = t.read(write(tmp_path / "s.tsv", "text_a\ttext_b\thard_negative\nthe cat\tthe cat sat\ta dog\n"))
    assert sup.hard_negative.sequence(0).tolist() == [2, 10, 8, 3]
    pairs = t.read(write(tmp_path / "p.tsv", "label\ttext_a\ttext_b\n4.5\tthe cat\tthe mat\n0\ta dog\tthe cat\n"))
    assert t.gold(pairs).tolist() == [4.5, 0.0]


@pytest.mark.parametrize("text, message", [
    ("label\tsentence\n1\tthe cat\n", r"x.tsv, line 1: expected a header.*unknown column name\(s\) \['sentence'\]"),
    ("label\ttext_b\n1\tthe cat\n", r"line 1: .*no 'text_a' column"),
    ("text_a\ttext_b\nthe cat\n", r"x.tsv, line 2: the line has 1 tab-separated field\(s\), the header has 2"),
    ("text_a\ttext_b\nthe cat\t \n", r"x.tsv, line 2: the text_b field is empty"),
    ("text_a\n", r"has a header but no data lines"),
])
def test_bad_files_are_named_by_line(wordpiece, tmp_path, text, message):
    with pytest.raises(UserError, match=message):
        task(wordpiece).read(write(tmp_path / "x.tsv", text))


def test_mode_and_columns_must_agree(wordpiece, tmp_path):
    sentences = write(tmp_path / "u.tsv", "text_a\nthe cat sat\n")
    with pytest.raises(UserError, match=r"u.tsv, line 1: task.mode is supervised.*text_b column"):
        task(wordpiece, mode="supervised").fit(sentences)
    t = task(wordpiece)
    with pytest.raises(UserError, match=r"u.tsv, line 1: simcse scores sentence pairs.*pentad embed"):
        t.gold(t.read(sentences))
    with pytest.raises(UserError, match=r"p.tsv, line 1: an evaluation file needs a label column"):
        t.gold(t.read(write(tmp_path / "p.tsv", "text_a\ttext_b\nthe cat\ta dog\n")))
    with pytest.raises(UserError, match=r"l.tsv, line 3: label 'high' is not a number"):
        t.gold(t.read(write(tmp_path / "l.tsv", "label\ttext_a\ttext_b\n1\tthe\tcat\nhigh\ta\tdog\n")))


# ------------------------------------------------------------------------- batches and model
def test_unsupervised_batches_hold_each_sentence_twice(wordpiece, tmp_path):
    t = task(wordpiece)
    inst = t.read(write(tmp_path / "u.tsv", "label\ttext_a\n1\tthe cat sat on the mat\n0\ta dog\n1\tthe dog ran\n"))
    batch = t.collate(inst, [2, 0], np.random.default_rng(0))
    assert torch.equal(batch.pair.tokens, batch.tokens) and batch.negative is None and not batch.labels
    assert batch.tokens[0].tolist()[:5] == [2, 5, 8, 9, 3] and batch.padding_mask.sum().item() == 3
    # a distributed split keeps every sentence with its copy
    part = batch.rows(torch.tensor([1]))
    assert torch.equal(part.tokens, part.pair.tokens)


def test_supervised_batches_pair_positives_and_hard_negatives(wordpiece, tmp_path):
    t = task(wordpiece, mode="supervised")
    path = write(tmp_path / "s.tsv", "text_a\ttext_b\thard_negative\nthe cat\tthe cat sat\ta dog\n"
                                     "a dog\ta dog ran\tthe mat\n")
    t.fit(path)
    batch = t.collate(t.read(path), [0, 1], np.random.default_rng(0))
    assert batch.pair.tokens[0].tolist() == [2, 5, 6, 7, 3] and batch.negative.tokens[1].tolist() == [2, 5, 11, 3]
    assert "hard negatives" in t.describe()


def test_model_config_gives_a_one_stream_model_two_streams_through_one_tower(wordpiece):
    t = task(wordpiece, pooling="mean", temperature=0.1)
    model = tiny_model_dict(vocab_size=13)
    model["targets"] = t.head_configs()
    dual = t.model_config(model)
    assert dual["streams"] == {"text_a": {"pooling": "mean"}, "text_b": {"share": "text_a", "pooling": "mean"}}
    assert dual["encoder"] == model["encoder"]
    cls = model_config_class()
    built = build_model(cls.model_validate(dual))
    plain = build_model(cls.model_validate(tiny_model_dict(vocab_size=13, targets=["sp"])))
    one_stream = {k for k in plain.state_dict() if not k.startswith("targets.")}
    assert set(built.state_dict()) == one_stream  # a BERT run initialises it as it is (clr has no weights)
    again = t.model_config(cls.model_validate(dual).model_dump())  # a two-stream model keeps its streams, repooled
    assert again["streams"]["text_a"]["pooling"] == "mean" and again["streams"]["text_b"]["share"] == "text_a"
    legacy = t.model_config({**model, "encoder": {"type": "dual", "stream_0": {"encoder": model["encoder"]}}})
    assert legacy["streams"]["text_b"] == {"pooling": "mean", "share": "text_a"}
    assert t.head_configs() == [{"type": "clr", "name": "clr", "temperature": 0.1, "symmetric": False}]


def test_predictions_are_cosines_of_the_pooled_pair_and_are_written(wordpiece, tmp_path):
    t = task(wordpiece, pooling="mean")
    model_dict = tiny_model_dict(vocab_size=13)
    model_dict["targets"] = t.head_configs()
    torch.manual_seed(0)
    model = build_model(model_config_class().model_validate(t.model_config(model_dict)))
    inst = t.read(write(tmp_path / "p.tsv", "label\ttext_a\ttext_b\n1\tthe cat sat\tthe cat\n0\ta dog\tthe mat on\n"
                                            "1\tthe dog\tthe dog ran\n"))
    predicted = t.predict(model, inst, 2, torch.device("cpu"))
    from pentad.tasks.simcse import sentence_batch

    a = sentence_batch(inst.text_a, t.pad_id)
    a.pair = sentence_batch(inst.text_b, t.pad_id)
    pooled = model.eval().encode_pair(a)
    assert np.allclose(predicted, F.cosine_similarity(pooled.first, pooled.second).detach().numpy(), atol=1e-5)
    scores = t.score(predicted, inst, t.gold(inst))
    assert set(scores) == {"spearman", "pearson"} and -1.0 <= scores["spearman"] <= 1.0
    t.write_predictions(tmp_path / "out.tsv", predicted, inst, False)
    lines = (tmp_path / "out.tsv").read_text().splitlines()
    assert lines[0] == "similarity" and [float(x) for x in lines[1:]] == pytest.approx(predicted, abs=1e-6)
