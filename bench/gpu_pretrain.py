r"""Pre-training on a GPU: pentad against Hugging Face Transformers and TencentPretrain, in one process.

Workloads (``--preset full``; ``tiny`` shrinks every model to 2 layers of width 32 and short
sequences, to check the script end to end on a CPU):

=============  ==============================================  ===========  ======
workload       model                                           batch x seq  tokens
=============  ==============================================  ===========  ======
``bert-128``   BERT-base, masked LM (15%) + next sentence       64 x 128     8192
``bert-512``   the same at sequence length 512                  16 x 512     8192
``gpt2``       GPT-2 small (124M), causal LM                    8 x 1024     8192
``llama-1b``   LLaMA shape, L22 H2048 A16 FF5632 (~1.2B)        4 x 2048     8192
=============  ==============================================  ===========  ======

Each runs in every ``--precisions`` mode of ``train.precision`` (``tf32``; ``bf16``: autocast over fp32
master weights; ``bf16-true``: bf16 weights, gradients and AdamW moments), applied on every side by
pentad's own precision code (``pentad.training.precision``: the TF32 switches, the weights' dtype, the
autocast dtype), so that the numbers are what ``train.precision`` does. Sides (``--sides``):

* ``pentad``: the zoo recipe built by ``pentad.builder.build_model``; loss = ``total_loss``. pentad's
  MLM head projects the masked positions only.
* ``hf``: ``BertForPreTraining`` / ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` with the same sizes and
  ``attn_implementation="sdpa"`` (the builders are shared with ``bench/pretrain_throughput.py``).
  Transformers' BERT offers no masked-only MLM head, so HF's standard head (every position) is timed.
* ``tencentpretrain``: TencentPretrain's own ``build_model`` (which assembles its ``Model`` from
  ``tencentpretrain.models.model``) over its config JSON from the checkout given by ``--tencentpretrain``
  (``models/bert/base_config.json``, ``models/gpt2/config.json``, ``models/llama/7b_config.json`` with
  the sizes above); skipped when no checkout is given. Nothing of TencentPretrain is part of pentad.

Every side runs the same loop on the same tensors: forward under the precision's autocast, backward,
gradient clipping at 1.0 (``train.clip_grad_norm``'s default), pentad's ``build_optimizer`` (torch's
fused AdamW, also HF Trainer's default) and ``zero_grad(set_to_none=True)``. Batches are full rows (no
padding), so tokens/s counts B x S; a padding mask that marks nothing is left out on every side, as the
trainer does. Repetitions alternate the sides' order; the median repetition is reported. The device is
synchronised before every clock read.

MFU = model FLOPs per token x tokens/s / peak, with the FLOPs per token of pentad's own
``model_flops_per_token`` (6 N + 12 L H S, the formula the trainer logs ``mfu`` with), computed on the
pentad model and used for every side (the same architecture; ratios of MFU are ratios of tokens/s).
The peak is measured in the same run by a large matrix product in the precision's matmul dtype (bf16,
or fp32 with TF32 on); ``mfu_datasheet`` divides by pentad's table of data-sheet peaks instead (GPUs
it knows). Peak memory is the side's own: the CUDA allocator's peak during its repetitions, less what
the other sides' resident weights and optimizer states held (None on a CPU). A side that runs out of
memory or fails is recorded with its error, its memory is given back, and the others go on (the three
1.2B models and their optimizer states stay resident together: about 45 GB before activations, which
an H200 holds; on an 80 GB H100, TencentPretrain's LLaMA, which materialises the attention scores,
may run out of memory in ``tf32`` and ``bf16``).

``--cli``: ``pentad pretrain`` itself (a subprocess) on a dataset that ``pentad preprocess`` makes from a
real corpus (``--corpus``, ``--vocab``: a WordPiece vocabulary), with the same model and batch as the
raw loop's pentad side (the model's vocabulary size follows the vocabulary file on both); its
tokens/s is the median of the ``tokens_per_s`` that the trainer logs to ``metrics.jsonl`` per
``--steps`` steps (the first interval, warm-up, left out), against the raw loop's. Target: >= 0.95.

Run from the repository root. Here, on a CPU, the tiny preset::

    PYTHONPATH=src .venv/bin/python bench/gpu_pretrain.py --preset tiny --cli --json /tmp/gpu_pretrain.json

On the GPU machine (no pydantic there: ``bench/gpu_setup.sh``, sourced, installs the carried wheels
and puts ``src`` on ``PYTHONPATH``; its header says how to build ``.whl``, ``.benchdata`` and ``.tp``
in the repository root here), with ``carry: [".whl", ".benchdata", ".tp"]`` (``.tp``: TencentPretrain's
``tencentpretrain/`` package and the config files read, copied from a checkout), one command line::

    set -o pipefail; . bench/gpu_setup.sh .whl && PYTHONUNBUFFERED=1 python3 bench/gpu_pretrain.py \
        --tencentpretrain .tp --cli --corpus .benchdata/corpus.txt --vocab .benchdata/vocab.txt \
        --json $OUT/gpu_pretrain.json 2>&1 | tee $OUT/gpu_pretrain.log

(about 4 to 6 minutes: 12 workload x precision pairs of three sides, then the CLI mode for GPT-2 in
bf16; ``--workloads`` / ``--precisions`` / ``--sides`` trim it.)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pretrain_throughput as shared  # noqa: E402  (bench/pretrain_throughput.py: HF builders, batches)

from pentad.assembly import load_config  # noqa: E402
from pentad.builder import build_model  # noqa: E402
from pentad.components.base import Batch  # noqa: E402
from pentad.model import total_loss  # noqa: E402
from pentad.training.config import TrainConfig  # noqa: E402
from pentad.training.optim import build_optimizer  # noqa: E402
from pentad.training.precision import (  # noqa: E402
    apply_matmul_precision,
    autocast_dtype,
    describe,
    model_flops_per_token,
    param_dtype,
    peak_memory_gib,
    peak_tflops,
    resolve,
    synchronize,
)

SIDES = ("pentad", "hf", "tencentpretrain")
PRECISIONS = ("tf32", "bf16", "bf16-true")
TP_DATA = ROOT.parent / "shared" / "data" / "tencentpretrain"  # the corpus and vocabulary used here, if present

LLAMA_1B = ["model.hidden_size=2048", "model.encoder.num_layers=22", "model.encoder.num_heads=16",
            "model.encoder.ffn_size=5632"]
TINY = ["model.hidden_size=32", "model.encoder.num_layers=2", "model.encoder.num_heads=2",
        "model.encoder.ffn_size=64", "model.vocab_size=1100"]  # > 1000: bert_inputs draws ids from 1000 up


@dataclass(frozen=True)
class Workload:
    recipe: str                     # pentad zoo recipe
    overrides: tuple[str, ...]      # on top of it (full preset)
    kind: str                       # bert | gpt2 | llama: HF model and batch layout
    tp_config: str                  # TencentPretrain config JSON, relative to the checkout
    batch: int
    seq: int
    tiny_batch: int
    tiny_seq: int


WORKLOADS: dict[str, Workload] = {
    "bert-128": Workload("bert/base", (), "bert", "models/bert/base_config.json", 64, 128, 4, 16),
    "bert-512": Workload("bert/base", (), "bert", "models/bert/base_config.json", 16, 512, 2, 32),
    "gpt2": Workload("gpt2/base", (), "gpt2", "models/gpt2/config.json", 8, 1024, 2, 32),
    "llama-1b": Workload("llama/7b", tuple(LLAMA_1B), "llama", "models/llama/7b_config.json", 4, 2048, 2, 32),
}


def model_config(w: Workload, preset: str, extra: list[str] | None = None) -> Any:
    """The pentad ``ModelConfig`` of a workload in a preset."""
    overrides = list(w.overrides) + (TINY if preset == "tiny" else []) + (extra or [])
    return load_config(w.recipe, overrides).model


# ------------------------------------------------------------------------------------ models
def hf_llama(cfg: Any) -> nn.Module:
    """``LlamaForCausalLM`` with the sizes of a pentad LLaMA ``ModelConfig`` (no grouped queries)."""
    import transformers

    enc = cfg.encoder
    config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=enc.ffn_size,
        num_hidden_layers=enc.num_layers, num_attention_heads=enc.num_heads, num_key_value_heads=enc.num_heads,
        max_position_embeddings=cfg.max_seq_length, rms_norm_eps=enc.layer_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings, attention_bias=False, mlp_bias=False,
        initializer_range=cfg.init_std, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config)


def hf_model(kind: str, cfg: Any) -> nn.Module:
    return {"bert": shared.hf_bert, "gpt2": shared.hf_gpt2, "llama": hf_llama}[kind](cfg)


def tp_model(checkout: Path, w: Workload, cfg: Any) -> nn.Module:
    """TencentPretrain's model, built by its own ``build_model`` from its config JSON with the sizes of
    the pentad config ``cfg`` (arguments: TencentPretrain's own option defaults, then the JSON)."""
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    here = Path.cwd()
    os.chdir(checkout)  # its constants module reads models/special_tokens_map.json from the working directory
    try:
        from tencentpretrain import opts
        from tencentpretrain.model_builder import build_model as tp_build
    finally:
        os.chdir(here)

    parser = argparse.ArgumentParser()
    for name in ("model_opts", "tokenizer_opts", "tgt_tokenizer_opts", "mp_opts", "optimization_opts",
                 "log_opts", "deepspeed_opts", "lora_opts"):
        if hasattr(opts, name):
            getattr(opts, name)(parser)
    args = parser.parse_args([])
    # what pretrain.py adds beside the option groups
    defaults = {"dropout": 0.1, "data_processor": "bert", "deep_init": False, "labels_num": None,
                "lora_params": None, "dist_train": False}
    for key, value in defaults.items():
        if not hasattr(args, key):
            setattr(args, key, value)
    config = json.loads((checkout / w.tp_config).read_text(encoding="utf-8"))
    enc = cfg.encoder
    config.update(emb_size=cfg.hidden_size, hidden_size=cfg.hidden_size, layers_num=enc.num_layers,
                  heads_num=enc.num_heads, feedforward_size=enc.ffn_size, max_seq_length=cfg.max_seq_length)
    vars(args).update(config)
    args.lora_params = None
    args.tokenizer = types.SimpleNamespace(vocab=dict.fromkeys(range(cfg.vocab_size)))
    model = tp_build(args)
    for name, p in model.named_parameters():  # TencentPretrain's trainer initialises so
        if "gamma" not in name and "beta" not in name:
            p.data.normal_(0, 0.02)
    return model


# -------------------------------------------------------------------------------------- data
@dataclass
class Feed:
    """One batch for every side, on the device."""

    pentad: Batch
    hf: dict[str, Tensor]
    tp: tuple[Tensor, Any, Tensor]  # src, tgt, seg
    tokens: int


def make_feed(kind: str, vocab: int, batch: int, seq: int, seed: int, device: torch.device) -> Feed:
    """Full rows (no padding). The padding masks that mark nothing are left out (the trainer's
    ``without_empty_padding``; HF without ``attention_mask``)."""
    make = shared.bert_inputs if kind == "bert" else shared.gpt2_inputs
    x = make(vocab, batch, seq, 0.0, seed)
    on = {k: v.to(device) for k, v in x.hf.items() if k != "attention_mask"}
    hf = {**on, **{k: v.to(device) for k, v in x.hf_labels.items()}}
    pentad = x.pentad.without_empty_padding().to(device)
    if kind == "bert":  # TencentPretrain: label 0 = not masked; segments 1 and 2, 0 = padding
        seg = (x.pentad.segments + 1).masked_fill(x.pentad.padding_mask, 0)
        tgt: Any = {"mlm": x.pentad.labels["mlm"].clamp_min(0).to(device), "sp": x.pentad.labels["sp"].to(device)}
    else:  # next-token labels (the last position's is 0); segment 1 = a real token
        seg = (~x.pentad.padding_mask).long()
        tgt = x.pentad.labels["lm"].clamp_min(0).to(device)
    return Feed(pentad, hf, (x.pentad.tokens.to(device), tgt, seg.to(device)), x.tokens)


def pentad_loss(model: nn.Module, feed: Feed) -> Tensor:
    return total_loss(model(feed.pentad))


def hf_loss(model: nn.Module, feed: Feed) -> Tensor:
    return model(**feed.hf).loss


def tp_loss(model: nn.Module, feed: Feed) -> Tensor:
    out = model(*feed.tp)
    if isinstance(out, dict):  # mlm + sp: {"mlm": (loss, correct, denominator), "sp": (loss, correct)}
        return sum(v[0] for v in out.values())
    return out[0] if isinstance(out, tuple) else out


LOSSES: dict[str, Callable[[nn.Module, Feed], Tensor]] = {"pentad": pentad_loss, "hf": hf_loss,
                                                          "tencentpretrain": tp_loss}


# ---------------------------------------------------------------------------------- stepping
@dataclass
class Side:
    name: str
    model: nn.Module
    opt: torch.optim.Optimizer
    loss_fn: Callable[[nn.Module, Feed], Tensor]
    precision: str
    device: torch.device
    seconds: list[float] = field(default_factory=list)
    peak_gib: float | None = None
    first_loss: float | None = None
    error: str | None = None

    def own_bytes(self) -> int:
        """The side's resident weights and optimizer state (gradients are None between steps)."""
        size = sum(p.numel() * p.element_size() for p in self.model.parameters())
        for state in self.opt.state.values():
            size += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, Tensor))
        return size

    def release(self) -> None:
        """Drop the model and optimizer (a side that failed), so that the others have its memory."""
        self.model = self.opt = None  # type: ignore[assignment]

    def run(self, feed: Feed, steps: int) -> float:
        """Seconds for ``steps`` training steps (synchronised); tracks the side's own peak memory."""
        cuda = self.device.type == "cuda"
        dtype = autocast_dtype(self.precision)
        clip = TrainConfig().clip_grad_norm
        if cuda:
            synchronize(self.device)
            others = torch.cuda.memory_allocated(self.device) - self.own_bytes()
            torch.cuda.reset_peak_memory_stats(self.device)
        self.model.train()
        start = time.perf_counter()
        for _ in range(steps):
            with torch.autocast(self.device.type, dtype=dtype) if dtype is not None else nullcontext():
                loss = self.loss_fn(self.model, feed)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip, foreach=True if cuda else None)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        synchronize(self.device)
        elapsed = time.perf_counter() - start
        if self.first_loss is None:
            self.first_loss = float(loss.detach())
        if cuda:
            peak = (peak_memory_gib(self.device) * 2 ** 30 - others) / 2 ** 30
            self.peak_gib = round(max(self.peak_gib or 0.0, peak), 3)
        return elapsed


