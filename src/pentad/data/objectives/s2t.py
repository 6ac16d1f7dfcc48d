"""Speech to text: ``text<TAB>path`` lines -> speech features and the transcript's decoder side.

The corpus is TencentPretrain's s2t format: a header line naming the columns ``text`` and ``path``
(in either order), then one utterance per line; or JSON lines ``{"text": ..., "path": ...}`` (the
first line starting with ``{`` says which). Audio paths are relative to the corpus file's folder, or
absolute. Preprocessing reads each file in the worker processes (soundfile, soxr to
``audio.sample_rate``, downmixing), computes its features (Kaldi filterbanks with CMVN, or Whisper's
log-mel spectrogram; :mod:`pentad.data.audio`) and stores them as a typed array beside the
transcript's token ids: float16 ``[frames, feature_size]`` rows per utterance (Whisper features:
the frames that see the audio, float32, and the fill value of the rest in the field ``fill``, as
its int32 bit pattern). Training never reads audio: batches are memory-mapped features, seeded
SpecAugment (``audio.specaugment``, drawn from the batch's generator) and padding.

Batch: ``audio`` [B, T, F] and ``audio_padding_mask`` [B, T] (True at padding; None for Whisper
features, padded to the chunk's frames); ``decoder_tokens`` = the start token, the decoder prompt,
then the transcript; ``labels["lm"]`` the transcript then the end token, IGNORE_INDEX at the prompt
and at padding. A missing or undecodable file, an empty or over-long utterance and an over-long
transcript are bad lines (``data.on_bad_line``: fail, naming file and line, or skip and count).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pentad.data.audio import (
    AudioConfig,
    BadAudio,
    check_features,
    collate,
    fbank,
    read_audio,
    utterance_cmvn,
    whisper_log_mel,
)
from pentad.data.corpus import BadLine
from pentad.data.masking import describe_tokenizer
from pentad.data.objectives.base import Objective, ObjectiveConfig, new_batch, to_batch_tensor
from pentad.data.objectives.mt import resolve_decoder_start
from pentad.data.shards import Instances, Ragged
from pentad.errors import UserError
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch

COLUMNS = ("text", "path")


def teacher_forced(bodies: list[np.ndarray], head: list[int], end_id: int, pad_id: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The decoder side of transcripts ``bodies``: decoder input [B, L] (``head`` = the start token
    and the decoder prompt, then the body, then padding), labels [B, L] (the body then ``end_id``,
    IGNORE_INDEX at the head's positions but its last and at padding) and the padding mask [B, L]."""
    from pentad.components.base import IGNORE_INDEX  # on first use; see objectives.base

    width = max(len(b) for b in bodies) + len(head)
    decoder = np.full((len(bodies), width), pad_id, dtype=np.int64)
    labels = np.full((len(bodies), width), IGNORE_INDEX, dtype=np.int64)
    skip = len(head) - 1
    for row, body in enumerate(bodies):
        decoder[row, :len(head)] = head
        decoder[row, len(head):len(head) + len(body)] = body
        labels[row, skip:skip + len(body)] = body
        labels[row, skip + len(body)] = end_id
    ends = np.array([len(head) + len(b) for b in bodies])
    return decoder, labels, np.arange(width)[None, :] >= ends[:, None]


class S2tObjectiveConfig(ObjectiveConfig):
    type: Literal["s2t"] = "s2t"
    seq_length: int = Field(64, ge=2, description="transcript tokens per utterance, the end token included; "
                            "longer transcripts are bad lines")
    decoder_start: str | None = Field(None, description="the decoder's first token: 'bos', 'cls', 'pad', 'eos' "
                                      "or a token string; default: bos, else cls")
    decoder_prompt: list[str] = Field(default_factory=list, description="tokens read after the start token, "
                                      "never scored (Whisper: ['<|notimestamps|>'])")
    audio: AudioConfig = Field(default_factory=AudioConfig, description="reading audio and its features")


