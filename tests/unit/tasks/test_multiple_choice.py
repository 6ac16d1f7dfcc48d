"""The multiple_choice task (C3 format): reading, sequence layout and truncation, batches of padded
choices (Batch.group_padding_mask, rows split by question), the choice head, accuracy and predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pentad.components.base import Batch
from pentad.components.targets.choice import ChoiceTarget
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.tasks.multiple_choice import MultipleChoiceTask, MultipleChoiceTaskConfig, assemble_choice

CHARS = "男女听说你们公司要派去南方工作是呀他在谈论什么旅行环境家庭天气很好吗不错"


@pytest.fixture()
def tokenizer(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(CHARS)]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def ids(tokenizer, text):
    return [tokenizer.token_to_id(c) for c in text]


def write(path, data):
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


DOCS = [
    [["男：你们公司要派你去南方", "女：是呀"], [
        {"question": "他们在谈论什么", "choice": ["旅行", "环境", "工作", "家庭"], "answer": "工作"},
        {"question": "女是什么", "choice": ["男", "女"], "answer": "女"}], "7-1"],
    [["天气很好"], [{"question": "天气好吗", "choice": ["很好", "不错", "不好"], "answer": "不好", "id": 42}]],
]


def task(tokenizer, seq_length=64, **over):
    return MultipleChoiceTask(MultipleChoiceTaskConfig(**over), tokenizer, seq_length)


def test_assemble_choice_layout_and_truncation_order():
    cls, sep = 100, 101
    seq, split = assemble_choice([1, 2, 3, 4], [5, 6], [7], cls, sep, 16)
    assert seq.tolist() == [cls, 1, 2, 3, 4, sep, 5, 6, 7, sep] and split == 6
    # the context loses its end first ...
    seq, split = assemble_choice([1, 2, 3, 4], [5, 6], [7], cls, sep, 8)
    assert seq.tolist() == [cls, 1, 2, sep, 5, 6, 7, sep] and split == 4
    # ... then the question, then the choice
    seq, _ = assemble_choice([1, 2], [5, 6], [7, 8], cls, sep, 6)
    assert seq.tolist() == [cls, sep, 5, 7, 8, sep]
    seq, _ = assemble_choice([1], [5], [7, 8, 9], cls, sep, 5)
    assert seq.tolist() == [cls, sep, 7, 8, sep]


def test_read_c3_questions_ids_answers_and_padding(tokenizer, tmp_path):
    t = task(tokenizer)
    q = t.read(write(tmp_path / "c3.json", DOCS))
    assert len(q) == 3 and q.width == 4
    assert q.counts.tolist() == [4, 2, 3] and q.answers.tolist() == [2, 1, 2]
    assert q.ids == ["7-1-0", "7-1-1", 42]  # document id + question number, or the question's own id
    assert q.groups.tolist() == [0, 0, 1] and q.texts[2] == ["很好", "不错", "不好"]
    assert len(q.choices) == 12
    # question 0, choice 2: [CLS] context [SEP] question choice [SEP] (the sentences joined by a newline)
    context = tokenizer.encode("男：你们公司要派你去南方\n女：是呀")
    assert tokenizer.unk_id in context  # the full-width colon is not in this vocabulary: [UNK], kept
    expected = [tokenizer.cls_id, *context, tokenizer.sep_id, *ids(tokenizer, "他们在谈论什么工作"), tokenizer.sep_id]
    assert q.choices.sequence(2).tolist() == expected
    assert q.choices.fields["split"][2] == len(context) + 2
    # dummy choices of question 1: [CLS] [SEP]
    assert q.choices.sequence(6).tolist() == [tokenizer.cls_id, tokenizer.sep_id]
    assert q.choices.sequence(7).tolist() == [tokenizer.cls_id, tokenizer.sep_id]
    assert t.gold(q).tolist() == [2, 1, 2]


def test_collate_flattens_choices_and_marks_dummies(tokenizer, tmp_path):
    t = task(tokenizer)
    q = t.read(write(tmp_path / "c3.json", DOCS))
    batch = t.collate(q, [2, 1], np.random.default_rng(0))
    assert batch.tokens.shape[0] == 8 and batch.batch_size == 2
    assert batch.group_padding_mask.tolist() == [[False, False, False, True], [False, False, True, True]]
    assert batch.labels["choice"].tolist() == [2, 1]
    # row 0 is question 2's first choice: its question+choice part is segment 1, the context segment 0
    row = batch.tokens[0][~batch.padding_mask[0]].tolist()
    assert row == q.choices.sequence(8).tolist()
    split = row.index(tokenizer.sep_id) + 1
    assert batch.segments[0, :split].tolist() == [0] * split
    assert batch.segments[0, split:len(row)].tolist() == [1] * (len(row) - split)
    assert not batch.segments[batch.padding_mask].any()
    assert batch.provided() >= {"tokens", "segments", "padding_mask", "group_padding_mask", "labels.choice"}
    assert batch.provided() <= t.provides


def test_rows_of_a_grouped_batch_are_whole_questions(tokenizer, tmp_path):
    t = task(tokenizer)
    q = t.read(write(tmp_path / "c3.json", DOCS))
    batch = t.collate(q, [0, 1, 2], np.random.default_rng(0))
    part = batch.rows(torch.tensor([2, 0]))
    assert part.batch_size == 2 and part.tokens.shape[0] == 8
    assert torch.equal(part.tokens[:4], batch.tokens[8:12]) and torch.equal(part.tokens[4:], batch.tokens[:4])
    assert torch.equal(part.padding_mask[:4], batch.padding_mask[8:12])
    assert part.group_padding_mask.tolist() == [batch.group_padding_mask[2].tolist(),
                                                batch.group_padding_mask[0].tolist()]
    assert part.labels["choice"].tolist() == [2, 2]
    moved = part.to("cpu")
    assert torch.equal(moved.group_padding_mask, part.group_padding_mask)


def test_each_rank_of_a_distributed_run_trains_on_whole_questions(tokenizer, tmp_path):
    """The trainer's split of a global batch between ranks (Trainer._rank_rows) goes by question."""
    from types import SimpleNamespace

    from pentad.training.trainer import Trainer

    t = task(tokenizer)
    q = t.read(write(tmp_path / "c3.json", DOCS))
    batch = t.collate(q, [0, 1, 2], np.random.default_rng(0))
    shares = [Trainer._rank_rows(SimpleNamespace(dist=SimpleNamespace(world_size=2, rank=r)), batch)
              for r in (0, 1)]
    (first, w0), (second, w1) = shares
    assert (w0, w1) == (1.0, 1.0) and (first.batch_size, second.batch_size) == (1, 2)
    assert torch.equal(first.tokens, batch.tokens[:4]) and torch.equal(second.tokens, batch.tokens[4:])
    assert second.labels["choice"].tolist() == [1, 2] and second.group_padding_mask.shape == (2, 4)
    # more ranks than questions: a rank without a question trains on a stand-in with weight 0
    lone = t.collate(q, [1], np.random.default_rng(0))
    stand_in, weight = Trainer._rank_rows(SimpleNamespace(dist=SimpleNamespace(world_size=2, rank=0)), lone)
    assert weight == 0.0 and stand_in.tokens.shape[0] == 4 and stand_in.batch_size == 1


