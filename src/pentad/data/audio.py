"""Audio as model input: reading (soundfile), resampling (soxr), Kaldi filterbank features
(kaldi-native-fbank) or Whisper's log-mel spectrogram, utterance CMVN and seeded SpecAugment.

Audio files are read and turned into features once, when a file of examples is read (float16
``[T, F]`` per utterance, so a set of utterances costs 160 bytes per 10 ms at 80 bins); training
batches then apply SpecAugment to copies with the batch's seeded generator, and every batch is
padded to ``audio [B, T, F]`` with ``audio_padding_mask [B, T]`` (True at padding frames). Nothing
here needs a GPU, and nothing reads audio inside the training loop.

Features follow TencentPretrain's S2T loader (torchaudio's Kaldi-compatible ``fbank`` over samples
scaled to 16-bit integers, no dither, 25 ms frames every 10 ms, then utterance CMVN). A file at
another sample rate is resampled (soxr, high quality) and a file with several channels is
downmixed to their mean; both are reported once per examples file. Bad input (a missing path, a
file soundfile cannot decode) is a :class:`~pentad.errors.UserError` naming the examples file, its
line and the audio path; empty and over-long utterances, and audio that decodes but cannot be used
(:class:`BadAudio`: NaN or infinite samples or features, a WAV or AIFF file cut short, a sample
rate outside 1-384 kHz), are skipped or refused (``on_bad``), and counted.

``features: whisper`` computes Whisper's input instead (Radford et al. 2022, as Hugging Face's
``WhisperFeatureExtractor``): the samples zero-padded to ``chunk_seconds`` (30 s), a centred
400-point periodic-Hann STFT every 160 samples (its last frame dropped), power through a Slaney
mel filterbank (0-8 kHz), log10 floored at 1e-10 and at the utterance maximum minus 8, then
(x + 4) / 4; 3,000 frames of 10 ms for every utterance. Only the frames that see the audio are
stored (float32, so the model reads exactly what Hugging Face's extractor gives), with the one value
every frame after them holds; batches pad to 3,000 frames with it and carry no padding mask (Whisper
always reads 30 s).
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from pentad.config.base import StrictModel
from pentad.data.media_files import open_regular
from pentad.errors import UserError
from pentad.log import info

WHISPER_FFT = 400  # 25 ms windows at 16 kHz
WHISPER_HOP = 160  # every 10 ms
# Sample rates a file (and the model) may have: below 1 kHz nothing of speech is left (telephone
# audio is 8 kHz), above 384 kHz no recording format goes; a rate outside is a broken header.
MIN_SAMPLE_RATE = 1000
MAX_SAMPLE_RATE = 384000
_UNKNOWN_SIZES = (0, 0xFFFFFFFF)  # a data chunk size streaming writers leave for "until the end"


class SpecAugmentConfig(StrictModel):
    """Frequency and time masks (Park et al. 2019) on training features; evaluation never masks.
    TencentPretrain's keys: freq_mask_N/F, time_mask_N/T/p (its time warp is not done)."""

    freq_masks: int = Field(2, ge=0, description="frequency masks per utterance (freq_mask_N)")
    freq_width: int = Field(27, ge=1, description="a frequency mask covers 0..freq_width-1 bins (freq_mask_F)")
    time_masks: int = Field(2, ge=0, description="time masks per utterance (time_mask_N)")
    time_width: int = Field(100, ge=1, description="a time mask covers 0..time_width-1 frames (time_mask_T)")
    time_ratio: float = Field(1.0, gt=0.0, le=1.0, description="and at most this share of the frames (time_mask_p)")
    value: float | None = Field(None, description="what masked cells hold; null: the utterance's mean")


