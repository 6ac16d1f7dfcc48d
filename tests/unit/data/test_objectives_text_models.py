"""The batches of the text objectives drive tiny models end to end: what each objective provides
is what the matching model reads (checked by the builder), and a forward/backward pass runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tests.conftest import tiny_model_dict

from pentad.builder import build_model
from pentad.components.model_config import model_config_class
from pentad.data.objectives import (
    AlbertObjective,
    BartObjective,
    BilmObjective,
    LlmSftObjective,
    MtObjective,
    PrefixLmObjective,
    T5Objective,
)
from pentad.data.tokenizers import load_tokenizer
from pentad.model import total_loss


@pytest.fixture(scope="module")
def tok(shared_data):
    return load_tokenizer({"type": "wordpiece",
                           "vocab": str(shared_data / "models/google_zh_with_sentinel_vocab.txt")})


@pytest.fixture(scope="module")
def lines(shared_data):
    with open(shared_data / "corpora/news-commentary-v13-en-zh_sampled.txt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(40)]


@pytest.fixture(scope="module")
def sentences(shared_data):
    with open(shared_data / "corpora/CLUECorpusSmall_bert_sampled.txt", encoding="utf-8") as f:
        return [line if line.strip() else None for line in (next(f).rstrip("\n") for _ in range(200))]


def run(objective, items, vocab_size, target_vocab_size=None, **model):
    """Build instances from parsed ``items``, collate 8 and train one step on a tiny model."""
    inst = objective.build([objective.parse_line(x, None) if isinstance(x, str) else x for x in items],
                           np.random.default_rng(0))
    batch = objective.collate(inst[:8], np.random.default_rng(0))
    cfg = model_config_class().model_validate(tiny_model_dict(vocab_size=vocab_size, max_seq_length=160,
                                                              target_vocab_size=target_vocab_size, **model))
    torch.manual_seed(0)
    net = build_model(cfg, provided=objective.provides)
    loss = total_loss(net(batch))
    loss.backward()
    assert torch.isfinite(loss)
    return loss


SEQ2SEQ = {"embedding": {"parts": ["word", "pos"], "dropout": 0.0},
           "target_embedding": {"parts": ["word", "pos"], "dropout": 0.0},
           "decoder": {"type": "transformer", "num_layers": 1, "num_heads": 4, "ffn_size": 64, "dropout": 0.0},
           "targets": ["lm"]}


def test_prefixlm_trains_with_the_lm_target(tok, lines):
    obj = PrefixLmObjective(PrefixLmObjective.Config(seq_length=64), tok)
    encoder = {"type": "transformer", "num_layers": 2, "num_heads": 4, "ffn_size": 64, "dropout": 0.0,
               "mask": "prefix"}
    run(obj, lines, tok.vocab_size, encoder=encoder, targets=["lm"])


def test_llm_sft_trains_causally(tok, lines):
    obj = LlmSftObjective(LlmSftObjective.Config(seq_length=159, prompt_template="{instruction}{input}",
                                                 prompt_template_no_input="{instruction}"), tok)
    records = [json.dumps({"instruction": "翻译：", "input": source, "output": target}, ensure_ascii=False)
               for source, target in (line.split("\t") for line in lines)]
    encoder = {"type": "transformer", "num_layers": 1, "num_heads": 4, "ffn_size": 64, "dropout": 0.0,
               "mask": "causal"}
    run(obj, records, tok.vocab_size, encoder=encoder, targets=["lm"],
        embedding={"parts": ["word", "pos"], "dropout": 0.0})


def test_albert_feeds_mlm_and_sop(tok, sentences):
    obj = AlbertObjective(AlbertObjective.Config(seq_length=64), tok)
    run(obj, sentences, tok.vocab_size, targets=["mlm", "sop"])


def test_bilm_feeds_the_bilm_target(tok, shared_data):
    with open(shared_data / "corpora/CLUECorpusSmall_sampled.txt", encoding="utf-8") as f:
        documents = [next(f) for _ in range(8)]
    obj = BilmObjective(BilmObjective.Config(seq_length=64), tok)
    run(obj, documents, tok.vocab_size, targets=["bilm"], embedding={"parts": ["word"], "dropout": 0.0},
        encoder={"type": "bilstm", "num_layers": 1, "dropout": 0.0})


@pytest.mark.parametrize("kind", ["t5", "bart"])
def test_denoising_objectives_feed_an_encoder_decoder(tok, sentences, kind):
    if kind == "t5":
        obj = T5Objective(T5Objective.Config(seq_length=64, decoder_start="pad"), tok)
        items = [s for s in sentences if s]
    else:
        obj = BartObjective(BartObjective.Config(seq_length=64, decoder_start="eos"), tok)
        items = sentences
    run(obj, items, tok.vocab_size, share_embedding=True, **SEQ2SEQ)


def test_mt_with_a_separate_target_vocabulary(shared_data, lines):
    en_config = {"type": "wordpiece", "vocab": str(shared_data / "models/google_uncased_en_vocab.txt")}
    zh_config = {"type": "wordpiece", "vocab": str(shared_data / "models/google_zh_vocab.txt")}
    en = load_tokenizer(en_config)
    obj = MtObjective(MtObjective.Config(seq_length=64, target_seq_length=64, target_tokenizer=zh_config), en)
    run(obj, lines, en.vocab_size, target_vocab_size=obj.target_tokenizer.vocab_size, **SEQ2SEQ)
