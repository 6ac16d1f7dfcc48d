"""Prompt-based classification through ``pentad finetune --task prompt`` and ``pentad infer``: a tiny Chinese
BERT pre-trained with MLM on book-review text in the test keeps its MLM head as the prompt head; zero-shot
evaluation runs without training; fine-tuning on 400 labelled sentences of "does it name a person" (from
MSRA NER's tags, bench/downstream_tasks/multi_task.py) beats the majority class. (Through the prompt, this
tiny model stayed at the majority class on book-review sentiment with 160 or 1,000 training reviews; a
person's name is a character-level cue it picks up.)"""

from __future__ import annotations

import json

import pytest
from tests.integration.bench_rows import bench_row

from pentad.cli.main import main

PROMPT = ["task.template=[TEXT_A]这里[MASK]人名。", 'task.verbalizer={"1": 有, "0": 无}']


def model_args(tp) -> list[str]:
    return ["--config", "bert/tiny", "tokenizer.type=wordpiece",
            f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}",
            "model.hidden_size=64", "model.max_seq_length=64", "model.encoder.num_layers=1",
            "model.encoder.num_heads=2", "model.encoder.ffn_size=128", "model.targets=[mlm]", "data.objective=mlm",
            "data.objective.seq_length=64", "train.progress=false"]


@pytest.fixture(scope="module")
def pretrained(tp, tmp_path_factory):
    """A tiny BERT pre-trained with MLM alone on 3,000 book-review texts (the dev set's are not among them)."""
    root = tmp_path_factory.mktemp("prompt")
    lines = (tp / "datasets" / "book_review" / "train.tsv").read_text(encoding="utf-8").splitlines()[1000:4000]
    (root / "corpus.txt").write_text("\n".join(line.split("\t")[1] for line in lines) + "\n", encoding="utf-8")
    assert main(["preprocess", *model_args(tp), f"data.corpus={root / 'corpus.txt'}",
                 f"data.output={root / 'dataset'}"]) == 0
    assert main(["pretrain", *model_args(tp), f"data.dataset={root / 'dataset'}", f"output={root / 'bert'}",
                 "train.steps=200", "train.batch_size=32", "train.lr=2e-3", "train.log_every=50"]) == 0
    return root / "bert"


def test_prompt_zero_shot_and_fine_tuning(tp, pretrained, tmp_path):
    common, row = bench_row("common"), bench_row("multi_task")
    msra = tp / "datasets" / "msra_ner"
    train = row.msra_person(msra / "test.tsv", tmp_path / "train.tsv", 400)
    dev = row.msra_person(msra / "dev.tsv", tmp_path / "dev.tsv", 200)

    zero = tmp_path / "zero"
    assert main(["finetune", "--task", "prompt", *model_args(tp), f"init={pretrained}", *PROMPT,
                 "task.zero_shot=true", f"data.dev={dev}", f"output={zero}"]) == 0
    zero_results = json.loads((zero / "results.json").read_text())
    assert zero_results["best_step"] == 0 and set(zero_results["dev"]) == {"accuracy", "macro_f1"}
    assert not (zero / "checkpoints").exists() and (zero / "model.safetensors").is_file()

    tuned = tmp_path / "tuned"
    assert main(["finetune", "--task", "prompt", *model_args(tp), f"init={pretrained}", *PROMPT,
                 f"data.train={train}", f"data.dev={dev}", f"output={tuned}", "train.epochs=8", "train.warmup=0",
                 "train.batch_size=16", "train.lr=1e-3", "train.adam_bias_correction=true"]) == 0
    results = json.loads((tuned / "results.json").read_text())
    majority = common.majority_accuracy(train, dev)
    assert majority == 0.5  # balanced by construction
    assert results["dev"]["accuracy"] > majority + 0.1, (results, zero_results, majority)  # measured 0.72

    texts = [line.split("\t")[1] for line in dev.read_text(encoding="utf-8").splitlines()[1:6]]
    (tmp_path / "in.tsv").write_text("text_a\n" + "\n".join(texts) + "\n", encoding="utf-8")
    for run in (zero, tuned):
        pred = tmp_path / f"{run.name}.tsv"
        assert main(["infer", "--model", str(run), f"data.test={tmp_path / 'in.tsv'}", "--output", str(pred),
                     "--probabilities"]) == 0
        lines = pred.read_text(encoding="utf-8").splitlines()
        assert lines[0] == "label\tprob_0\tprob_1" and len(lines) == 6
