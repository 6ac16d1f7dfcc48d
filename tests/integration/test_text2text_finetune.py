"""text2text end to end on real data: English -> Chinese news commentary (TencentPretrain's shared
sample), ``pentad finetune`` then ``pentad infer``, with a tiny encoder-decoder (T5 recipe) and a tiny
decoder-only model (GPT-2 recipe) over a BERT Chinese vocabulary. The baseline is the same model
untrained, scored by the same task code on the same dev rows.

Seconds of CPU training cannot teach translation: what a tiny model learns in that time is the
target language's most frequent characters and the length of its sentences, which is what the
scores measure; the tests check the whole path (training, generation, scoring, prediction files),
finite scores, and that training does not make the model worse than untrained.
"""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from pentad.builder import build_model
from pentad.cli.main import main
from pentad.registry import TASKS
from pentad.runs import load_run
from pentad.tasks.runner import read_task_state
from pentad.training.trainer import MetricsLog

SIZES = {
    "t5/small": ["model.encoder.num_layers=1", "model.decoder.num_layers=1", "model.encoder.num_heads=2",
                 "model.decoder.num_heads=2", "model.encoder.ffn_size=64", "model.decoder.ffn_size=64",
                 "model.max_seq_length=64", "data.objective.seq_length=48", "train.lr=1e-2"],
    "gpt2/tiny": ["model.encoder.num_layers=1", "model.encoder.num_heads=2", "model.encoder.ffn_size=64",
                  "model.max_seq_length=96", "data.objective.seq_length=80", "train.lr=3e-3"],
}
TRAIN, DEV = 320, 24


def run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def news(shared_data, tmp_path_factory):
    """train.tsv (the first 320 pairs) and dev.tsv (the 24 pairs with the shortest Chinese side),
    ``text_a<TAB>label`` = English<TAB>Chinese."""
    root = tmp_path_factory.mktemp("news")
    with open(shared_data / "corpora/news-commentary-v13-en-zh_sampled.txt", encoding="utf-8") as f:
        pairs = [tuple(p.strip() for p in line.rstrip("\n").split("\t")) for line in f]
    pairs = [p for p in pairs if len(p) == 2 and all(p)]
    dev = sorted(range(len(pairs)), key=lambda i: len(pairs[i][1]))[:DEV]
    train = [i for i in range(len(pairs)) if i not in set(dev)][:TRAIN]
    files = {}
    for name, rows in (("train", train), ("dev", dev)):
        files[name] = root / f"{name}.tsv"
        files[name].write_text("text_a\tlabel\n" + "".join(f"{pairs[i][0]}\t{pairs[i][1]}\n" for i in rows),
                               encoding="utf-8")
    files["nolabel"] = root / "nolabel.tsv"
    files["nolabel"].write_text("text_a\n" + "".join(f"{pairs[i][0]}\n" for i in dev), encoding="utf-8")
    return files


def untrained_scores(run_dir, dev_path) -> dict[str, float]:
    """The dev scores of the run's model with fresh weights (seeded as the run was), by the same task code."""
    cfg, tokenizer = load_run(run_dir)
    seq_length = min(cfg.data.objective.seq_length, cfg.model.max_seq_length)
    task = TASKS.get("text2text")(cfg.task, tokenizer, seq_length, read_task_state(run_dir))
    task.bind(cfg)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, provided=task.provides, training=False)
    data = task.read(dev_path)
    return task.evaluate(model, data, task.gold(data), 32, torch.device("cpu"))


