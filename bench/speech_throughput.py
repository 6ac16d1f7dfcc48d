"""Speech throughput: pentad against Hugging Face Transformers in one process, for the S2T-small and
Whisper-tiny shapes, on the CPU and, when ``torch.cuda.is_available()``, on the GPU.

Three measurements per shape:

* ``features``: ``pentad.data.audio.load_features`` (read WAV; S2T: Kaldi filterbank, utterance
  CMVN, float16; Whisper: its log-mel spectrogram of a 30 s chunk) over synthetic utterances of
  ``--seconds`` seconds (tones in noise: the features cost the same whatever the audio holds), as
  utterances/s and x real time (audio seconds per wall second), against Hugging Face's
  ``Speech2TextFeatureExtractor`` / ``WhisperFeatureExtractor`` on the same files (numpy, as
  without torchaudio). CPU only, one process: a loader worker's rate. The headroom row divides it by
  the audio seconds per second the training step consumes.
* ``train``: forward + cross-entropy (the recipe's label smoothing) + backward + AdamW step
  (pentad's optimizer for both) on the same batch of random features and random targets, both
  models from random weights in train mode (dropout as the recipe), fp32; target tokens/s and audio
  seconds/s (Whisper reads every utterance as a 30 s chunk; the audio seconds are the real ones).
* ``decode``: greedy decoding of exactly ``--new-tokens`` tokens per utterance (pentad's cached
  generator with no stop token; HF's plain ``GenerationMixin.generate`` with ``min_new_tokens`` =
  ``max_new_tokens``), eval mode, no dropout; the real-time factor is decoding seconds / audio
  seconds (lower is faster), at each of ``--decode-batch-sizes``.

pentad builds each model from its recipe (``s2t/small``, ``whisper/tiny``); Hugging Face builds
``Speech2TextForConditionalGeneration`` (eager attention, its only one) or
``WhisperForConditionalGeneration`` (sdpa) from the equivalent config, random weights, no download.
Trainable parameters are reported for both (equal for S2T; pentad's Whisper keeps a key bias in its
fused projection, zero in converted weights, which HF's has not). Repetitions alternate between the
libraries (and which goes first) so a background load hits both; medians are reported with the
ratio pentad / HF (speed: above 1 pentad is faster). ``--quick`` shrinks the widths and the work
to a smoke test of seconds (it sets the work options itself). A shape runs once its recipe exists
in the checkout (``--help`` lists them). Run from the repository root (needs ``transformers``, as
the test extra installs)::

    PYTHONPATH=src .venv/bin/python bench/speech_throughput.py                 # ~4 min on 2 cores
    PYTHONPATH=src .venv/bin/python bench/speech_throughput.py --quick --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Sizes of each shape: the pentad recipe with overrides, and the same numbers for Hugging Face.
SHAPES: dict[str, dict[str, Any]] = {
    "s2t-small": dict(family="s2t", recipe="s2t/small", hidden=256, encoder_layers=12, decoder_layers=6, heads=4,
                      ffn=2048, conv_channels=1024, features=80, vocab=10000, batch_size=8, chunk_seconds=None,
                      decode_batch_sizes=[1, 8]),
    # Whisper reads every utterance as a 30 s chunk: a smaller training batch and decoding one
    # utterance at a time keep the run short (its encoder dominates a batch of 8)
    "whisper-tiny": dict(family="whisper", recipe="whisper/tiny", hidden=384, encoder_layers=4, decoder_layers=4,
                         heads=6, ffn=1536, conv_channels=384, features=80, vocab=51865, batch_size=2,
                         chunk_seconds=30, decode_batch_sizes=[1]),
}
QUICK = dict(hidden=32, encoder_layers=1, decoder_layers=1, heads=2, ffn=64, conv_channels=64, vocab=64)
START, PAD = 2, 1  # decoder start (HF S2T's eos = decoder start) and padding ids


def available() -> list[str]:
    """The shapes whose pentad recipe exists in this checkout."""
    from pentad.config.loader import zoo_names

    names = set(zoo_names())
    return [shape for shape, spec in SHAPES.items() if spec["recipe"] in names]


def sizes(shape: str, quick: bool) -> dict[str, Any]:
    spec = dict(SHAPES[shape])
    if quick:
        spec.update(QUICK)
        if spec["family"] == "whisper":
            spec.update(chunk_seconds=1, conv_channels=spec["hidden"])
    return spec


def build(spec: dict[str, Any], train: bool = True):
    """(pentad model, HF model, label smoothing) of the same shape, random weights; dropout as the
    recipe sets it when ``train``, none otherwise."""
    import transformers

    from pentad.assembly import load_config
    from pentad.builder import build_model

    h, c = spec["hidden"], spec["conv_channels"]
    whisper = spec["family"] == "whisper"
    overrides = [
        f"model.hidden_size={h}", f"model.vocab_size={spec['vocab']}",
        f"model.encoder.num_layers={spec['encoder_layers']}", f"model.decoder.num_layers={spec['decoder_layers']}",
        f"model.encoder.num_heads={spec['heads']}", f"model.decoder.num_heads={spec['heads']}",
        f"model.encoder.ffn_size={spec['ffn']}", f"model.decoder.ffn_size={spec['ffn']}",
        f"model.embedding.parts.0.conv_channels=[{c},{h if whisper else 2 * h}]",
        f"model.embedding.parts.0.feature_size={spec['features']}", f"task.audio.feature_size={spec['features']}"]
    if whisper:
        positions = spec["chunk_seconds"] * 50  # 100 frames a second, halved by the stem
        overrides += [f"model.embedding.parts.1.max_positions={positions}",
                      f"task.audio.chunk_seconds={spec['chunk_seconds']}"]
    cfg = load_config(spec["recipe"], overrides)
    dropout = cfg.model.encoder.dropout if train else 0.0
    if not train:
        cfg = load_config(spec["recipe"], [*overrides, "model.embedding.dropout=0.0",
                                           "model.target_embedding.dropout=0.0", "model.encoder.dropout=0.0",
                                           "model.decoder.dropout=0.0"])
    lm = [t for t in cfg.model.targets if t.type == "lm"][0]
    ours = build_model(cfg.model)
    common = dict(vocab_size=spec["vocab"], d_model=h, encoder_layers=spec["encoder_layers"],
                  decoder_layers=spec["decoder_layers"], encoder_attention_heads=spec["heads"],
                  decoder_attention_heads=spec["heads"], encoder_ffn_dim=spec["ffn"], decoder_ffn_dim=spec["ffn"],
                  dropout=dropout, attention_dropout=dropout, activation_dropout=0.0, pad_token_id=PAD,
                  bos_token_id=0, eos_token_id=START, decoder_start_token_id=START)
    if whisper:
        hf = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
            **common, num_mel_bins=spec["features"], max_source_positions=positions,
            max_target_positions=cfg.model.max_seq_length, activation_function="gelu", scale_embedding=False,
            attn_implementation="sdpa"))
    else:
        hf = transformers.Speech2TextForConditionalGeneration(transformers.Speech2TextConfig(
            **common, activation_function="relu", num_conv_layers=2, conv_kernel_sizes=[5, 5], conv_channels=c,
            input_feat_per_channel=spec["features"], input_channels=1, scale_embedding=True,
            max_source_positions=6000, max_target_positions=1024,
            attn_implementation="eager"))  # S2T has no SDPA path in HF
    return ours, hf, lm.label_smoothing


def count(model: torch.nn.Module) -> int:
    """Trainable parameters (HF Whisper's fixed encoder positions are a frozen parameter, pentad's a buffer)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(calls: dict[str, Callable[[], Any]], reps: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each call over ``reps`` repetitions, the order rotating every repetition."""
    names = list(calls)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            synchronize(device)
            start = time.perf_counter()
            calls[name]()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {n: statistics.median(t) for n, t in times.items()}


def batch_tensors(spec: dict[str, Any], args, device: torch.device, rows: int | None = None
                  ) -> dict[str, torch.Tensor]:
    """Random features [B, T, F], the seconds of audio of each row (every other row a quarter
    shorter), the padding mask (True at padding; S2T, padded to the longest row) or None (Whisper: a
    full chunk, no mask), decoder input (start + target) and next-token labels (-100 at padding)."""
    g = torch.Generator().manual_seed(0)
    rows = rows or args.batch_size or spec["batch_size"]
    frames = int(args.seconds * 100)
    lengths = torch.tensor([frames - (frames // 4) * (i % 2) for i in range(rows)])
    total = spec["chunk_seconds"] * 100 if spec["chunk_seconds"] else frames
    audio = torch.randn(rows, total, spec["features"], generator=g)
    pad = torch.arange(total)[None, :] >= lengths[:, None]
    audio[pad] = 0.0
    targets = torch.randint(4, spec["vocab"], (rows, args.target_tokens), generator=g)
    target_lengths = torch.tensor([args.target_tokens - (args.target_tokens // 4) * (i % 2) for i in range(rows)])
    target_pad = torch.arange(args.target_tokens)[None, :] >= target_lengths[:, None]
    decoder = torch.cat([torch.full((rows, 1), START), targets[:, :-1]], dim=1).masked_fill(target_pad, PAD)
    labels = targets.masked_fill(target_pad, -100)
    out = {"audio": audio, "audio_padding_mask": None if spec["chunk_seconds"] else pad, "decoder_tokens": decoder,
           "decoder_padding_mask": target_pad, "labels": labels, "seconds": lengths.double() / 100,
           "hf_audio": audio.transpose(1, 2).contiguous() if spec["chunk_seconds"] else None}
    return {k: None if v is None else v.to(device) for k, v in out.items()}


def hf_audio(t: dict[str, torch.Tensor], rows: int | None = None) -> dict[str, torch.Tensor]:
    """HF's keyword arguments for the features: S2T's [B, T, F] and a frame mask (1 = audio);
    Whisper's [B, F, T] (a copy made once, outside the timings) and none."""
    if t["audio_padding_mask"] is None:
        return {"input_features": t["hf_audio"][:rows]}
    return {"input_features": t["audio"][:rows], "attention_mask": (~t["audio_padding_mask"][:rows]).long()}


def train_rows(spec: dict[str, Any], args, device: torch.device) -> dict[str, Any]:
    from pentad.components.base import Batch
    from pentad.training.config import TrainConfig
    from pentad.training.optim import build_optimizer

    torch.manual_seed(0)
    ours, hf, smoothing = build(spec)  # the recipe's label smoothing, applied to HF's logits the same way
    ours.to(device).train()
    hf.to(device).train()
    t = batch_tensors(spec, args, device)

    def step(name: str, model: torch.nn.Module) -> Callable[[], None]:
        optimizer = build_optimizer(model, TrainConfig(lr=1e-4))

        def run() -> None:
            if name == "pentad":
                loss = model(Batch(audio=t["audio"], audio_padding_mask=t["audio_padding_mask"],
                                   decoder_tokens=t["decoder_tokens"], decoder_padding_mask=t["decoder_padding_mask"],
                                   labels={"lm": t["labels"]}))["lm"].loss
            else:
                logits = model(**hf_audio(t), decoder_input_ids=t["decoder_tokens"],
                               decoder_attention_mask=(~t["decoder_padding_mask"]).long()).logits
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), t["labels"].flatten(),
                                                         ignore_index=-100, label_smoothing=smoothing)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return run

    calls = {"pentad": step("pentad", ours), "hf": step("hf", hf)}
    for call in calls.values():
        call()  # warm-up
    seconds = alternate(calls, args.steps, device)
    tokens = int((t["labels"] != -100).sum())
    audio_s = float(t["seconds"].sum())
    return {"parameters": {"pentad": count(ours), "hf": count(hf)}, "batch": len(t["labels"]),
            "target_tokens": tokens, "audio_seconds": audio_s,
            "step_s": seconds, "tokens_per_s": {n: tokens / s for n, s in seconds.items()},
            "audio_s_per_s": {n: audio_s / s for n, s in seconds.items()},
            "ratio": seconds["hf"] / seconds["pentad"]}


