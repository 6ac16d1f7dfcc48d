"""Streamed inference input (``Task.read_windows``): each task that streams reads a file in consecutive
windows of at most the window's size, lazily, and each row encodes exactly as reading the file whole
encodes it."""

from __future__ import annotations

import math

import numpy as np
import pytest

import pentad.tasks  # noqa: F401  (registers every task)
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.registry import TASKS

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away"]


@pytest.fixture()
def tok(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n",
                                        encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(1 + i % 5))


INPUTS = {  # task: (config, header, line i)
    "classification": ({}, "text_a\ttext_b", lambda i: f"{sentence(i)}\t{sentence(i + 1)}"),
    "regression": ({}, "text_a", sentence),
    "multi_label": ({}, "text_a", sentence),
    "ner": ({"labels": ["O", "B-X"]}, "text_a", sentence),
    "simcse": ({}, "text_a\ttext_b", lambda i: f"{sentence(i)}\t{sentence(i + 2)}"),
}


@pytest.mark.parametrize("name", list(INPUTS))
@pytest.mark.parametrize("window", [1, 4, 100])
def test_windows_encode_as_the_whole_file(name, window, tok, tmp_path):
    options, header, line = INPUTS[name]
    cls = TASKS.get(name)
    task = cls(cls.Config(**options), tok, 16)
    path = tmp_path / "input.tsv"
    path.write_text(header + "\n" + "".join(line(i) + "\n" for i in range(11)), encoding="utf-8")
    whole = task.read(path, with_labels=False)
    windows = list(task.read_windows(path, window))
    assert [len(w) for w in windows] == [min(window, 11 - k) for k in range(0, 11, window)]
    assert len(windows) == math.ceil(11 / window)
    rng = np.random.default_rng(0)
    row = 0
    for part in windows:
        for i in range(len(part)):
            mine, theirs = task.collate(part, [i], rng), task.collate(whole, [row], rng)
            assert np.array_equal(mine.tokens.numpy(), theirs.tokens.numpy()), (name, row)
            if theirs.pair is not None:
                assert np.array_equal(mine.pair.tokens.numpy(), theirs.pair.tokens.numpy()), (name, row)
            row += 1
    assert row == 11


def test_windows_are_read_lazily_and_a_bad_line_fails_when_reached(tok, tmp_path):
    cls = TASKS.get("classification")
    task = cls(cls.Config(), tok, 16)
    path = tmp_path / "input.tsv"
    path.write_text("text_a\n" + "".join(sentence(i) + "\n" for i in range(6)) + "a\tb\n", encoding="utf-8")
    windows = task.read_windows(path, 3)
    assert len(next(windows)) == 3 and len(next(windows)) == 3  # the bad line 8 is not read yet
    with pytest.raises(UserError, match=r"input.tsv, line 8: the line has 2 tab-separated field"):
        next(windows)
    empty = tmp_path / "empty.tsv"
    empty.write_text("text_a\n", encoding="utf-8")
    with pytest.raises(UserError, match="has a header but no data lines"):
        list(task.read_windows(empty, 3))
