"""Speech recognition (ASR): TSV ``text<TAB>path`` -> an encoder-decoder over speech features,
trained with teacher forcing on the transcript, evaluated by generating (WER and CER, ``jiwer``).

The file has a header line naming its columns, ``text`` and ``path`` (TencentPretrain's s2t format;
inference input may leave ``text`` out). Paths are relative to the TSV file's folder, or absolute.
Audio is read and turned into filterbank features when the file is read (``pentad.data.audio``:
resampling, downmixing, CMVN; SpecAugment on training batches only, seeded per batch). The model
needs a ``speech`` embedding part on its encoder side and a decoder; transcripts are encoded with
the run's tokenizer, the decoder starts from ``decoder_start`` and every target ends with the end
token. Evaluation and inference generate with the cached generator (greedy, or beam search with
``num_beams``). WER and CER are jiwer's corpus rates (edit operations over reference words or
characters) in percent, lower is better; the dev set's ``metric`` picks the best model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.components.base import Batch
from pentad.data.audio import AudioConfig, AudioSet, collate, load_features
from pentad.data.objectives.s2t import teacher_forced
from pentad.data.tsv import iter_path_tsv, read_path_tsv
from pentad.errors import UserError
from pentad.registry import TASKS
from pentad.tasks.base import EpochBatches, Task, TaskConfig, in_order

METRICS = ("wer", "cer")


class AsrTaskConfig(TaskConfig):
    type: Literal["asr"] = "asr"
    target_seq_length: int = Field(64, ge=2, description="transcript tokens per example, the end token included; "
                                   "longer transcripts fail or are skipped (audio.on_bad)")
    max_new_tokens: int | None = Field(None, ge=1, description="tokens generated at most (the end token "
                                       "included); default: target_seq_length")
    num_beams: int = Field(1, ge=1, description="beam search with this many hypotheses; 1: greedy decoding")
    length_penalty: float = Field(1.0, description="beam search: score = sum of log-probs / length ** "
                                  "length_penalty")
    decoder_start: str | int | None = Field(None, description="the decoder's first token: 'bos', 'cls', 'pad', "
                                            "'eos', a token string or an id; default: bos, else cls")
    decoder_prompt: list[str | int] = Field(default_factory=list, description="tokens (strings or ids) the "
                                            "decoder reads after the start token, in training and decoding, before "
                                            "the transcript (Whisper: ['<|notimestamps|>']); never scored")
    suppress_tokens: list[int] = Field(default_factory=list, description="token ids decoding never produces "
                                       "(Whisper's suppress_tokens)")
    begin_suppress_tokens: list[int] = Field(default_factory=list, description="token ids decoding does not "
                                             "produce first (Whisper: the space and the end token)")
    lowercase: bool = Field(False, description="lower-case transcripts and predictions before scoring")
    audio: AudioConfig = Field(default_factory=AudioConfig, description="reading audio and its features "
                               "(feature_size must equal the speech part's)")
    metric: Literal["wer", "cer"] = Field("wer", description="dev metric that picks the best model (lower is "
                                          "better)")


@dataclass
class Utterances:
    """Features of the utterances kept, their transcripts' token ids (None without text), the
    transcripts, and the TSV lines they came from."""

    audio: AudioSet
    targets: list[np.ndarray] | None
    references: list[str] | None
    lines: list[int]

    def __len__(self) -> int:
        return len(self.audio.features)


def read_asr_tsv(path: Path, with_text: bool) -> list[tuple[int, str, str | None]]:
    """(line, audio path as written, transcript or None) of each row of a ``text<TAB>path`` file."""
    return read_path_tsv(path, "text", with_text, "utterance")


def error_rates(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Corpus WER and CER (jiwer, percent) of one reference per row."""
    import jiwer

    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not references:
        return {"wer": 0.0, "cer": 0.0}
    return {"wer": 100.0 * float(jiwer.wer(references, predictions)),
            "cer": 100.0 * float(jiwer.cer(references, predictions))}


def _show_piece(piece: str) -> str:
    """A piece of text for an error message: quoted, a lone character with its code point."""
    if len(piece) == 1:
        return f"{piece!r} (U+{ord(piece):04X})"
    return f"the word {piece!r}"


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


