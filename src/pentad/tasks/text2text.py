"""Text-to-text fine-tuning (translation, summarisation, generation from a prompt): TSV
``text_a\\tlabel`` -> the ``lm`` head, evaluated by generating.

File format (TencentPretrain's ``run_text2text`` format, header required)::

    text_a<TAB>label                         source text and target text (train, dev, labelled test)
    text_a<TAB>text_b<TAB>label              two source texts, joined by the separator token
    text_a[<TAB>text_b]                      inference input

Any model with an ``lm`` head works, in one of two layouts chosen from the run's model config:

* **encoder-decoder** (T5, BART, Transformer): the encoder reads ``[BOS] source [EOS]`` (the BOS
  only when the tokenizer has one distinct from its end token: ``[CLS] source [SEP]`` with BERT
  vocabularies); the decoder is teacher-forced on ``target [EOS]`` from the start token
  (``decoder_start``), exactly as the ``mt`` objective builds batches;
* **decoder-only** (GPT-2, LLaMA, a prefix-LM): one sequence ``[BOS] source SEP target [EOS]``, the
  loss on the target and its end token only (the ``llm_sft`` objective's batches); a prefix-LM
  reads ``[BOS] source SEP`` as its bidirectional prefix.

Evaluation and inference generate with the cached generator (``pentad.generation``): greedy, or
beam search with ``num_beams``; the text is decoded without special tokens and spaces next to CJK
characters are removed (a WordPiece vocabulary decodes Chinese with a space between characters).
Scores: corpus BLEU by ``sacrebleu`` and the mean ROUGE-1/2/L F-measure by ``rouge-score``, both
on a 0-100 scale. With ``auto`` (default) the tokenization of both follows the training targets:
when at least 30% of their non-space characters are Chinese (Han) characters, BLEU uses
sacrebleu's ``zh`` tokenizer and ROUGE counts characters (every non-space character is a token);
otherwise BLEU uses ``13a`` and ROUGE rouge-score's own tokenizer (lower-cased runs of ``a-z0-9``,
the ROUGE-1.5.5 rule, which drops other scripts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from pentad.data.shards import Instances
from pentad.errors import UserError
from pentad.log import get_logger
from pentad.registry import OBJECTIVES, TASKS
from pentad.tasks.base import Task, TaskConfig, in_order

log = get_logger(__name__)

# Han characters (CJK unified ideographs and their extensions A and B, compatibility ideographs).
_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df]")
# Characters after which, or before which, a decoded space is an artefact of tokenization: Han
# characters and the CJK and full-width punctuation.
_CJK = "\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
_SPACE_AFTER_CJK = re.compile(f"(?<=[{_CJK}]) +")
_SPACE_BEFORE_CJK = re.compile(f" +(?=[{_CJK}])")
CHINESE_SHARE = 0.3
METRICS = ("bleu", "rouge1", "rouge2", "rougeL")


class Text2TextTaskConfig(TaskConfig):
    type: Literal["text2text"] = "text2text"
    target_seq_length: int = Field(64, ge=2, description="target tokens per example, its end token included "
                                   "(longer targets are truncated for training)")
    max_new_tokens: int | None = Field(None, ge=1, description="tokens generated at most in evaluation and "
                                       "inference (the end token included); default: target_seq_length")
    num_beams: int = Field(1, ge=1, description="beam search with this many hypotheses; 1: greedy decoding")
    length_penalty: float = Field(1.0, description="beam search: score = sum of log-probs / length ** "
                                  "length_penalty")
    repetition_penalty: float = Field(1.0, gt=0.0, description="divide the positive scores (multiply the negative "
                                      "ones) of tokens already in the source or the output by this; 1: off")
    decoder_start: str | None = Field(None, description="encoder-decoder models: the decoder's first token, "
                                      "'bos', 'cls', 'pad', 'eos' or a token string; default: "
                                      "data.objective.decoder_start, else bos, else cls (converted T5: "
                                      "pad, BART: eos)")
    separator: str | None = Field(None, description="decoder-only models: the token between source and "
                                  "target, and between text_a and text_b (a token string of the vocabulary); "
                                  "default: [SEP], else the end token")
    bleu_tokenize: Literal["auto", "13a", "zh", "intl", "char", "none"] = Field(
        "auto", description="sacrebleu's tokenizer for BLEU; auto: zh when the training targets are "
        "Chinese, else 13a")
    rouge_tokenize: Literal["auto", "words", "chars"] = Field(
        "auto", description="ROUGE tokens: words (rouge-score's tokenizer: lower-cased a-z0-9 runs) or "
        "chars (every non-space character); auto: chars when the training targets are Chinese")
    metric: Literal["bleu", "rouge1", "rouge2", "rougeL"] = Field("bleu", description="dev metric that picks "
                                                                  "the best model")


@dataclass
class TextPairs:
    """Encoded rows. ``instances``: each row's prompt followed by its target, with the field ``split``
    (where the target starts): encoder-decoder: ``[BOS] source [EOS]`` then the target body (the
    ``mt`` objective's layout, whose collate adds the EOS); decoder-only: ``[BOS] source SEP`` then
    ``target [EOS]`` (the ``llm_sft`` layout). Without labels the target part is empty.
    ``references``: the target texts (None without labels); ``lines``: 1-based file lines."""

    instances: Instances
    references: list[str] | None
    lines: list[int]

    def __len__(self) -> int:
        return len(self.instances)

    def prompts(self) -> list[np.ndarray]:
        """The prompt of each row (what generation starts from)."""
        offsets, split = self.instances.offsets, self.instances.fields["split"]
        return [self.instances.tokens[offsets[i]:offsets[i] + split[i]] for i in range(len(self))]


@dataclass
class Generated:
    """Generated texts, one per row, and their scores (greedy: the sum of the tokens'
    log-probabilities; beam search: the length-penalised beam score)."""

    texts: list[str]
    scores: list[float]


def detokenize(text: str) -> str:
    """``text`` without the spaces next to CJK characters and punctuation (a WordPiece decoder puts
    one between every two Chinese characters), stripped."""
    return _SPACE_BEFORE_CJK.sub("", _SPACE_AFTER_CJK.sub("", text)).strip()


def chinese_share(texts: list[str]) -> float:
    """Fraction of Han characters among the non-space characters of ``texts``."""
    chars = sum(len(t) - sum(c.isspace() for c in t) for t in texts)
    return sum(len(_HAN.findall(t)) for t in texts) / chars if chars else 0.0


def bleu(predictions: list[str], references: list[str], tokenize: str) -> float:
    """Corpus BLEU (sacrebleu, 0-100; its default exponential smoothing) of one reference per row."""
    import sacrebleu

    if not predictions:
        return 0.0
    return float(sacrebleu.corpus_bleu(predictions, [references], tokenize=tokenize).score)


def rouge(predictions: list[str], references: list[str], chars: bool) -> dict[str, float]:
    """Mean ROUGE-1, ROUGE-2 and ROUGE-L F-measures (rouge-score, 0-100) over the rows; ``chars``:
    every non-space character is a token (Chinese), else rouge-score's own tokenizer."""
    from rouge_score import rouge_scorer

    keys = ("rouge1", "rouge2", "rougeL")
    scorer = rouge_scorer.RougeScorer(list(keys), tokenizer=_CharTokens() if chars else None)
    totals = dict.fromkeys(keys, 0.0)
    for prediction, reference in zip(predictions, references):
        scores = scorer.score(reference, prediction)
        for key in keys:
            totals[key] += scores[key].fmeasure
    n = max(len(predictions), 1)
    return {key: 100.0 * value / n for key, value in totals.items()}


class _CharTokens:
    """rouge-score tokenizer: every non-space character is a token."""

    def tokenize(self, text: str) -> list[str]:
        return [c for c in text if not c.isspace()]


@TASKS.register("text2text")
class Text2TextTask(Task):
    """Text-to-text generation (translation, summarisation) with an encoder-decoder or decoder-only model.

    Trained with teacher forcing on the target; evaluated by generating (greedy or beam search).
    """

    Config = Text2TextTaskConfig
    head = "lm"
    input_format = "text_a[<TAB>text_b]<TAB>label (label: the target text)"
    metric_names = METRICS
    inference_options = frozenset({"max_new_tokens", "num_beams", "length_penalty", "repetition_penalty"})

    def __init__(self, cfg: Text2TextTaskConfig, tokenizer, seq_length: int, state=None):
        self.bleu_tokenize: str | None = None
        self.rouge_chars: bool | None = None
        self.encoder_decoder: bool | None = None
        self.head_config: dict[str, Any] = {"type": "lm"}
        super().__init__(cfg, tokenizer, seq_length, state)

    # ---------------------------------------------------------------- the model's layout
    def bind(self, run_cfg: Any) -> None:
        """Encoder-decoder or decoder-only from the model config; the ``lm`` head keeps the model's
        own ``lm`` target options (bias, label smoothing, T5's hidden scaling)."""
        model = run_cfg.model
        tokenizer = self.tokenizer
        self.encoder_decoder = model.decoder is not None
        if self.encoder_decoder and model.target_vocab_size not in (None, model.vocab_size):
            raise UserError(f"text2text reads source and target with the run's one tokenizer, but the model has "
                            f"a target vocabulary of its own (model.target_vocab_size {model.target_vocab_size} "
                            f"vs vocab_size {model.vocab_size}); use a model with one shared vocabulary")
        mask = getattr(model.encoder, "mask", None)
        if not self.encoder_decoder and mask == "bidirectional":
            raise UserError("text2text generates with an encoder-decoder model or a decoder-only one (an "
                            "encoder with mask: causal or prefix); this model has one bidirectional encoder "
                            "and no decoder (a BERT-style encoder cannot generate)")
        lm = [t for t in model.targets if getattr(t, "type", None) == "lm"]
        head = lm[0].model_dump(exclude_none=True) if lm else {"type": "lm"}
        head.pop("name", None)
        self.head_config = head
        end = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
        if end is None:
            from pentad.data.masking import describe_tokenizer

            raise UserError(f"text2text needs an end token (EOS or [SEP]) to end targets, which the "
                            f"{describe_tokenizer(tokenizer)} lacks")
        self.end_id = int(end)
        self.pad_id = int(tokenizer.pad_id) if tokenizer.pad_id is not None else 0
        self.new_tokens = self.cfg.max_new_tokens or self.cfg.target_seq_length
        if self.encoder_decoder:
            from pentad.data.objectives.mt import MtObjectiveConfig

            for key, value in (("target_seq_length", self.cfg.target_seq_length), ("max_new_tokens", self.new_tokens)):
                if value > model.max_seq_length:
                    raise UserError(f"task.{key} {value} exceeds the model's model.max_seq_length "
                                    f"{model.max_seq_length} (the decoder's positions)")
            start = self.cfg.decoder_start
            if start is None:
                start = getattr(run_cfg.data.objective, "decoder_start", None)
            self.seq2seq = OBJECTIVES.get("mt")(MtObjectiveConfig(
                seq_length=self.seq_length, target_seq_length=self.cfg.target_seq_length, decoder_start=start),
                tokenizer)
            self.separator_id = self.end_id
        else:
            from pentad.data.objectives.llm import LlmSftObjectiveConfig

            self.sft = OBJECTIVES.get("llm_sft")(LlmSftObjectiveConfig(seq_length=self.seq_length), tokenizer)
            self.separator_id = self._separator()
            bos = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.cls_id
            self.start_ids = [int(bos)] if bos is not None and int(bos) != self.end_id else []
            # The prompt leaves room for the target (training) and for the generated tokens
            # (generation): a stored sequence is at most seq_length + 1 tokens.
            room = max(self.cfg.target_seq_length, self.new_tokens)
            self.source_budget = self.seq_length + 1 - room - len(self.start_ids) - 1
            if self.source_budget < 1:
                raise UserError(f"a decoder-only model reads source and target in one sequence of seq_length "
                                f"{self.seq_length}: task.target_seq_length {self.cfg.target_seq_length} and "
                                f"task.max_new_tokens {self.new_tokens} leave no room for the source; lower "
                                f"them or raise data.objective.seq_length")

    def _separator(self) -> int:
        tokenizer = self.tokenizer
        if self.cfg.separator is not None:
            index = tokenizer.token_to_id(self.cfg.separator)
            if index is None:
                raise UserError(f"task.separator {self.cfg.separator!r} is not a token of the vocabulary; give a "
                                "token string the tokenizer has (e.g. [SEP]) or leave it unset")
            return int(index)
        return int(tokenizer.sep_id) if tokenizer.sep_id is not None else self.end_id

    def _require_bound(self) -> None:
        if self.encoder_decoder is None:
            raise RuntimeError("text2text: call bind(run_config) before using the task")

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        self._require_bound()
        objective = self.seq2seq if self.encoder_decoder else self.sft
        return frozenset(objective.provides)

    def head_configs(self) -> list[dict[str, Any]]:
        return [dict(self.head_config)]

    # ---------------------------------------------------------------- fitting and state
    def fit(self, train_path: Path) -> None:
        """Pick the BLEU and ROUGE tokenizations from the training targets (``auto``)."""
        from pentad.data.tsv import read_classification_tsv

        rows, _ = read_classification_tsv(train_path, with_labels=True)
        chinese = chinese_share([r.label or "" for r in rows]) >= CHINESE_SHARE
        self.bleu_tokenize = ("zh" if chinese else "13a") if self.cfg.bleu_tokenize == "auto" \
            else self.cfg.bleu_tokenize
        self.rouge_chars = chinese if self.cfg.rouge_tokenize == "auto" else self.cfg.rouge_tokenize == "chars"

    def state(self) -> dict[str, Any]:
        return {"bleu_tokenize": self.bleu_tokenize, "rouge_tokenize": "chars" if self.rouge_chars else "words"}

    def load_state(self, state: dict[str, Any]) -> None:
        self.bleu_tokenize = state.get("bleu_tokenize")
        self.rouge_chars = state.get("rouge_tokenize") == "chars"

    def describe(self) -> str:
        layout = "encoder-decoder" if self.encoder_decoder else "decoder-only"
        rouge_on = "characters" if self.rouge_chars else "words"
        return f"{layout} model; BLEU tokenized with {self.bleu_tokenize}, ROUGE on {rouge_on}"

    # ---------------------------------------------------------------- data
    def read(self, path: Path, with_labels: bool = True) -> TextPairs:
        """The rows of a TSV file, encoded for the model's layout (see the module docstring)."""
        from pentad.data.tsv import read_classification_tsv

        self._require_bound()
        rows, columns = read_classification_tsv(path, with_labels=with_labels)
        return self._encode(rows, columns, with_labels)

    def read_windows(self, path: Path, window: int):
        """Windows of rows; each is generated in batches of similar prompt length, as a whole input is."""
        from pentad.data.tsv import iter_classification_tsv

        self._require_bound()
        return (self._encode(rows, columns, False)
                for rows, columns in iter_classification_tsv(path, False, window=window))

    def _encode(self, rows, columns, with_labels: bool) -> TextPairs:
        from pentad.data.tsv import fit_pair

        labelled = with_labels and "label" in columns
        tok = self.tokenizer
        first = tok.encode_batch([r.text_a for r in rows])
        second = tok.encode_batch([r.text_b or "" for r in rows]) if "text_b" in columns else None
        targets = tok.encode_batch([r.label or "" for r in rows]) if labelled else [[] for _ in rows]
        budget = self.seq2seq.source_budget if self.encoder_decoder else self.source_budget
        sequences, splits = [], []
        for i, target in enumerate(targets):
            a = np.asarray(first[i], dtype=np.int64)
            if second is None:
                source = a[:budget]
            else:
                b = np.asarray(second[i], dtype=np.int64)
                keep_a, keep_b = fit_pair(len(a), len(b), max(budget - 1, 0))
                source = np.concatenate([a[:keep_a], [self.separator_id], b[:keep_b]])
            body = np.asarray(target[:self.cfg.target_seq_length - 1], dtype=np.int64)
            if self.encoder_decoder:
                prompt = self.seq2seq.frame_source(source)
                answer = body
            else:
                prompt = np.concatenate([self.start_ids, source, [self.separator_id]])
                answer = np.append(body, self.end_id) if labelled else body
            sequences.append(np.concatenate([prompt, answer]).astype(np.int64))
            splits.append(len(prompt))
        references = [r.label or "" for r in rows] if labelled else None
        return TextPairs(Instances.from_sequences(sequences, split=splits), references, [r.line for r in rows])

    def collate(self, data: TextPairs, indices, rng: np.random.Generator):
        """Encoder-decoder: the ``mt`` objective's batch (tokens, padding_mask; decoder_tokens,
        decoder_padding_mask, labels.lm [B,T]); decoder-only: the ``llm_sft`` objective's (tokens,
        segments, padding_mask, labels.lm [B,S], scored on the target)."""
        chosen = data.instances[np.asarray(indices)]
        if self.encoder_decoder:
            return self.seq2seq.collate_split(chosen)
        return self.sft.collate(chosen, rng)

    def gold(self, data: TextPairs) -> list[str]:
        return list(data.references or [])

    # ---------------------------------------------------------------- generation and scores
    def generation_config(self):
        from pentad.generation.config import GenerationConfig

        return GenerationConfig(
            max_new_tokens=self.new_tokens, num_beams=self.cfg.num_beams, length_penalty=self.cfg.length_penalty,
            repetition_penalty=self.cfg.repetition_penalty, stop_token_ids=[self.end_id], pad_token_id=self.pad_id,
            decoder_start_token_id=self.seq2seq.decoder_start_id if self.encoder_decoder else None)

    def predict(self, model, data: TextPairs, batch_size: int, device, progress: str | None = None) -> Generated:
        """Generate a text for every row (rows batched by prompt length, answers in file order)."""
        from pentad.generation.search import generate

        self._require_bound()
        model = getattr(model, "module", model)  # a strategy's wrapper: generation needs the Model
        config = self.generation_config()
        prompts = data.prompts()
        order = np.argsort([len(p) for p in prompts], kind="stable")
        texts: list[str] = [""] * len(prompts)
        scores: list[float] = [0.0] * len(prompts)
        stops = set(config.stop_token_ids)
        for index in in_order(len(prompts), batch_size, progress):
            rows = order[index]
            output = generate(model, [prompts[i].tolist() for i in rows], config)
            for row, ids, score in zip(rows, output.sequences(), output.scores.tolist()):
                body = ids[:-1] if ids and ids[-1] in stops else ids
                texts[row] = detokenize(self.tokenizer.decode(body, skip_special_tokens=True))
                scores[row] = float(score)
        return Generated(texts, scores)

    def score(self, predictions: Generated, data: TextPairs, gold: list[str]) -> dict[str, float]:
        """BLEU and ROUGE-1/2/L F (0-100) of the generated texts against ``gold``."""
        texts = predictions.texts
        if len(texts) != len(gold):
            raise ValueError(f"{len(texts)} predictions for {len(gold)} references")
        metrics = {"bleu": bleu(texts, gold, self.bleu_tokenize or "13a")}
        metrics.update(rouge(texts, gold, bool(self.rouge_chars)))
        return metrics

    def prediction_header(self, probabilities: bool) -> str:
        """TSV with header ``text``: one generated text per input row (tabs and line breaks in a
        text become spaces); with ``probabilities`` also ``score``, the sequence's score (greedy:
        the sum of its tokens' log-probabilities; beams: the length-penalised beam score)."""
        return "text\tscore" if probabilities else "text"

    def prediction_lines(self, predictions: Generated, data: TextPairs, probabilities: bool) -> list[str]:
        lines = []
        for text, score in zip(predictions.texts, predictions.scores):
            clean = " ".join(text.replace("\t", " ").splitlines())
            lines.append(f"{clean}\t{score:.6f}" if probabilities else clean)
        return lines