def decode_rows(spec: dict[str, Any], args, device: torch.device) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    ours, hf, _ = build(spec, train=False)
    ours.to(device).eval()
    hf.to(device).eval()
    # no stop token anywhere: both libraries decode exactly `new` tokens per row
    hf.generation_config.eos_token_id = None
    hf.generation_config.forced_eos_token_id = None
    hf.generation_config.begin_suppress_tokens = None  # WhisperConfig's default; pentad's call suppresses none
    batches = args.decode_batch_sizes or spec["decode_batch_sizes"]
    t = batch_tensors(spec, args, device, max(batches))
    return [decode(ours, hf, t, rows, args, device) for rows in batches]


def decode(ours, hf, t: dict[str, torch.Tensor], rows: int, args, device: torch.device) -> dict[str, Any]:
    """Greedy decoding of the first ``rows`` utterances of ``t``."""
    import transformers

    from pentad.components.base import Batch
    from pentad.generation.search import generate

    new = args.new_tokens
    audio = t["audio"][:rows]
    pad = None if t["audio_padding_mask"] is None else t["audio_padding_mask"][:rows]

    def pentad_call() -> torch.Tensor:
        return generate(ours, Batch(audio=audio, audio_padding_mask=pad), max_new_tokens=new, stop_token_ids=[],
                        pad_token_id=PAD, decoder_start_token_id=START).tokens

    def hf_call() -> torch.Tensor:
        # GenerationMixin's generate: plain greedy search (Whisper's own generate adds language and
        # task detection and long-form logic, which pentad's generator does not do)
        with torch.inference_mode():
            out = transformers.GenerationMixin.generate(
                hf, **hf_audio(t, rows), max_new_tokens=new, min_new_tokens=new, do_sample=False, num_beams=1,
                decoder_start_token_id=START, pad_token_id=PAD)
        return out[:, 1:]

    calls = {"pentad": pentad_call, "hf": hf_call}
    lengths = {n: tuple(c().shape) for n, c in calls.items()}  # warm-up, and both decode `new` tokens
    if lengths["pentad"] != lengths["hf"] or lengths["pentad"][1] != new:
        raise RuntimeError(f"decoded shapes differ: {lengths}, expected ({rows}, {new})")
    seconds = alternate(calls, args.decode_reps, device)
    audio_s = float(t["seconds"][:rows].sum())
    return {"batch": rows, "new_tokens": new, "audio_seconds": audio_s, "decode_s": seconds,
            "rtf": {n: s / audio_s for n, s in seconds.items()},
            "tokens_per_s": {n: rows * new / s for n, s in seconds.items()},
            "ratio": seconds["hf"] / seconds["pentad"]}


