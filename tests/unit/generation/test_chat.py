"""Chat through the tokenizer's chat template: ``pentad chat`` fed on stdin, ``pentad generate --chat``
and the session API, on a tiny random GPT-2 run."""

from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path

import pytest

from pentad.cli.main import parse_arguments, run
from pentad.errors import UserError
from pentad.generation import TextGenerator
from pentad.generation.chat import ChatSession, ConversationTooLong, prompt_ids, replies
from pentad.layout import WEIGHTS
from pentad.run_config import validate_raw
from pentad.runs import prepare_run_dir
from pentad.training.checkpoint import save_weights

from .models import CONFIGS, VOCAB, tiny_model

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(VOCAB - len(SPECIALS))]
# roles as words of the vocabulary; each turn ends with [SEP], the run's end token
TEMPLATE = ("{% set names = {'system': 'w1', 'user': 'w2', 'assistant': 'w3'} %}"
            "{% for m in messages %}{{ names[m.role] }} {{ m.content }} [SEP] {% endfor %}"
            "{% if add_generation_prompt %}w3 {% endif %}")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from pentad.data.tokenizers import load_tokenizer

    root = tmp_path_factory.mktemp("chat")
    (root / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n", encoding="utf-8")
    (root / "chat.jinja").write_text(TEMPLATE, encoding="utf-8")
    raw = {"model": copy.deepcopy(CONFIGS["gpt2"]),
           "tokenizer": {"type": "space", "vocab": str(root / "vocab.txt"), "chat_template": str(root / "chat.jinja")}}
    cfg = validate_raw(raw, {}, "test")
    out = root / "run"
    prepare_run_dir(out, cfg, load_tokenizer(cfg.tokenizer))
    save_weights(tiny_model("gpt2"), out / WEIGHTS)
    return out


def pentad(*argv: str) -> int:
    return run(parse_arguments(list(argv)))


def test_the_template_frames_the_prompt(run_dir):
    gen = TextGenerator.from_run(run_dir)
    messages = [{"role": "user", "content": "w5 w6"}]
    tok = gen.tokenizer
    assert prompt_ids(gen, messages) == tok.encode("w2 w5 w6 [SEP] w3") == [5 + 2, 5 + 5, 5 + 6, 3, 5 + 3]


def test_pentad_chat_on_stdin(run_dir, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("w5 w6\nw7\n/reset\nw5 w6\n" + "w9 " * 70 + "\n/exit\nw8\n"))
    assert pentad("chat", str(run_dir), "--max-new-tokens", "6") == 0
    out, err = capsys.readouterr()
    lines = out.split("\n")
    assert len(lines) == 4 and lines[3] == ""  # three replies; the line after /exit is never read
    # the same replies from the session API: history kept between turns, cleared by /reset
    gen = TextGenerator.from_run(run_dir)
    first = replies(gen, [[{"role": "user", "content": "w5 w6"}]], max_new_tokens=6)[0][0].text
    second = replies(gen, [[{"role": "user", "content": "w5 w6"}, {"role": "assistant", "content": first},
                            {"role": "user", "content": "w7"}]], max_new_tokens=6)[0][0].text
    assert lines[:3] == [first, second, first] and first != second
    assert "(new conversation)" in err
    assert re.search(r"this turn: the conversation is \d+ tokens with the generation prompt .* the model has 64", err)
    assert "/reset starts a new conversation" in err


def test_session_history_sampling_and_length(run_dir):
    gen = TextGenerator.from_run(run_dir)
    config = gen.config(max_new_tokens=6, do_sample=True, temperature=1.5, top_k=20, top_p=0.9, seed=3)
    one, two = ChatSession(gen, config, system="w4"), ChatSession(gen, config, system="w4")
    streamed: list[str] = []
    a = one.send("w5", streamed.append)
    assert "".join(streamed) == a.text == two.send("w5").text  # seeded: replays; streaming changes nothing
    assert [m["role"] for m in one.history] == ["system", "user", "assistant"]
    with pytest.raises(ConversationTooLong, match=r"the model has 64"):
        one.send("w9 " * 70)
    assert len(one.history) == 3  # the turn that did not fit is not kept
    one.reset()
    assert one.history == [{"role": "system", "content": "w4"}]


def test_generate_chat_batch(run_dir, tmp_path, capsys):
    conversations = [[{"role": "user", "content": "w5 w6"}],
                     [{"role": "system", "content": "w4"}, {"role": "user", "content": "w7"}]]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"messages": c, "id": i}) + "\n" for i, c in enumerate(conversations)),
                    encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert pentad("generate", str(run_dir), "--chat", str(path), "--max-new-tokens", "6", "-o", str(out)) == 0
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    expected = replies(TextGenerator.from_run(run_dir), conversations, max_new_tokens=6)
    assert [r["text"] for r in records] == [group[0].text for group in expected]
    assert records[1]["prompt"] == "w1 w4 [SEP] w2 w7 [SEP] w3 " and records[1]["input"]["id"] == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": conversations[0]}) + "\n" +
                   json.dumps({"messages": [{"role": "robot", "content": "w1"}]}) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r'bad\.jsonl, line 2: messages\[0\]\.role is "robot"'):
        pentad("generate", str(run_dir), "--chat", str(bad), "--max-new-tokens", "6")
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "w9 " * 70}]}) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r'bad\.jsonl, line 1, "messages": the conversation is 73 tokens'):
        pentad("generate", str(run_dir), "--chat", str(bad), "--max-new-tokens", "6")
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "w1"},
                                            {"role": "assistant", "content": ""}]}) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"line 1: messages\[1\] is an empty assistant turn"):
        pentad("generate", str(run_dir), "--chat", str(bad))
    capsys.readouterr()
