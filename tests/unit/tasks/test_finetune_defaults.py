"""Fine-tuning defaults (``task.defaults``): which set a run gets, what each sets, and the pieces the
tencentpretrain set switches on (TencentPretrain's schedule, data order, truncation, head initialisation,
NER layout and CRF loss), each against the behaviour of TencentPretrain's scripts written out here."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from pentad import layout
from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.targets.tagger import TaggerTarget
from pentad.data.tokenizers import load_tokenizer
from pentad.data.tsv import TsvRow, encode_classification
from pentad.tasks import finetune_defaults
from pentad.tasks.base import EpochBatches
from pentad.tasks.ner import NerTask, NerTaskConfig, TaggedRow, encode_tagged
from pentad.training.config import TrainConfig
from pentad.training.optim import build_schedule

TP_BERT = {"emb_size": 32, "feedforward_size": 64, "hidden_size": 32, "hidden_act": "gelu", "heads_num": 2,
           "layers_num": 1, "max_seq_length": 32, "dropout": 0.1, "data_processor": "bert",
           "embedding": ["word", "pos", "seg"], "encoder": "transformer", "mask": "fully_visible",
           "target": ["mlm", "sp"], "tie_weights": True, "layernorm_positioning": "post"}


@pytest.fixture()
def tokenizer(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefgh"]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt")})


def resolved(config: str, *overrides: str):
    return finetune_defaults.apply(load_config(config, list(overrides)).model_copy(deep=True))


# ------------------------------------------------------------------------------- which set, what it sets
def test_pentad_defaults_set_only_what_is_unset():
    cfg = resolved("bert/tiny", "task.type=classification")
    assert cfg.task.defaults == "pentad" and cfg.train.adam_bias_correction is False
    assert cfg.train.clip_grad_norm == 1.0 and cfg.task.head_dropout == 0.1 and cfg.task.truncation == "longest_first"
    kept = resolved("bert/tiny", "task.type=classification", "train.adam_bias_correction=true")
    assert kept.train.adam_bias_correction is True  # set, even to the shared value, is kept
    assert resolved("bert/tiny").train.adam_bias_correction is False  # no task: pentad's train defaults
    assert load_config("bert/tiny", []).train.adam_bias_correction is True  # pre-training's own


def test_tencentpretrain_defaults_on_request_each_key_overridable():
    cfg = resolved("bert/tiny", "task.type=classification", "task.defaults=tencentpretrain", "task.head_dropout=0.2")
    assert cfg.train.clip_grad_norm is None and cfg.train.schedule_convention == "tencentpretrain"
    assert cfg.train.data_order == "tencentpretrain" and cfg.train.adam_bias_correction is False
    assert cfg.task.head_init == "torch" and cfg.task.truncation == "end"
    assert cfg.task.head_dropout == 0.2  # given: kept
    ner = resolved("bert/tiny", "task.type=ner", "task.defaults=tencentpretrain")
    assert (ner.task.boundary_tokens, ner.task.pad_tag, ner.task.crf_reduction) == (False, True, "sequence")
    regression = resolved("bert/tiny", "task.type=regression", "task.defaults=tencentpretrain")
    assert regression.task.head_dropout == 0.0 and "truncation" not in type(regression.task).model_fields
    assert finetune_defaults.apply(regression) == regression  # applying twice changes nothing


def test_auto_follows_a_tencentpretrain_config_or_checkpoint(tmp_path):
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps(TP_BERT), encoding="utf-8")
    imported = resolved(str(config), "vocab_size=20", "task.type=classification")
    assert imported.imported_from == "tencentpretrain" and imported.task.defaults == "tencentpretrain"
    assert imported.train.clip_grad_norm is None

    converted = tmp_path / "converted"
    converted.mkdir()
    (converted / layout.INTEROP).write_text(json.dumps({"format": 1, "source": {"kind": "tencentpretrain"}}))
    assert finetune_defaults.detect(load_config("bert/tiny", [f"init={converted}"]))[0] == "tencentpretrain"
    pretrained = tmp_path / "pretrained"
    pretrained.mkdir()
    (pretrained / layout.CONFIG).write_text("imported_from: tencentpretrain\n", encoding="utf-8")
    assert finetune_defaults.detect(load_config("bert/tiny", [f"init={pretrained}"]))[0] == "tencentpretrain"
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / layout.CONFIG).write_text("description: a pentad run\n", encoding="utf-8")
    assert finetune_defaults.detect(load_config("bert/tiny", [f"init={plain}"])) == ("pentad", "")
    forced = resolved(str(config), "vocab_size=20", "task.type=classification", "task.defaults=pentad")
    assert forced.task.defaults == "pentad" and forced.train.clip_grad_norm == 1.0


# ------------------------------------------------------------------------------- the schedule
def tencentpretrain_linear(warmup: float, total: int):
    """TencentPretrain's get_linear_schedule_with_warmup lambda, as written in its optimizers.py."""
    def factor(step: int) -> float:
        if step < warmup:
            return float(step) / float(max(1, warmup))
        return max(0.0, float(total - step) / float(max(1, total - warmup)))
    return factor


@pytest.mark.parametrize("examples, batch, epochs, warmup", [(99, 8, 2, 0.1), (3000, 32, 2, 0.1), (40, 8, 3, 0.3)])
def test_tencentpretrain_schedule_is_its_lambda(examples, batch, epochs, warmup):
    nominal = int(examples * epochs / batch) + 1  # run_classifier.py's train_steps
    steps = -(-examples // batch) * epochs  # what runs: every epoch keeps its last, smaller batch
    cfg = TrainConfig(lr=1.0, warmup=warmup, schedule_convention="tencentpretrain")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = build_schedule(optimizer, cfg, steps, nominal)
    expected = tencentpretrain_linear(warmup * nominal, nominal)
    for step in range(steps):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected(step), abs=1e-12), step
        optimizer.step()
        schedule.step()
    assert tencentpretrain_linear(warmup * nominal, nominal)(0) == 0.0