@TASKS.register("asr")
class AsrTask(Task):
    """Speech recognition with an encoder-decoder over speech features (WER, CER)."""

    Config = AsrTaskConfig
    head = "lm"
    input_format = "text<TAB>path (paths relative to the TSV)"
    metric_names = METRICS
    inference_options = frozenset({"max_new_tokens", "num_beams", "length_penalty", "decoder_prompt",
                                   "suppress_tokens", "begin_suppress_tokens", "lowercase"})
    provides = frozenset({"audio", "audio_padding_mask", "decoder_tokens", "decoder_padding_mask", "labels.lm"})

    def __init__(self, cfg: AsrTaskConfig, tokenizer, seq_length: int, state=None):
        self.head_config: dict[str, Any] = {"type": "lm"}
        self.bound = False
        super().__init__(cfg, tokenizer, seq_length, state)

    def bind(self, run_cfg: Any) -> None:
        """Checks the model (a speech part whose feature_size matches, a decoder); the lm head keeps
        the model's own lm options (label smoothing, bias); the end and start tokens."""
        from pentad.data.objectives.mt import resolve_decoder_start

        model = run_cfg.model
        speech = next((p for p in model.embedding.parts if getattr(p, "type", "") == "speech"), None)
        if speech is None or model.decoder is None:
            kinds = [p.type for p in model.embedding.parts]
            raise UserError(f"task asr reads audio into an encoder-decoder, but model.embedding.parts is {kinds}"
                            f"{'' if model.decoder is not None else ' and the model has no decoder'}: it needs a "
                            "'speech' part and a decoder (an S2T recipe, e.g. --config s2t/small)")
        if speech.feature_size != self.cfg.audio.feature_size:
            raise UserError(f"task.audio.feature_size {self.cfg.audio.feature_size} differs from the speech part's "
                            f"feature_size {speech.feature_size}; make them equal")
        prompt = len(self.cfg.decoder_prompt)
        for key, value in (("target_seq_length", self.cfg.target_seq_length),
                           ("max_new_tokens", self.cfg.max_new_tokens or self.cfg.target_seq_length)):
            if value + prompt > model.max_seq_length:
                raise UserError(f"task.{key} {value}" + (f" after a decoder_prompt of {prompt}" if prompt else "")
                                + f" exceeds the model's model.max_seq_length {model.max_seq_length} (the decoder's "
                                "positions)")
        vocab = model.target_vocab_size or model.vocab_size
        for key in ("suppress_tokens", "begin_suppress_tokens"):
            bad = [i for i in getattr(self.cfg, key) if not 0 <= i < vocab]
            if bad:
                raise UserError(f"task.{key}: {bad[:5]} are not token ids of the {vocab}-entry vocabulary")
        lm = [t for t in model.targets if getattr(t, "type", None) == "lm"]
        head = lm[0].model_dump(exclude_none=True) if lm else {"type": "lm"}
        head.pop("name", None)
        self.head_config = head
        tok = self.tokenizer
        end = tok.eos_id if tok.eos_id is not None else tok.sep_id
        if end is None:
            from pentad.data.masking import describe_tokenizer

            raise UserError(f"task asr needs an end token (EOS or [SEP]) to end transcripts, which the "
                            f"{describe_tokenizer(tok)} lacks")
        self.end_id = int(end)
        self.pad_id = int(tok.pad_id) if tok.pad_id is not None else 0
        start = self.cfg.decoder_start
        self.start_id = self._token_id(start, "decoder_start", vocab) if isinstance(start, int) else \
            resolve_decoder_start(tok, start, "asr")
        self.prompt_ids = [self._token_id(t, "decoder_prompt", vocab) for t in self.cfg.decoder_prompt]
        self.bound = True

    def _token_id(self, token: str | int, key: str, vocab: int) -> int:
        """The id of a token given as a string or an id (checked against the vocabulary)."""
        from pentad.data.masking import describe_tokenizer

        if isinstance(token, int):
            if not 0 <= token < vocab:
                raise UserError(f"task.{key}: id {token} is outside the {vocab}-entry vocabulary")
            return token
        value = self.tokenizer.token_to_id(token)
        if value is None:
            raise UserError(f"task.{key}: {token!r} is not a token of the {describe_tokenizer(self.tokenizer)}")
        return int(value)

    def head_configs(self) -> list[dict[str, Any]]:
        return [dict(self.head_config)]

    def describe(self) -> str:
        decoding = f"beam search ({self.cfg.num_beams})" if self.cfg.num_beams > 1 else "greedy decoding"
        audio = self.cfg.audio
        return f"speech to text, {audio.feature_size} filterbanks at {audio.sample_rate} Hz; {decoding}"

    def selection_score(self, metrics: dict[str, float]) -> float:
        return -float(metrics.get(self.cfg.metric, 100.0))

    # ---------------------------------------------------------------- data
    def _normal(self, text: str) -> str:
        return " ".join(text.lower().split()) if self.cfg.lowercase else " ".join(text.split())

    def read(self, path: Path, with_labels: bool = True) -> Utterances:
        if not self.bound:
            raise RuntimeError("asr: call bind(run_config) before read()")
        path = Path(path)
        return self._utterances(path, read_asr_tsv(path, with_labels), with_labels)

    def read_windows(self, path: Path, window: int):
        if not self.bound:
            raise RuntimeError("asr: call bind(run_config) before read_windows()")
        return self._windows(Path(path), window)

    def _windows(self, path: Path, window: int):
        skipped: Counter[str] = Counter()
        kept = 0
        for rows in iter_path_tsv(path, "text", False, "utterance", window):
            data = self._utterances(path, rows, False, skipped)
            if data is not None:  # a window whose every utterance was skipped gives no predictions
                kept += len(data)
                yield data
        if not kept:
            raise UserError(f"{path}: every utterance was skipped ({dict(skipped)}); nothing to read")

    def _utterances(self, path: Path, rows: list[tuple[int, str, str | None]], with_labels: bool,
                    skips: Counter[str] | None = None) -> Utterances | None:
        """The utterances of ``rows`` read from ``path``; when every one is skipped, a UserError, or with
        ``skips`` (streamed windows) None, the reasons added to it."""
        labelled = with_labels and all(r[2] is not None for r in rows)
        cfg = self.cfg.audio
        targets: list[np.ndarray] | None = None
        keep_rows = list(range(len(rows)))
        dropped: dict[str, int] = {}
        if labelled:
            encoded = self.tokenizer.encode_batch([r[2] for r in rows])
            unknown = self._unknown_text(path, rows, encoded, cfg.on_bad)
            targets, keep_rows = [], []
            skipped = 0
            for i, (ids, (line, _, text)) in enumerate(zip(encoded, rows)):
                if i in unknown:
                    continue
                if len(ids) + 1 > self.cfg.target_seq_length:
                    if cfg.on_bad == "fail":
                        raise UserError(f"{path}, line {line}: the transcript has {len(ids)} tokens, more than "
                                        f"task.target_seq_length {self.cfg.target_seq_length} allows (the end "
                                        "token included); raise it, or set task.audio.on_bad: skip")
                    skipped += 1
                    continue
                if not ids:
                    raise UserError(f"{path}, line {line}: the transcript {text!r} encodes to no tokens")
                targets.append(np.asarray(ids, dtype=np.int64))
                keep_rows.append(i)
            if skipped:
                from pentad.log import info

                info(f"{path}: skipped {skipped} utterance(s) with an over-long transcript (task.audio.on_bad: skip)")
            dropped = {k: n for k, n in (("transcript outside the vocabulary", len(unknown)),
                                         ("over-long transcript", skipped)) if n}
        chosen = [rows[i] for i in keep_rows]
        audio = load_features([path.parent / r[1] for r in chosen], [r[0] for r in chosen], path, cfg)
        if targets is not None:
            targets = [targets[i] for i in audio.kept]
        kept = [chosen[i] for i in audio.kept]
        if not kept and skips is not None:
            skips.update(audio.skipped)
            return None
        if not kept:
            raise UserError(f"{path}: every utterance was skipped ({dict(audio.skipped) | dropped}); nothing to read")
        references = [self._normal(r[2]) for r in kept] if labelled else None
        return Utterances(audio, targets, references, [r[0] for r in kept])

    def _unknown_text(self, path: Path, rows: list[tuple[int, str, str | None]], encoded: list[list[int]],
                      on_bad: str) -> set[int]:
        """The rows whose transcripts have text outside the vocabulary (``Tokenizer.unknown_text``:
        what encodes to the unknown token without being it literally). ``on_bad`` fail: a UserError
        naming the first such line, its characters and the tokenizer; skip: the rows, reported."""
        from pentad.data.masking import describe_tokenizer

        tok = self.tokenizer
        unk = tok.unk_id
        if unk is None:
            return set()
        bad: dict[int, list[str]] = {}
        for i, (ids, row) in enumerate(zip(encoded, rows)):
            if unk in ids:
                pieces = tok.unknown_text(str(row[2]))
                if pieces:
                    bad[i] = pieces
        if not bad:
            return set()
        if on_bad == "fail":
            first = min(bad)
            pieces = bad[first]
            shown = ", ".join(_show_piece(p) for p in pieces[:10]) + (f" and {len(pieces) - 10} more"
                                                                       if len(pieces) > 10 else "")
            more = f" ({len(bad) - 1} more line(s) like it)" if len(bad) > 1 else ""
            raise UserError(f"{path}, line {rows[first][0]}: the transcript {_clip(str(rows[first][2]))!r} has text "
                            f"outside the vocabulary of the {describe_tokenizer(tok)}: {shown}{more}; it would become "
                            f"the unknown token {tok.special_tokens['unk']!r}. Fix the transcript, use a tokenizer "
                            "whose vocabulary covers it, or set task.audio.on_bad: skip to leave such utterances out")
        from pentad.log import info

        info(f"{path}: skipped {len(bad)} utterance(s) whose transcript has text outside the vocabulary "
             "(task.audio.on_bad: skip)")
        return set(bad)

    def _batch(self, data: Utterances, indices, rng: np.random.Generator | None) -> Batch:
        index = [int(i) for i in np.asarray(indices)]
        fills = data.audio.fills
        audio, mask = collate([data.audio.features[i] for i in index],
                              self.cfg.audio.specaugment if rng is not None else None, rng,
                              fills=None if fills is None else [fills[i] for i in index], frames=data.audio.frames)
        batch = Batch(audio=audio, audio_padding_mask=mask)
        if data.targets is not None:
            decoder, labels, padding = teacher_forced([data.targets[i] for i in index],
                                                      [self.start_id, *self.prompt_ids], self.end_id, self.pad_id)
            batch.decoder_tokens = torch.from_numpy(decoder)
            batch.decoder_padding_mask = torch.from_numpy(padding)
            batch.labels["lm"] = torch.from_numpy(labels)
        return batch

    def collate(self, data: Utterances, indices, rng: np.random.Generator) -> Batch:
        """An evaluation batch (no SpecAugment): audio, audio_padding_mask and, with transcripts,
        the teacher-forced decoder input and labels.lm."""
        return self._batch(data, indices, None)

    def train_batches(self, data: Utterances, batch_size: int, seed: int) -> EpochBatches:
        """Batches with SpecAugment drawn from each batch's own seeded generator (a resumed run masks
        exactly as an uninterrupted one)."""
        return EpochBatches(len(data), batch_size, seed, lambda idx, rng: self._batch(data, idx, rng))

    def gold(self, data: Utterances) -> list[str]:
        return list(data.references or [])

    # ---------------------------------------------------------------- generation and scores
    def generation_config(self):
        from pentad.generation.config import GenerationConfig

        return GenerationConfig(max_new_tokens=self.cfg.max_new_tokens or self.cfg.target_seq_length,
                                num_beams=self.cfg.num_beams, length_penalty=self.cfg.length_penalty,
                                stop_token_ids=[self.end_id], pad_token_id=self.pad_id,
                                decoder_start_token_id=self.start_id, decoder_prompt_ids=self.prompt_ids,
                                suppress_tokens=self.cfg.suppress_tokens,
                                begin_suppress_tokens=self.cfg.begin_suppress_tokens)

    def predict(self, model, data: Utterances, batch_size: int, device, progress: str | None = None) -> list[str]:
        """A transcript for every utterance (batched by length, answers in file order)."""
        from pentad.generation.search import generate
        from pentad.tasks.text2text import detokenize

        model = getattr(model, "module", model)
        config = self.generation_config()
        order = np.argsort([len(f) for f in data.audio.features], kind="stable")
        texts = [""] * len(data)
        stops = set(config.stop_token_ids)
        dtype = next(model.parameters()).dtype
        for index in in_order(len(data), batch_size, progress):
            rows = order[index]
            batch = self._batch(Utterances(data.audio, None, None, data.lines), rows, None)
            batch.audio = batch.audio.to(dtype)
            output = generate(model, batch, config)
            for row, ids in zip(rows, output.sequences()):
                body = ids[:-1] if ids and ids[-1] in stops else ids
                texts[int(row)] = self._normal(detokenize(self.tokenizer.decode(body, skip_special_tokens=True)))
        return texts

    def score(self, predictions: list[str], data: Utterances, gold: list[str]) -> dict[str, float]:
        return error_rates(predictions, gold)

    def num_predictions(self, data: Utterances) -> int:
        return len(data)

    def prediction_header(self, probabilities: bool) -> str:
        """TSV with header ``line<TAB>text``: the examples file's line of each utterance kept and its
        transcript (tabs and line breaks become spaces)."""
        return "line\ttext"

    def prediction_lines(self, predictions: list[str], data: Utterances, probabilities: bool) -> list[str]:
        return [f"{line}\t{' '.join(text.replace(chr(9), ' ').splitlines())}"
                for line, text in zip(data.lines, predictions)]
