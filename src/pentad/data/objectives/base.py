"""The objective contract: how corpus lines become stored instances, and instances a Batch.

An objective runs in two places:

* **preprocess** (worker processes): ``parse_line`` checks and converts one decoded corpus line,
  ``build`` turns a chunk of parsed lines into :class:`~pentad.data.shards.Instances` (or, for
  objectives that pack across documents, into a flat token stream that the writer cuts into
  windows of ``window`` tokens, ``stride`` apart, so packing ignores chunk boundaries).
* **training** (DataLoader workers): ``collate(instances, rng)`` pads, masks and returns a Batch.
  All randomness comes from ``rng``, so a batch is a pure function of its instances and seed.

The objective modules do not import torch at module level (``to_batch_tensor`` and ``new_batch``
import it on first use): preprocess worker processes import them to build instances and never
collate, and importing torch there would cost every ``pentad preprocess`` with workers about two
CPU-seconds and a few hundred MB per process before the first line is tokenized.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import Field

from pentad.config.base import StrictModel
from pentad.data.masking import describe_tokenizer
from pentad.data.shards import Instances, concat_ranges
from pentad.errors import UserError

if TYPE_CHECKING:
    import torch

    from pentad.components.base import Batch


class ObjectiveConfig(StrictModel):
    """Options every objective has."""

    seq_length: int = Field(128, ge=4, description="Tokens per instance, special tokens included.")
    if TYPE_CHECKING:  # declared by each objective as the Literal of its registered name
        type: str


class MaskingObjectiveConfig(ObjectiveConfig):
    """Options of objectives that mask tokens at collate time."""

    mask_prob: float = Field(0.15, gt=0.0, lt=1.0,
                             description="Fraction of maskable tokens selected per sequence.")
    whole_word_masking: bool = Field(
        False, description="Select whole words (a word start and its continuation pieces).")


class Objective:
    """Base class of the pre-training objectives (see the module docstring for the contract)."""

    Config: ClassVar[type[ObjectiveConfig]] = ObjectiveConfig
    registry_name: ClassVar[str]
    provides: ClassVar[frozenset[str]] = frozenset()
    corpus_format: ClassVar[str] = ""
    # Per-instance integer fields stored next to the tokens.
    field_names: ClassVar[tuple[str, ...]] = ()
    # Config keys that only affect collate, so a dataset stays valid when they change.
    collate_options: ClassVar[frozenset[str]] = frozenset({"mask_prob", "whole_word_masking"})
    # True when a chunk may only end after a blank line (corpora of sentence-per-line documents).
    documents_end_at_blank_lines: ClassVar[bool] = False
    # Sequence-length warm-up (train.curriculum, pentad.data.curriculum): None when a batch cut to its
    # first L positions is a valid batch of this objective (every label is a label of a position);
    # otherwise why it is not, naming the field that cutting would make wrong.
    truncation_refused: ClassVar[str | None] = "it does not declare that its batches may be cut"
    # False for objectives whose instances hold no text (vit: an image and a label): no tokenizer needed
    needs_tokenizer: ClassVar[bool] = True
    # Lines per preprocessing chunk where each line names a file to decode (an image, audio): the work
    # splits by items, not only by corpus bytes; None: chunks of chunk_bytes only (lines of text).
    chunk_lines: ClassVar[int | None] = None

    def __init__(self, cfg: ObjectiveConfig, tokenizer: Any):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.seq_length = cfg.seq_length
        # Padding positions carry their own mask, so any id will do when the vocab has no pad.
        self.pad_id = int(tokenizer.pad_id) if tokenizer is not None and tokenizer.pad_id is not None else 0

    @property
    def name(self) -> str:
        return type(self).registry_name

    def require_ids(self, **ids: int | None) -> None:
        """UserError naming the vocab when one of the special tokens this objective needs is absent."""
        missing = [name for name, value in ids.items() if value is None]
        if missing:
            raise UserError(
                f"objective '{self.name}' needs the special token(s) {', '.join(missing)}, which "
                f"the {describe_tokenizer(self.tokenizer)} does not have; add them to the "
                f"vocabulary or choose another objective.")

    # ---- preprocessing (worker processes) ---------------------------------------------------

    def instance_options(self) -> dict[str, Any]:
        """The config values that shape stored instances (checked when a dataset is opened)."""
        dumped = self.cfg.model_dump(mode="json")
        return {k: v for k, v in dumped.items() if k not in self.collate_options}

    def begin_corpus(self, first_line: str, path: Path) -> tuple[Any, bool]:
        """Look at the corpus's first line: returns (context for parse_line, header consumed)."""
        return None, False

    def parse_line(self, text: str, context: Any) -> Any:
        """One decoded line -> the item ``build`` takes; raise BadLine if it is malformed."""
        return text

    @property
    def packs(self) -> bool:
        """Whether ``build`` returns a token stream to be cut into windows across chunks."""
        return False

    @property
    def window(self) -> tuple[int, int]:
        """(window, stride) used to cut a packed stream (stride < window makes windows overlap)."""
        return self.seq_length, self.seq_length

    def build(self, items: list[Any], rng: np.random.Generator) -> Instances | np.ndarray:
        """A chunk's parsed lines -> Instances (or a 1-D token stream when ``packs``)."""
        raise NotImplementedError

    def take_notes(self) -> dict[str, int]:
        """What parsing changed in the input since the last call, counted by kind (s2t: files resampled
        or downmixed; images: converted to the model's mode, and how), then forgotten; preprocess reports
        the corpus's totals. None by default."""
        return {}

    def array_specs(self) -> dict[str, dict[str, Any]]:
        """Typed per-instance arrays stored beside the tokens: name -> ``{"dtype": ..., "shape":
        [row shape]}`` (speech features: float16 rows of ``feature_size``); none by default."""
        return {}

    def manifest_extra(self) -> dict[str, Any]:
        """Objective-specific entries for the dataset manifest."""
        return {}

    # ---- training (DataLoader workers) ------------------------------------------------------

    def check_model(self, model: Any) -> None:
        """Called with the model config before the model is built: a UserError when the stored data
        cannot train it (beit: the image tokenizer's patch size against the patch part's); may fill in
        a size the data decides. Nothing to check by default."""

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """Pad (and mask) ``instances`` into a Batch of torch tensors."""
        raise NotImplementedError