def test_pentad_schedule_starts_above_zero():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    build_schedule(optimizer, TrainConfig(lr=1.0, warmup=0.1), 100, 25)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # (0 + 1) / 10; the nominal length is not read


# ------------------------------------------------------------------------------- the data order
def test_tencentpretrain_order_is_random_shuffle_in_place_per_epoch():
    batches = EpochBatches(23, 5, 7, lambda idx, rng: list(idx), order="tencentpretrain")
    random.seed(7)  # TencentPretrain's set_seed, then random.shuffle(trainset) at each epoch's start
    trainset = list(range(23))
    for epoch in range(3):
        random.shuffle(trainset)
        got = [row for i in range(epoch * 5, (epoch + 1) * 5) for row in batches.batch(i)]
        assert got == trainset, epoch
    fresh = EpochBatches(23, 5, 7, lambda idx, rng: list(idx), order="tencentpretrain")
    assert fresh.batch(12) == batches.batch(12)  # a resumed run reaches the same batch directly
    assert EpochBatches(23, 5, 7, lambda idx, rng: list(idx)).batch(0) != batches.batch(0)


# ------------------------------------------------------------------------------- truncation
def test_end_truncation_cuts_the_assembled_sequence(tokenizer):
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    ids = {c: tokenizer.encode(c)[0] for c in "abcdefgh"}
    single = [TsvRow(2, "a b c d e f", None, "0")]
    out = encode_classification(single, tokenizer, 5, None, truncation="end")
    assert out.tokens.tolist() == [cls, ids["a"], ids["b"], ids["c"], ids["d"]]  # the [SEP] is lost
    kept = encode_classification(single, tokenizer, 5, None)
    assert kept.tokens.tolist() == [cls, ids["a"], ids["b"], ids["c"], sep]
    pair = [TsvRow(2, "a b c", "d e f", "0")]
    out = encode_classification(pair, tokenizer, 7, None, truncation="end")
    assert out.tokens.tolist() == [cls, ids["a"], ids["b"], ids["c"], sep, ids["d"], ids["e"]]
    assert out.fields["split"].tolist() == [5]
    long_a = [TsvRow(2, "a b c d e f g", "h", "0")]
    out = encode_classification(long_a, tokenizer, 5, None, truncation="end")
    assert out.fields["split"].tolist() == [5] and len(out.tokens) == 5  # text_a crowds out text_b


# ------------------------------------------------------------------------------- head initialisation
def test_torch_head_init_is_torchs_default():
    cfg = load_config("bert/tiny", ["model.targets=[{type: cls, num_labels: 3, init: torch}]"]).model
    torch.manual_seed(0)
    model = build_model(cfg)
    head = model.targets["cls"]
    bound = 1 / cfg.hidden_size ** 0.5
    for layer in (head.pooler, head.classifier):
        assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.5 * bound
        assert layer.bias.abs().min() > 0  # torch's biases are not zero
    normal = build_model(load_config("bert/tiny", ["model.targets=[{type: cls, num_labels: 3}]"]).model)
    assert torch.count_nonzero(normal.targets["cls"].classifier.bias) == 0
    tied = build_model(load_config("bert/tiny", ["model.targets=[{type: mlm, init: torch}]"]).model)
    assert tied.targets["mlm"].output.weight is tied.embedding.word.weight  # the shared table is not reset
    assert float(tied.embedding.word.weight.detach().std()) < 0.05


# ------------------------------------------------------------------------------- NER
def test_ner_words_alone_and_a_padding_class(tokenizer, tmp_path):
    rows = [TaggedRow(2, ["a", "b", "c"], ["B-X", "I-X", "O"])]
    cfg = NerTaskConfig(labels=["O", "B-X", "I-X"], boundary_tokens=False, pad_tag=True)
    task = NerTask(cfg, tokenizer, 8)
    seqs = encode_tagged(rows, tokenizer, 8, task.label_map, boundary_tokens=False)
    assert seqs.tokens[0].tolist() == [tokenizer.encode(c)[0] for c in "abc"]
    assert seqs.targets[0].tolist() == [1, 2, 0] and seqs.starts[0].tolist() == [0, 1, 2]
    assert task.head_configs()[0]["num_labels"] == 4  # the tags and the padding class
    from pentad.tasks.ner import TagPredictions

    decoded = task.decode(seqs, TagPredictions([[1, 3, 2]], [[1.0, 1.0, 1.0]]))
    assert decoded == [["B-X", "O", "I-X"]]  # the padding class reads as O


def test_crf_loss_per_sentence_or_per_word():
    torch.manual_seed(0)
    per_word = TaggerTarget("tagger", 8, 4, dropout=0.0, crf=True)
    per_sentence = TaggerTarget("tagger", 8, 4, dropout=0.0, crf=True, crf_reduction="sequence")
    per_sentence.load_state_dict(per_word.state_dict())
    hidden = torch.randn(3, 5, 8)
    labels = torch.tensor([[0, 1, 2, 3, 0], [1, 1, 0, -100, -100], [2, 0, -100, -100, -100]])
    batch = Batch(tokens=torch.zeros(3, 5, dtype=torch.long))
    batch.labels["tagger"] = labels
    a, b = per_word(hidden, batch), per_sentence(hidden, batch)
    assert float(a.loss) * 10 == pytest.approx(float(b.loss) * 3, rel=1e-5)  # 10 words, 3 sentences
    assert int(b.metrics["weight"]) == 3 and int(b.metrics["count"]) == 10
    assert np.isfinite(float(b.loss))
