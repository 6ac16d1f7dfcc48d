"""Generation throughput: pentad with a dynamic key/value cache, a static one, a static one with a
compiled decoding step, without a cache, and Hugging Face ``generate``, on the same weights, in one process.

Two workloads, built from Hugging Face configs with random weights and converted to pentad with
``pentad.interop.convert`` (so both libraries run exactly the same model):

* ``gpt2``: GPT-2 small (L12 H768 A12, vocab 50257), decoder-only; prompts of ``--prompt-length``
  tokens.
* ``t5``: T5-small (L6+6 H512 A8, FF 2048, vocab 32128), encoder-decoder; sources of
  ``--prompt-length`` tokens, the decoder starts from the pad id.
* ``deepseek_v3``: a small DeepSeek-V3-class decoder (multi-head latent attention, the first layer dense,
  then sigmoid-routed grouped experts with a shared one; sizes in ``PRESETS``). pentad caches the latent and
  decodes with the absorbed projections; the row also reports the cache bytes per token of pentad's cache,
  of transformers' (measured after the prompt) and of full keys and values of the same heads
  (``cache_bytes_per_token``).
* ``qwen3``: a small Qwen3-class decoder (query/key norms before the rotation, grouped-query attention with
  a quarter of the key/value heads, untied); its cache row reports the keys and values pentad keeps per token
  against transformers' and against full keys and values of every query head.

Greedy decoding of exactly ``--new-tokens`` tokens per row (no stop token), eval mode,
``torch.inference_mode``, on ``--device`` (cpu or cuda) in ``--dtype`` (fp32 or bf16). Five paths
(``--paths`` picks some; all by default):

* ``cache``: ``pentad.generation.generate`` (dynamic key/value cache, one new position per step);
* ``static``: the same with ``cache="static"`` (buffers of the final length allocated once);
* ``compiled``: ``cache="static", compile=True``: the one-token step through ``torch.compile``
  (mode ``reduce-overhead``, i.e. CUDA graphs, on CUDA). Its first call, which compiles, is a
  warm-up outside the timing, reported as ``first_call_s`` and ``compile_s`` (first call minus the
  median timed call);
* ``no-cache``: ``use_cache=False``: the whole sequence re-run at every step, as TencentPretrain's
  generation scripts do (the encoder of T5 still runs once);
* ``hf``: ``model.generate(..., do_sample=False, num_beams=1)`` of transformers (its dynamic cache).

Repetitions interleave the paths and rotate which goes first, so a background load that comes and
goes hits all of them; the median is reported. new tokens/s = batch x new tokens / seconds (on CUDA
the clock is read after ``torch.cuda.synchronize()``). The no-cache path is slow (quadratic in
length), so by default it runs once per batch size listed in ``--no-cache-batch-sizes``. Checks:
the greedy tokens of pentad (cache) and HF (``same_tokens_as_hf``), of the static and compiled paths
and the dynamic cache (``same_tokens_static``, ``same_tokens_compiled``), of the cache and no-cache
paths. In bf16 rounding differs between paths, so a mismatch there is not necessarily an error.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/generation_throughput.py                 # full, ~15 min on 2 cores
    PYTHONPATH=src .venv/bin/python bench/generation_throughput.py --preset tiny   # smoke test, seconds
    PYTHONPATH=src .venv/bin/python bench/generation_throughput.py --device cuda   # on a GPU
    PYTHONPATH=src .venv/bin/python bench/generation_throughput.py --models deepseek_v3 --preset reduced
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
        "deepseek_v3": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, moe_intermediate_size=256,
                            num_hidden_layers=8, num_attention_heads=16, kv_lora_rank=128, q_lora_rank=384,
                            qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, n_routed_experts=32,
                            num_experts_per_tok=4, n_group=8, topk_group=4, n_shared_experts=1,
                            first_k_dense_replace=1, max_position_embeddings=1024),
        "qwen3": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                      num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024),
    },
    "reduced": {
        "gpt2": dict(vocab_size=50257, n_embd=256, n_layer=4, n_head=4, n_positions=1024),
        "t5": dict(vocab_size=32128, d_model=256, d_kv=32, d_ff=1024, num_layers=3, num_heads=8),
        "deepseek_v3": dict(vocab_size=32000, hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
                            num_hidden_layers=4, num_attention_heads=8, kv_lora_rank=64, q_lora_rank=128,
                            qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=16,
                            num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
                            first_k_dense_replace=1, max_position_embeddings=1024),
        "qwen3": dict(vocab_size=32000, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024),
    },
    "tiny": {
        "gpt2": dict(vocab_size=512, n_embd=32, n_layer=2, n_head=2, n_positions=128),
        "t5": dict(vocab_size=512, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4),
        "deepseek_v3": dict(vocab_size=512, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=2, num_attention_heads=4, kv_lora_rank=16, q_lora_rank=24,
                            qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=8,
                            num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
                            first_k_dense_replace=1, max_position_embeddings=512),
        "qwen3": dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512),
    },
}
MODELS = ("gpt2", "t5", "deepseek_v3", "qwen3")
PATHS = ("cache", "static", "compiled", "no-cache", "hf")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_pair(family: str, sizes: dict[str, Any], root: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(HF model, pentad model converted from it, HF generate kwargs), same random weights."""
    import transformers

    from pentad.generation import load_model
    from pentad.interop import convert

    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(**sizes, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        hf = transformers.GPT2LMHeadModel(config)
    elif family == "deepseek_v3":
        config = transformers.DeepseekV3Config(**sizes, num_key_value_heads=sizes["num_attention_heads"],
                                               num_nextn_predict_layers=0, bos_token_id=0, eos_token_id=1,
                                               pad_token_id=0)
        hf = transformers.DeepseekV3ForCausalLM(config)
        with torch.no_grad():  # a routing that is not uniform, and a choice bias that matters
            for name, buffer in hf.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buffer.normal_(std=0.02)
    elif family == "qwen3":  # query/key norms, grouped-query attention, untied
        config = transformers.Qwen3Config(**sizes, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
                                          pad_token_id=0)
        hf = transformers.Qwen3ForCausalLM(config)
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


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device = torch.device("cpu")) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, result) of one call; on CUDA the queued work is waited
    for before the clock is read, at both ends."""
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    synchronize(device)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def run_workload(family: str, hf: Any, ours: Any, hf_kwargs: dict[str, Any], batch: int, args: argparse.Namespace
                 ) -> dict[str, Any]:
    from pentad.generation import generate

    device = torch.device(args.device)
    g = torch.Generator().manual_seed(batch)
    vocab = ours.embedding.word.weight.shape[0]
    prompts = torch.randint(2, vocab, (batch, args.prompt_length), generator=g).to(device)
    new = args.new_tokens
    seq2seq = ours.decoder is not None
    start = 0 if seq2seq else None
    options = {"cache": {}, "static": {"cache": "static"}, "compiled": {"cache": "static", "compile": True},
               "no-cache": {"use_cache": False}}

    def pentad(path: str, tokens: int = new) -> Callable[[], torch.Tensor]:
        return lambda: generate(ours, prompts, max_new_tokens=tokens, stop_token_ids=[], pad_token_id=0,
                                decoder_start_token_id=start, **options[path]).tokens

    def huggingface(tokens: int = new) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            with torch.inference_mode():
                out = hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=tokens,
                                  min_new_tokens=tokens, do_sample=False, num_beams=1, **hf_kwargs)
            return out[:, 1:] if seq2seq else out[:, prompts.shape[1]:]
        return call

    paths = [p for p in args.paths if p != "no-cache" or batch in args.no_cache_batch_sizes]
    calls = {path: pentad(path) for path in options} | {"hf": huggingface()}
    # Warm-up: a short run of each path; the compiled one runs at the timed shapes (the static cache's
    # length is prompt + new tokens, and another length would compile another step), so this first
    # call compiles what the timed ones reuse.
    warm = {path: pentad(path, 4) for path in options} | {"hf": huggingface(4), "compiled": calls["compiled"]}
    outputs: dict[str, torch.Tensor] = {}
    first_call: dict[str, float] = {}
    for name in paths:
        wall, _, out = timed(warm[name], device)
        if name == "compiled":
            first_call[name] = wall
            outputs[name] = out.cpu()
            print(f"  {family} b{batch} compiled: first call (compiles) {wall:7.2f} s", flush=True)
    times: dict[str, list[float]] = {p: [] for p in paths}
    cpu: dict[str, list[float]] = {p: [] for p in paths}
    for rep in range(args.repeats):
        order = paths[rep % len(paths):] + paths[:rep % len(paths)]
        for name in order:
            if name == "no-cache" and len(times[name]) >= args.no_cache_repeats:
                continue
            wall, used, out = timed(calls[name], device)
            assert out.shape == (batch, new), f"{name} produced {tuple(out.shape)}, expected {(batch, new)}"
            times[name].append(wall)
            cpu[name].append(used)
            outputs[name] = out.cpu()
            print(f"  {family} b{batch} rep {rep + 1} {name:8s} {wall:7.2f} s  ({batch * new / wall:7.1f} tok/s)",
                  flush=True)
    result: dict[str, Any] = {"model": family, "batch": batch, "new_tokens": new, "prompt_length": args.prompt_length,
                              "device": args.device, "dtype": args.dtype}
    for name in paths:
        seconds = statistics.median(times[name])
        result[name] = {"seconds": seconds, "tokens_per_s": batch * new / seconds,
                        "cpu_s": statistics.median(cpu[name]), "repeats": len(times[name])}
        if name in first_call:
            result[name]["first_call_s"] = first_call[name]
            result[name]["compile_s"] = max(0.0, first_call[name] - seconds)

    def same(a: str, b: str) -> bool | None:
        return bool(torch.equal(outputs[a], outputs[b])) if a in outputs and b in outputs else None

    if family in ("deepseek_v3", "qwen3"):
        result["cache_bytes_per_token"] = cache_bytes(hf, ours, prompts)
    checks = {"same_tokens_as_hf": ("cache", "hf"), "same_tokens_static": ("static", "cache"),
              "same_tokens_compiled": ("compiled", "cache"), "same_tokens_cache_vs_no_cache": ("cache", "no-cache")}
    for key, (a, b) in checks.items():
        if (check := same(a, b)) is not None:
            result[key] = check
    return result


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def cache_bytes(hf: Any, ours: Any, prompts: torch.Tensor) -> dict[str, float]:
    """Cache bytes per token (all layers, one row) after the prompt: pentad's latent cache (the rows it
    wrote, not its spare capacity), transformers' cache, and full keys and values of the same heads
    (heads x (nope + rope + v) per layer), in the model's dtype."""
    from pentad.components.base import Batch
    from pentad.layers.cache import KVCache

    batch, length = prompts.shape
    cache = KVCache()
    with torch.inference_mode():
        ours.encode(Batch(tokens=prompts), cache)
        theirs = hf(prompts, use_cache=True)
    pentad = sum(_tensor_bytes(layer.latent[:, :, :cache.length]) if getattr(layer, "latent", None) is not None
                 else _tensor_bytes([layer.keys[:, :, :cache.length], layer.values[:, :, :cache.length]])
                 for layer in cache.layers)
    past = getattr(theirs, "cache", None) or getattr(theirs, "past_key_values", None)
    hf_bytes = sum(_tensor_bytes([getattr(layer, "keys", None), getattr(layer, "values", None)])
                   for layer in getattr(past, "layers", []))
    attention = ours.encoder.layers[0].attention
    size = next(ours.parameters()).element_size()
    if hasattr(attention, "kv_norm"):  # latent attention: every head's keys (nope + rope) and values
        per_layer = attention.num_heads * (attention.nope_dim + attention.rope_dim + attention.v_dim)
    else:  # keys and values of every query head (no grouping)
        per_layer = 2 * attention.num_heads * attention.head_size
    full = len(ours.encoder.layers) * per_layer * size
    per_token = batch * length
    return {"pentad": pentad / per_token, "hf": hf_bytes / per_token, "full_kv": float(full)}