def build_side(name: str, w: Workload, cfg: Any, precision: str, device: torch.device, seed: int,
               checkout: Path | None) -> Side:
    """One side's model (built on the device, weights in the precision's dtype) and optimizer."""
    def build() -> nn.Module:
        torch.manual_seed(seed)
        if name == "pentad":
            return build_model(cfg)
        if name == "hf":
            return hf_model(w.kind, cfg)
        return tp_model(checkout, w, cfg)  # type: ignore[arg-type]

    try:
        with torch.device(device):  # initialised on the GPU: seconds, not minutes, for the 1B model
            model = build()
    except Exception:  # noqa: BLE001 - code that insists on host tensors while building: build it there
        free(device)
        model = build()
    model = model.to(device, dtype=param_dtype(precision))
    return Side(name, model, build_optimizer(model, TrainConfig()), LOSSES[name], precision, device)


def failure(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) < 400 else text[:400] + "..."


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------- peaks
def measure_peak(kind: str, device: torch.device, n: int, reps: int = 10) -> float:
    """TFLOP/s of an n x n x n matrix product: ``bf16``, or fp32 under ``tf32``'s switches."""
    apply_matmul_precision("tf32" if kind == "tf32" else "fp32", device)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    for _ in range(3):
        torch.mm(a, b)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    synchronize(device)
    seconds = (time.perf_counter() - start) / reps
    del a, b
    return 2 * n ** 3 / seconds / 1e12


