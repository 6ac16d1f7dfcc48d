"""The llm_sft objective on conversations: rendered by the tokenizer's chat template, scored on the
assistant turns only (checked per token), with bad lines naming file, line and field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pentad.components.base import IGNORE_INDEX
from pentad.data.objectives import LlmSftObjective
from pentad.data.preprocess import preprocess
from pentad.data.shards import ShardDataset
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError

from .chat_fixtures import CHATML, CONVERSATION, TOOL_CONVERSATION, TOOLS, WEATHER, build_tokenizer, write_template


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    return build_tokenizer(root), write_template(root, CHATML), write_template(root / "tools", TOOLS)


def tokenizer_config(files, template=1):
    return {"type": "tokenizer_json", "file": str(files[0]), "chat_template": str(files[template]),
            "special_tokens": {"eos": "<|im_end|>", "pad": "<|endoftext|>"}}


def prep(files, records, tmp_path, template=1, name="chat.jsonl", **options):
    config = tokenizer_config(files, template)
    tok = load_tokenizer(config)
    corpus = tmp_path / name
    corpus.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    objective = LlmSftObjective(LlmSftObjective.Config(**{"seq_length": 128, **options}), tok)
    out = tmp_path / (name + ".ds")
    manifest = preprocess(objective, tok, config, corpus, out, progress=False,
                          on_bad_line=options.pop("on_bad_line", "fail") if "on_bad_line" in options else "fail")
    return tok, objective, manifest, ShardDataset(out)


def test_only_assistant_tokens_are_scored(files, tmp_path):
    records = [{"messages": CONVERSATION}, {"messages": CONVERSATION[1:3]},
               {"messages": TOOL_CONVERSATION, "tools": [WEATHER]}]
    tok, objective, manifest, ds = prep(files, records[:2], tmp_path)
    assert manifest["arrays"] == {"scored": {"dtype": "|u1", "shape": []}} and len(ds) == 2
    batch = objective.collate(ds.take(np.arange(2)), np.random.default_rng(0))
    assert batch.provided() == set(objective.provides)
    tokens, labels, pad = batch.tokens.numpy(), batch.labels["lm"].numpy(), batch.padding_mask.numpy()
    segments = batch.segments.numpy()
    for b, record in enumerate(records[:2]):
        # the expected labels, one by one: the text before each reply is never scored, the reply and its end are
        pieces, text = [], ""
        for message in record["messages"]:
            head = "" if text or message["role"] == "system" else \
                "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            if message["role"] == "assistant":
                pieces += [(head + "<|im_start|>assistant\n", False), (message["content"] + "<|im_end|>\n", True)]
            else:
                pieces.append((head + f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n", False))
            text += message["content"]
        ids = [i for piece, _ in pieces for i in tok.encode(piece)]
        scored = [flag for piece, flag in pieces for _ in tok.encode(piece)]
        n = len(ids) - 1
        assert tokens[b, :n].tolist() == ids[:-1] and pad[b, n:].all()
        expected = [ids[j + 1] if scored[j + 1] else IGNORE_INDEX for j in range(n)]
        assert labels[b, :n].tolist() == expected and (labels[b, n:] == IGNORE_INDEX).all()
        first = scored.index(True)
        assert segments[b, :n].tolist() == [0] * first + [1] * (n - first)
    # tool calls are learned, tool results are not
    tok, objective, _, ds = prep(files, records[2:], tmp_path, template=2, name="tools.jsonl", seq_length=1024)
    batch = objective.collate(ds.take([0]), np.random.default_rng(0))
    learned = tok.decode([t for t in batch.labels["lm"].numpy()[0] if t != IGNORE_INDEX])
    assert learned.startswith('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}') and \
        "rain\": true" not in learned and learned.endswith("Yes, it is raining in Oslo.<|im_end|>\n")


def test_bad_conversations_name_file_line_and_field(files, tmp_path):
    good = {"messages": CONVERSATION[1:3]}
    cases = [
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]},
         r'line 2: .*messages\[1\]\.role is "bot"; expected one of system, user, assistant, tool'),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},
         r"line 2: .*messages\[1\] is an empty assistant turn"),
        ({"messages": [{"role": "user", "content": "hi"}]}, r'line 2: .*"messages" has no assistant turn'),
        ({"instruction": "x", "output": "y"}, r"line 2: the line is not a conversation"),
    ]
    for i, (bad, message) in enumerate(cases):
        with pytest.raises(UserError, match=r"bad\d\.jsonl, " + message):
            prep(files, [good, bad], tmp_path, name=f"bad{i}.jsonl")
    # longer than the context: cut at its end, or refused with too_long: skip
    good = {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "yo"}]}
    long = {"messages": [{"role": "user", "content": "Paris " * 10},
                         {"role": "assistant", "content": "Rome " * 60}]}
    _, _, _, ds = prep(files, [good, long], tmp_path, name="long.jsonl", seq_length=64)
    assert ds.take([1]).lengths[0] == 65
    with pytest.raises(UserError, match=r'long2\.jsonl, line 2: the line has "messages" of \d+ tokens, more than '
                                        r"seq_length 64 \+ 1, and objective\.too_long is 'skip'"):
        prep(files, [good, long], tmp_path, name="long2.jsonl", seq_length=64, too_long="skip")
    late = {"messages": [{"role": "user", "content": "Paris " * 60}, {"role": "assistant", "content": "Rome"}]}
    with pytest.raises(UserError, match=r"late\.jsonl, line 2: .*first assistant token comes after seq_length 64"):
        prep(files, [good, late], tmp_path, name="late.jsonl", seq_length=64)
    # a template that fails names its file and Jinja's message
    odd = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                        {"role": "tool", "content": "x", "name": "t"}, {"role": "assistant", "content": "z"}]}
    raising = write_template(tmp_path / "raising", "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(UserError, match=r"raise\.jsonl, line 1: .*raising/chat_template\.jinja \(template "
                                        r"'default'\) failed to render this conversation: roles must alternate"):
        prep((files[0], raising), [odd], tmp_path, name="raise.jsonl")


def test_a_conversation_corpus_needs_a_template(files, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"messages": CONVERSATION}) + "\n", encoding="utf-8")
    config = {"type": "tokenizer_json", "file": str(files[0])}
    tok = load_tokenizer(config)
    with pytest.raises(UserError, match=r"reads the conversations of .*c\.jsonl has no chat template"):
        preprocess(LlmSftObjective(LlmSftObjective.Config(), tok), tok, config, corpus, tmp_path / "ds",
                   progress=False)