class AudioConfig(StrictModel):
    """How audio files become filterbank features."""

    sample_rate: int = Field(16000, ge=MIN_SAMPLE_RATE, le=MAX_SAMPLE_RATE,
                             description="the model's sample rate; other files are resampled")
    feature_size: int = Field(80, ge=1, description="mel filterbank bins (the speech part's feature_size)")
    cmvn: bool = Field(True, description="normalise each utterance to zero mean, unit variance per bin")
    max_frames: int = Field(3000, ge=1, description="longest utterance in 10 ms frames (TencentPretrain's "
                            "max_audio_frames); longer ones are skipped or refused (on_bad)")
    on_bad: Literal["fail", "skip"] = Field("fail", description="empty or over-long utterances, unusable audio "
                                            "(NaN or infinite samples, a truncated WAV, a sample rate outside "
                                            "1-384 kHz) and, in the asr task, over-long transcripts or ones with "
                                            "text outside the vocabulary: fail (exit 2) or skip them, counted")
    specaugment: SpecAugmentConfig | None = Field(None, description="training-time masks; null: none")
    features: Literal["kaldi", "whisper"] = Field("kaldi", description="kaldi: Kaldi filterbanks (S2T, "
                                                 "TencentPretrain); whisper: Whisper's log-mel spectrogram over "
                                                 "chunk_seconds (set cmvn: false)")
    chunk_seconds: int = Field(30, ge=1, description="features: whisper: every utterance is padded to this "
                               "length (Whisper: 30 s, 3,000 frames)")

    @model_validator(mode="after")
    def _whisper_options(self) -> AudioConfig:
        if self.features == "whisper" and self.cmvn:
            raise ValueError("cmvn: Whisper's log-mel features are normalised their own way; set cmvn: false "
                             "with features: whisper")
        if self.features == "whisper" and self.max_frames < self.whisper_frames:
            raise ValueError(f"max_frames {self.max_frames} is shorter than the {self.whisper_frames} frames "
                             f"of chunk_seconds {self.chunk_seconds}; Whisper pads every utterance to them")
        return self

    @property
    def whisper_frames(self) -> int:
        """Frames of one Whisper chunk (100 per second at a 160-sample hop and 16 kHz)."""
        return self.chunk_seconds * self.sample_rate // WHISPER_HOP

    def duration_limit(self) -> tuple[float, str]:
        """The longest file worth decoding, by its header's duration, and the setting that says so:
        Whisper's chunk, or the audio that Kaldi framing (25 ms windows every 10 ms) turns into
        ``max_frames`` frames; a frame of slack for resampling (the features' lengths are then checked
        exactly)."""
        if self.features == "whisper":
            return self.chunk_seconds + 0.01, f"audio.chunk_seconds {self.chunk_seconds}"
        return self.max_frames * 0.01 + 0.025, f"audio.max_frames {self.max_frames} ({self.max_frames / 100:.2f} s)"


