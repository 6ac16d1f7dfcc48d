"""Generation throughput: pentad with a key/value cache, pentad without one, and Hugging Face
``generate``, on the same weights, in one process.

Two workloads, built from Hugging Face configs with random weights and converted to pentad with
``pentad.interop.convert`` (so both libraries run exactly the same model):

* ``gpt2``: GPT-2 small (L12 H768 A12, vocab 50257), decoder-only; prompts of ``--prompt-length``
  tokens.
* ``t5``: T5-small (L6+6 H512 A8, FF 2048, vocab 32128), encoder-decoder; sources of
  ``--prompt-length`` tokens, the decoder starts from the pad id.

Greedy decoding of exactly ``--new-tokens`` tokens per row (no stop token), fp32, eval mode,
``torch.inference_mode``. Three paths:

* ``cache``: ``pentad.generation.generate`` (key/value cache, one new position per step);
* ``no-cache``: the same with ``use_cache=False``: the whole sequence re-run at every step, as
  TencentPretrain's generation scripts do (the encoder of T5 still runs once);
* ``hf``: ``model.generate(..., do_sample=False, num_beams=1)`` of transformers (its dynamic cache).

Repetitions interleave the paths and rotate which goes first, so a background load that comes and
goes hits all of them; the median is reported. new tokens/s = batch x new tokens / seconds. The
no-cache path is slow (quadratic in length), so by default it runs once per batch size listed in
``--no-cache-batch-sizes``. The greedy tokens of pentad (cache) and HF are compared as a check.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/generation_throughput.py                 # full, ~15 min on 2 cores
    PYTHONPATH=src .venv/bin/python bench/generation_throughput.py --preset tiny   # smoke test, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "full": {
        "gpt2": dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024),
        "t5": dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8),
    },
    "reduced": {
        "gpt2": dict(vocab_size=50257, n_embd=256, n_layer=4, n_head=4, n_positions=1024),
        "t5": dict(vocab_size=32128, d_model=256, d_kv=32, d_ff=1024, num_layers=3, num_heads=8),
    },
    "tiny": {
        "gpt2": dict(vocab_size=512, n_embd=32, n_layer=2, n_head=2, n_positions=128),
        "t5": dict(vocab_size=512, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4),
    },
}
PATHS = ("cache", "no-cache", "hf")


def build_pair(family: str, sizes: dict[str, Any], root: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(HF model, pentad model converted from it, HF generate kwargs), same random weights."""
    import transformers

    from pentad.generation import load_model
    from pentad.interop import convert

    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(**sizes, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        hf = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.T5Config(**sizes, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        hf = transformers.T5ForConditionalGeneration(config)
    hf.eval()
    hf.save_pretrained(root / family)
    convert("hf-to-pentad", root / family, root / f"{family}-pentad")
    ours, _, _ = load_model(root / f"{family}-pentad")
    # No stop token: every path generates exactly max_new_tokens per row.
    hf.generation_config.eos_token_id = None
    hf.generation_config.forced_eos_token_id = None
    return hf, ours, {"pad_token_id": 0}


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, result) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def run_workload(family: str, hf: Any, ours: Any, hf_kwargs: dict[str, Any], batch: int, args: argparse.Namespace
                 ) -> dict[str, Any]:
    from pentad.generation import generate

    g = torch.Generator().manual_seed(batch)
    vocab = ours.embedding.word.weight.shape[0]
    prompts = torch.randint(2, vocab, (batch, args.prompt_length), generator=g)
    new = args.new_tokens
    seq2seq = ours.decoder is not None
    start = 0 if seq2seq else None

    def pentad(use_cache: bool, tokens: int = new) -> Callable[[], torch.Tensor]:
        return lambda: generate(ours, prompts, max_new_tokens=tokens, stop_token_ids=[], pad_token_id=0,
                                decoder_start_token_id=start, use_cache=use_cache).tokens

    def huggingface(tokens: int = new) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            with torch.inference_mode():
                out = hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=tokens,
                                  min_new_tokens=tokens, do_sample=False, num_beams=1, **hf_kwargs)
            return out[:, 1:] if seq2seq else out[:, prompts.shape[1]:]
        return call

    paths = ["cache", "hf"] + (["no-cache"] if batch in args.no_cache_batch_sizes else [])
    calls = {"cache": pentad(True), "no-cache": pentad(False), "hf": huggingface()}
    warm = {"cache": pentad(True, 4), "no-cache": pentad(False, 4), "hf": huggingface(4)}
    for name in paths:
        warm[name]()
    times: dict[str, list[float]] = {p: [] for p in paths}
    cpu: dict[str, list[float]] = {p: [] for p in paths}
    outputs: dict[str, torch.Tensor] = {}
    for rep in range(args.repeats):
        order = paths[rep % len(paths):] + paths[:rep % len(paths)]
        for name in order:
            if name == "no-cache" and len(times[name]) >= args.no_cache_repeats:
                continue
            wall, used, out = timed(calls[name])
            assert out.shape == (batch, new), f"{name} produced {tuple(out.shape)}, expected {(batch, new)}"
            times[name].append(wall)
            cpu[name].append(used)
            outputs[name] = out
            print(f"  {family} b{batch} rep {rep + 1} {name:8s} {wall:7.2f} s  ({batch * new / wall:7.1f} tok/s)",
                  flush=True)
    result: dict[str, Any] = {"model": family, "batch": batch, "new_tokens": new, "prompt_length": args.prompt_length}
    for name in paths:
        seconds = statistics.median(times[name])
        result[name] = {"seconds": seconds, "tokens_per_s": batch * new / seconds,
                        "cpu_s": statistics.median(cpu[name]), "repeats": len(times[name])}
    result["same_tokens_as_hf"] = bool(torch.equal(outputs["cache"], outputs["hf"]))
    if "no-cache" in outputs:
        result["same_tokens_cache_vs_no_cache"] = bool(torch.equal(outputs["cache"], outputs["no-cache"]))
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| model | batch | new tokens | pentad cache tok/s | pentad no-cache tok/s | HF tok/s | cache / no-cache "
             "| pentad / HF | CPU-time HF / pentad | same tokens as HF |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        nc = r.get("no-cache")
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['new_tokens']} | {r['cache']['tokens_per_s']:.1f} | "
            + (f"{nc['tokens_per_s']:.2f}" if nc else "not run") + f" | {r['hf']['tokens_per_s']:.1f} | "
            + (f"**{r['cache']['tokens_per_s'] / nc['tokens_per_s']:.1f}x**" if nc else "—") + " | "
            + f"**{r['cache']['tokens_per_s'] / r['hf']['tokens_per_s']:.2f}** | "
            + f"{r['hf']['cpu_s'] / r['cache']['cpu_s']:.2f} | {'yes' if r['same_tokens_as_hf'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=tuple(PRESETS), default="full", help="model sizes (tiny: smoke test)")
    parser.add_argument("--models", nargs="+", choices=("gpt2", "t5"), default=["gpt2", "t5"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions of the cache and HF paths")
    parser.add_argument("--no-cache-repeats", type=int, default=1, help="timed repetitions of the no-cache path")
    parser.add_argument("--no-cache-batch-sizes", nargs="*", type=int, default=[1],
                        help="batch sizes at which the (slow) no-cache path runs")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, load average {load}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.models:
            hf, ours, hf_kwargs = build_pair(family, PRESETS[args.preset][family], Path(tmp))
            for batch in args.batch_sizes:
                results.append(run_workload(family, hf, ours, hf_kwargs, batch, args))
    try:
        load_after = os.getloadavg()
    except OSError:
        load_after = None
    print(f"\nload average at the end: {load_after}")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                         "load_before": load, "load_after": load_after}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
