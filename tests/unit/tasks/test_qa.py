"""The qa task: reading SQuAD/CMRC JSON, sliding windows and their labels, the span head, n-best
prediction mapped back to the context, the CMRC 2018 metrics and the predictions file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pentad.components.base import Batch, TargetOutput
from pentad.components.targets.span import SpanTarget
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.tasks.qa import (
    QaTask,
    QaTaskConfig,
    encode_windows,
    exact_match,
    f1_score,
    qa_metrics,
    read_squad,
    segments,
)

CONTEXT = "甲乙丙丁戊己庚辛壬癸子丑寅卯辰巳午未申酉"  # 20 characters, one token each


@pytest.fixture()
def chars(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *CONTEXT, *"问谁是"]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "char", "vocab": str(tmp_path / "vocab.txt")})


def squad(tmp_path, qas, context=CONTEXT, name="q.json"):
    path = tmp_path / name
    data = {"version": "v1.0", "data": [{"paragraphs": [{"context": context, "qas": qas}], "title": "t"}]}
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def qa(qid, answers, question="谁是"):
    return {"id": qid, "question": question, "answers": [{"text": t, "answer_start": s} for t, s in answers]}


# ------------------------------------------------------------------------------------ metrics
def test_segments_follow_the_official_mixed_segmentation():
    assert segments("光荣和ω-force") == ["光", "荣", "和", "ωforce"]  # '-' dropped without breaking the run
    assert segments("光荣和ω-force", drop_punctuation=False) == ["光", "荣", "和", "ω", "-", "force"]
    assert segments("  1998年3月，Hello World 3.5米 ") == ["1998", "年", "3", "月", "hello", "world", "3.5", "米"]
    assert segments("《战国无双3》") == ["战", "国", "无", "双", "3"]


def test_f1_and_em_against_hand_computed_values():
    assert f1_score(["光荣和ω-force"], "光荣") == pytest.approx(2 / 3)  # P 2/2, R 2/4
    assert f1_score(["1998年"], "1998年3月") == pytest.approx(2 / 3)  # P 2/4, R 2/2
    # the longest common *contiguous* run: 丙丁 (2), not the subsequence 甲丙丁 (3): P 2/3, R 2/4
    assert f1_score(["甲乙丙丁"], "甲丙丁") == pytest.approx(4 / 7)
    # the best reference counts: 3/5 and 1 -> 0.75 against 村雨城; 1 and 5/10 -> 2/3 against the other
    assert f1_score(["村雨城", "任天堂游戏谜之村雨城"], "谜之村雨城") == pytest.approx(0.75)
    assert f1_score(["村雨城"], "午未") == 0.0 and f1_score(["村雨城"], "") == 0.0 and f1_score([], "x") == 0.0
    assert exact_match(["《战国无双3》"], "战国无双3") == 1.0  # punctuation removed
    assert exact_match(["Hello World"], " hello world ") == 1.0  # lower-cased and stripped
    assert exact_match(["村雨城", "谜之村雨城"], "雨城") == 0.0
    metrics = qa_metrics([["光荣和ω-force"], ["《战国无双3》"]], ["光荣", "战国无双3"])
    assert metrics == pytest.approx({"f1": (2 / 3 + 1) / 2, "em": 0.5})
    with pytest.raises(ValueError):
        qa_metrics([["a"]], [])


# ------------------------------------------------------------------------------------ reading
def test_read_squad_uses_the_first_located_answer_and_keeps_every_reference(tmp_path):
    path = squad(tmp_path, [qa("q1", [("丙丁", 2), ("丙丁戊", 2)]),
                            qa("q2", [("子丑", -1), ("子丑", 10)]),  # the first has no position
                            qa(3, [("癸", 9)])])
    questions, skipped = read_squad(path, with_labels=True)
    assert skipped == [] and [q.id for q in questions] == ["q1", "q2", "3"]
    assert [(q.start, q.end) for q in questions] == [(2, 4), (10, 12), (9, 10)]
    assert questions[1].answers == ("子丑", "子丑") and questions[0].where == "data[0].paragraphs[0].qas[0]"


def test_a_bad_answer_fails_naming_file_and_id_or_is_skipped_and_counted(tmp_path, chars):
    path = squad(tmp_path, [qa("good", [("丙丁", 2)]), qa("DEV_7_QUERY_1", [("丙丁", 5), ("乙", 3)]),
                            {"id": "none", "question": "谁", "answers": []}])
    with pytest.raises(UserError, match=r"q\.json: question 'DEV_7_QUERY_1' \(data\[0\]\.paragraphs\[0\]\.qas\[1\]\)"
                       r".*'丙丁' at answer_start 5, where the context has '己庚'.*on_bad_answer=skip"):
        read_squad(path, with_labels=True)
    questions, skipped = read_squad(path, with_labels=True, on_bad_answer="skip")
    assert [q.id for q in questions] == ["good"] and skipped == ["DEV_7_QUERY_1", "none"]
    # without labels answers are not read (CMRC's test file has FAKE_ANSWER_1 at -1)
    assert [q.id for q in read_squad(path, with_labels=False)[0]] == ["good", "DEV_7_QUERY_1", "none"]
    task = QaTask(QaTaskConfig(on_bad_answer="skip"), chars, 16)
    assert [q.id for q in task.read(path).questions] == ["good"]
    with pytest.raises(UserError, match=r"holds no questions \(1 skipped for a bad answer\)"):
        task.read(squad(tmp_path, [qa("bad", [("丙丁", 5)])], name="bad.json"))


@pytest.mark.parametrize("text, match", [
    ("{", r"is not valid JSON"),
    ('{"version": 1}', r'an object whose "data" is a list'),
    ('{"data": [{"paragraphs": [{"qas": []}]}]}', r"data\[0\]\.paragraphs\[0\]\.context: expected the context text "
                                                  r"\(str\), found nothing"),
    ('{"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "a"}]}]}]}',
     r"qas\[0\]\.question: expected the question text"),
    ('{"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "a", "question": "q", "answers": '
     '[{"text": "x", "answer_start": "0"}]}]}]}]}', r"answers\[0\]\.answer_start: expected .* found str '0'"),
    ('{"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "a", "question": "q", "answers": '
     '[{"text": "x", "answer_start": 0}]}, {"id": "a", "question": "q"}]}]}]}',
     r"'a' appears twice \(data\[0\]\.paragraphs\[0\]\.qas\[0\] and data\[0\]\.paragraphs\[0\]\.qas\[1\]\)"),
])
def test_malformed_files_name_the_place(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=match):
        read_squad(path, with_labels=True)


# ------------------------------------------------------------------------------------ windows
def test_windows_slide_by_doc_stride_and_label_the_answer_where_it_is_whole(tmp_path, chars):
    path = squad(tmp_path, [qa("q", [("癸子丑", 9)], question="谁是问")])
    questions, _ = read_squad(path, with_labels=True)
    # [CLS] 3 question tokens [SEP] = 5, + final [SEP]: 6 context tokens per window of 12
    w = encode_windows(questions, chars, 12, doc_stride=4, max_question_length=64, labelled=True)
    assert len(w) == 5 and w.context_begin.tolist() == [5] * 5
    assert [CONTEXT[o[0, 0]:o[-1, 1]] for o in w.offsets] == [CONTEXT[b:b + 6] for b in (0, 4, 8, 12)] + [CONTEXT[16:]]
    # the answer (characters 9-11) is whole only in the window starting at 8; elsewhere [CLS] (0, 0)
    assert w.labels.tolist() == [[0, 0], [0, 0], [5 + 1, 5 + 3], [0, 0], [0, 0]]
    assert chars.decode(w.tokens[2]) == "[CLS]谁是问[SEP]壬癸子丑寅卯[SEP]"
    # questions are cut to max_question_length; the stride never skips tokens
    w = encode_windows(questions, chars, 12, doc_stride=100, max_question_length=1, labelled=False)
    assert chars.decode(w.tokens[0]) == "[CLS]谁[SEP]甲乙丙丁戊己庚辛[SEP]" and w.labels is None
    assert [len(o) for o in w.offsets] == [8, 8, 4]
    with pytest.raises(UserError, match="seq_length 5 leaves no room for the context"):
        encode_windows(questions, chars, 5, 4, 64, labelled=True)


def test_each_token_has_one_window_of_most_context():
    from pentad.tasks.qa import _max_context

    # windows 0-5 and 4-9: token 4 is nearer the end of the first (1 left of it on the narrow side) than
    # the start of the second (0); token 5 the other way round
    first, second = _max_context([(0, 6), (4, 6)], 10)
    assert first.tolist() == [True] * 5 + [False] and second.tolist() == [False] + [True] * 5
    spans = [(0, 6), (4, 6), (8, 6), (12, 6), (16, 4)]
    masks = _max_context(spans, 20)
    owners = np.zeros(20, dtype=int)
    for (begin, length), mask in zip(spans, masks):
        assert len(mask) == length
        owners[begin:begin + length] += mask
    assert (owners == 1).all()
    assert _max_context([(0, 0)], 0)[0].tolist() == []


def test_labels_map_back_to_the_answers_on_cmrc_data(shared_data):
    """Every labelled window of TencentPretrain's CMRC sample, with the Chinese BERT vocabulary: the
    tokens between its start and end labels cover exactly the answer's characters."""
    tok = load_tokenizer({"type": "wordpiece", "vocab": str(shared_data / "models" / "google_zh_vocab.txt")})
    questions, _ = read_squad(shared_data / "datasets" / "test_data" / "cmrc" / "train.json", with_labels=True)
    w = encode_windows(questions, tok, 128, 32, 64, labelled=True)
    inside = 0
    for i in range(len(w)):
        start, end = w.labels[i]
        if start == 0:
            continue
        inside += 1
        q = w.questions[w.question_of[i]]
        offs = w.offsets[i]
        begin = w.context_begin[i]
        assert q.context[offs[start - begin, 0]:offs[end - begin, 1]] == q.context[q.start:q.end]
    assert inside >= len(questions)  # each answer is whole in at least one window


