"""The prompt task: template and verbalizer parsing and their errors, TencentPretrain's prompts.json, the
encoded cloze inputs, the prompt head (MLM logits of the verbalizer words at the mask) and its loading of
a pre-trained MLM head's weights."""

from __future__ import annotations

import json
from types import SimpleNamespace

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
from pentad.tasks.prompt import PromptTask, PromptTaskConfig, parse_template, verbalizer_ids
from pentad.training import checkpoint as ckpt

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "好", "差", "书", "很", "这", "个", "。", "不", "错",
         "good", "bad", "it", "was"]


@pytest.fixture()
def tok(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def task(tok, seq_length=16, **cfg):
    cfg = {"template": "[TEXT_A]这个很[MASK]。", "verbalizer": {"1": "好", "0": "差"}, **cfg}
    t = PromptTask(PromptTaskConfig(**cfg), tok, seq_length)
    t.bind(SimpleNamespace(model=model_config_class().model_validate(tiny_model_dict(vocab_size=len(WORDS)))))
    return t


def test_template_parsing():
    assert parse_template("[TEXT_A]这个很[MASK]。") == ["[TEXT_A]", "这个很", "[MASK]", "。"]
    assert parse_template("[TEXT_A],我[ANS]满意") == ["[TEXT_A]", ",我", "[MASK]", "满意"]  # TencentPretrain's slot
    assert parse_template("[TEXT_A]？[MASK]，[TEXT_B]") == ["[TEXT_A]", "？", "[MASK]", "，", "[TEXT_B]"]
    for bad, says in [("这个很[MASK]。", r"\[TEXT_A\] 0 times"), ("[TEXT_A]很好", "0 answer slots"),
                      ("[TEXT_A][MASK][ANS]", "2 answer slots"), ("[TEXT_A][TEXT_B][TEXT_B][MASK]", r"\[TEXT_B\] 2")]:
        with pytest.raises(UserError, match=says):
            parse_template(bad)


def test_verbalizer_words_must_be_single_known_tokens(tok):
    assert verbalizer_ids({"1": "好", "0": "差"}, tok) == {"1": 5, "0": 6}
    with pytest.raises(UserError, match=r"the word '不错' of label '1' is 2 tokens \['不', '错'\]; .*single token"):
        verbalizer_ids({"1": "不错", "0": "差"}, tok)
    with pytest.raises(UserError, match="'棒' of label 'pos' is not in the vocabulary"):
        verbalizer_ids({"pos": "棒", "neg": "差"}, tok)
    with pytest.raises(UserError, match="same word"):
        verbalizer_ids({"1": "好", "0": "好"}, tok)
    with pytest.raises(UserError, match="at least two labels"):
        verbalizer_ids({"1": "好"}, tok)


def test_config_needs_a_prompt(tok, tmp_path):
    with pytest.raises(UserError, match="needs task.template"):
        PromptTask(PromptTaskConfig(template="[TEXT_A][MASK]"), tok, 16)
    prompts = write(tmp_path / "prompts.json", json.dumps(
        {"senti": {"template": "[TEXT_A]很[ANS]", "answer_words": {"0": "差", "1": "好"}}}, ensure_ascii=False))
    t = PromptTask(PromptTaskConfig(prompts_file=prompts, prompt_id="senti"), tok, 16)
    assert t.parts == ["[TEXT_A]", "很", "[MASK]"] and t.label_map.names == ["0", "1"] and t.word_ids == [6, 5]
    with pytest.raises(UserError, match=r"no entry 'other' .*entries: \['senti'\]"):
        PromptTask(PromptTaskConfig(prompts_file=prompts, prompt_id="other"), tok, 16)
    with pytest.raises(UserError, match="go together"):
        PromptTask(PromptTaskConfig(prompt_id="senti"), tok, 16)


def test_labels_follow_the_verbalizer(tok, tmp_path):
    t = task(tok, verbalizer={"pos": "好", "neg": "差"})
    assert t.label_map.names == ["pos", "neg"] and t.word_ids == [5, 6]
    t.fit(write(tmp_path / "t.tsv", "label\ttext_a\npos\t书\nneg\t书\n"))
    with pytest.raises(UserError, match=r"t2.tsv, line 3"):
        t.fit(write(tmp_path / "t2.tsv", "label\ttext_a\npos\t书\nmeh\t书\n"))


def test_cloze_inputs(tok, tmp_path):
    t = task(tok, seq_length=9)
    inst = t.read(write(tmp_path / "d.tsv", "label\ttext_a\n1\t好书好书好书\n0\t差\n"))
    batch = t.collate(inst, [0, 1], np.random.default_rng(0))
    cls, sep, mask = 2, 3, 4
    # 9 = [CLS] + text + 这个很 + [MASK] + 。 + [SEP]: the text keeps 9 - 2 - 5 = 2 tokens
    assert batch.tokens[0].tolist() == [cls, 5, 7, 9, 10, 8, mask, 11, sep]
    assert batch.tokens[1][~batch.padding_mask[1]].tolist() == [cls, 6, 9, 10, 8, mask, 11, sep]
    assert int(batch.segments.sum()) == 0 and batch.labels == {"mlm": batch.labels["mlm"]}
    assert batch.labels["mlm"].tolist() == [1, 0]
    with pytest.raises(UserError, match="no room for the text"):
        task(tok, seq_length=7).read(tmp_path / "d.tsv")
    with pytest.raises(UserError, match="line 2: the text contains the mask token"):
        t.read(write(tmp_path / "m.tsv", "label\ttext_a\n1\t好[MASK]\n"))
    pairs = task(tok, template="[TEXT_A][MASK][TEXT_B]")
    with pytest.raises(UserError, match="no text_b column"):
        pairs.read(tmp_path / "d.tsv")


def test_head_takes_the_mlm_heads_name_options_and_weights(tok, tmp_path):
    t = task(tok)
    (head,) = t.head_configs()
    assert head["type"] == "prompt" and head["name"] == "mlm" and head["word_ids"] == [6, 5]
    assert t.head_names() == ()  # not a new head: init's MLM weights are required
    with pytest.raises(UserError, match="no mlm target"):
        t.bind(SimpleNamespace(model=model_config_class().model_validate(tiny_model_dict(
            vocab_size=len(WORDS), targets=[{"type": "cls", "num_labels": 2}]))))

    torch.manual_seed(0)
    pretrained = build_model(model_config_class().model_validate(
        tiny_model_dict(vocab_size=len(WORDS), tie_word_embeddings=True))).eval()
    ckpt.save_weights(pretrained, tmp_path / "w.safetensors")
    prompt = build_model(model_config_class().model_validate(
        tiny_model_dict(vocab_size=len(WORDS), tie_word_embeddings=True, targets=[head]))).eval()
    notes = ckpt.load_weights(prompt, ckpt.read_weights(tmp_path / "w.safetensors"), "w",
                              new_heads=t.head_names(), drop_heads=True)
    assert notes == ["pre-training head(s) not used: sp"]

    inst = t.read(write(tmp_path / "d.tsv", "label\ttext_a\n1\t好书\n0\t差\n"))
    batch = t.collate(inst, [0, 1], np.random.default_rng(0))
    out = prompt(batch)
    mlm_logits = pretrained(Batch(tokens=batch.tokens, segments=batch.segments,
                                  padding_mask=batch.padding_mask))["mlm"].logits
    at_mask = mlm_logits[batch.tokens == 4]  # [2, V]
    torch.testing.assert_close(out["mlm"].logits, at_mask[:, [6, 5]])
    torch.testing.assert_close(out["mlm"].loss, F.cross_entropy(at_mask[:, [6, 5]], torch.tensor([1, 0])))


def test_zero_shot_needs_no_training_file(tok):
    cfg = PromptTaskConfig(template="[TEXT_A][MASK]", verbalizer={"1": "好", "0": "差"}, zero_shot=True)
    data = SimpleNamespace(train=None, dev="dev.tsv", test=None)
    assert PromptTask.sources(cfg, data) == {"train": None, "dev": "dev.tsv", "test": None}
    assert not PromptTask(cfg, tok, 16).trains and task(tok).trains
    with pytest.raises(UserError, match="data.dev and/or data.test"):
        PromptTask.sources(cfg, SimpleNamespace(train=None, dev=None, test=None))
    with pytest.raises(UserError, match="data.train is not set"):
        PromptTask.sources(cfg.model_copy(update={"zero_shot": False}), data)
