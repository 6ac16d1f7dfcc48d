"""text2text: reading into both layouts, batches, metrics against hand-computed values, generation
order, prediction files and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import IGNORE_INDEX
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.tasks.text2text import (
    Generated,
    Text2TextTask,
    Text2TextTaskConfig,
    bleu,
    chinese_share,
    detokenize,
    rouge,
)

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<sep>", "the", "cat", "sat", "on", "mat", "a", "dog",
          "猫", "坐", "在", "垫", "子", "上", "。"]
SMALL = ["model.hidden_size=16", "model.max_seq_length=32", "data.objective.seq_length=24"]
ENCODER_DECODER = ["model.encoder.num_layers=1", "model.decoder.num_layers=1", "model.encoder.num_heads=2",
                   "model.decoder.num_heads=2", "model.encoder.ffn_size=32", "model.decoder.ffn_size=32"]
DECODER_ONLY = ["model.encoder.num_layers=1", "model.encoder.num_heads=2", "model.encoder.ffn_size=32"]


@pytest.fixture()
def tokenizer(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(TOKENS) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt")})


def run_config(recipe: str, *overrides: str):
    extra = ENCODER_DECODER if recipe.startswith("t5") else DECODER_ONLY
    return load_config(recipe, [*SMALL, *extra, f"model.vocab_size={len(TOKENS)}", *overrides])


def make_task(tokenizer, recipe="t5/small", overrides=(), **options):
    cfg = run_config(recipe, *overrides)
    options.setdefault("target_seq_length", 8)
    task = Text2TextTask(Text2TextTaskConfig(**options), tokenizer, cfg.data.objective.seq_length)
    task.bind(cfg)
    return task, cfg


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_metrics_match_hand_computed_values():
    # 13a: precisions 5/6, 3/5, 2/4, 1/3 and no brevity penalty
    assert bleu(["the cat sat on a mat"], ["the cat sat on the mat"], "13a") == pytest.approx(
        100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25, abs=1e-6)
    # zh: every character a token; all precisions 1, brevity penalty exp(1 - 7/6)
    assert bleu(["猫坐在垫子上"], ["猫坐在垫子上。"], "zh") == pytest.approx(100 * math.exp(1 - 7 / 6), abs=1e-6)
    assert bleu([], [], "13a") == 0.0
    # characters: unigrams P 4/4 R 4/6; bigrams 猫坐, 垫子 of 3 and 5; LCS 猫坐垫子
    scores = rouge(["猫坐垫子"], ["猫坐在垫子上"], chars=True)
    assert scores == pytest.approx({"rouge1": 80.0, "rouge2": 50.0, "rougeL": 80.0})
    # words (rouge-score's tokenizer lower-cases): 3 of 6 reference words
    assert rouge(["The cat sat"], ["the cat sat on the mat"], chars=False)["rouge1"] == pytest.approx(200 / 3)
    # rouge-score's word tokenizer keeps a-z0-9 only: Chinese scores nothing without chars
    assert rouge(["猫坐"], ["猫坐"], chars=False)["rouge1"] == 0.0
    # the mean over rows
    assert rouge(["猫", "狗"], ["猫", "猫"], chars=True)["rouge1"] == pytest.approx(50.0)


def test_detokenize_and_language_detection():
    assert detokenize("巴 黎 - 随 着 ， 1989 年 。 the economic crisis") == "巴黎-随着，1989年。the economic crisis"
    assert detokenize(" the cat , sat ") == "the cat , sat"
    assert chinese_share(["猫坐 ab"]) == pytest.approx(0.5)
    assert chinese_share(["", " "]) == 0.0


def test_auto_tokenization_follows_the_training_targets(tokenizer, tmp_path):
    zh = write(tmp_path / "zh.tsv", "text_a\tlabel\nthe cat\t猫坐在垫子上。\n")
    en = write(tmp_path / "en.tsv", "text_a\tlabel\n猫\tthe cat sat\n")
    task, _ = make_task(tokenizer)
    task.fit(zh)
    assert task.state() == {"bleu_tokenize": "zh", "rouge_tokenize": "chars"}
    task.fit(en)
    assert task.state() == {"bleu_tokenize": "13a", "rouge_tokenize": "words"}
    task, _ = make_task(tokenizer, bleu_tokenize="intl", rouge_tokenize="chars")
    task.fit(en)
    assert task.state() == {"bleu_tokenize": "intl", "rouge_tokenize": "chars"}
    again = Text2TextTask(Text2TextTaskConfig(), tokenizer, 24, task.state())
    assert (again.bleu_tokenize, again.rouge_chars) == ("intl", True)


def test_encoder_decoder_batches_teacher_force_the_target(tokenizer, tmp_path):
    path = write(tmp_path / "train.tsv", "text_a\tlabel\nthe cat\t猫坐\nthe dog sat\t上\n")
    task, _ = make_task(tokenizer)
    assert task.encoder_decoder and "decoder_tokens" in task.provides
    data = task.read(path)
    assert data.references == ["猫坐", "上"] and data.lines == [2, 3]
    cls, sep, pad = 2, 3, 0
    ids = {t: i for i, t in enumerate(TOKENS)}
    assert [p.tolist() for p in data.prompts()] == [[cls, ids["the"], ids["cat"], sep],
                                                     [cls, ids["the"], ids["dog"], ids["sat"], sep]]
    batch = task.collate(data, [0, 1], np.random.default_rng(0))
    start = task.seq2seq.decoder_start_id
    assert start == cls  # the t5 recipe's objective leaves decoder_start unset: bos, else cls
    assert batch.decoder_tokens.tolist() == [[start, ids["猫"], ids["坐"]], [start, ids["上"], pad]]
    assert batch.labels["lm"].tolist() == [[ids["猫"], ids["坐"], sep], [ids["上"], sep, IGNORE_INDEX]]
    assert batch.padding_mask.tolist() == [[False] * 4 + [True], [False] * 5]
    assert task.head_configs() == [{"type": "lm", "bias": False, "label_smoothing": 0.0,
                                   "label_smoothing_spread": "all", "scale_hidden": True, "init": "model"}]


def test_decoder_only_batches_score_the_target_only(tokenizer, tmp_path):
    path = write(tmp_path / "train.tsv", "text_a\ttext_b\tlabel\nthe cat\tdog\t猫坐\n")
    task, _ = make_task(tokenizer, "gpt2/tiny", target_seq_length=4)
    assert not task.encoder_decoder and "decoder_tokens" not in task.provides
    data = task.read(path)
    ids = {t: i for i, t in enumerate(TOKENS)}
    cls, sep = 2, 3
    prompt = [cls, ids["the"], ids["cat"], sep, ids["dog"], sep]  # text_a SEP text_b, then the separator
    assert data.prompts()[0].tolist() == prompt
    batch = task.collate(data, [0], np.random.default_rng(0))
    sequence = prompt + [ids["猫"], ids["坐"], sep]
    assert batch.tokens[0].tolist() == sequence[:-1]
    assert batch.labels["lm"][0].tolist() == [IGNORE_INDEX] * (len(prompt) - 1) + [ids["猫"], ids["坐"], sep]
    assert batch.segments[0].tolist() == [0] * len(prompt) + [1, 1]
    # a separator of one's own, and an inference input (no target)
    task, _ = make_task(tokenizer, "gpt2/tiny", separator="<sep>", target_seq_length=4)
    unlabelled = task.read(write(tmp_path / "test.tsv", "text_a\nthe cat\n"), with_labels=False)
    assert unlabelled.references is None
    assert unlabelled.prompts()[0].tolist() == [cls, ids["the"], ids["cat"], ids["<sep>"]]
    assert len(unlabelled.instances.sequence(0)) == 4


def test_long_sources_and_targets_are_truncated(tokenizer, tmp_path):
    path = write(tmp_path / "train.tsv", "text_a\tlabel\n" + "the " * 40 + "\t" + "猫" * 40 + "\n")
    task, _ = make_task(tokenizer, target_seq_length=5)
    data = task.read(path)
    assert len(data.prompts()[0]) == 24  # seq_length, [CLS] and [SEP] included
    assert len(data.instances.sequence(0)) - 24 == 4  # the body; collate adds the end token
    task, _ = make_task(tokenizer, "gpt2/tiny", target_seq_length=5, max_new_tokens=8)
    data = task.read(path)
    # a stored sequence is at most seq_length + 1 tokens, with room for the 8 generated ones
    assert len(data.prompts()[0]) == 24 + 1 - 8
    assert len(data.instances.sequence(0)) == 24 + 1 - 8 + 5


@pytest.mark.parametrize("recipe", ["t5/small", "gpt2/tiny"])
def test_predictions_keep_the_file_order(tokenizer, tmp_path, recipe):
    """Rows are generated sorted by length in batches; each answer still lands on its own row, and
    batching does not change it."""
    rows = ["the cat sat on the mat", "a", "the dog", "cat sat", "the the the the the mat", "dog"]
    path = write(tmp_path / "test.tsv", "text_a\n" + "".join(f"{r}\n" for r in rows))
    task, cfg = make_task(tokenizer, recipe, max_new_tokens=6)
    task.bleu_tokenize, task.rouge_chars = "zh", True
    torch.manual_seed(0)
    model_cfg = type(cfg.model).model_validate({**cfg.model.model_dump(), "targets": task.head_configs()})
    model = build_model(model_cfg, provided=task.provides, training=False)
    data = task.read(path, with_labels=False)
    together = task.predict(model, data, batch_size=6, device=torch.device("cpu"))
    one_by_one = task.predict(model, data, batch_size=1, device=torch.device("cpu"))
    alone = [task.predict(model, task.read(write(tmp_path / f"{i}.tsv", f"text_a\n{r}\n"), with_labels=False),
                          batch_size=1, device=torch.device("cpu")).texts[0] for i, r in enumerate(rows)]
    assert together.texts == one_by_one.texts == alone
    assert len(together.texts) == len(rows) and all(math.isfinite(s) for s in together.scores)
    metrics = task.score(together, data, ["猫"] * len(rows))
    assert set(metrics) == set(task.metric_names) and all(math.isfinite(v) for v in metrics.values())


def test_generation_options_reach_the_generator(tokenizer):
    task, _ = make_task(tokenizer, num_beams=4, length_penalty=0.6, repetition_penalty=1.3, max_new_tokens=12)
    config = task.generation_config()
    assert (config.num_beams, config.length_penalty, config.repetition_penalty, config.max_new_tokens) == \
        (4, 0.6, 1.3, 12)
    assert config.stop_token_ids == [3] and config.decoder_start_token_id == 2  # [SEP] ends, [CLS] starts
    task, _ = make_task(tokenizer, "gpt2/tiny")
    config = task.generation_config()
    assert config.max_new_tokens == 8 and config.decoder_start_token_id is None  # target_seq_length


def test_prediction_file(tokenizer, tmp_path):
    task, _ = make_task(tokenizer)
    out = tmp_path / "predictions.tsv"
    task.write_predictions(out, Generated(["猫坐\t在", "a\nb"], [-1.5, -0.25]), None, probabilities=False)
    assert out.read_text(encoding="utf-8") == "text\n猫坐 在\na b\n"
    task.write_predictions(out, Generated(["猫坐"], [-1.5]), None, probabilities=True)
    assert out.read_text(encoding="utf-8") == "text\tscore\n猫坐\t-1.500000\n"


@pytest.mark.parametrize("text, message", [
    ("text_a\nthe cat\n", "line 1"),                          # no label column for training
    ("text_a\tlabel\nthe cat\t\n", "line 2"),                 # an empty target
    ("text_a\tlabel\nthe cat\t猫\tdog\n", "line 2"),          # a field too many
    ("label\tsource\n猫\tthe cat\n", "line 1"),              # unknown column
])
def test_bad_files_name_the_line(tokenizer, tmp_path, text, message):
    task, _ = make_task(tokenizer)
    with pytest.raises(UserError, match=message):
        task.read(write(tmp_path / "bad.tsv", text))


def test_models_and_options_that_cannot_work(tokenizer):
    with pytest.raises(UserError, match="bidirectional"):
        make_task(tokenizer, "bert/tiny")
    with pytest.raises(UserError, match="not a token of the vocabulary"):
        make_task(tokenizer, "gpt2/tiny", separator="<nope>")
    with pytest.raises(UserError, match="no room for the source"):
        make_task(tokenizer, "gpt2/tiny", target_seq_length=24)
    with pytest.raises(UserError, match="target_seq_length 40 exceeds the model's model.max_seq_length"):
        make_task(tokenizer, target_seq_length=40)
    with pytest.raises(UserError, match="max_new_tokens 33 exceeds the model's model.max_seq_length"):
        make_task(tokenizer, max_new_tokens=33)
    with pytest.raises(UserError, match="target vocabulary of its own"):
        make_task(tokenizer, "t5/small", ["model.target_vocab_size=99"])
    with pytest.raises(RuntimeError, match="bind"):
        _ = Text2TextTask(Text2TextTaskConfig(), tokenizer, 24).provides


@pytest.mark.parametrize("recipe, mask", [("t5/small", None), ("gpt2/tiny", None), ("gpt2/tiny", "prefix")])
def test_generation_reads_what_training_taught(tokenizer, tmp_path, recipe, mask):
    """A model trained on the task's batches until it knows four pairs by heart generates exactly
    their targets: the prompts, decoder start and end token of generation are those of training (and
    a prefix-LM's prefix is the same prompt in both)."""
    pairs = [("the cat", "猫坐"), ("the dog sat", "上。"), ("a mat", "垫子"), ("cat on the mat", "猫在垫子上")]
    path = write(tmp_path / "train.tsv", "text_a\tlabel\n" + "".join(f"{a}\t{b}\n" for a, b in pairs))
    no_dropout = ["model.embedding.dropout=0", "model.encoder.dropout=0"]
    if recipe.startswith("t5"):
        no_dropout += ["model.decoder.dropout=0", "model.target_embedding.dropout=0"]
    if mask is not None:
        no_dropout.append(f"model.encoder.mask={mask}")
    task, cfg = make_task(tokenizer, recipe, ["model.hidden_size=32", *no_dropout])
    task.fit(path)
    torch.manual_seed(0)
    model_cfg = type(cfg.model).model_validate({**cfg.model.model_dump(), "targets": task.head_configs()})
    model = build_model(model_cfg, provided=task.provides)
    data = task.read(path)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = task.collate(data, range(len(pairs)), np.random.default_rng(0))
    for _ in range(150):
        optimizer.zero_grad()
        model(batch)["lm"].loss.backward()
        optimizer.step()
    predicted = task.predict(model, data, batch_size=3, device=torch.device("cpu"))
    assert predicted.texts == [b for _, b in pairs]
    assert task.score(predicted, data, task.gold(data)) == pytest.approx(
        {"bleu": 100.0, "rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0})
    beams = Text2TextTask(Text2TextTaskConfig(target_seq_length=8, num_beams=3), tokenizer, task.seq_length,
                          task.state())
    beams.bind(cfg)
    assert beams.predict(model, data, batch_size=2, device=torch.device("cpu")).texts == [b for _, b in pairs]