# ------------------------------------------------------------------------------------ head
def test_span_head_loss_is_the_mean_of_start_and_end_cross_entropy():
    torch.manual_seed(0)
    head = SpanTarget("span", 8)
    hidden = torch.randn(2, 5, 8)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    labels = torch.tensor([[1, 3], [0, 0]])
    out = head(hidden, Batch(padding_mask=padding, labels={"span": labels}))
    assert out.logits.shape == (2, 5, 2)
    assert (out.logits[1, 3:] == torch.finfo(torch.float32).min).all()  # padding is never chosen
    raw = head.qa_outputs(hidden)
    start = raw[..., 0].masked_fill(padding, torch.finfo(torch.float32).min)
    end = raw[..., 1].masked_fill(padding, torch.finfo(torch.float32).min)
    expected = (F.cross_entropy(start, labels[:, 0]) + F.cross_entropy(end, labels[:, 1])) / 2
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert out.metrics["count"].item() == 2
    assert head(hidden, Batch(padding_mask=padding)).loss is None


# ------------------------------------------------------------------------------------ prediction
class Pointer(torch.nn.Module):
    """Scores start at the tokens `start_id` and end at `end_id` (tokens given in ``scores``: id -> (s, e))."""

    def __init__(self, scores):
        super().__init__()
        self.scores = scores

    def forward(self, batch):
        logits = torch.zeros(*batch.tokens.shape, 2)
        for token, (s, e) in self.scores.items():
            logits[..., 0] += s * (batch.tokens == token)
            logits[..., 1] += e * (batch.tokens == token)
        return {"span": TargetOutput(loss=None, logits=logits)}


