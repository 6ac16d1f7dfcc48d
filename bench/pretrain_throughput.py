"""Pre-training throughput: pentad against Hugging Face Transformers, in one process.

Two workloads, each built twice with the same sizes (pentad from its zoo recipe, Hugging Face
from the equivalent config with ``attn_implementation="sdpa"``):

* ``bert``: masked LM (15% of tokens) + next-sentence prediction; ``BertForPreTraining``.
* ``gpt2``: causal LM; ``GPT2LMHeadModel``.

Three modes are timed:

* ``train``: train mode (dropout on), forward + backward + AdamW step, as a pre-training step.
* ``infer``: eval mode under ``no_grad``, forward with the same labels (the evaluation loss).
* ``logits``: eval mode under ``no_grad``, forward without labels, vocabulary logits for every
  position on both sides (the same work on both sides: a check of the shared layers alone).

Repetitions alternate between the two libraries (and which one goes first), and the median of
the repetitions is reported, so a background load that comes and goes hits both sides alike.
Tokens/s counts every input position (B x S) on both sides. Beside the wall-clock ratio, the
ratio of process CPU seconds (HF / pentad) is printed: on a machine shared with other jobs it
moves less than wall-clock time. Both sides get the same tensors, the same dtype (fp32), the
same thread count and the same optimizer (pentad's ``build_optimizer``, or with ``--optimizer
fused`` the same AdamW with torch's fused kernel, the default of HF's Trainer on torch >= 2.8).

Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/pretrain_throughput.py            # reduced sizes, ~1.5 min
    PYTHONPATH=src .venv/bin/python bench/pretrain_throughput.py --size base --json out.json  # ~6 min
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import IGNORE_INDEX, Batch
from pentad.model import total_loss
from pentad.training.config import TrainConfig
from pentad.training.optim import build_optimizer

MODES = ("train", "infer", "logits")
MASK_ID = 103  # BERT's [MASK] in the uncased WordPiece vocabulary; any id works for timing

# Per size: zoo recipe, overrides, batch size, sequence length.
SIZES: dict[str, dict[str, tuple[str, list[str], int, int]]] = {
    "small": {
        "bert": ("bert/mini", [], 16, 128),  # L4 H256 A4, vocab 30522
        "gpt2": ("gpt2/base", ["model.hidden_size=256", "model.encoder.num_layers=4",
                               "model.encoder.num_heads=4", "model.encoder.ffn_size=1024"], 8, 128),
    },
    "base": {
        "bert": ("bert/base", [], 16, 128),  # L12 H768 A12
        "gpt2": ("gpt2/base", [], 8, 128),  # 124M
    },
}


# ----------------------------------------------------------------------------------- models
def hf_bert(cfg: Any) -> nn.Module:
    """``BertForPreTraining`` with the sizes of a pentad BERT ``ModelConfig``."""
    import transformers

    enc = cfg.encoder
    config = transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=enc.num_layers,
        num_attention_heads=enc.num_heads, intermediate_size=enc.ffn_size or 4 * cfg.hidden_size,
        hidden_act=enc.activation, hidden_dropout_prob=enc.dropout,
        attention_probs_dropout_prob=enc.dropout if enc.attention_dropout is None else enc.attention_dropout,
        max_position_embeddings=cfg.max_seq_length, layer_norm_eps=enc.layer_norm_eps,
        initializer_range=cfg.init_std, attn_implementation="sdpa")
    return transformers.BertForPreTraining(config)


def hf_gpt2(cfg: Any) -> nn.Module:
    """``GPT2LMHeadModel`` with the sizes of a pentad GPT-2 ``ModelConfig``."""
    import transformers

    enc = cfg.encoder
    config = transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_length, n_embd=cfg.hidden_size,
        n_layer=enc.num_layers, n_head=enc.num_heads, n_inner=enc.ffn_size,
        activation_function={"gelu_tanh": "gelu_new"}.get(enc.activation, enc.activation),
        resid_pdrop=enc.dropout, embd_pdrop=cfg.embedding.dropout,
        attn_pdrop=enc.dropout if enc.attention_dropout is None else enc.attention_dropout,
        layer_norm_epsilon=enc.layer_norm_eps, initializer_range=cfg.init_std,
        bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return transformers.GPT2LMHeadModel(config)


# ------------------------------------------------------------------------------------- data
@dataclass
class Inputs:
    """One batch in both libraries' conventions. ``hf`` are keyword arguments of the HF model."""

    pentad: Batch
    hf: dict[str, Tensor]
    hf_labels: dict[str, Tensor]
    tokens: int  # B * S, the throughput unit