@pytest.mark.parametrize("recipe", ["t5/small", "gpt2/tiny"])
def test_translation_finetune_and_infer(shared_data, news, tmp_path, recipe):
    out = tmp_path / "run"
    assert run("finetune", "--task", "text2text", "--config", recipe, "tokenizer.type=wordpiece",
               f"tokenizer.vocab={shared_data / 'models/google_zh_vocab.txt'}", "model.hidden_size=32",
               *SIZES[recipe], "task.target_seq_length=24", "train.batch_size=16", "train.epochs=4",
               "train.progress=false", f"data.train={news['train']}", f"data.dev={news['dev']}",
               f"output={out}") == 0
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    state = json.loads((out / "labels.json").read_text(encoding="utf-8"))
    assert state == {"bleu_tokenize": "zh", "rouge_tokenize": "chars"}  # Chinese targets, detected
    trained = results["dev"]
    assert set(trained) == {"bleu", "rouge1", "rouge2", "rougeL"}
    assert all(math.isfinite(v) and 0.0 <= v <= 100.0 for v in trained.values())
    baseline = untrained_scores(out, news["dev"])
    assert all(math.isfinite(v) for v in baseline.values())
    print(f"{recipe}: dev {trained} (untrained: {baseline})")
    assert trained["bleu"] >= baseline["bleu"]
    assert trained["rouge1"] >= baseline["rouge1"]
    # the teacher-forced loss ends far below the uniform guess over the vocabulary (ln 21128 = 9.96)
    losses = [r["loss"] for r in MetricsLog(out / "metrics.jsonl").read() if "loss" in r]
    assert losses[-1] < math.log(21128) - 2.5

    # inference: one generated text per input row, in order, with or without a label column
    for test_file in (news["dev"], news["nolabel"]):
        predictions = tmp_path / f"{test_file.stem}.predictions.tsv"
        assert run("infer", "--task", "text2text", "--model", out, f"data.test={test_file}",
                   "--output", predictions) == 0
        with open(predictions, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        assert rows[0] == ["text"] and len(rows) == 1 + DEV
        texts = [r[0] if r else "" for r in rows[1:]]
        assert not any(" " in t.strip() and all("\u4e00" <= c <= "\u9fff" for c in t.replace(" ", ""))
                       for t in texts if t), "Chinese output keeps the tokenizer's spaces"
    # infer writes what evaluation scored: the same texts give the same BLEU
    from pentad.tasks.text2text import bleu

    with open(news["dev"], encoding="utf-8") as f:
        references = [line.rstrip("\n").split("\t")[1] for line in list(f)[1:]]
    assert bleu(texts, references, "zh") == pytest.approx(trained["bleu"], abs=1e-6)


def test_finetune_from_a_pretrained_translation_run(shared_data, news, tmp_path, capsys):
    """A Transformer pre-trained with the ``mt`` objective fine-tunes as text2text with its own ``lm``
    head (weights from the run, label smoothing from its config), not a fresh one."""
    corpus = tmp_path / "pairs.tsv"
    corpus.write_text("".join(line + "\n" for line in news["train"].read_text(encoding="utf-8").splitlines()[1:]),
                      encoding="utf-8")
    model = ["--config", "transformer/base", "tokenizer.type=wordpiece",
             f"tokenizer.vocab={shared_data / 'models/google_zh_vocab.txt'}", "model.hidden_size=32",
             "model.encoder.num_layers=1", "model.decoder.num_layers=1", "model.encoder.num_heads=2",
             "model.decoder.num_heads=2", "model.encoder.ffn_size=64", "model.decoder.ffn_size=64",
             "model.max_seq_length=64", "data.objective.seq_length=48", "train.progress=false",
             "train.batch_size=16"]
    dataset, pretrained, out = tmp_path / "ds", tmp_path / "pretrained", tmp_path / "run"
    assert run("preprocess", *model, "data.objective.target_seq_length=24", f"data.corpus={corpus}",
               f"data.output={dataset}") == 0
    assert run("pretrain", *model, "data.objective.target_seq_length=24", f"data.dataset={dataset}",
               "train.steps=4", f"output={pretrained}") == 0
    capsys.readouterr()
    assert run("finetune", "--task", "text2text", *model, f"init={pretrained}", "task.target_seq_length=24",
               "train.epochs=1", f"data.train={news['train']}", f"data.dev={news['dev']}", f"output={out}") == 0
    log = capsys.readouterr().err
    assert "initialised from scratch" not in log and "not used" not in log
    cfg, _ = load_run(out)
    assert [(t.type, t.label_smoothing) for t in cfg.model.targets] == [("lm", 0.1)]
    assert math.isfinite(json.loads((out / "results.json").read_text(encoding="utf-8"))["dev"]["bleu"])
