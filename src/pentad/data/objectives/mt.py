"""Machine translation: ``source<TAB>target`` lines -> encoder input and decoder input/labels.

This module also holds what every sequence-to-sequence objective (``t5``, ``bart``, ``gsg``,
``mt``) shares, the decoder side of the Batch:

* ``tokens`` / ``padding_mask`` [B,S]: the encoder input, ``[BOS] source [EOS]`` (the BOS only
  when the tokenizer has one distinct from its EOS; with BERT vocabularies that is
  ``[CLS] source [SEP]``, as in TencentPretrain).
* ``decoder_tokens`` [B,T]: a start token, then the target shifted right by one.
* ``decoder_padding_mask`` [B,T] bool, True at padding.
* ``labels["lm"]`` [B,T]: the target token each decoder position predicts (the last one is the
  EOS), IGNORE_INDEX at padding.

``decoder_start`` picks the start token: ``bos``, ``cls``, ``pad``, ``eos`` (the token of that role)
or a literal token string; by default the tokenizer's BOS, else its CLS. T5 starts with ``pad``,
BART with ``eos``.

The ``mt`` corpus is ``source<TAB>target`` per line. Sources are tokenized with the run's
tokenizer and truncated to ``seq_length``; targets with ``target_tokenizer`` (a full tokenizer
config, like the run's ``tokenizer:`` section; default: the run's tokenizer) and truncated to
``target_seq_length`` tokens including the EOS. A stored instance is ``[BOS] source [EOS]``
followed by the target ids, with the field ``split`` (where the target starts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pentad.config.unions import registry_union
from pentad.data.masking import describe_tokenizer
from pentad.data.objectives.base import Objective, ObjectiveConfig, new_batch, to_batch_tensor
from pentad.data.objectives.prefixlm import parse_pair
from pentad.data.shards import Instances, concat_ranges
from pentad.data.tokenizers import load_tokenizer  # also registers the tokenizers of TokenizerConfig
from pentad.errors import UserError
from pentad.registry import OBJECTIVES, TOKENIZERS

if TYPE_CHECKING:
    from pentad.components.base import Batch

DECODER_START_ROLES = ("bos", "cls", "pad", "eos")
SEQ2SEQ_PROVIDES = frozenset({"tokens", "padding_mask", "decoder_tokens", "decoder_padding_mask",
                              "labels.lm"})


class Seq2SeqObjectiveConfig(ObjectiveConfig):
    """Options every sequence-to-sequence objective has."""

    decoder_start: str | None = Field(
        None, description="First decoder input token: 'bos', 'cls', 'pad', 'eos' (that role's "
                          "token) or a token string of the vocabulary; default the tokenizer's "
                          "bos, else cls (T5 uses 'pad', BART 'eos').")


def resolve_decoder_start(tokenizer: Any, choice: str | None, objective: str) -> int:
    """The id of the decoder start token ``choice`` names (see ``decoder_start``); UserError when
    the vocabulary has no such token."""
    where = describe_tokenizer(tokenizer)
    if choice is None:
        value = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.cls_id
        if value is None:
            raise UserError(f"objective '{objective}': the {where} has neither a bos nor a cls token "
                            f"to start the decoder with; set objective.decoder_start to 'pad', 'eos' "
                            f"or a token of the vocabulary.")
        return int(value)
    if choice in DECODER_START_ROLES:
        value = getattr(tokenizer, f"{choice}_id")
        if value is None:
            raise UserError(f"objective '{objective}': decoder_start '{choice}' names the {choice} "
                            f"token, which the {where} does not have; choose another of "
                            f"{', '.join(DECODER_START_ROLES)} or a token string.")
        return int(value)
    value = tokenizer.token_to_id(choice)
    if value is None:
        raise UserError(f"objective '{objective}': decoder_start {choice!r} is neither one of "
                        f"{', '.join(DECODER_START_ROLES)} nor a token of the {where}.")
    return int(value)


def seq2seq_batch(source_ids: np.ndarray, source_valid: np.ndarray, targets: Instances,
                  start_id: int, target_pad_id: int) -> Batch:
    """The encoder-decoder Batch (see the module docstring).

    Args:
        source_ids, source_valid: [B,S] encoder input ids and validity (True = real token).
        targets: B target sequences, each ending with its EOS.
        start_id: the decoder start token; target_pad_id: filler at decoder padding.
    """
    from pentad.components.base import IGNORE_INDEX  # on first use; see objectives.base

    target_ids, target_valid = targets.padded(target_pad_id)
    decoder = np.empty_like(target_ids)
    decoder[:, 0] = start_id
    decoder[:, 1:] = target_ids[:, :-1]
    decoder[~target_valid] = target_pad_id
    labels = np.where(target_valid, target_ids, IGNORE_INDEX).astype(np.int64)
    return new_batch(tokens=to_batch_tensor(source_ids), padding_mask=to_batch_tensor(~source_valid),
                     decoder_tokens=to_batch_tensor(decoder),
                     decoder_padding_mask=to_batch_tensor(~target_valid),
                     labels={"lm": to_batch_tensor(labels)})


class Seq2SeqObjective(Objective):
    """Base of the encoder-decoder objectives: source framing, target EOS, decoder start.

    ``target_tokenizer`` is the tokenizer of the decoder side (the source tokenizer unless an
    objective has its own, as ``mt`` may).
    """

    truncation_refused: ClassVar[str | None] = (
        "its targets are decoder_tokens and labels.lm of the decoder side, whose positions are not the "
        "encoder's: cutting the source would keep targets for text it removed")
    provides: ClassVar[frozenset[str]] = SEQ2SEQ_PROVIDES
    collate_options: ClassVar[frozenset[str]] = frozenset({"decoder_start"})

    def __init__(self, cfg: Seq2SeqObjectiveConfig, tokenizer: Any, target_tokenizer: Any = None):
        super().__init__(cfg, tokenizer)
        self.target_tokenizer = tokenizer if target_tokenizer is None else target_tokenizer
        eos = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
        self.require_ids(**{"an end-of-sequence token (EOS or [SEP])": eos})
        self.eos_id = int(eos)
        bos = tokenizer.bos_id
        # A distinct start token frames the source ([CLS] x [SEP], <s> x </s>); GPT-2's single
        # <|endoftext|> does not (as in the lm objective).
        self.source_bos = [int(bos)] if bos is not None and int(bos) != self.eos_id else []
        target = self.target_tokenizer
        target_eos = target.eos_id if target.eos_id is not None else target.sep_id
        if target_eos is None:
            raise UserError(f"objective '{self.name}' needs an end-of-sequence token (EOS or [SEP]) "
                            f"for the targets, which the {describe_tokenizer(target)} does not have.")
        self.target_eos_id = int(target_eos)
        self.target_pad_id = int(target.pad_id) if target.pad_id is not None else 0
        self.decoder_start_id = resolve_decoder_start(target, cfg.decoder_start, self.name)

    @property
    def source_budget(self) -> int:
        """Source tokens that fit ``seq_length`` besides the framing BOS/EOS."""
        return self.seq_length - len(self.source_bos) - 1

    def frame_source(self, ids: np.ndarray) -> np.ndarray:
        """``[BOS] ids [EOS]`` (no BOS when the tokenizer has no distinct one)."""
        return np.concatenate([self.source_bos, ids, [self.eos_id]]).astype(np.int64)

    def collate_split(self, instances: Instances) -> Batch:
        """Batch of instances stored as ``framed source ++ target body`` with field ``split``."""
        split = instances.fields["split"]
        starts = instances.offsets[:-1]
        sources = Instances(instances.tokens[concat_ranges(starts, split)], split.copy())
        body = instances.lengths - split
        # Each target is its body plus the EOS: scatter the bodies, then the EOS after each.
        target_lengths = body + 1
        ends = np.cumsum(target_lengths)
        target_tokens = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
        target_tokens[concat_ranges(ends - target_lengths, body)] = instances.tokens[
            concat_ranges(starts + split, body)]
        target_tokens[ends - 1] = self.target_eos_id
        source_ids, source_valid = sources.padded(self.pad_id)
        return seq2seq_batch(source_ids, source_valid, Instances(target_tokens, target_lengths),
                             self.decoder_start_id, self.target_pad_id)


# The union of every registered tokenizer config, exactly what the run config's `tokenizer:` takes.
TokenizerConfig = registry_union(TOKENIZERS)


class MtObjectiveConfig(Seq2SeqObjectiveConfig):
    type: Literal["mt"] = "mt"
    target_seq_length: int = Field(128, ge=2, description="Target tokens per instance, EOS included.")
    target_tokenizer: TokenizerConfig | None = Field(
        None, description="Tokenizer of the targets (same form as the run's tokenizer section); "
                          "default: the run's tokenizer.")


@OBJECTIVES.register("mt")
class MtObjective(Seq2SeqObjective):
    """Parallel text -> encoder input, decoder input and next-token labels."""

    Config = MtObjectiveConfig
    corpus_format: ClassVar[str] = ("one pair per line, 'source<TAB>target' (UTF-8 text, both "
                                    "non-empty); blank lines are ignored")
    field_names: ClassVar[tuple[str, ...]] = ("split",)

    def __init__(self, cfg: MtObjectiveConfig, tokenizer: Any):
        target_tokenizer = None
        if cfg.target_tokenizer is not None:
            target_tokenizer = load_tokenizer(cfg.target_tokenizer)
        super().__init__(cfg, tokenizer, target_tokenizer)
        self.cfg: MtObjectiveConfig = cfg

    def instance_options(self) -> dict[str, Any]:
        """Instance-shaping options; the target tokenizer enters by fingerprint, not by paths,
        so a copy of its files in a run directory still matches the dataset."""
        options = super().instance_options()
        options["target_tokenizer"] = (None if self.cfg.target_tokenizer is None
                                       else self.target_tokenizer.fingerprint())
        return options

    def manifest_extra(self) -> dict[str, Any]:
        if self.cfg.target_tokenizer is None:
            return {}
        return {"target_tokenizer": {
            "config": self.cfg.target_tokenizer.model_dump(mode="json"),
            "fingerprint": self.target_tokenizer.fingerprint(),
            "vocab_size": int(self.target_tokenizer.vocab_size)}}

    def parse_line(self, text: str, context: Any) -> tuple[str, str] | None:
        """``(source, target)``, or None for a blank line; BadLine unless exactly two non-empty
        tab-separated fields."""
        return parse_pair(text, require_source=True)

    def build(self, items: list[tuple[str, str] | None], rng: np.random.Generator) -> Instances:
        pairs = [item for item in items if item is not None]
        sources = self.tokenizer.encode_batch([s for s, _ in pairs])
        targets = self.target_tokenizer.encode_batch([t for _, t in pairs])
        sequences, splits = [], []
        for source, target in zip(sources, targets):
            framed = self.frame_source(np.asarray(source[:self.source_budget], dtype=np.int64))
            body = np.asarray(target[:self.cfg.target_seq_length - 1], dtype=np.int64)
            sequences.append(np.concatenate([framed, body]))
            splits.append(len(framed))
        return Instances.from_sequences(sequences, split=splits)

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/padding_mask [B,S]; decoder_tokens/decoder_padding_mask/labels.lm [B,T]."""
        return self.collate_split(instances)