class BadAudio(UserError):
    """A file that decodes but cannot be used as it is (``kind``, for the skip counts: "non-finite",
    "truncated", "bad-rate", "over-long"); with ``on_bad: skip`` it is left out like an empty utterance. The
    message names the file (``where``) and what was found, and leaves the remedy to the caller."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def data_shortfall(path: Path) -> tuple[str, int, int, int] | None:
    """(container, bytes of samples its header declares, bytes present, bytes per frame) of an
    uncompressed WAV (RIFF, RIFX, RF64) or AIFF file whose sample data is cut short; None when it is
    complete, another format, or its size was left unknown.

    libsndfile reads such a file without complaint, returning the frames that are there; only the
    header says how many there should be. (FLAC and Ogg streams that end early fail to decode.)"""
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12:
            return None
        if head[8:12] == b"WAVE" and head[:4] in (b"RIFF", b"RIFX", b"RF64", b"BW64"):
            return _chunk_shortfall(f, path.stat().st_size, ">" if head[:4] == b"RIFX" else "<", aiff=False)
        if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
            return _chunk_shortfall(f, path.stat().st_size, ">", aiff=True)
    return None


def _chunk_shortfall(f, size: int, order: str, aiff: bool) -> tuple[str, int, int, int] | None:
    """Walk the chunks after a WAV's or AIFF's 12-byte file header (see :func:`data_shortfall`)."""
    frame_bytes, long_size = 0, None
    while True:
        header = f.read(8)
        if len(header) < 8:
            return None
        kind, (length,) = header[:4], struct.unpack(order + "I", header[4:])
        body = f.tell()
        if kind == b"ds64" and length >= 16:  # RF64: the data size, when the 32-bit field says 0xFFFFFFFF
            long_size = struct.unpack("<QQ", f.read(16))[1]
        elif kind == b"fmt " and length >= 14:  # ... channels, rate, bytes/s, block align
            frame_bytes = struct.unpack(order + "HHIIH", f.read(14))[4]
        elif kind == b"COMM" and length >= 18:  # channels, frames, bits per sample, rate, [compression]
            channels, _, bits = struct.unpack(">HIH", f.read(8))
            f.seek(body + 18)
            compression = f.read(4) if length >= 22 else b"NONE"
            if compression not in (b"NONE", b"sowt", b"twos", b"fl32", b"FL32", b"fl64", b"FL64"):
                return None  # compressed AIFC: bytes do not count frames
            frame_bytes = channels * -(-bits // 8)
        elif kind in (b"data", b"SSND"):
            declared = long_size if length == 0xFFFFFFFF and long_size else length
            if declared in _UNKNOWN_SIZES:
                return None
            present = size - body
            if aiff:  # SSND starts with an offset and a block size
                declared, present = declared - 8, present - 8
            frame_bytes = max(frame_bytes, 1)
            if declared // frame_bytes <= present // frame_bytes:  # every frame is there (a stray byte may not be)
                return None
            return ("AIFF" if aiff else "WAV"), declared, present, frame_bytes
        f.seek(body + length + (length & 1))  # chunks are padded to an even size


def read_audio(path: Path, where: str, sample_rate: int, notes: Counter[str] | None = None,
               limit: tuple[float, str] | None = None) -> np.ndarray:
    """``path`` -> float32 mono samples in [-1, 1] at ``sample_rate``; ``where`` names it in errors;
    resampling and downmixing are counted in ``notes``. :class:`BadAudio` for a sample rate outside
    ``MIN_SAMPLE_RATE``..``MAX_SAMPLE_RATE``, a file its header says lasts longer than ``limit`` (seconds
    and the setting's name, :meth:`AudioConfig.duration_limit`; kind ``over-long``: refused before its
    samples are decoded, so an hour-long file costs nothing), truncated WAV or AIFF sample data or a NaN
    or infinite sample. A path that is not a regular file (a directory, FIFO, device) is a UserError
    saying what it is."""
    import soundfile

    try:
        with open_regular(path, where, "audio") as file, soundfile.SoundFile(file) as sound:
            rate = int(sound.samplerate)
            # checked before reading: resampling 1 Hz audio to 16 kHz would make 16,000 samples of each
            if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
                raise BadAudio(f"{where} declares a sample rate of {rate} Hz; audio is read from "
                               f"{MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz (speech is usually 8-48 kHz), so its "
                               "header is wrong or it is not audio", "bad-rate")
            if limit is not None and sound.frames > 0 and sound.frames / rate > limit[0]:
                raise BadAudio(f"{where} lasts {sound.frames / rate:.2f} s, more than {limit[1]} allows",
                               "over-long")
            samples = sound.read(dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, ValueError) as error:
        raise UserError(f"{where} could not be decoded ({error}); expected WAV, FLAC or another format "
                        "libsndfile reads") from None
    short = data_shortfall(path)
    if short is not None:
        container, declared, present, frame_bytes = short
        raise BadAudio(f"{where} is truncated: its {container} header declares {declared // frame_bytes} frames "
                       f"({declared // frame_bytes / rate:.2f} s) but the file holds {present // frame_bytes} "
                       f"({present // frame_bytes / rate:.2f} s), {declared - present} bytes are missing "
                       "(an interrupted copy or recording?)", "truncated")
    finite = np.isfinite(samples)
    if not finite.all():
        bad = np.flatnonzero(~finite.all(axis=1))
        raise BadAudio(f"{where} holds {int((~finite).sum())} NaN or infinite sample(s), the first at "
                       f"{bad[0] / rate:.3f} s (frame {int(bad[0])}); audio samples must be finite numbers",
                       "non-finite")
    if samples.shape[1] > 1:
        samples = samples.mean(axis=1, dtype=np.float32)
        if notes is not None:
            notes["downmixed to mono"] += 1
    else:
        samples = samples[:, 0]
    if rate != sample_rate and len(samples):
        import soxr

        samples = soxr.resample(samples, rate, sample_rate, quality="HQ").astype(np.float32, copy=False)
        if notes is not None:
            notes[f"resampled from {rate} Hz"] += 1
    return np.ascontiguousarray(samples, dtype=np.float32)


def fbank(samples: np.ndarray, sample_rate: int, bins: int) -> np.ndarray:
    """Kaldi log-mel filterbank ``[T, bins]`` (float32) of float samples in [-1, 1], as torchaudio's
    ``compliance.kaldi.fbank`` computes it on samples scaled to 16-bit integers (no dither)."""
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = float(sample_rate)
    opts.frame_opts.dither = 0.0
    opts.mel_opts.num_bins = bins
    computer = knf.OnlineFbank(opts)
    with np.errstate(over="ignore"):  # absurd float samples overflow; check_features names the file
        scaled = (samples * 32768.0).astype(np.float32)
    computer.accept_waveform(float(sample_rate), scaled)
    computer.input_finished()
    frames = computer.num_frames_ready
    if frames == 0:
        return np.zeros((0, bins), dtype=np.float32)
    return np.stack([computer.get_frame(i) for i in range(frames)]).astype(np.float32, copy=False)


def hertz_to_mel(hertz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic (27 mels per factor
    6.4) above."""
    hertz = np.asarray(hertz, dtype=np.float64)
    mels = 3.0 * hertz / 200.0
    log_part = hertz >= 1000.0
    mels[log_part] = 15.0 + np.log(hertz[log_part] / 1000.0) * (27.0 / np.log(6.4))
    return mels


def mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    """The inverse of :func:`hertz_to_mel`."""
    mels = np.asarray(mels, dtype=np.float64)
    hertz = 200.0 * mels / 3.0
    log_part = mels >= 15.0
    hertz[log_part] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels[log_part] - 15.0))
    return hertz


def slaney_mel_filters(sample_rate: int, n_fft: int, bins: int, high: float | None = None) -> np.ndarray:
    """[n_fft//2 + 1, bins] triangular filters evenly spaced on Slaney's mel scale from 0 Hz to
    ``high`` (Nyquist), each scaled to unit area (2 / its width in Hz), as librosa's and Whisper's."""
    high = sample_rate / 2 if high is None else high
    edges = mel_to_hertz(np.linspace(hertz_to_mel(np.array([0.0]))[0], hertz_to_mel(np.array([high]))[0], bins + 2))
    freqs = np.linspace(0, sample_rate // 2, n_fft // 2 + 1)
    widths = np.diff(edges)
    slopes = edges[None, :] - freqs[:, None]
    rising, falling = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


def whisper_log_mel(samples: np.ndarray, sample_rate: int, bins: int, chunk_seconds: int = 30
                    ) -> tuple[np.ndarray, float]:
    """Whisper's input for float samples in [-1, 1] (see the module's docstring): the frames that
    see the audio ``[T, bins]`` (float32) and the value of every later frame up to the chunk's end."""
    import torch

    size = chunk_seconds * sample_rate
    padded = np.zeros(size, dtype=np.float32)
    padded[:min(len(samples), size)] = samples[:size]
    window = torch.hann_window(WHISPER_FFT)
    stft = torch.stft(torch.from_numpy(padded), WHISPER_FFT, WHISPER_HOP, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2
    filters = torch.from_numpy(slaney_mel_filters(sample_rate, WHISPER_FFT, bins, 8000.0)).float()
    log_spec = torch.clamp(filters.T @ power, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    features = ((log_spec + 4.0) / 4.0).T.contiguous().numpy()
    # Frame t's window covers samples [160 t - 200, 160 t + 200): later frames see only the padding.
    seen = min(len(features), -(-(min(len(samples), size) + WHISPER_FFT // 2) // WHISPER_HOP) + 1)
    tail = features[seen:]
    fill = float(tail[0, 0]) if len(tail) else 0.0
    if len(tail) and not bool((tail == fill).all()):  # pragma: no cover - a frame past the audio saw it
        seen = len(features)
    return np.ascontiguousarray(features[:seen]), fill


def check_features(features: np.ndarray, samples: np.ndarray, where: str) -> np.ndarray:
    """``features`` as they are when every value is finite; :class:`BadAudio` otherwise (finite
    samples far outside [-1, 1] overflow the filterbank's power)."""
    if not np.isfinite(features).all():
        raise BadAudio(f"{where} gives NaN or infinite features: its samples reach {float(np.abs(samples).max()):.3g}, "
                       "where audio lies in [-1, 1]", "non-finite")
    return features


def utterance_cmvn(features: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance per bin over one utterance's frames (variance floored at 1e-10)."""
    mean = features.mean(axis=0)
    var = (features.astype(np.float64) ** 2).mean(axis=0) - mean.astype(np.float64) ** 2
    return ((features - mean) / np.sqrt(np.maximum(var, 1e-10))).astype(np.float32)


def spec_augment(features: np.ndarray, cfg: SpecAugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """A masked copy of ``[T, F]`` features: ``freq_masks`` bands of 0..freq_width-1 bins and
    ``time_masks`` spans of 0..min(time_width, time_ratio*T)-1 frames, drawn from ``rng``."""
    out = np.array(features, dtype=np.float32, copy=True)
    frames, bins = out.shape
    if frames == 0:
        return out
    value = float(out.mean()) if cfg.value is None else cfg.value
    if bins >= cfg.freq_width:
        for _ in range(cfg.freq_masks):
            width = int(rng.integers(0, cfg.freq_width))
            start = int(rng.integers(0, bins - width + 1))
            out[:, start:start + width] = value
    longest = min(cfg.time_width, int(frames * cfg.time_ratio))
    if longest >= 1:
        for _ in range(cfg.time_masks):
            width = int(rng.integers(0, longest))
            start = int(rng.integers(0, frames - width + 1))
            out[start:start + width, :] = value
    return out


@dataclass
class AudioSet:
    """Features of the utterances kept (float16 ``[T, F]`` each), their positions in the input, and
    the count of each kind of utterance left out."""

    features: list[np.ndarray]
    kept: list[int]
    skipped: Counter[str] = field(default_factory=Counter)
    # features: whisper: the value of each utterance's frames after the stored ones, and the frames
    # every batch pads to (None: Kaldi features, padded with zeros and masked)
    fills: list[float] | None = None
    frames: int | None = None


def load_features(paths: Sequence[Path], lines: Sequence[int], source: Path, cfg: AudioConfig) -> AudioSet:
    """Read ``paths`` and compute their features; ``lines``: each path's line in ``source`` (the
    examples file), for errors and for the skip counts."""
    notes: Counter[str] = Counter()
    whisper = cfg.features == "whisper"
    out = AudioSet([], [], fills=[] if whisper else None, frames=cfg.whisper_frames if whisper else None)
    for i, (path, line) in enumerate(zip(paths, lines)):
        where = f"{source}, line {line}: audio {path}"
        problem = None
        remedy = "split it" if whisper else "raise audio.max_frames"
        try:
            samples = read_audio(path, where, cfg.sample_rate, notes, limit=cfg.duration_limit())
            if whisper:
                limit = cfg.chunk_seconds * cfg.sample_rate
                if len(samples) == 0:
                    problem = ("empty", f"{where} is empty (no samples)")
                elif len(samples) > limit:
                    problem = ("over-long", f"{where} lasts {len(samples) / cfg.sample_rate:.2f} s, more than "
                               f"audio.chunk_seconds {cfg.chunk_seconds} (Whisper reads one chunk)")
                else:
                    features, fill = whisper_log_mel(samples, cfg.sample_rate, cfg.feature_size, cfg.chunk_seconds)
                    check_features(features, samples, where)
            else:
                features = fbank(samples, cfg.sample_rate, cfg.feature_size)
                if len(features) == 0:
                    problem = ("empty", f"{where} is empty or shorter than one 25 ms frame ({len(samples)} samples)")
                elif len(features) > cfg.max_frames:
                    problem = ("over-long", f"{where} has {len(features)} frames, more than audio.max_frames "
                               f"{cfg.max_frames} ({cfg.max_frames / 100:.1f} s)")
                else:
                    check_features(features, samples, where)
        except BadAudio as bad:
            problem = (bad.kind, str(bad))
            if bad.kind != "over-long":
                remedy = "replace or repair the file"
        if problem is not None:
            if cfg.on_bad == "fail":
                raise UserError(problem[1] + f"; {remedy}, or set audio.on_bad: skip to leave such utterances out")
            out.skipped[problem[0]] += 1
            continue
        if whisper:
            out.features.append(features)
            out.fills.append(fill)
        else:
            if cfg.cmvn:
                features = utterance_cmvn(features)
            out.features.append(features.astype(np.float16))
        out.kept.append(i)
    for note, count in sorted(notes.items()):
        info(f"{source}: {note}: {count} file(s) (the model takes mono {cfg.sample_rate} Hz)")
    if out.skipped:
        found = ", ".join(f"{n} {kind}" for kind, n in sorted(out.skipped.items()))
        info(f"{source}: skipped {found} utterance(s) (audio.on_bad: skip)")
    return out


def collate(features: Sequence[np.ndarray], specaugment: SpecAugmentConfig | None = None,
            rng: np.random.Generator | None = None, fills: Sequence[float] | None = None,
            frames: int | None = None):
    """``[T_i, F]`` arrays -> float32 ``audio [B, T, F]`` (zero-padded) and ``audio_padding_mask
    [B, T]`` (True at padding); SpecAugment on each utterance when given (training). With ``fills``
    and ``frames`` (Whisper features): every row padded to ``frames`` with its fill value, and no
    padding mask (None)."""
    import torch

    if specaugment is not None and rng is None:
        raise ValueError("SpecAugment needs the batch's seeded generator")
    longest = max(len(f) for f in features) if frames is None else frames
    bins = features[0].shape[1]
    audio = np.zeros((len(features), longest, bins), dtype=np.float32)
    mask = np.ones((len(features), longest), dtype=bool)
    for i, f in enumerate(features):
        f = np.asarray(f, dtype=np.float32)
        if fills is not None:
            f = np.concatenate([f, np.full((longest - len(f), bins), fills[i], dtype=np.float32)])
        if specaugment is not None:
            f = spec_augment(f, specaugment, rng)
        audio[i, :len(f)] = f
        mask[i, :len(f)] = False
    return torch.from_numpy(audio), (None if fills is not None else torch.from_numpy(mask))