def feature_rows(spec: dict[str, Any], args) -> dict[str, Any]:
    import soundfile
    import transformers

    from pentad.data.audio import AudioConfig, load_features

    rng = np.random.default_rng(0)
    rate = 16000
    n = int(args.seconds * rate)
    clock = np.arange(n) / rate
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths, waves = [], []
        for i in range(args.utterances):
            wave = 0.3 * np.sin(2 * np.pi * (200 + 50 * (i % 13)) * clock) + rng.normal(0, 0.05, n)
            waves.append(wave.astype(np.float32))
            paths.append(root / f"{i}.wav")
            soundfile.write(paths[-1], waves[-1], rate, subtype="PCM_16")
        if spec["family"] == "whisper":
            cfg = AudioConfig(sample_rate=rate, feature_size=spec["features"], features="whisper", cmvn=False,
                              chunk_seconds=spec["chunk_seconds"])
            extractor = transformers.WhisperFeatureExtractor(feature_size=spec["features"],
                                                             chunk_length=spec["chunk_seconds"])
        else:
            cfg = AudioConfig(sample_rate=rate, feature_size=spec["features"], max_frames=100_000)
            extractor = transformers.Speech2TextFeatureExtractor(feature_size=spec["features"],
                                                                 num_mel_bins=spec["features"])

        def ours() -> None:
            load_features(paths, list(range(2, len(paths) + 2)), root / "bench.tsv", cfg)

        def hf() -> None:
            # the same files read as samples first, then HF's extractor one utterance at a time (S2T:
            # with CMVN; Whisper: padded to the chunk)
            for path in paths:
                samples, _ = soundfile.read(str(path), dtype="float32")
                extractor(samples, sampling_rate=rate, return_tensors="np")

        seconds = alternate({"pentad": ours, "hf": hf}, args.feature_reps, torch.device("cpu"))
    audio_s = args.utterances * args.seconds
    return {"utterances": args.utterances, "seconds_each": args.seconds, "wall_s": seconds,
            "utterances_per_s": {k: args.utterances / s for k, s in seconds.items()},
            "x_real_time": {k: audio_s / s for k, s in seconds.items()},
            "ratio": seconds["hf"] / seconds["pentad"]}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({torch.get_num_threads()} threads)"


