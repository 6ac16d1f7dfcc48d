"""Speech datasets made on this machine: spoken digit sequences synthesised with ``espeak-ng``.

Utterances are one to three English digit words ("three seven one") spoken at a random rate and pitch.
Training and test voices are disjoint (voice variants x accents: a held-out voice is neither seen nor of
a seen variant); a dev set of training voices picks the best step. ``bench/speech_digits.py`` trains on
the same utterances (it imports :func:`synthesise` from here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pentad.data.catalog import DATASETS, Prepared, PreparedDataset
from pentad.errors import UserError
from pentad.files import atomic_write_text, temporary_file

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TRAIN_VOICES = [f"en-us+m{i}" for i in (1, 2, 3, 4, 5)] + [f"en-us+f{i}" for i in (1, 2, 3)] + \
    ["en-gb+m1", "en-gb+f1", "en-gb-scotland+m2", "en-gb-x-rp+f2"]
TEST_VOICES = ["en-us+m7", "en-us+f4", "en-gb+m6", "en-gb-x-rp+m8", "en-029+f5", "en-gb-scotland+croak"]
# split -> (voices, utterances per voice, seed)
SPLITS = {"train": (TRAIN_VOICES, 60, 0), "dev": (TRAIN_VOICES, 5, 1), "test": (TEST_VOICES, 20, 2)}
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
INSTALL = "apt-get install -y --no-install-recommends espeak-ng"


@dataclass(frozen=True)
class Utterance:
    text: str
    voice: str
    rate: int  # words per minute (espeak-ng -s)
    pitch: int  # 0-99 (espeak-ng -p)
    path: str  # relative to the dataset's directory


def require_espeak() -> str:
    """The ``espeak-ng`` executable on PATH, or a :class:`UserError` saying how to install it."""
    found = shutil.which("espeak-ng")
    if found is None:
        raise UserError("dataset 'spoken_digits' synthesises its utterances with the espeak-ng speech synthesiser, "
                        "which is not on PATH; install it (Debian/Ubuntu: "
                        f"`{INSTALL}`) and run the command again")
    return found


def espeak_version(executable: str) -> str:
    """espeak-ng's version number (``1.51``), or ``unknown``."""
    out = subprocess.run([executable, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"text-to-speech:\s*(\S+)", out)
    return m.group(1) if m else "unknown"


def utterances(name: str, voices: list[str], per_voice: int, seed: int) -> list[Utterance]:
    """The utterances of split ``name``: ``per_voice`` by each voice, in voice order, drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    made = []
    for voice in voices:
        for i in range(per_voice):
            words = " ".join(WORDS[d] for d in rng.integers(0, 10, size=int(rng.integers(1, 4))))
            rate, pitch = int(rng.integers(130, 190)), int(rng.integers(30, 70))
            made.append(Utterance(words, voice, rate, pitch, f"{name}/{voice.replace('+', '_')}_{i}.wav"))
    return made


def _speak(executable: str, root: Path, utterance: Utterance) -> None:
    target = root / utterance.path
    fd, tmp = temporary_file(target.parent, f".{target.name}.", ".wav")
    os.close(fd)
    try:
        proc = subprocess.run([executable, "-v", utterance.voice, "-s", str(utterance.rate), "-p",
                               str(utterance.pitch), "-w", tmp, utterance.text], capture_output=True, text=True)
        if proc.returncode != 0 or os.path.getsize(tmp) == 0:
            detail = (proc.stderr or proc.stdout).strip() or "no message, and no audio written"
            raise UserError(f"espeak-ng failed to speak '{utterance.text}' with voice '{utterance.voice}' into "
                            f"{target} (exit status {proc.returncode}): {detail}; `espeak-ng --voices=en` lists "
                            "the installed voices (the Debian package has every voice this dataset uses)")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def synthesise(root: Path, name: str, voices: list[str], per_voice: int, seed: int,
               rows: int | None = None) -> Path:
    """Speak split ``name`` (the first ``rows`` of its utterances, all by default) into WAV files under
    ``root/name/`` and write ``root/name.tsv`` (``text<TAB>path``, paths relative to ``root``); returns the TSV."""
    executable = require_espeak()
    chosen = utterances(name, voices, per_voice, seed)[:rows]
    (root / name).mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda u: _speak(executable, root, u), chosen))
    tsv = root / f"{name}.tsv"
    atomic_write_text(tsv, "text\tpath\n" + "".join(f"{u.text}\t{u.path}\n" for u in chosen))
    return tsv


def write_vocab(path: Path) -> Path:
    """The WordPiece vocabulary of the digit words (BERT's five special tokens first)."""
    atomic_write_text(path, "\n".join(VOCAB) + "\n")
    return path


@DATASETS.register("spoken_digits")
class SpokenDigits(PreparedDataset):
    summary = ("spoken digit sequences synthesised with espeak-ng (one to three digit words, random rate and "
               "pitch): train/dev/test.tsv text<TAB>path (720 / 60 from 12 voices, 120 from 6 held-out voices; "
               "seeds 0/1/2) over 22,050 Hz WAV files in train/ dev/ test/, and vocab.txt (needs espeak-ng: "
               f"{INSTALL})")
    task = "finetune --task asr"

    def write(self, output: Path, rows: int | None, source: Path | None, cache: Path) -> Prepared:
        executable = require_espeak()
        prepared = Prepared(source=f"synthesised with espeak-ng {espeak_version(executable)}, seeds 0/1/2",
                            notes="espeak-ng writes 22,050 Hz WAV; pentad's audio reader resamples it to 16 kHz")
        for split, (voices, per_voice, seed) in SPLITS.items():
            synthesise(output, split, voices, per_voice, seed, rows)
            prepared.files[split] = f"{split}.tsv"
            prepared.rows[split] = min(rows or len(voices) * per_voice, len(voices) * per_voice)
            prepared.files[f"{split}_audio"] = f"{split}/"
        prepared.files["vocab"] = write_vocab(output / "vocab.txt").name
        return prepared