def windows(stream: np.ndarray, window: int, stride: int, final: bool) -> tuple[Instances, np.ndarray]:
    """Cut ``stream`` into windows of ``window`` tokens starting every ``stride`` tokens.

    Returns the full windows and the remainder (the tokens a later window still needs; with
    overlapping windows it starts with the last window's final tokens). With ``final`` the
    remainder becomes one shorter instance when it holds tokens no window has covered yet.
    """
    overlap = window - stride
    count = 0 if len(stream) < window else (len(stream) - window) // stride + 1
    starts = np.arange(count, dtype=np.int64) * stride
    lengths = np.full(count, window, dtype=np.int64)
    rest = stream[count * stride:]
    if final and len(rest) > overlap:
        starts = np.append(starts, count * stride)
        lengths = np.append(lengths, len(rest))
        rest = rest[:0]
    tokens = stream[concat_ranges(starts, lengths)]
    return Instances(tokens.astype(np.int64), lengths), rest


def to_batch_tensor(array: np.ndarray) -> torch.Tensor:
    """A numpy array as a torch tensor (int64 for ids, bool for masks), without a copy when possible."""
    import torch  # on first use; see the module docstring

    return torch.from_numpy(np.ascontiguousarray(array))


def new_batch(**fields: Any) -> Batch:
    """``Batch(**fields)``, importing the Batch class (and torch) on first use; see the module
    docstring."""
    from pentad.components.base import Batch

    return Batch(**fields)


def segments_from_split(split: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """[B,S] int64 segment ids: 0 before ``split[b]`` (segment A), 1 from it on, 0 at padding."""
    positions = np.arange(valid.shape[1])[None, :]
    return ((positions >= split[:, None]) & valid).astype(np.int64)