def matmul_kind(precision: str) -> str:
    return "bf16" if precision.startswith("bf16") else "tf32"


class MatmulDefaults:
    """The process's TF32 switches as torch set them, restored before each precision (so that a
    ``tf32`` run does not leak into the next, as in a fresh ``pentad pretrain`` process)."""

    def __init__(self) -> None:
        self.matmul = torch.backends.cuda.matmul.allow_tf32
        self.cudnn = torch.backends.cudnn.allow_tf32

    def apply(self, precision: str, device: torch.device) -> None:
        torch.backends.cuda.matmul.allow_tf32 = self.matmul
        torch.backends.cudnn.allow_tf32 = self.cudnn
        apply_matmul_precision(precision, device)


# ----------------------------------------------------------------------------------- bench
def flops_per_token(cfg: Any, seq: int) -> tuple[float, int]:
    """pentad's model FLOPs per token at ``seq`` (6 N + 12 L H S) and N, from the model built on the
    meta device (no memory)."""
    with torch.device("meta"):
        model = build_model(cfg)
    linear, attention = model_flops_per_token(model)
    return linear + attention * seq, sum(p.numel() for p in model.parameters())


def bench_pair(wname: str, precision: str, args: argparse.Namespace, peaks: dict[str, float],
               defaults: MatmulDefaults) -> list[dict[str, Any]]:
    """Every requested side on one workload in one precision; one row per side."""
    w = WORKLOADS[wname]
    device = args.device
    batch, seq = (w.batch, w.seq) if args.preset == "full" else (w.tiny_batch, w.tiny_seq)
    cfg = model_config(w, args.preset)
    resolved = resolve(precision, device)
    defaults.apply(resolved, device)
    fpt, n_params = flops_per_token(cfg, seq)
    print(f"\n{wname} {precision}: batch {batch} x seq {seq}, {n_params:,} parameters (pentad), "
          f"{fpt / 1e9:.2f} GFLOP/token; {describe(precision, resolved, device)}", flush=True)
    feed = make_feed(w.kind, cfg.vocab_size, batch, seq, args.seed, device)
    sides: list[Side] = []
    rows: dict[str, dict[str, Any]] = {}
    for name in args.sides:
        base = {"workload": wname, "precision": precision, "side": name, "batch_size": batch, "seq_length": seq,
                "tokens_per_step": feed.tokens, "model_flops_per_token": fpt, "tokens_per_s": None, "mfu": None,
                "mfu_datasheet": None, "peak_memory_gib": None, "seconds": [], "first_loss": None, "error": None}
        rows[name] = base
        if name == "tencentpretrain" and args.tencentpretrain is None:
            base["error"] = "skipped: no --tencentpretrain checkout"
            continue
        side = None
        try:
            side = build_side(name, w, cfg, resolved, device, args.seed, args.tencentpretrain)
            base["parameters"] = sum(p.numel() for p in side.model.parameters())
            side.run(feed, args.warmup)  # allocator, kernels' autotuning, optimizer state
            sides.append(side)
        except Exception as error:  # noqa: BLE001 - an OOM or a failing side is recorded, the others go on
            base["error"] = failure(error)
            print(f"  {name}: {base['error']}", flush=True)
            side = None  # its memory goes back before the next side is built
            free(device)
    for rep in range(args.reps):
        for side in sides if rep % 2 == 0 else sides[::-1]:
            if side.error is not None:
                continue
            try:
                side.seconds.append(side.run(feed, args.steps))
            except Exception as error:  # noqa: BLE001
                side.error = failure(error)
                side.release()
                free(device)
    peak = peaks[matmul_kind(resolved)]
    sheet = peak_tflops(resolved, device, None)
    for side in sides:
        row = rows[side.name]
        row.update(seconds=side.seconds, first_loss=side.first_loss, error=side.error,
                   peak_memory_gib=side.peak_gib)
        if side.seconds:
            tps = feed.tokens * args.steps / statistics.median(side.seconds)
            row.update(tokens_per_s=tps, mfu=tps * fpt / (peak * 1e12),
                       mfu_datasheet=tps * fpt / (sheet * 1e12) if sheet else None)
        print(f"  {side.name:<16} " + (f"{row['tokens_per_s']:10.0f} tok/s  MFU {row['mfu']:.3f}  peak "
                                        f"{row['peak_memory_gib']} GiB  first loss {row['first_loss']:.3f}"
                                        if side.seconds else "") + (f"  failed: {side.error}" if side.error else ""),
              flush=True)
    del sides, feed
    free(device)
    return [rows[name] for name in args.sides]


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pentad / HF and pentad / TencentPretrain tokens/s per workload and precision."""
    out = []
    keys = dict.fromkeys((r["workload"], r["precision"]) for r in rows)
    for wname, precision in keys:
        tps = {r["side"]: r["tokens_per_s"] for r in rows if (r["workload"], r["precision"]) == (wname, precision)}
        ours = tps.get("pentad")
        out.append({"workload": wname, "precision": precision,
                    "pentad_over_hf": ours / tps["hf"] if ours and tps.get("hf") else None,
                    "pentad_over_tencentpretrain":
                        ours / tps["tencentpretrain"] if ours and tps.get("tencentpretrain") else None})
    return out


# -------------------------------------------------------------------------------- CLI mode
def vocab_size_of(path: Path) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)  # one token a line (a blank line is a token too)


def bench_cli(precision: str, args: argparse.Namespace, peaks: dict[str, float],
              defaults: MatmulDefaults) -> dict[str, Any]:
    """``pentad pretrain`` (a subprocess, its logged tokens/s) against the raw loop's pentad side."""
    w = WORKLOADS[args.cli_workload]
    device = args.device
    batch, seq = (w.batch, w.seq) if args.preset == "full" else (w.tiny_batch, w.tiny_seq)
    overrides = [*w.overrides, *(TINY if args.preset == "tiny" else [])]
    overrides = [o for o in overrides if not o.startswith("model.vocab_size=")]
    overrides.append(f"model.vocab_size={vocab_size_of(args.vocab)}")
    common = [*overrides, "tokenizer.type=wordpiece", f"tokenizer.vocab={args.vocab}",
              f"data.objective.seq_length={seq}"]
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]))
    dataset = work / f"dataset_{args.cli_workload}_{seq}"
    if not (dataset / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "pentad", "preprocess", "--config", w.recipe, *common,
                        f"data.corpus={args.corpus}", f"data.output={dataset}"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
    run_dir = work / f"run_{args.cli_workload}_{precision}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a run directory that exists would be resumed
    intervals = args.reps + 1
    cmd = [sys.executable, "-m", "pentad", "pretrain", "--config", w.recipe, *common, f"data.dataset={dataset}",
           f"output={run_dir}", f"train.steps={args.steps * intervals}", f"train.batch_size={batch}",
           f"train.log_every={args.steps}", f"train.precision={precision}", "train.progress=false",
           "train.tensorboard=false"]
    print(f"\nCLI {args.cli_workload} {precision}: {' '.join(cmd[2:])}", flush=True)
    row: dict[str, Any] = {"mode": "cli", "workload": args.cli_workload, "precision": precision,
                           "batch_size": batch, "seq_length": seq, "target": 0.95, "cli_tokens_per_s": None,
                           "raw_tokens_per_s": None, "ratio": None, "error": None}
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    row["cli_seconds"] = time.perf_counter() - started
    if done.returncode != 0:
        row["error"] = f"pentad pretrain failed ({done.returncode}): {done.stderr[-1500:]}"
        print(row["error"], flush=True)
        return row
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    logged = [r for r in records if "tokens_per_s" in r][1:]  # the first interval warms up
    row["cli_intervals_tokens_per_s"] = [r["tokens_per_s"] for r in logged]
    row["cli_tokens_per_s"] = statistics.median(row["cli_intervals_tokens_per_s"]) if logged else None
    row["cli_mfu_logged"] = [r.get("mfu") for r in logged]
    row["cli_peak_memory_gib"] = max((r.get("peak_memory_gib") or 0.0 for r in logged), default=None)

    cfg = load_config(w.recipe, overrides).model
    resolved = resolve(precision, device)
    defaults.apply(resolved, device)
    fpt, _ = flops_per_token(cfg, seq)
    feed = make_feed(w.kind, cfg.vocab_size, batch, seq, args.seed, device)
    side = build_side("pentad", w, cfg, resolved, device, args.seed, None)
    side.run(feed, args.warmup)
    for _ in range(args.reps):
        side.seconds.append(side.run(feed, args.steps))
    raw = feed.tokens * args.steps / statistics.median(side.seconds)
    row.update(raw_tokens_per_s=raw, raw_seconds=side.seconds, model_flops_per_token=fpt,
               raw_mfu=raw * fpt / (peaks[matmul_kind(resolved)] * 1e12))
    if row["cli_tokens_per_s"]:
        row["ratio"] = row["cli_tokens_per_s"] / raw
        row["cli_mfu"] = row["cli_tokens_per_s"] * fpt / (peaks[matmul_kind(resolved)] * 1e12)
    print(f"  CLI {row['cli_tokens_per_s'] or 0:.0f} tok/s, raw loop {raw:.0f} tok/s, "
          f"ratio {row['ratio'] or 0:.3f} (target >= 0.95)", flush=True)
    del side, feed
    free(device)
    return row


# -------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=("full", "tiny"), default="full",
                   help="full: the sizes above; tiny: 2 layers of width 32, short sequences (a CPU check)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {', '.join(WORKLOADS)}")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help=f"comma-separated: {', '.join(PRECISIONS)}")
    p.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated: {', '.join(SIDES)}")
    p.add_argument("--steps", type=int, default=None, help="steps per timed repetition (full 10, tiny 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per side first (full 3, tiny 1)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per side, sides alternating")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tencentpretrain", type=Path, default=None,
                   help="a TencentPretrain checkout (its tencentpretrain/ and models/); without it, that side is "
                        "skipped")
    p.add_argument("--matmul-size", type=int, default=None,
                   help="n of the peak-measuring product (full 8192, tiny 256)")
    p.add_argument("--cli", action="store_true", help="also time `pentad pretrain` against the raw loop")
    p.add_argument("--cli-only", action="store_true", help="only the CLI mode")
    p.add_argument("--cli-workload", choices=("gpt2", "llama-1b"), default="gpt2")
    p.add_argument("--cli-precisions", default="bf16", help="comma-separated precisions of the CLI mode")
    p.add_argument("--corpus", type=Path, default=TP_DATA / "corpora" / "CLUECorpusSmall_sampled.txt",
                   help="the CLI mode's corpus: one document per line")
    p.add_argument("--vocab", type=Path, default=TP_DATA / "models" / "google_zh_vocab.txt",
                   help="the CLI mode's WordPiece vocabulary")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "gpu_pretrain", help="the CLI mode's dataset and runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="PATH", help="write the environment and every row as JSON")
    args = p.parse_args(argv)
    for key, allowed in (("workloads", WORKLOADS), ("precisions", PRECISIONS), ("sides", SIDES),
                         ("cli_precisions", PRECISIONS)):
        value = [v.strip() for v in getattr(args, key).split(",") if v.strip()]
        bad = [v for v in value if v not in allowed]
        if bad:
            p.error(f"--{key.replace('_', '-')}: unknown {', '.join(bad)} (choose from {', '.join(allowed)})")
        setattr(args, key, value)
    tiny = args.preset == "tiny"
    args.steps = args.steps or (2 if tiny else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if tiny else 3)
    args.matmul_size = args.matmul_size or (256 if tiny else 8192)
    args.device = torch.device(args.device)
    args.cli = args.cli or args.cli_only
    if args.tencentpretrain is not None:
        args.tencentpretrain = args.tencentpretrain.resolve()
        if not (args.tencentpretrain / "tencentpretrain" / "model_builder.py").is_file():
            p.error(f"--tencentpretrain {args.tencentpretrain}: no tencentpretrain/model_builder.py there")
    if args.cli and not (args.corpus.is_file() and args.vocab.is_file()):
        p.error(f"--cli needs --corpus and --vocab files ({args.corpus}, {args.vocab})")
    return args


