"""An S2T-small-shaped model trained from scratch on spoken digit sequences synthesised with
``espeak-ng``, scored on held-out voices against trivial baselines in the same run.

Utterances are one to three English digit words ("three seven one"), spoken by ``espeak-ng``
(Debian package; ``apt-get install -y --no-install-recommends espeak-ng``) at a random rate and
pitch, by :func:`pentad.data.catalog.speech.synthesise` (the utterances ``pentad data prepare
spoken_digits`` writes; docs/speech.md runs this benchmark as commands). Training voices and test
voices are disjoint (voice variants x accents: the held-out ones are neither seen nor of a seen
variant), and a dev set of training voices picks the best step.
espeak-ng writes 22,050 Hz WAV; pentad's loader resamples to 16 kHz (soxr) and computes 80 Kaldi
filterbanks with CMVN. ``pentad finetune --task asr`` trains ``s2t/small`` shrunk (the same
modules: two stride-2 Conv1d + GLU, sinusoidal positions, pre-LN encoder-decoder) with
SpecAugment. Baselines: the most common training transcript for every test utterance, and the
most common word repeated as often as the mean transcript length. Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/speech_digits.py            # ~4 min on 2 cores
    PYTHONPATH=src .venv/bin/python bench/speech_digits.py --quick    # ~1 min (too short to learn much)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from pentad.data.catalog.speech import TEST_VOICES, TRAIN_VOICES, require_espeak, synthesise, write_vocab
from pentad.errors import UserError


def baselines(train: Path, test: Path) -> dict[str, dict[str, float]]:
    from pentad.tasks.asr import error_rates

    texts = [line.split("\t")[0] for line in train.read_text(encoding="utf-8").splitlines()[1:]]
    refs = [line.split("\t")[0] for line in test.read_text(encoding="utf-8").splitlines()[1:]]
    common = Counter(texts).most_common(1)[0][0]
    word = Counter(w for t in texts for w in t.split()).most_common(1)[0][0]
    mean = round(np.mean([len(t.split()) for t in texts]))
    return {"most common transcript": error_rates([common] * len(refs), refs),
            "most common word x mean length": error_rates([" ".join([word] * mean)] * len(refs), refs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer utterances and epochs")
    parser.add_argument("--epochs", type=int, help="training epochs (default 40; --quick 12)")
    parser.add_argument("--keep", type=Path, help="keep the audio and the run here")
    args = parser.parse_args()
    try:
        require_espeak()
    except UserError as e:
        raise SystemExit(str(e)) from None
    from pentad.cli.main import main as pentad

    root = args.keep or Path(tempfile.mkdtemp(prefix="speech_digits_"))
    per_voice = 25 if args.quick else 60
    start = time.time()
    train = synthesise(root, "train", TRAIN_VOICES, per_voice, 0)
    dev = synthesise(root, "dev", TRAIN_VOICES, 5, 1)
    test = synthesise(root, "test", TEST_VOICES, 20, 2)
    made = time.time() - start
    vocab = write_vocab(root / "vocab.txt")
    out = root / "run"
    epochs = args.epochs or (12 if args.quick else 40)
    overrides = ["model.hidden_size=96", "model.encoder.num_layers=3", "model.decoder.num_layers=1",
                 "model.encoder.num_heads=4", "model.decoder.num_heads=4", "model.encoder.ffn_size=192",
                 "model.decoder.ffn_size=192", "model.embedding.parts.0.conv_channels=[192,192]",
                 "model.max_seq_length=16", "task.target_seq_length=8", "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={vocab}", "task.audio.specaugment={freq_masks: 2, freq_width: 15, time_masks: 2, "
                 "time_width: 20, time_ratio: 0.2}", f"data.train={train}", f"data.dev={dev}", f"data.test={test}",
                 f"output={out}", f"train.epochs={epochs}", "train.batch_size=16", "train.lr=2e-3",
                 "train.warmup=0.05", "train.progress=false", "train.tensorboard=false"]
    start = time.time()
    code = pentad(["finetune", "--task", "asr", "--config", "s2t/small", *overrides])
    if code != 0:
        raise SystemExit(f"pentad finetune failed ({code})")
    trained = time.time() - start
    results = json.loads((out / "results.json").read_text())
    rows = {"S2T (from scratch)": results["test"], **baselines(train, test)}
    counts = {name: len(p.read_text().splitlines()) - 1 for name, p in (("train", train), ("dev", dev),
                                                                          ("test", test))}
    print(f"\nutterances {counts}; synthesis {made:.0f} s, training + evaluation {trained:.0f} s; "
          f"{len(TRAIN_VOICES)} training voices, {len(TEST_VOICES)} held-out voices")
    print("| model | test WER % | test CER % |\n|---|---:|---:|")
    for name, metrics in rows.items():
        print(f"| {name} | {metrics['wer']:.1f} | {metrics['cer']:.1f} |")


if __name__ == "__main__":
    main()
