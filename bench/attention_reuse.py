"""Attention-weight reuse with stochastic recomputation: speed and quality of a small BERT on real text.

A small Chinese BERT (``bert/mini`` shrunk: ``--layers`` x ``--hidden``, ``--heads`` heads; masked LM +
next-sentence prediction, the ``bert`` objective at sequence length ``--seq``, Google's Chinese
WordPiece) is trained from the same initial weights on the same batches of TencentPretrain's sampled
CLUECorpusSmall (its last ``--dev-docs`` documents held out as the dev set) once per variant (the
pure-reuse variants' value projections are the value rows of the plain model's ``qkv``):

* ``off``: the plain model (fused SDPA attention);
* ``e2-p0``: ``attention_reuse: {every: 2}``: layers 1, 3, ... reuse the previous layer's attention
  probabilities and never recompute (pure reuse: no query/key projections in those layers);
* ``e2-p0.1`` / ``e2-p0.5``: the same with recompute_p 0.1 / 0.5 (query/key projections kept);
* ``e4-p0``: every 4: layers 1-3 all reuse layer 0's probabilities (pure reuse).

The variants train in lockstep, one step each in turn (the order rotating), so that a background load
that comes and goes hits them alike. Per variant: train tokens/s (B x S over the median step time:
forward + backward + AdamW, dropout on), inference tokens/s (eval mode, forward with labels, the median
dev batch, also in turn), the mean training loss of the last 10 steps and the dev loss (MLM + NSP, eval mode:
reusing layers reuse). The variants with query/key projections are also evaluated with
``eval: recompute`` (each layer its own attention). Parameter counts are printed beside.

Run from the repository root (full: about 8 minutes on 2 cores; ``--quick``: about 1 minute)::

    PYTHONPATH=src .venv/bin/python bench/attention_reuse.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "tencentpretrain"
CORPUS = "corpora/CLUECorpusSmall_bert_sampled.txt"
VOCAB = "models/google_zh_vocab.txt"
VARIANTS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "e2-p0": {"every": 2},
    "e2-p0.1": {"every": 2, "recompute_p": 0.1},
    "e2-p0.5": {"every": 2, "recompute_p": 0.5},
    "e4-p0": {"every": 4},
}


def overrides(args: argparse.Namespace, vocab: Path, reuse: dict[str, Any] | None = None) -> list[str]:
    """Config overrides of the small BERT (and of one variant's ``attention_reuse``)."""
    out = ["tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}", f"model.hidden_size={args.hidden}",
           f"model.encoder.num_layers={args.layers}", f"model.encoder.num_heads={args.heads}",
           f"model.encoder.ffn_size={4 * args.hidden}", f"data.objective.seq_length={args.seq}",
           f"model.max_seq_length={args.seq}", "train.progress=false"]
    if reuse is not None:
        out.append("model.encoder.attention_reuse=" + json.dumps(reuse))
    return out


def split_corpus(corpus: Path, out: Path, dev_docs: int) -> tuple[Path, Path]:
    """The corpus's documents (blank-line separated) but the last ``dev_docs``, and those."""
    docs = [d for d in corpus.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    train, dev = out / "train.txt", out / "dev.txt"
    train.write_text("\n\n".join(docs[:-dev_docs]) + "\n", encoding="utf-8")
    dev.write_text("\n\n".join(docs[-dev_docs:]) + "\n", encoding="utf-8")
    return train, dev


def preprocess(args: argparse.Namespace, out: Path) -> tuple[Path, Path]:
    """Datasets of the train and dev documents (made once per output directory)."""
    from pentad.cli.main import main

    datasets = out / "train-dataset", out / "dev-dataset"
    if all((d / "manifest.json").is_file() for d in datasets):
        return datasets
    texts = split_corpus(SHARED / CORPUS, out, args.dev_docs)
    for text, dataset in zip(texts, datasets):
        code = main(["preprocess", "--config", "bert/mini", *overrides(args, SHARED / VOCAB),
                     f"data.corpus={text}", f"data.output={dataset}"])
        if code:
            raise SystemExit(f"pentad preprocess failed with exit code {code}")
    return datasets


class Variant:
    """One model of the comparison, its optimizer and its measurements."""

    def __init__(self, name: str, cfg: Any, provides: frozenset[str], start: dict[str, torch.Tensor]):
        from pentad.builder import build_model
        from pentad.model import count_parameters
        from pentad.training.optim import build_optimizer

        self.name = name
        self.model = build_model(cfg.model, provides)
        self.model.load_state_dict(starting_weights(self.model, start))
        self.optimizer = build_optimizer(self.model, cfg.train)
        self.params = count_parameters(self.model)
        self.step_seconds: list[float] = []
        self.losses: list[float] = []
        self.reuse = getattr(self.model.encoder, "attention_reuse", None)

    def train_step(self, batch: Any) -> None:
        from pentad.model import total_loss

        self.model.train()
        torch.manual_seed(len(self.losses))  # the same dropout draws for every variant at a step
        start = time.perf_counter()
        loss = total_loss(self.model(batch).targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.step_seconds.append(time.perf_counter() - start)
        self.losses.append(loss.item())

    @torch.no_grad()
    def eval_step(self, batch: Any, recompute: bool = False) -> tuple[float, float, float]:
        """(dev loss, dev MLM loss, seconds) of one batch in eval mode, reusing layers reusing (or recomputing)."""
        from pentad.model import total_loss

        self.model.eval()
        if self.reuse is not None:
            self.reuse.eval_recompute = recompute
        start = time.perf_counter()
        out = self.model(batch).targets
        seconds = time.perf_counter() - start
        if self.reuse is not None:
            self.reuse.eval_recompute = False
        return float(total_loss(out)), float(out["mlm"].loss), seconds


def evaluate(variants: list[Variant], batches: list[Any], recompute: bool = False
             ) -> dict[str, tuple[float, float, float]]:
    """Per variant: (mean dev loss, mean dev MLM loss, eval tokens/s over the median batch time), the
    variants taking each batch in turn (the order rotating)."""
    runs: dict[str, list[tuple[float, float, float]]] = {v.name: [] for v in variants}
    for i, batch in enumerate(batches):
        k = i % len(variants)
        for v in variants[k:] + variants[:k]:
            runs[v.name].append(v.eval_step(batch, recompute))
    tokens = batches[0].tokens.numel()
    return {name: (statistics.mean(r[0] for r in rows), statistics.mean(r[1] for r in rows),
                   tokens / statistics.median(r[2] for r in rows)) for name, rows in runs.items()}


def starting_weights(model: torch.nn.Module, plain: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The plain model's weights in ``model``'s layout: a pure-reuse layer's value projection ``v`` is
    the value rows of the plain layer's ``qkv`` (so every variant starts from the same function)."""
    out = {}
    for key, value in model.state_dict().items():
        if key in plain:
            out[key] = plain[key].clone()
            continue
        layer, _, kind = key.rpartition(".v.")
        rows = value.shape[0]  # kv_dim: the last rows of the fused projection
        out[key] = plain[f"{layer}.qkv.{kind}"][-rows:].clone()
    return out


def run(args: argparse.Namespace, out: Path) -> dict[str, dict[str, Any]]:
    from pentad.assembly import load_config
    from pentad.builder import build_model
    from pentad.data.loader import PretrainBatches, open_dataset
    from pentad.registry import OBJECTIVES
    from pentad.runs import complete_vocab, load_tokenizer

    train_set, dev_set = preprocess(args, out)
    base = load_config("bert/mini", overrides(args, SHARED / VOCAB) + [f"train.lr={args.lr}", "train.warmup=0.05",
                                                                      f"train.steps={args.steps}"])
    tokenizer = load_tokenizer(base)
    complete_vocab(base, tokenizer)
    objective = OBJECTIVES.get(base.data.objective.type)(base.data.objective, tokenizer)
    train = PretrainBatches(open_dataset(train_set, tokenizer, objective), objective, args.batch, seed=1)
    dev = PretrainBatches(open_dataset(dev_set, tokenizer, objective), objective, args.batch, seed=2)
    dev_batches = [dev.batch(i) for i in range(min(args.dev_batches, len(dev)))]
    torch.manual_seed(0)
    plain = build_model(base.model, objective.provides).state_dict()
    variants = []
    for name in args.variants:
        cfg = load_config("bert/mini", overrides(args, SHARED / VOCAB, VARIANTS[name])
                          + [f"train.lr={args.lr}", f"train.steps={args.steps}"])
        cfg.model.vocab_size = base.model.vocab_size
        variants.append(Variant(name, cfg, objective.provides, plain))
    for step in range(args.steps):
        batch = train.batch(step)
        k = step % len(variants)
        for variant in variants[k:] + variants[:k]:
            variant.train_step(batch)
        if args.verbose and (step + 1) % 50 == 0:
            print(f"step {step + 1}: " + ", ".join(f"{v.name} {v.losses[-1]:.3f}" for v in variants), file=sys.stderr)
    results: dict[str, dict[str, Any]] = {}
    tokens = args.batch * args.seq
    evaluate(variants, dev_batches[:1])  # warm-up
    dev = evaluate(variants, dev_batches)
    keeping = [v for v in variants if v.reuse is not None and v.model.encoder.layers[1].attention.qkv is not None]
    recomputed = evaluate(keeping, dev_batches, recompute=True) if keeping else {}
    for v in variants:
        timed = v.step_seconds[min(5, len(v.step_seconds) - 1):]  # the first steps warm up
        dev_loss, dev_mlm, infer = dev[v.name]
        r = {"params": v.params, "train_tokens_per_s": tokens / statistics.median(timed),
             "final_loss": statistics.mean(v.losses[-10:]), "dev_loss": dev_loss, "dev_mlm_loss": dev_mlm,
             "infer_tokens_per_s": infer}
        if v.name in recomputed:
            r["dev_loss_recompute"], r["dev_mlm_loss_recompute"], _ = recomputed[v.name]
        results[v.name] = r
    return results


def table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"# {platform.machine()}, python {platform.python_version()}, torch {torch.__version__}, "
             f"{args.threads} thread(s); L{args.layers} H{args.hidden} A{args.heads}, batch {args.batch} x "
             f"{args.seq}, {args.steps} steps, lr {args.lr}",
             "| variant | parameters | train tok/s | x off | infer tok/s | x off | final loss | dev loss | "
             "dev MLM | dev loss, eval recompute |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    off = results.get("off")
    for name, r in results.items():
        speed = f"{r['train_tokens_per_s'] / off['train_tokens_per_s']:.2f}" if off else "-"
        infer = f"{r['infer_tokens_per_s'] / off['infer_tokens_per_s']:.2f}" if off else "-"
        recompute = f"{r['dev_loss_recompute']:.3f}" if "dev_loss_recompute" in r else "-"
        lines.append(f"| {name} | {r['params']:,} | {r['train_tokens_per_s']:.0f} | {speed} | "
                     f"{r['infer_tokens_per_s']:.0f} | {infer} | {r['final_loss']:.3f} | {r['dev_loss']:.3f} | "
                     f"{r['dev_mlm_loss']:.3f} | {recompute} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smaller model and 40 steps (about a minute)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=None, help="default 128 (quick: 64)")
    p.add_argument("--heads", type=int, default=None, help="default hidden / 64 (quick: 2)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=None, help="default 300 (quick: 40)")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--dev-docs", type=int, default=250, help="documents held out at the end of the corpus")
    p.add_argument("--dev-batches", type=int, default=None, help="default 20 (quick: 5)")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="keep the datasets here (default: a temporary directory)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--verbose", action="store_true", help="print the losses every 50 steps")
    args = p.parse_args()
    args.hidden = args.hidden or (64 if args.quick else 128)
    args.heads = args.heads or max(1, args.hidden // 64) * (2 if args.quick else 1)
    args.steps = args.steps or (40 if args.quick else 300)
    args.dev_batches = args.dev_batches or (5 if args.quick else 20)
    if not (SHARED / CORPUS).is_file():
        raise SystemExit(f"the sampled CLUECorpusSmall is not at {SHARED / CORPUS}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        results = run(args, args.out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results = run(args, Path(tmp))
    print(table(results, args))
    print(f"# {time.perf_counter() - start:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