def test_predict_takes_the_best_pair_over_all_windows_within_max_answer_length(tmp_path, chars):
    path = squad(tmp_path, [qa("q", [("子丑", 10)])])
    ids = {c: chars.token_to_id(c) for c in CONTEXT}
    cfg = QaTaskConfig(doc_stride=3, max_answer_length=4)
    task = QaTask(cfg, chars, 10, None)  # 5 context tokens per window: the answer spans windows
    windows = task.read(path)
    assert len(windows) > 3
    # best start 乙 (1) and best end 申 (18) are too far apart; 子 .. 寅 (10-12) is the best legal pair
    model = Pointer({ids["乙"]: (9, 0), ids["申"]: (0, 9), ids["子"]: (6, 0), ids["寅"]: (0, 4), ids["丑"]: (0, 1)})
    pred = task.predict(model, windows, 2, torch.device("cpu"))
    assert pred.answers == ["子丑寅"] and 0 < pred.probabilities[0] < 1
    assert task.num_predictions(windows) == 1 and len(windows) > 1
    assert task.score(pred, windows, task.gold(windows)) == pytest.approx({"f1": 0.8, "em": 0.0})
    # with a longer limit, the far pair wins, mapped back to the exact substring
    task = QaTask(QaTaskConfig(doc_stride=3, max_answer_length=30), chars, 30, None)
    assert task.predict(model, task.read(path), 2, torch.device("cpu")).answers == [CONTEXT[1:19]]