@OBJECTIVES.register("s2t")
class S2tObjective(Objective):
    """Utterances -> speech features (a typed array) and teacher-forced transcripts."""

    Config = S2tObjectiveConfig
    corpus_format: ClassVar[str] = ("a header line 'text<TAB>path', then one utterance per line: its transcript "
                                    "and its audio file (WAV, FLAC, OGG; relative to the corpus's folder); or "
                                    "JSON lines {\"text\": ..., \"path\": ...}")
    provides: ClassVar[frozenset[str]] = frozenset({"audio", "audio_padding_mask", "decoder_tokens",
                                                    "decoder_padding_mask", "labels.lm"})
    truncation_refused: ClassVar[str | None] = (
        "its inputs are speech frames and its targets the decoder's transcript, not one token sequence a "
        "shorter length could cut")
    collate_options: ClassVar[frozenset[str]] = frozenset({"decoder_start"})
    chunk_lines: ClassVar[int | None] = 64  # a line is an audio file to decode and turn into features

    def __init__(self, cfg: S2tObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: S2tObjectiveConfig = cfg
        end = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
        self.require_ids(**{"an end-of-sequence token (EOS or [SEP])": end})
        self.end_id = int(end)
        self.start_id = resolve_decoder_start(tokenizer, cfg.decoder_start, self.name)
        self.prompt_ids = []
        for token in cfg.decoder_prompt:
            value = tokenizer.token_to_id(token)
            if value is None:
                raise UserError(f"objective.decoder_prompt: {token!r} is not a token of the "
                                f"{describe_tokenizer(tokenizer)}")
            self.prompt_ids.append(int(value))
        self.whisper = cfg.audio.features == "whisper"
        self.field_names = ("fill",) if self.whisper else ()
        self.notes: Counter[str] = Counter()  # resampled / downmixed files, as the asr task reports them

    def array_specs(self) -> dict[str, dict[str, Any]]:
        return {"audio": {"dtype": "<f4" if self.whisper else "<f2", "shape": [self.cfg.audio.feature_size]}}

    # ---- preprocessing ----------------------------------------------------------------------
    def begin_corpus(self, first_line: str, path: Path) -> tuple[Any, bool]:
        if first_line.lstrip().startswith("{"):  # JSON lines: no header
            return (path.resolve().parent, None, None), False
        names = [c.strip().lower() for c in first_line.rstrip("\r\n").split("\t")]
        if sorted(names) != sorted(COLUMNS):
            raise UserError(f"{path}, line 1: expected a header naming the columns text and path (e.g. "
                            f"'text<TAB>path'), found {first_line.strip()[:80]!r}")
        return (path.resolve().parent, names.index("text"), names.index("path")), True

    def parse_line(self, text: str, context: Any) -> tuple[list[int], np.ndarray, float] | None:
        """(transcript ids, features, fill value) of one utterance, None for a blank line."""
        if not text.strip():
            return None
        folder, text_col, path_col = context
        if text_col is None:
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise BadLine(f"is not valid JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str) or \
                    not isinstance(record.get("path"), str):
                raise BadLine("is not a JSON object with the strings 'text' and 'path'")
            transcript, audio_path = record["text"].strip(), record["path"].strip()
        else:
            fields = text.rstrip("\r\n").split("\t")
            if len(fields) != 2:
                raise BadLine(f"has {len(fields)} tab-separated field(s); expected 2 (text and path)")
            transcript, audio_path = fields[text_col].strip(), fields[path_col].strip()
        if not transcript or not audio_path:
            raise BadLine(f"has an empty {'transcript' if not transcript else 'audio path'}")
        ids = self.tokenizer.encode(transcript)
        unk = self.tokenizer.unk_id
        if unk is not None and unk in ids:
            pieces = self.tokenizer.unknown_text(transcript)
            if pieces:  # as the asr task: text the vocabulary cannot hold is refused, not silently [UNK]
                shown = ", ".join(repr(p) for p in pieces[:10]) + (" ..." if len(pieces) > 10 else "")
                raise BadLine(f"has a transcript with text outside the vocabulary ({shown}), which would become "
                              "the unknown token")
        if len(ids) + 1 > self.seq_length:
            raise BadLine(f"has a transcript of {len(ids)} tokens; objective.seq_length {self.seq_length} allows "
                          f"{self.seq_length - 1} (and the end token)")
        path = Path(audio_path) if Path(audio_path).is_absolute() else folder / audio_path
        cfg = self.cfg.audio
        where = f"names the audio file {path}, which"
        try:
            samples = read_audio(path, where, cfg.sample_rate, self.notes, limit=cfg.duration_limit())
        except UserError as error:  # BadAudio too: data.on_bad_line=skip leaves it out, counted
            raise BadLine(str(error)) from None
        fill = 0.0
        if self.whisper:
            if len(samples) == 0 or len(samples) > cfg.chunk_seconds * cfg.sample_rate:
                raise BadLine(f"audio {path} lasts {len(samples) / cfg.sample_rate:.2f} s; Whisper features take "
                              f"1 sample to audio.chunk_seconds {cfg.chunk_seconds} s")
            features, fill = whisper_log_mel(samples, cfg.sample_rate, cfg.feature_size, cfg.chunk_seconds)
        else:
            features = fbank(samples, cfg.sample_rate, cfg.feature_size)
            if len(features) == 0 or len(features) > cfg.max_frames:
                raise BadLine(f"audio {path} has {len(features)} frames; audio.max_frames allows 1 to "
                              f"{cfg.max_frames}")
        try:
            check_features(features, samples, where)
        except BadAudio as error:
            raise BadLine(str(error)) from None
        if not self.whisper and cfg.cmvn:
            features = utterance_cmvn(features)
        return list(ids), features, fill

    def take_notes(self) -> dict[str, int]:
        notes = {f"{note} (the model takes mono {self.cfg.audio.sample_rate} Hz)": n for note, n in self.notes.items()}
        self.notes.clear()
        return notes

    def build(self, items: list[Any], rng: np.random.Generator) -> Instances:
        kept = [item for item in items if item is not None]
        dtype = self.array_specs()["audio"]["dtype"]
        fields = {}
        if self.whisper:
            fills = np.array([fill for _, _, fill in kept], dtype=np.float32)
            fields["fill"] = fills.view(np.int32).astype(np.int64)
        out = Instances.from_sequences([ids for ids, _, _ in kept], **fields)
        out.arrays["audio"] = Ragged.from_arrays([f for _, f, _ in kept], dtype, [self.cfg.audio.feature_size])
        return out

    def manifest_extra(self) -> dict[str, Any]:
        audio = self.cfg.audio
        return {"audio": {"features": audio.features, "sample_rate": audio.sample_rate,
                          "feature_size": audio.feature_size}}

    # ---- training ---------------------------------------------------------------------------
    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """audio/audio_padding_mask [B,T,F]/[B,T]; decoder_tokens/decoder_padding_mask/labels.lm [B,L]."""
        ragged = instances.arrays["audio"]
        utterances = [ragged.item(i) for i in range(len(instances))]
        fills = None
        if self.whisper:
            fills = instances.fields["fill"].astype(np.int32).view(np.float32).tolist()
        audio, mask = collate(utterances, self.cfg.audio.specaugment, rng if self.cfg.audio.specaugment else None,
                              fills=fills, frames=self.cfg.audio.whisper_frames if self.whisper else None)
        bodies = [instances.sequence(i) for i in range(len(instances))]
        decoder, labels, padding = teacher_forced(bodies, [self.start_id, *self.prompt_ids], self.end_id,
                                                  self.pad_id)
        return new_batch(audio=audio, audio_padding_mask=mask, decoder_tokens=to_batch_tensor(decoder),
                         decoder_padding_mask=to_batch_tensor(padding), labels={"lm": to_batch_tensor(labels)})