def run(args) -> dict[str, Any]:
    import transformers

    torch.set_num_threads(args.threads)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() and not args.cpu_only
                                       else [])
    report: dict[str, Any] = {
        "command": " ".join(["bench/speech_throughput.py", *sys.argv[1:]]) if args.from_cli else None,
        "quick": args.quick, "threads": args.threads, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": sys.version.split()[0],
        "settings": {k: getattr(args, k) for k in ("batch_size", "seconds", "target_tokens", "steps",
                                                  "decode_batch_sizes", "new_tokens", "decode_reps", "utterances",
                                                  "feature_reps")},
        "shapes": {}}
    for shape in args.shapes:
        spec = sizes(shape, args.quick)
        entry: dict[str, Any] = {"sizes": spec, "features": feature_rows(spec, args), "devices": {}}
        for device in devices:
            train = train_rows(spec, args, device)
            entry["devices"][device.type] = {
                "device": device_name(device), "train": train, "decode": decode_rows(spec, args, device),
                # above 1: one process computes features faster than the model trains on them
                "feature_headroom": entry["features"]["x_real_time"]["pentad"] / train["audio_s_per_s"]["pentad"]}
        report["shapes"][shape] = entry
    return report


def table(report: dict[str, Any]) -> str:
    lines = [f"torch {report['torch']}, transformers {report['transformers']}, python {report['python']}, "
             f"{report['threads']} CPU threads", "",
             "| shape | device | what | pentad | HF | pentad / HF |", "|---|---|---|---:|---:|---:|"]
    for shape, entry in report["shapes"].items():
        f = entry["features"]
        lines.append(f"| {shape} | cpu, 1 process | features, utterances/s ({f['seconds_each']:g} s each) | "
                     f"{f['utterances_per_s']['pentad']:.1f} | {f['utterances_per_s']['hf']:.1f} | "
                     f"{f['ratio']:.2f} |")
        lines.append(f"| {shape} | cpu, 1 process | features, x real time | {f['x_real_time']['pentad']:.0f} | "
                     f"{f['x_real_time']['hf']:.0f} | |")
        for kind, d in entry["devices"].items():
            tr = d["train"]
            lines.append(f"| {shape} | {kind} | train step, target tokens/s (batch {tr['batch']}) | "
                         f"{tr['tokens_per_s']['pentad']:.0f} | {tr['tokens_per_s']['hf']:.0f} | {tr['ratio']:.2f} |")
            lines.append(f"| {shape} | {kind} | train step, audio s/s | {tr['audio_s_per_s']['pentad']:.1f} | "
                         f"{tr['audio_s_per_s']['hf']:.1f} | |")
            lines.append(f"| {shape} | {kind} | feature headroom: one feature process's audio s/s over the "
                         f"training step's | {d['feature_headroom']:.0f}x | | |")
            for de in d["decode"]:
                lines.append(f"| {shape} | {kind} | greedy decode RTF (batch {de['batch']}, {de['new_tokens']} "
                             f"tokens; lower is faster) | {de['rtf']['pentad']:.4f} | {de['rtf']['hf']:.4f} | "
                             f"{de['ratio']:.2f} |")
        devices = "; ".join(f"{k}: {d['device']}" for k, d in entry["devices"].items())
        params = next(iter(entry["devices"].values()))["train"]["parameters"]
        lines.append("")
        lines.append(f"{shape}: {params['pentad']:,} parameters (HF {params['hf']:,}); {devices}")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shapes = available()
    parser.add_argument("--shapes", default=",".join(shapes),
                        help=f"comma-separated shapes to run (default: all); available in this checkout: "
                        f"{', '.join(shapes)} (a shape runs once its pentad recipe exists: {', '.join(SHAPES)})")
    parser.add_argument("--quick", action="store_true", help="shrunk widths and few steps: a smoke test of seconds")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cpu-only", action="store_true", help="skip the GPU even when one is available")
    parser.add_argument("--batch-size", type=int, default=None, help="utterances per training step; default: "
                        + ", ".join(f"{k} {v['batch_size']}" for k, v in SHAPES.items()))
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds of audio per utterance")
    parser.add_argument("--target-tokens", type=int, default=48, help="transcript tokens per utterance (training)")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps per library (median)")
    parser.add_argument("--decode-batch-sizes", default=None, help="comma-separated decoding batch sizes; "
                        "default: " + ", ".join(f"{k} {','.join(map(str, v['decode_batch_sizes']))}"
                                                for k, v in SHAPES.items()))
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--decode-reps", type=int, default=5)
    parser.add_argument("--utterances", type=int, default=40, help="utterances the feature rows read")
    parser.add_argument("--feature-reps", type=int, default=3)
    args = parser.parse_args(argv)
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in args.shapes if s not in shapes]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}; available in this checkout: {', '.join(shapes)}")
    if args.quick:
        for key, value in dict(batch_size=2, seconds=1.0, target_tokens=6, steps=1, decode_batch_sizes="2",
                               new_tokens=4, decode_reps=1, utterances=2, feature_reps=1).items():
            setattr(args, key, value)
    if args.decode_batch_sizes is not None:
        args.decode_batch_sizes = [int(b) for b in str(args.decode_batch_sizes).split(",")]
    args.from_cli = argv is None
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    report = run(args)
    print(table(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