def test_an_ungrouped_batch_is_unchanged_by_the_new_field():
    batch = Batch(tokens=torch.arange(6).view(3, 2), labels={"cls": torch.tensor([0, 1, 2])})
    assert batch.batch_size == 3 and "group_padding_mask" not in batch.provided()
    part = batch.rows(torch.tensor([1]))
    assert part.tokens.tolist() == [[2, 3]] and part.labels["cls"].tolist() == [1]


def test_choice_head_scores_each_choice_and_never_picks_a_dummy():
    torch.manual_seed(0)
    head = ChoiceTarget("choice", hidden_size=8, pooler=False, dropout=0.0)
    with torch.no_grad():
        head.scorer.weight.fill_(1.0)
        head.scorer.bias.zero_()
    hidden = torch.zeros(2 * 3, 5, 8)
    hidden[:, 0, 0] = torch.tensor([1.0, 3.0, 2.0, 0.5, 9.0, 9.5])  # the [CLS] vector's sum is the score
    groups = torch.tensor([[False, False, False], [False, True, True]])
    batch = Batch(tokens=torch.zeros(6, 5, dtype=torch.long), group_padding_mask=groups,
                  labels={"choice": torch.tensor([1, 0])})
    out = head(hidden, batch)
    assert out.logits.shape == (2, 3)
    assert out.logits.argmax(-1).tolist() == [1, 0]  # question 1's dummies (9.0, 9.5) never win
    assert torch.softmax(out.logits, -1)[1].tolist() == [1.0, 0.0, 0.0]
    expected = torch.nn.functional.cross_entropy(torch.tensor([1.0, 3.0, 2.0]).view(1, 3), torch.tensor([1]))
    assert out.loss.item() == pytest.approx(expected.item() / 2, rel=1e-5)  # question 1 has one choice: loss 0
    assert out.metrics["correct"].item() == 2 and out.metrics["count"].item() == 2
    assert head(hidden, Batch(tokens=batch.tokens, group_padding_mask=groups)).loss is None
    with pytest.raises(ValueError, match="6 rows for 3 questions"):
        head(hidden, Batch(tokens=batch.tokens, group_padding_mask=torch.zeros(3, 3, dtype=torch.bool)))