def padding_mask(batch_size: int, seq_len: int, padded_rows: float, g: torch.Generator) -> Tensor:
    """[B,S] bool, True = padding: a fraction of the rows ends early (at half to full length)."""
    lengths = torch.full((batch_size,), seq_len)
    short = torch.rand(batch_size, generator=g) < padded_rows
    lengths[short] = torch.randint(seq_len // 2, seq_len, (int(short.sum()),), generator=g)
    return torch.arange(seq_len)[None, :] >= lengths[:, None]


def bert_inputs(vocab: int, batch_size: int, seq_len: int, padded_rows: float, seed: int) -> Inputs:
    """Segments A/B, 15% of the real tokens masked (replaced by [MASK]), random NSP labels."""
    g = torch.Generator().manual_seed(seed)
    pad = padding_mask(batch_size, seq_len, padded_rows, g)
    original = torch.randint(1000, vocab, (batch_size, seq_len), generator=g).masked_fill(pad, 0)
    length = (~pad).sum(dim=1, keepdim=True)
    segments = ((torch.arange(seq_len)[None, :] >= length // 2) & ~pad).long()
    masked = (torch.rand(batch_size, seq_len, generator=g) < 0.15) & ~pad
    tokens = original.masked_fill(masked, MASK_ID)
    mlm = original.masked_fill(~masked, IGNORE_INDEX)
    nsp = torch.randint(0, 2, (batch_size,), generator=g)
    return Inputs(
        pentad=Batch(tokens=tokens, segments=segments, padding_mask=pad, labels={"mlm": mlm, "sp": nsp}),
        hf={"input_ids": tokens, "token_type_ids": segments, "attention_mask": (~pad).long()},
        hf_labels={"labels": mlm, "next_sentence_label": nsp},
        tokens=batch_size * seq_len)


def gpt2_inputs(vocab: int, batch_size: int, seq_len: int, padded_rows: float, seed: int) -> Inputs:
    """Right-padded token rows; HF shifts its labels itself, pentad's objective has shifted them."""
    g = torch.Generator().manual_seed(seed)
    pad = padding_mask(batch_size, seq_len, padded_rows, g)
    tokens = torch.randint(0, vocab, (batch_size, seq_len), generator=g).masked_fill(pad, 0)
    hf_labels = tokens.masked_fill(pad, IGNORE_INDEX)
    shifted = torch.full_like(tokens, IGNORE_INDEX)
    shifted[:, :-1] = hf_labels[:, 1:]
    return Inputs(
        pentad=Batch(tokens=tokens, padding_mask=pad, labels={"lm": shifted}),
        hf={"input_ids": tokens, "attention_mask": (~pad).long()},
        hf_labels={"labels": hf_labels},
        tokens=batch_size * seq_len)


# ---------------------------------------------------------------------------------- stepping
def make_optimizer(model: nn.Module, kind: str) -> torch.optim.Optimizer:
    """The same optimizer for both sides: pentad's ``build_optimizer`` (what ``pentad pretrain``
    uses), or the same AdamW with torch's fused kernel (what HF's Trainer uses by default)."""
    opt = build_optimizer(model, TrainConfig())
    if kind == "fused":
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in opt.param_groups]
        opt = torch.optim.AdamW(groups, lr=opt.defaults["lr"], betas=opt.defaults["betas"],
                                eps=opt.defaults["eps"], fused=True)
    return opt


def pentad_step(model: nn.Module, opt: torch.optim.Optimizer | None, x: Inputs, mode: str) -> Tensor | None:
    if mode == "train":
        loss = total_loss(model(x.pentad))
        loss.backward()
        opt.step()  # type: ignore[union-attr]
        opt.zero_grad(set_to_none=True)  # type: ignore[union-attr]
        return loss.detach()
    with torch.no_grad():
        if mode == "infer":
            return total_loss(model(x.pentad))
        unlabelled = Batch(tokens=x.pentad.tokens, segments=x.pentad.segments, padding_mask=x.pentad.padding_mask)
        model(unlabelled)
        return None


def hf_step(model: nn.Module, opt: torch.optim.Optimizer | None, x: Inputs, mode: str) -> Tensor | None:
    if mode == "train":
        loss = model(**x.hf, **x.hf_labels).loss
        loss.backward()
        opt.step()  # type: ignore[union-attr]
        opt.zero_grad(set_to_none=True)  # type: ignore[union-attr]
        return loss.detach()
    with torch.no_grad():
        if mode == "infer":
            return model(**x.hf, **x.hf_labels).loss
        model(**x.hf)
        return None


@dataclass
class Side:
    """One library's model, optimizer and step function."""

    name: str
    model: nn.Module
    step: Callable[[nn.Module, torch.optim.Optimizer | None, Inputs, str], Tensor | None]
    opt: torch.optim.Optimizer | None = None
    times: dict[str, list[float]] = field(default_factory=dict)
    cpu_times: dict[str, list[float]] = field(default_factory=dict)
    first_loss: dict[str, float] = field(default_factory=dict)

    def run(self, x: Inputs, mode: str, steps: int) -> tuple[float, float]:
        """Wall-clock and process CPU seconds for ``steps`` steps."""
        self.model.train(mode == "train")
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(steps):
            loss = self.step(self.model, self.opt, x, mode)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        if loss is not None and mode not in self.first_loss:
            self.first_loss[mode] = float(loss)
        return elapsed, cpu


def bench_workload(name: str, size: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Time both libraries on one workload in every requested mode; one result row per mode.

    ``first_loss`` in a row is the loss of the first (warmup) step of that mode: a sanity check
    that both sides compute the same kind of loss (near ln(vocab) at initialisation in train).
    """
    recipe, overrides, batch_size, seq_len = SIZES[size][name]
    batch_size = args.batch_size or batch_size
    seq_len = args.seq_length or seq_len
    cfg = load_config(recipe, overrides).model
    torch.manual_seed(args.seed)
    ours = build_model(cfg)
    theirs = hf_bert(cfg) if name == "bert" else hf_gpt2(cfg)
    make = bert_inputs if name == "bert" else gpt2_inputs
    x = make(cfg.vocab_size, batch_size, seq_len, args.padded_rows, args.seed)
    sides = [Side("pentad", ours, pentad_step), Side("hf", theirs, hf_step)]
    for side in sides:
        side.opt = make_optimizer(side.model, args.optimizer)
    n_params = {s.name: sum(p.numel() for p in s.model.parameters()) for s in sides}
    print(f"\n{name} ({recipe}{' ' + ' '.join(overrides) if overrides else ''}): batch {batch_size} x "
          f"seq {seq_len}, parameters pentad {n_params['pentad']:,} / hf {n_params['hf']:,}", flush=True)
    rows = []
    for mode in args.modes:
        for side in sides:
            side.run(x, mode, args.warmup)  # warmup: allocator, oneDNN primitives, optimizer state
            side.times[mode], side.cpu_times[mode] = [], []
        for rep in range(args.reps):
            order = sides if rep % 2 == 0 else sides[::-1]  # alternate who goes first
            for side in order:
                wall, cpu = side.run(x, mode, args.steps)
                side.times[mode].append(wall)
                side.cpu_times[mode].append(cpu)
        tps = {s.name: x.tokens * args.steps / statistics.median(s.times[mode]) for s in sides}
        cpu = {s.name: statistics.median(s.cpu_times[mode]) for s in sides}
        row = {"model": name, "size": size, "mode": mode, "batch_size": batch_size, "seq_length": seq_len,
               "pentad_tokens_per_s": tps["pentad"], "hf_tokens_per_s": tps["hf"],
               "ratio": tps["pentad"] / tps["hf"], "cpu_time_ratio": cpu["hf"] / cpu["pentad"],
               "pentad_seconds": sides[0].times[mode], "hf_seconds": sides[1].times[mode],
               "pentad_cpu_seconds": sides[0].cpu_times[mode], "hf_cpu_seconds": sides[1].cpu_times[mode],
               "steps_per_rep": args.steps,
               "first_loss": {s.name: s.first_loss.get(mode) for s in sides}}
        rows.append(row)
        print(f"  {mode:<7} pentad {tps['pentad']:9.0f} tok/s   hf {tps['hf']:9.0f} tok/s   "
              f"ratio {row['ratio']:.2f}   (CPU-time ratio {row['cpu_time_ratio']:.2f})", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="small",
                   help="small: BERT-mini (L4 H256) and a reduced GPT-2 (L4 H256); base: BERT-base and GPT-2 124M")
    p.add_argument("--models", default="bert,gpt2", help="comma-separated: bert, gpt2")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per side (default 5; base: 3)")
    p.add_argument("--steps", type=int, default=1, help="steps per repetition")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per side and mode")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    p.add_argument("--batch-size", type=int, default=None, help="override the workload's batch size")
    p.add_argument("--seq-length", type=int, default=None, help="override the workload's sequence length")
    p.add_argument("--padded-rows", type=float, default=0.0,
                   help="fraction of rows that end early (padding; default 0: full rows)")
    p.add_argument("--optimizer", choices=("pentad", "fused"), default="pentad",
                   help="pentad: pentad's build_optimizer for both sides; fused: the same AdamW, fused kernel")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for value, allowed, flag in ((args.models, ("bert", "gpt2"), "--models"), (args.modes, MODES, "--modes")):
        bad = [v for v in value if v not in allowed]
        if bad:
            p.error(f"{flag}: unknown {', '.join(bad)} (choose from {', '.join(allowed)})")
    args.reps = args.reps or (3 if args.size == "base" else 5)

    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)  # one process, so both libraries share this setting
    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version(), "threads": torch.get_num_threads(),
           "cpu": platform.processor() or platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv])}
    print(f"torch {env['torch']}, transformers {env['transformers']}, {env['threads']} threads, "
          f"{env['cpu_capability']}; {args.reps} reps x {args.steps} steps, {args.warmup} warmup, fp32")
    started = time.perf_counter()
    rows = []
    for name in args.models:
        rows += bench_workload(name, args.size, args)
    print("\n| model | mode | pentad tok/s | HF tok/s | pentad/HF | CPU-time HF/pentad |\n"
          "|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} ({r['size']}) | {r['mode']} | {r['pentad_tokens_per_s']:.0f} | "
              f"{r['hf_tokens_per_s']:.0f} | {r['ratio']:.2f} | {r['cpu_time_ratio']:.2f} |")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"env": env, "args": {k: v for k, v in vars(args).items() if k != "json"},
                       "results": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