class EdgeLover(Pointer):
    """Also scores the last context token of each window (the one before the final [SEP]) as a start,
    except at the end of the context."""

    def __init__(self, scores, last_id):
        super().__init__(scores)
        self.last_id = last_id

    def forward(self, batch):
        out = super().forward(batch)
        lengths = (~batch.padding_mask).sum(1)
        for r, n in enumerate(lengths.tolist()):
            if batch.tokens[r, n - 2] != self.last_id:
                out["span"].logits[r, n - 2, 0] += 5
        return out


def test_an_answer_starts_only_where_its_window_gives_the_most_context(tmp_path, chars):
    path = squad(tmp_path, [qa("q", [("子丑", 10)])])
    task = QaTask(QaTaskConfig(doc_stride=3), chars, 10, None)
    windows = task.read(path)
    model = EdgeLover({chars.token_to_id("丑"): (1, 1)}, last_id=chars.token_to_id(CONTEXT[-1]))
    # a window's last token has more context in the next window, where the model does not like it
    assert task.predict(model, windows, 4, torch.device("cpu")).answers == ["丑"]
    windows.max_context = [np.ones_like(m) for m in windows.max_context]  # without the rule, an edge wins
    assert task.predict(model, windows, 4, torch.device("cpu")).answers[0] in {"戊", "辛", "子", "卯", "午"}


def test_predictions_file_is_the_official_json(tmp_path, chars):
    path = squad(tmp_path, [qa("DEV_0_QUERY_0", [("甲", 0)]), qa("DEV_0_QUERY_1", [("乙", 1)])])
    task = QaTask(QaTaskConfig(), chars, 32, None)
    windows = task.read(path, with_labels=False)
    model = Pointer({chars.token_to_id("丙"): (3, 3)})
    pred = task.predict(model, windows, 8, torch.device("cpu"))
    task.write_predictions(tmp_path / "p.json", pred, windows, probabilities=False)
    written = json.loads((tmp_path / "p.json").read_text(encoding="utf-8"))
    assert written == {"DEV_0_QUERY_0": "丙", "DEV_0_QUERY_1": "丙"}
    task.write_predictions(tmp_path / "p.json", pred, windows, probabilities=True)
    written = json.loads((tmp_path / "p.json").read_text(encoding="utf-8"))
    assert written["DEV_0_QUERY_1"]["answer"] == "丙" and 0 < written["DEV_0_QUERY_1"]["probability"] <= 1
    with pytest.raises(UserError, match="read without answers"):
        task.gold(windows)


def test_collate_marks_the_context_segment_and_pads(tmp_path, chars):
    path = squad(tmp_path, [qa("a", [("甲", 0)], question="谁"), qa("b", [("乙", 1)], question="谁是问")])
    task = QaTask(QaTaskConfig(), chars, 32, None)
    windows = task.read(path)
    batch = task.collate(windows, [0, 1], np.random.default_rng(0))
    assert batch.segments[0].tolist() == [0, 0, 0] + [1] * 21 + [0] * 2
    assert batch.padding_mask[0].tolist() == [False] * 24 + [True] * 2
    assert batch.labels["span"].tolist() == [[3, 3], [6, 6]]