def test_the_choice_head_is_checked_against_the_data_at_build_time():
    from tests.conftest import tiny_model_dict

    from pentad.assembly import run_config_class
    from pentad.builder import build_model

    model_cfg = run_config_class().model_validate({"model": tiny_model_dict(targets=[{"type": "choice"}])}).model
    with pytest.raises(UserError, match="target 'choice' needs Batch.group_padding_mask"):
        build_model(model_cfg, provided={"tokens", "segments", "padding_mask", "labels.choice"})
    model = build_model(model_cfg, provided=MultipleChoiceTask.provides)
    batch = Batch(tokens=torch.randint(5, 50, (8, 6)), segments=torch.zeros(8, 6, dtype=torch.long),
                  padding_mask=torch.zeros(8, 6, dtype=torch.bool),
                  group_padding_mask=torch.tensor([[False] * 4, [False, False, True, True]]),
                  labels={"choice": torch.tensor([3, 1])})
    out = model(batch)["choice"]
    out.loss.backward()
    assert out.logits.shape == (2, 4) and torch.isfinite(out.loss)


def test_score_and_predictions(tokenizer, tmp_path):
    t = task(tokenizer)
    q = t.read(write(tmp_path / "c3.json", DOCS))
    floor = torch.finfo(torch.float32).min
    logits = torch.tensor([[0.0, 1.0, 3.0, floor], [2.0, 1.0, floor, floor], [0.0, 0.0, -1.0, floor]])
    assert t.score(logits, q, t.gold(q)) == {"accuracy": pytest.approx(1 / 3)}  # gold 2, 1, 2: only the first
    out = tmp_path / "pred.jsonl"
    t.write_predictions(out, logits, q, probabilities=False)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert records == [{"id": "7-1-0", "label": 2, "answer": "工作"}, {"id": "7-1-1", "label": 0, "answer": "男"},
                       {"id": 42, "label": 0, "answer": "很好"}]
    t.write_predictions(out, logits, q, probabilities=True)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [len(r["probabilities"]) for r in records] == [4, 2, 3]  # one per real choice
    assert sum(records[1]["probabilities"]) == pytest.approx(1.0, abs=1e-5)


def test_inference_input_needs_no_answers(tokenizer, tmp_path):
    docs = [[["天气很好"], [{"question": "天气好吗", "choice": ["很好", "不好"], "id": 1}]]]
    q = task(tokenizer).read(write(tmp_path / "test.json", docs), with_labels=False)
    assert q.answers is None and q.ids == [1]
    assert "choice" not in task(tokenizer).collate(q, [0], np.random.default_rng(0)).labels


@pytest.mark.parametrize("docs, message", [
    ([[["天气"], [{"question": "好吗", "choice": ["很好", "不好"], "answer": "还行"}], "d9"]],
     r"c3.json, document 0 \(id d9\), question 0 \(id d9-0\): the answer '还行' is not among the choices"),
    ([[["天气"], [{"question": "好吗", "choice": ["很好", "不好"]}]]],
     r"document 0, question 0 \(id 0-0\): no \"answer\""),
    ([[["天气"], [{"question": "好吗", "choice": ["a", "b", "c", "d", "e"], "answer": "a"}]]],
     r"5 choices, more than task.max_choices=4"),
    ([[["天气"], [{"question": "好吗", "choice": [], "answer": "a"}]]], r"\"choice\" must be a non-empty list"),
    ([["天气", [{"question": "好吗", "choice": ["a"], "answer": "a"}]]], r"the context \(first element\) must be"),
    ([[["天气"]]], r"document 0: expected \[\[context sentences\], \[questions\]\]"),
    ({"data": []}, r"expected a JSON list of documents"),
    ([], r"c3.json: no questions"),
    ([[["天气"], []]], r"c3.json: no questions"),
])
def test_bad_input_names_file_document_and_question(tokenizer, tmp_path, docs, message):
    with pytest.raises(UserError, match=message):
        task(tokenizer).read(write(tmp_path / "c3.json", docs))


def test_invalid_json_names_the_line(tokenizer, tmp_path):
    path = tmp_path / "c3.json"
    path.write_text('[\n  [["a"], [{"question": "b",}]]\n]', encoding="utf-8")
    with pytest.raises(UserError, match=r"c3.json, line 2, column \d+: not valid JSON"):
        task(tokenizer).read(path)
    with pytest.raises(UserError, match="does not exist"):
        task(tokenizer).read(tmp_path / "missing.json")


def test_reads_the_real_c3_dev_set(shared_data):
    from pentad.data.tokenizers import load_tokenizer as load

    tok = load({"type": "wordpiece", "vocab": str(shared_data / "models" / "google_zh_vocab.txt"), "lowercase": True})
    t = task(tok, seq_length=128)
    q = t.read(shared_data / "datasets" / "c3" / "dev.json")
    assert len(q) == 3816 and int(q.counts.sum()) == 4 * 3181 + 3 * 465 + 2 * 170
    assert q.choices.lengths.max() <= 128 and q.ids[0] == "47-275-0" and q.answers[0] == 2  # "工作"
    test = t.read(shared_data / "datasets" / "c3" / "test.json", with_labels=False)
    assert len(test) == 3892 and test.ids[0] == 508
