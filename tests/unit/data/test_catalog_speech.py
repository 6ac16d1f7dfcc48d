"""``pentad data prepare spoken_digits``: espeak-ng utterances as text<TAB>path TSVs + vocab.txt (speech when
espeak-ng is installed), the utterances bench/speech_digits.py trains on, and the error without espeak-ng."""

from __future__ import annotations

import json
import shutil

import pytest

from pentad.cli.main import main
from pentad.data.catalog import prepare, speech
from pentad.errors import UserError


def test_the_splits_are_the_benchmarks_and_rows_keep_their_first_utterances():
    train = speech.utterances("train", speech.TRAIN_VOICES, 60, 0)
    assert len(train) == 720 and len({u.path for u in train}) == 720
    assert [u.path for u in train[:2]] == ["train/en-us_m1_0.wav", "train/en-us_m1_1.wav"]
    assert all(1 <= len(u.text.split()) <= 3 and set(u.text.split()) <= set(speech.WORDS) for u in train)
    assert all(130 <= u.rate < 190 and 30 <= u.pitch < 70 for u in train)
    assert train == speech.utterances("train", speech.TRAIN_VOICES, 60, 0)  # seeded
    assert not {u.voice for u in speech.utterances("test", *speech.SPLITS["test"])} & set(speech.TRAIN_VOICES)
    assert speech.VOCAB[5:] == speech.WORDS


def test_without_espeak_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(UserError, match=r"espeak-ng speech synthesiser, which is not on PATH; install it "
                                        r"\(Debian/Ubuntu: `apt-get install -y --no-install-recommends espeak-ng`\)"):
        prepare("spoken_digits", tmp_path / "out", rows=2)
    assert not (tmp_path / "out/train.tsv").exists()
    assert main(["data", "prepare", "spoken_digits", str(tmp_path / "cli")]) == 2


def test_a_failing_voice_names_the_utterance(tmp_path, monkeypatch):
    if shutil.which("espeak-ng") is None:
        pytest.skip(f"espeak-ng is not installed ({speech.INSTALL})")
    with pytest.raises(UserError, match=r"espeak-ng failed to speak '.*' with voice 'xx-nonesuch'"):
        speech.synthesise(tmp_path, "train", ["xx-nonesuch"], 1, 0)
    assert not (tmp_path / "train.tsv").exists() and not list((tmp_path / "train").iterdir())


def test_rows_write_the_splits_vocab_and_readable_speech(tmp_path, capsys):
    if shutil.which("espeak-ng") is None:
        pytest.skip(f"espeak-ng is not installed ({speech.INSTALL})")
    soundfile = pytest.importorskip("soundfile")
    out = tmp_path / "digits"
    assert main(["data", "prepare", "spoken_digits", str(out), "--rows", "3"]) == 0
    described = json.loads((out / "dataset.json").read_text())
    assert described["rows"] == {"train": 3, "dev": 3, "test": 3}
    assert described["source"].startswith("synthesised with espeak-ng ")
    assert (out / "vocab.txt").read_text().split() == speech.VOCAB
    for split, (voices, per_voice, seed) in speech.SPLITS.items():
        lines = (out / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        expected = speech.utterances(split, voices, per_voice, seed)[:3]
        assert lines == ["text\tpath"] + [f"{u.text}\t{u.path}" for u in expected]
        for line in lines[1:]:
            samples, rate = soundfile.read(out / line.split("\t")[1])
            assert rate == 22050 and samples.ndim == 1 and 0.2 < len(samples) / rate < 5 and samples.std() > 0
        assert sorted(p.name for p in (out / split).iterdir()) == sorted(u.path.split("/")[1] for u in expected)


def test_list_shows_it(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "spoken_digits\n" in out and "read by: pentad finetune --task asr" in out
