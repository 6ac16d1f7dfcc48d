"""Prompt-based classification: "does the sentence name a person" (derived from MSRA NER's tags) through a cloze
template over the small pre-trained BERT's MLM head; zero-shot score and fine-tuned score against the majority class."""

from __future__ import annotations

from pathlib import Path

PROMPT = ["task.template=[TEXT_A]这里[MASK]人名。", 'task.verbalizer={"1": 有, "0": 无}']


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    """Fine-tune the benchmark's small pre-trained Chinese BERT (MLM + NSP; its MLM head kept as the prompt head)
    with ``--task prompt`` on the MSRA person set, after a zero-shot evaluation of the same model."""
    from bench.downstream_tasks.common import finetune, majority_accuracy, pretrained_bert, small_bert
    from bench.downstream_tasks.multi_task import msra_person

    work, msra = out_dir / "prompt", shared / "datasets" / "msra_ner"
    train = msra_person(msra / "test.tsv", work / "train.tsv", 400 if quick else 4000)
    dev = msra_person(msra / "dev.tsv", work / "dev.tsv", 200 if quick else 1000)
    init = pretrained_bert(out_dir, shared, quick)
    zero, zero_seconds = finetune("prompt", work / "zero", [*small_bert(shared, quick), f"init={init}", *PROMPT,
                                                            "task.zero_shot=true", f"data.dev={dev}"])
    results, seconds = finetune("prompt", work / "run", [
        *small_bert(shared, quick), f"init={init}", *PROMPT, f"data.train={train}", f"data.dev={dev}",
        "train.epochs=8" if quick else "train.epochs=3", "train.batch_size=16", "train.lr=1e-3", "train.warmup=0",
        "train.adam_bias_correction=true"])
    return {"task": "prompt", "dataset": "MSRA person (dev)", "metric": "accuracy",
            "score": results["dev"]["accuracy"], "baseline_name": "majority class",
            "baseline": majority_accuracy(train, dev), "seconds": seconds + zero_seconds,
            "train_examples": sum(1 for _ in open(train, encoding="utf-8")) - 1,
            "detail": {"zero_shot_accuracy": zero["dev"]["accuracy"]}}
