"""Audio input: reading, resampling, downmixing, Kaldi filterbanks, CMVN, SpecAugment, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("soundfile")
pytest.importorskip("soxr")
pytest.importorskip("kaldi_native_fbank")

import soundfile  # noqa: E402

from pentad.data.audio import (  # noqa: E402
    AudioConfig,
    SpecAugmentConfig,
    collate,
    data_shortfall,
    fbank,
    load_features,
    read_audio,
    spec_augment,
    utterance_cmvn,
)
from pentad.errors import UserError  # noqa: E402


def _tone(seconds: float, rate: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_frames_and_tone_peak(tmp_path: Path):
    path = tmp_path / "a.wav"
    soundfile.write(path, _tone(1.0, 16000, 1000.0), 16000, subtype="PCM_16")
    samples = read_audio(path, "a", 16000)
    features = fbank(samples, 16000, 80)
    assert features.shape == (1 + (16000 - 400) // 160, 80)  # Kaldi snip_edges: 25 ms every 10 ms
    # the loudest bin of a 1 kHz tone sits where the mel scale puts 1 kHz (of 20..8000 Hz)
    mel = lambda f: 1127.0 * np.log(1.0 + f / 700.0)  # noqa: E731
    expected = (mel(1000.0) - mel(20.0)) / (mel(8000.0) - mel(20.0)) * 81 - 1
    assert abs(int(features[50].argmax()) - expected) <= 1.5


def test_resample_and_downmix_said_once(tmp_path: Path, capsys):
    tone = _tone(0.5, 22050)
    for i in range(2):
        soundfile.write(tmp_path / f"s{i}.wav", np.stack([tone, tone], axis=1), 22050)
    out = load_features([tmp_path / "s0.wav", tmp_path / "s1.wav"], [2, 3], tmp_path / "x.tsv", AudioConfig())
    assert [len(f) for f in out.features] == [1 + (8000 - 400) // 160] * 2
    assert out.features[0].dtype == np.float16
    text = capsys.readouterr().err
    assert text.count("downmixed to mono: 2 file(s)") == 1 and text.count("resampled from 22050 Hz: 2") == 1
    mono = read_audio(tmp_path / "s0.wav", "s0", 16000)
    assert len(mono) == 8000 and abs(np.abs(mono).max() - 0.3) < 0.01


def test_cmvn():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(50, 4)) * [1, 2, 3, 4] + [5, -1, 0, 2]).astype(np.float32)
    y = utterance_cmvn(x)
    np.testing.assert_allclose(y.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.std(axis=0), 1.0, atol=1e-4)
    assert np.isfinite(utterance_cmvn(np.ones((3, 2), np.float32))).all()  # constant bins do not divide by 0


def test_specaugment_seeded_and_bounded():
    x = np.arange(200 * 20, dtype=np.float32).reshape(200, 20)
    cfg = SpecAugmentConfig(freq_masks=1, freq_width=5, time_masks=2, time_width=30, time_ratio=0.1, value=-1.0)
    a = spec_augment(x, cfg, np.random.default_rng(3))
    b = spec_augment(x, cfg, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    assert (x >= 0).all() and a.shape == x.shape
    masked_cols = (a == -1.0).all(axis=0).sum()
    masked_rows = (a == -1.0).all(axis=1).sum()
    assert masked_cols <= 4 and masked_rows <= 2 * 19  # widths below freq_width and 0.1*200
    draws = [spec_augment(x, cfg, np.random.default_rng(s)) for s in range(5)]
    assert any((d == -1.0).any() for d in draws) and any(not np.array_equal(draws[0], d) for d in draws[1:])


def test_collate_pads_and_masks():
    rng = np.random.default_rng(0)
    audio, mask = collate([np.ones((3, 2), np.float16), np.ones((5, 2), np.float16)])
    assert audio.shape == (2, 5, 2) and mask.tolist() == [[False] * 3 + [True] * 2, [False] * 5]
    assert float(audio[0, 3:].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="seeded"):
        collate([np.ones((3, 2))], SpecAugmentConfig())
    masked, _ = collate([np.zeros((300, 80), np.float32)], SpecAugmentConfig(value=1.0), rng)
    assert float(masked.sum()) > 0


def test_bad_audio_named(tmp_path: Path):
    source = tmp_path / "train.tsv"
    with pytest.raises(UserError, match=r"train.tsv, line 4: audio .*missing.wav does not exist"):
        load_features([tmp_path / "missing.wav"], [4], source, AudioConfig())
    (tmp_path / "bad.wav").write_bytes(b"RIFF\x00\x00not audio at all")
    with pytest.raises(UserError, match=r"line 2: audio .*bad.wav could not be decoded"):
        load_features([tmp_path / "bad.wav"], [2], source, AudioConfig())


def test_empty_and_overlong_skip_or_fail(tmp_path: Path):
    soundfile.write(tmp_path / "empty.wav", np.zeros(100, np.float32), 16000)
    soundfile.write(tmp_path / "long.wav", _tone(0.5, 16000), 16000)
    soundfile.write(tmp_path / "ok.wav", _tone(0.2, 16000), 16000)
    paths = [tmp_path / "empty.wav", tmp_path / "long.wav", tmp_path / "ok.wav"]
    cfg = AudioConfig(max_frames=30)
    with pytest.raises(UserError, match=r"line 2: audio .*empty.wav is empty"):
        load_features(paths, [2, 3, 4], tmp_path / "t.tsv", cfg)
    with pytest.raises(UserError, match=r"line 3: audio .*long.wav lasts 0.50 s, more than audio.max_frames 30 "
                                        r"\(0.30 s\) allows; raise audio.max_frames"):
        load_features(paths[1:], [3, 4], tmp_path / "t.tsv", cfg)
    # 5,040 samples: within the header's slack for 29 frames, and 30 frames once framed
    soundfile.write(tmp_path / "edge.wav", _tone(5040 / 16000, 16000), 16000)
    with pytest.raises(UserError, match=r"line 3: audio .*edge.wav has 30 frames, more than audio.max_frames 29"):
        load_features([tmp_path / "edge.wav"], [3], tmp_path / "t.tsv", AudioConfig(max_frames=29))
    out = load_features(paths, [2, 3, 4], tmp_path / "t.tsv", AudioConfig(max_frames=30, on_bad="skip"))
    assert out.kept == [2] and dict(out.skipped) == {"empty": 1, "over-long": 1}


def test_espeak_speech_reads_as_features(tmp_path: Path, capsys):
    """Real synthesised speech (espeak-ng writes 22,050 Hz mono WAV), as bench/speech_digits.py makes it."""
    import shutil
    import subprocess

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y --no-install-recommends espeak-ng)")
    for word in ("seven", "three one"):
        subprocess.run(["espeak-ng", "-v", "en-us+f2", "-w", str(tmp_path / f"{word}.wav"), word], check=True,
                       capture_output=True)
    out = load_features([tmp_path / "seven.wav", tmp_path / "three one.wav"], [2, 3], tmp_path / "t.tsv",
                        AudioConfig())
    assert "resampled from 22050 Hz: 2 file(s)" in capsys.readouterr().err
    short, long = (len(f) for f in out.features)
    assert 30 < short < long < 300  # tenths of a second to a few seconds of 10 ms frames
    speech = out.features[0].astype(np.float32)
    assert np.isfinite(speech).all() and speech.std() > 0.5  # CMVN over real, varying spectra


def test_whisper_features_equal_hugging_face(tmp_path: Path):
    """Whisper's log-mel input, as transformers' WhisperFeatureExtractor computes it (the frames past
    the audio held as one fill value), and its Slaney mel filters."""
    transformers = pytest.importorskip("transformers")
    from pentad.data.audio import slaney_mel_filters, whisper_log_mel

    extractor = transformers.WhisperFeatureExtractor()
    assert np.abs(extractor.mel_filters - slaney_mel_filters(16000, 400, 80, 8000.0)).max() < 1e-12
    rng = np.random.default_rng(0)
    for n in (1000, 16000 * 3 + 37, 480000):
        samples = (rng.standard_normal(n) * 0.1).astype(np.float32)
        reference = extractor(samples, sampling_rate=16000, return_tensors="np").input_features[0].T
        frames, fill = whisper_log_mel(samples, 16000, 80)
        assert len(frames) == min(3000, n // 160 + 3)
        full = np.concatenate([frames, np.full((3000 - len(frames), 80), fill, np.float32)])
        np.testing.assert_array_equal(full, reference)
    soundfile.write(tmp_path / "a.wav", _tone(1.0, 16000), 16000, subtype="FLOAT")
    soundfile.write(tmp_path / "b.wav", _tone(2.5, 16000, 300.0), 16000, subtype="FLOAT")
    cfg = AudioConfig(features="whisper", cmvn=False)
    out = load_features([tmp_path / "a.wav", tmp_path / "b.wav"], [2, 3], tmp_path / "x.tsv", cfg)
    audio, mask = collate(out.features, fills=out.fills, frames=out.frames)
    assert mask is None and tuple(audio.shape) == (2, 3000, 80)
    for row, name in enumerate(("a.wav", "b.wav")):
        samples = read_audio(tmp_path / name, name, 16000)
        reference = extractor(samples, sampling_rate=16000, return_tensors="np").input_features[0].T
        np.testing.assert_array_equal(audio[row].numpy(), reference)


def test_whisper_feature_options_checked(tmp_path: Path):
    with pytest.raises(ValueError, match="cmvn"):
        AudioConfig(features="whisper")
    with pytest.raises(ValueError, match="max_frames"):
        AudioConfig(features="whisper", cmvn=False, max_frames=100)
    soundfile.write(tmp_path / "long.wav", _tone(2.0, 16000), 16000)
    cfg = AudioConfig(features="whisper", cmvn=False, chunk_seconds=1)
    with pytest.raises(UserError, match=r"x.tsv, line 4: audio .*long.wav lasts 2.00 s, more than "
                                        r"audio.chunk_seconds 1"):
        load_features([tmp_path / "long.wav"], [4], tmp_path / "x.tsv", cfg)
    out = load_features([tmp_path / "long.wav"], [4], tmp_path / "x.tsv", cfg.model_copy(update={"on_bad": "skip"}))
    assert out.features == [] and out.skipped["over-long"] == 1


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def test_non_finite_samples_are_refused_or_skipped_by_file_and_line(tmp_path: Path):
    wave = _tone(0.2, 16000)
    wave[800], wave[900] = np.nan, np.inf
    soundfile.write(tmp_path / "nan.wav", wave, 16000, subtype="FLOAT")
    soundfile.write(tmp_path / "ok.wav", _tone(0.2, 16000), 16000)
    paths, source = [tmp_path / "nan.wav", tmp_path / "ok.wav"], tmp_path / "t.tsv"
    with pytest.raises(UserError, match=r"t.tsv, line 2: audio .*nan.wav holds 2 NaN or infinite sample\(s\), the "
                                        r"first at 0.050 s \(frame 800\).*audio.on_bad: skip"):
        load_features(paths, [2, 3], source, AudioConfig())
    out = load_features(paths, [2, 3], source, AudioConfig(on_bad="skip"))
    assert out.kept == [1] and dict(out.skipped) == {"non-finite": 1}
    with pytest.raises(UserError, match=r"line 2: audio .*nan.wav holds 2 NaN"):  # Whisper's features too
        load_features(paths, [2, 3], source, AudioConfig(features="whisper", cmvn=False, chunk_seconds=1))


@pytest.mark.parametrize("features", ["kaldi", "whisper"])
def test_finite_samples_that_overflow_the_features_are_refused(tmp_path: Path, features: str):
    soundfile.write(tmp_path / "loud.wav", _tone(0.2, 16000) * np.float32(1e30), 16000, subtype="FLOAT")
    cfg = AudioConfig(features=features, cmvn=features == "kaldi", chunk_seconds=1)
    with pytest.raises(UserError, match=r"line 5: audio .*loud.wav gives NaN or infinite features: its samples "
                                        r"reach 3e\+29"):
        load_features([tmp_path / "loud.wav"], [5], tmp_path / "t.tsv", cfg)
    out = load_features([tmp_path / "loud.wav"], [5], tmp_path / "t.tsv", cfg.model_copy(update={"on_bad": "skip"}))
    assert out.features == [] and dict(out.skipped) == {"non-finite": 1}


@pytest.mark.parametrize("container, subtype, width", [("WAV", "PCM_16", 2), ("WAV", "FLOAT", 4), ("RF64", "PCM_24", 3),
                                                      ("AIFF", "PCM_16", 2), ("AIFF", "FLOAT", 4)])
def test_truncated_sample_data_is_refused_or_skipped(tmp_path: Path, container: str, subtype: str, width: int):
    path = tmp_path / f"cut.{container.lower()}"
    soundfile.write(path, np.stack([_tone(1.0, 16000)] * 2, axis=1), 16000, format=container, subtype=subtype)
    assert data_shortfall(path) is None
    _truncate(path, 0.5)
    assert len(soundfile.read(path)[0]) < 9000  # what libsndfile returns without a word
    header = "AIFF" if container == "AIFF" else "WAV"
    with pytest.raises(UserError, match=rf"t.tsv, line 7: audio .*{path.name} is truncated: its {header} header "
                                        r"declares 16000 frames \(1.00 s\) but the file holds \d+ \(0.\d\d s\), "
                                        r"\d+ bytes are missing"):
        load_features([path], [7], tmp_path / "t.tsv", AudioConfig())
    out = load_features([path], [7], tmp_path / "t.tsv", AudioConfig(on_bad="skip"))
    assert out.features == [] and dict(out.skipped) == {"truncated": 1}
    _, declared, present, frame_bytes = data_shortfall(path)
    assert (declared, frame_bytes) == (16000 * 2 * width, 2 * width) and present < declared // 2


def test_streamed_and_complete_wavs_are_not_truncated(tmp_path: Path):
    path = tmp_path / "s.wav"
    soundfile.write(path, _tone(0.2, 16000), 16000, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    at = data.index(b"data") + 4
    data[at:at + 4] = b"\xff\xff\xff\xff"  # size unknown, as a writer to a pipe leaves it
    path.write_bytes(bytes(data))
    assert data_shortfall(path) is None
    assert len(load_features([path], [2], tmp_path / "t.tsv", AudioConfig()).features) == 1
    data[at:at + 4] = (len(data) - at - 4 + 1).to_bytes(4, "little")  # one byte more than there is: no frame missing
    path.write_bytes(bytes(data))
    assert data_shortfall(path) is None
    flac = tmp_path / "x.flac"
    soundfile.write(flac, _tone(0.2, 16000), 16000)
    assert data_shortfall(flac) is None


@pytest.mark.parametrize("rate", [1, 500_000])
def test_a_sample_rate_outside_the_accepted_range_is_refused_or_skipped(tmp_path: Path, rate: int):
    path = tmp_path / "odd.wav"
    soundfile.write(path, _tone(0.2, 16000), rate)
    with pytest.raises(UserError, match=rf"t.tsv, line 3: audio .*odd.wav declares a sample rate of {rate} Hz; audio "
                                        r"is read from 1000 to 384000 Hz"):
        load_features([path], [3], tmp_path / "t.tsv", AudioConfig())
    out = load_features([path], [3], tmp_path / "t.tsv", AudioConfig(on_bad="skip"))
    assert out.features == [] and dict(out.skipped) == {"bad-rate": 1}
    with pytest.raises(ValueError, match="sample_rate"):
        AudioConfig(sample_rate=rate)


def test_a_directory_fifo_or_device_given_as_audio_is_named_as_such_without_blocking(tmp_path: Path):
    """They were all reported as "does not exist"; a FIFO with no writer would block a plain open."""
    import os

    (tmp_path / "folder.wav").mkdir()
    cases = {tmp_path / "folder.wav": "is a directory, not an audio file",
             tmp_path / "missing.wav": "does not exist"}
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.wav")
        cases[tmp_path / "pipe.wav"] = r"is a named pipe \(FIFO\), not an audio file"
    if os.path.exists("/dev/zero"):
        cases[Path("/dev/zero")] = "is a character device, not an audio file"
    for path, expected in cases.items():
        with pytest.raises(UserError, match=f"line 2: audio {path} {expected}"):
            load_features([path], [2], tmp_path / "t.tsv", AudioConfig())


def test_an_over_long_file_is_refused_by_its_header_before_its_samples_are_decoded(tmp_path: Path, monkeypatch):
    """An hour of audio (or a header that says so) was decoded and resampled whole before the length check."""
    soundfile.write(tmp_path / "hour.wav", _tone(3.0, 8000), 8000)
    decoded = []
    real = soundfile.SoundFile.read
    monkeypatch.setattr(soundfile.SoundFile, "read", lambda self, *a, **k: decoded.append(1) or real(self, *a, **k))
    for cfg, limit in ((AudioConfig(max_frames=100), r"audio.max_frames 100 \(1.00 s\)"),
                       (AudioConfig(features="whisper", cmvn=False, chunk_seconds=2), "audio.chunk_seconds 2")):
        with pytest.raises(UserError, match=f"line 5: audio .*hour.wav lasts 3.00 s, more than {limit} allows"):
            load_features([tmp_path / "hour.wav"], [5], tmp_path / "t.tsv", cfg)
        out = load_features([tmp_path / "hour.wav"], [5], tmp_path / "t.tsv", cfg.model_copy(update={"on_bad": "skip"}))
        assert out.kept == [] and out.skipped == {"over-long": 1}
    assert decoded == []
    load_features([tmp_path / "hour.wav"], [5], tmp_path / "t.tsv", AudioConfig())
    assert decoded == [1]