def cache_table(results: list[dict[str, Any]]) -> str:
    lines = ["| model | batch | pentad cache B/token | HF cache B/token | full keys/values B/token "
             "| full / pentad | pentad cache / HF tok/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if "cache_bytes_per_token" not in r:
            continue
        c = r["cache_bytes_per_token"]
        speed = f"{r['cache']['tokens_per_s'] / r['hf']['tokens_per_s']:.2f}" if "cache" in r and "hf" in r else "—"
        lines.append(f"| {r['model']} | {r['batch']} | {c['pentad']:.0f} | {c['hf']:.0f} | {c['full_kv']:.0f} "
                     f"| {c['full_kv'] / c['pentad']:.1f}x | {speed} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _speed(r: dict[str, Any], path: str) -> float | None:
    return r[path]["tokens_per_s"] if path in r else None


def table(results: list[dict[str, Any]]) -> str:
    def number(value: float | None, digits: int) -> str:
        return "not run" if value is None else f"{value:.{digits}f}"

    def ratio(a: float | None, b: float | None, digits: int = 1, bold: bool = True) -> str:
        if a is None or b is None:
            return "—"
        text = f"{a / b:.{digits}f}" + ("x" if digits == 1 else "")
        return f"**{text}**" if bold else text

    def yes(r: dict[str, Any], key: str) -> str:
        return "—" if key not in r else ("yes" if r[key] else "no")

    lines = ["| model | batch | new tokens | pentad cache tok/s | static tok/s | compiled tok/s | compile s "
             "| pentad no-cache tok/s | HF tok/s | cache / no-cache | static / no-cache | compiled / no-cache "
             "| pentad / HF | CPU-time HF / pentad | same tokens as HF | static, compiled = cache |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in results:
        cache, static, compiled = _speed(r, "cache"), _speed(r, "static"), _speed(r, "compiled")
        no_cache, hf = _speed(r, "no-cache"), _speed(r, "hf")
        compile_s = r["compiled"]["compile_s"] if "compiled" in r else None
        cpu = (r["hf"]["cpu_s"] / r["cache"]["cpu_s"]) if "hf" in r and "cache" in r else None
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['new_tokens']} | {number(cache, 1)} | {number(static, 1)} | "
            f"{number(compiled, 1)} | {number(compile_s, 1)} | {number(no_cache, 2)} | {number(hf, 1)} | "
            f"{ratio(cache, no_cache)} | {ratio(static, no_cache)} | {ratio(compiled, no_cache)} | "
            f"{ratio(cache, hf, 2)} | {number(cpu, 2) if cpu is not None else '—'} | {yes(r, 'same_tokens_as_hf')} | "
            f"{yes(r, 'same_tokens_static')}, {yes(r, 'same_tokens_compiled')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=tuple(PRESETS), default="full", help="model sizes (tiny: smoke test)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["gpt2", "t5"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS),
                        help="paths to run (default: all); the token checks compare paths that ran")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]: models and prompts move there")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32", help="weights and activations")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions of every path but no-cache")
    parser.add_argument("--no-cache-repeats", type=int, default=1, help="timed repetitions of the no-cache path")
    parser.add_argument("--no-cache-batch-sizes", nargs="*", type=int, default=[1],
                        help="batch sizes at which the (slow) no-cache path runs")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    args = parser.parse_args(argv)
    args.paths = [p for p in PATHS if p in args.paths]  # one order, no duplicates
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here")
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    accelerator = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
          f"{accelerator}, {args.dtype}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"load average {load}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.models:
            hf, ours, hf_kwargs = build_pair(family, PRESETS[args.preset][family], Path(tmp))
            hf.to(device=device, dtype=DTYPES[args.dtype])
            ours.to(device=device, dtype=DTYPES[args.dtype])
            for batch in args.batch_sizes:
                results.append(run_workload(family, hf, ours, hf_kwargs, batch, args))
    try:
        load_after = os.getloadavg()
    except OSError:
        load_after = None
    print(f"\nload average at the end: {load_after}")
    print(table(results))
    memory = cache_table(results)
    if memory:
        print("\n" + memory)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                         "load_before": load, "load_after": load_after}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
