"""The chid task (ChID idiom cloze): blanks as questions, the window around a blank, the answer file,
the exclusive assignment of candidates to a line's blanks, and predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.tasks.chid import ChidTask, ChidTaskConfig, answer_path, window

CHARS = "一二三四五六七八九十甲乙丙丁天地人和风雨春秋"


@pytest.fixture()
def tokenizer(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *CHARS]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def task(tokenizer, seq_length=32, **over):
    return ChidTask(ChidTaskConfig(**over), tokenizer, seq_length)


def write_set(tmp_path, lines, answers=None, name="train.json"):
    data = tmp_path / name
    data.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    if answers is not None:
        answer_path(data).write_text(json.dumps(answers), encoding="utf-8")
    return data


LINES = [
    {"content": ["一二三#idiom000001#四五六#idiom000002#七八", "九十#idiom000003#甲"],
     "candidates": ["天地人和", "风雨春秋", "甲乙丙丁"]},
    {"content": ["天#idiom000004#地"], "candidates": ["一二三四", "五六七八"]},
]
ANSWERS = {"#idiom000001#": 0, "#idiom000002#": 2, "#idiom000003#": 1, "#idiom000004#": 1}


def test_answer_file_is_beside_the_data_file(tmp_path):
    assert answer_path(tmp_path / "dev.json") == tmp_path / "dev_answer.json"


@pytest.mark.parametrize("left, right, size, expected", [
    (list(range(10)), list(range(10, 20)), 4, ([8, 9], [10, 11])),
    (list(range(1)), list(range(10, 20)), 4, ([0], [10, 11, 12])),         # short left: more on the right
    (list(range(10)), list(range(10, 11)), 4, ([7, 8, 9], [10])),           # short right: more on the left
    (list(range(2)), list(range(10, 11)), 8, ([0, 1], [10])),               # all there is
    (list(range(5)), list(range(10, 15)), 5, ([3, 4], [10, 11, 12])),
])
def test_window_is_centred_on_the_blank(left, right, size, expected):
    assert window(left, right, size) == expected


def test_every_blank_is_a_question_with_the_line_candidates(tokenizer, tmp_path):
    t = task(tokenizer, blank_tokens=2)
    q = t.read(write_set(tmp_path, LINES, ANSWERS))
    assert len(q) == 4 and q.ids == ["#idiom000001#", "#idiom000002#", "#idiom000003#", "#idiom000004#"]
    assert q.answers.tolist() == [0, 2, 1, 1] and q.counts.tolist() == [3, 3, 3, 2]
    assert q.groups.tolist() == [1, 1, 1, 2]  # the line numbers
    assert q.texts[3] == ["一二三四", "五六七八"] and q.width == 10
    mask, unk, cls, sep = tokenizer.mask_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id
    c = {ch: tokenizer.token_to_id(ch) for ch in CHARS}
    # blank 2: the other blank of its passage is [UNK], itself two [MASK]s; candidate 1 after [SEP]
    expected = [cls, c["一"], c["二"], c["三"], unk, c["四"], c["五"], c["六"], mask, mask, c["七"], c["八"], sep,
                c["风"], c["雨"], c["春"], c["秋"], sep]
    assert q.choices.sequence(1 * 10 + 1).tolist() == expected
    # blank 3 lives in the second passage: the first one's blanks are not in its window
    assert q.choices.sequence(2 * 10).tolist() == [cls, c["九"], c["十"], mask, mask, c["甲"], sep,
                                                   c["天"], c["地"], c["人"], c["和"], sep]


def test_the_window_fits_beside_the_longest_candidate(tokenizer, tmp_path):
    text = "一二三四五六七八九十" * 3
    lines = [{"content": [text + "#idiom000001#" + text], "candidates": ["天地人和", "风雨"]}]
    t = task(tokenizer, seq_length=16, blank_tokens=4)
    q = t.read(write_set(tmp_path, lines, {"#idiom000001#": 0}))
    longest = q.choices.sequence(0).tolist()
    assert len(longest) == 16
    window_ids = longest[1:longest.index(tokenizer.sep_id)]
    assert len(window_ids) == 16 - 3 - 4  # beside the 4-token candidate
    begin = window_ids.index(tokenizer.mask_id)
    assert window_ids[begin:begin + 4] == [tokenizer.mask_id] * 4 and begin == (16 - 3 - 4 - 4) // 2
    assert len(q.choices.sequence(1).tolist()) == 14  # the same window beside the 2-token candidate
    with pytest.raises(UserError, match="do not fit in seq_length 10"):
        task(tokenizer, seq_length=10, blank_tokens=4).read(write_set(tmp_path, lines, {"#idiom000001#": 0}))


def test_exclusive_assignment_gives_a_line_different_candidates(tokenizer, tmp_path):
    q = task(tokenizer).read(write_set(tmp_path, LINES, ANSWERS))
    floor = torch.finfo(torch.float32).min
    pad = [floor] * 7
    logits = torch.tensor([[3.0, 0.0, 0.0, *pad],     # blank 1: candidate 0 (p 0.91)
                           [2.0, 0.0, 1.0, *pad],     # blank 2 prefers 0 too (p 0.67), then 2
                           [0.0, 1.0, 0.9, *pad],     # blank 3: 1 (p 0.44)
                           [0.0, 1.0, floor, *pad]])  # another line: unaffected
    independent = task(tokenizer, exclusive=False)
    assert independent.choose(logits, q).tolist() == [0, 0, 1, 1]
    assert independent.score(logits, q, q.answers) == {"accuracy": pytest.approx(3 / 4)}  # gold 0, 2, 1, 1
    exclusive = task(tokenizer)
    # (blank 1, 0) first, then (blank 3, 1) at 0.44, then blank 2 takes 2, what is left
    assert exclusive.choose(logits, q).tolist() == [0, 2, 1, 1]
    assert exclusive.score(logits, q, q.answers) == {"accuracy": 1.0}
    # more blanks than candidates: the ones left over take their most probable candidate
    three = torch.tensor([[2.0, 0.0], [1.5, 0.0], [0.0, 1.0]])  # (1, 0) at 0.88, (3, 1) at 0.73; blank 2: 0
    assert exclusive.choose(three, _subset(q, [0, 1, 2], 2)).tolist() == [0, 0, 1]


def _subset(q, index, count):
    """The questions ``index`` of ``q`` as if their line had ``count`` candidates."""
    from dataclasses import replace

    return replace(q, counts=np.full(len(index), count), groups=q.groups[index], ids=[q.ids[i] for i in index])


def test_predictions_are_the_answer_file_layout(tokenizer, tmp_path):
    t = task(tokenizer)
    data = write_set(tmp_path, LINES, name="test.json")  # no answer file: inference input
    q = t.read(data, with_labels=False)
    assert q.answers is None
    floor = torch.finfo(torch.float32).min
    logits = torch.tensor([[1.0, 0.0, 0.0] + [floor] * 7, [0.0, 1.0, 0.0] + [floor] * 7,
                           [0.0, 0.0, 1.0] + [floor] * 7, [0.0, 1.0] + [floor] * 8])
    out = tmp_path / "pred.json"
    t.write_predictions(out, logits, q, probabilities=False)
    assert json.loads(out.read_text(encoding="utf-8")) == {"#idiom000001#": 0, "#idiom000002#": 1,
                                                           "#idiom000003#": 2, "#idiom000004#": 1}
    t.write_predictions(out, logits, q, probabilities=True)
    value = json.loads(out.read_text(encoding="utf-8"))["#idiom000004#"]
    assert value["label"] == 1 and len(value["probabilities"]) == 2


@pytest.mark.parametrize("lines, answers, message", [
    (LINES, None, r"train.json: its answers are read from .*train_answer.json .* which does not exist"),
    (LINES, {k: v for k, v in ANSWERS.items() if k != "#idiom000003#"},
     r"train.json, line 1, blank #idiom000003#: the blank has no answer in .*train_answer.json"),
    (LINES, {**ANSWERS, "#idiom000004#": 2}, r"train_answer.json: the answer of #idiom000004# .* is 2; expected "
                                             r"the index of one of its 2 candidates, 0..1"),
    (LINES, [0, 1], r"train_answer.json: expected a JSON object"),
    ([{"content": ["一二三"], "candidates": ["天地人和"]}], {}, r"train.json, line 1: no blank"),
    ([], {}, r"train.json: no lines"),
    ([{"content": "一#idiom000001#", "candidates": ["天地人和"]}], {}, r"line 1: \"content\" must be a list"),
    ([{"content": ["一#idiom000001#"], "candidates": []}], {}, r"line 1: \"candidates\" must be a non-empty"),
    ([{"content": ["一#idiom000001#"], "candidates": ["甲"]}, {"content": ["#idiom000001#"], "candidates": ["甲"]}],
     {"#idiom000001#": 0}, r"line 2: the blank #idiom000001# already appears on line 1"),
    ([{"content": ["一#idiom000001#"], "candidates": list("一二三四五六七八九十甲")}], {"#idiom000001#": 0},
     r"11 choices, more than task.max_choices=10"),
])
def test_bad_input_names_file_line_and_blank(tokenizer, tmp_path, lines, answers, message):
    with pytest.raises(UserError, match=message):
        task(tokenizer).read(write_set(tmp_path, lines, answers))


def test_a_line_that_is_not_json_is_named(tokenizer, tmp_path):
    data = tmp_path / "train.json"
    data.write_text(json.dumps(LINES[0]) + "\n{\"content\": [\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"train.json, line 2, column \d+: not valid JSON"):
        task(tokenizer).read(data, with_labels=False)


def test_collate_pads_to_max_choices(tokenizer, tmp_path):
    t = task(tokenizer, max_choices=4)
    q = t.read(write_set(tmp_path, LINES, ANSWERS))
    batch = t.collate(q, [3, 0], np.random.default_rng(0))
    assert batch.tokens.shape[0] == 8
    assert batch.group_padding_mask.tolist() == [[False, False, True, True], [False, False, False, True]]
    assert batch.labels["choice"].tolist() == [1, 0]