def environment(args: argparse.Namespace, peaks: dict[str, float]) -> dict[str, Any]:
    import transformers

    device = args.device
    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version(), "device": str(device),
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else
           (platform.processor() or platform.machine()),
           "cuda": torch.version.cuda, "peak_tflops_measured": peaks, "matmul_size": args.matmul_size,
           "command": " ".join([Path(sys.executable).name, *sys.argv])}
    if device.type == "cpu":
        env["threads"] = torch.get_num_threads()
    return env


def table(rows: list[dict[str, Any]], ratio_rows: list[dict[str, Any]], cli_rows: list[dict[str, Any]]) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = ["| workload | precision | side | tokens/s | MFU | peak GiB | pentad/side |",
             "|---|---|---|---:|---:|---:|---:|"]
    ours = {(r["workload"], r["precision"]): r["tokens_per_s"] for r in rows if r["side"] == "pentad"}
    for r in rows:
        mine = ours.get((r["workload"], r["precision"]))
        rel = mine / r["tokens_per_s"] if mine and r["tokens_per_s"] and r["side"] != "pentad" else None
        what = num(r["tokens_per_s"], ".0f") if r["error"] is None else (r["error"].split(":")[0])
        lines.append(f"| {r['workload']} | {r['precision']} | {r['side']} | {what} | {num(r['mfu'], '.3f')} | "
                     f"{num(r['peak_memory_gib'], '.2f')} | {num(rel, '.2f')} |")
    del ratio_rows  # the same ratios, in the last column
    if cli_rows:
        lines += ["", "| CLI vs raw loop | precision | CLI tokens/s | raw tokens/s | CLI/raw (target >= 0.95) |",
                  "|---|---|---:|---:|---:|"]
        for r in cli_rows:
            lines.append(f"| {r['workload']} | {r['precision']} | {num(r['cli_tokens_per_s'], '.0f')} | "
                         f"{num(r['raw_tokens_per_s'], '.0f')} | {num(r['ratio'], '.3f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    device = args.device
    defaults = MatmulDefaults()
    kinds = sorted({matmul_kind(p) for p in [*([] if args.cli_only else args.precisions),
                                             *(args.cli_precisions if args.cli else [])]})
    peaks = {k: measure_peak(k, device, args.matmul_size) for k in kinds}
    env = environment(args, peaks)
    print(f"{env['device_name']}; torch {env['torch']}, transformers {env['transformers']}; measured peak "
          + ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in peaks.items())
          + f"; {args.reps} reps x {args.steps} steps, {args.warmup} warmup", flush=True)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    if not args.cli_only:
        for wname in args.workloads:
            for precision in args.precisions:
                rows += bench_pair(wname, precision, args, peaks, defaults)
    cli_rows = [bench_cli(p, args, peaks, defaults) for p in args.cli_precisions] if args.cli else []
    ratio_rows = ratios(rows)
    print("\n" + table(rows, ratio_rows, cli_rows))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    result = {"env": env, "args": {k: str(v) if isinstance(v, (Path, torch.device)) else v
                                   for k, v in vars(args).items() if k != "json"},
              "results": rows, "ratios": ratio_rows, "cli": cli_rows}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
    raise SystemExit(0)
