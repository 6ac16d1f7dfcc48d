"""The ``data:`` section of a run config: where the corpus, dataset and TSV files are.

The run config adds an ``objective`` field (a discriminated union over the registered objectives'
configs, selected by ``type``) when it assembles itself; this base holds the paths and process
counts shared by ``preprocess``, ``pretrain``, ``finetune`` and ``infer``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from pentad.config.base import StrictModel

#: Pillow's own default (``PIL.Image.MAX_IMAGE_PIXELS``): a 24-bit image of this many pixels takes 256 MiB.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485


class DataConfigBase(StrictModel):
    """Paths and worker counts of the data pipeline (the objective is added by the run config)."""

    corpus: Path | None = Field(
        None, description="Raw text corpus read by `pentad preprocess` (format set by the objective).")
    output: Path | None = Field(
        None, description="Directory `pentad preprocess` creates; it must not exist or be empty.")
    dataset: Path | None = Field(
        None, description="A directory written by `pentad preprocess`, read for pre-training.")
    workers: int = Field(
        1, ge=1, description="Processes that tokenize the corpus in `preprocess` (1 = in-process).")
    loader_workers: int = Field(
        0, ge=0, description="DataLoader worker processes that build batches while training (pre-training and "
                              "fine-tuning tasks alike); 0 builds them in the training process.")
    on_bad_line: Literal["fail", "skip"] = Field(
        "fail", description="What `preprocess` does with a corpus line that is not UTF-8 or not in "
                            "the objective's format: stop with an error, or skip it and count it.")
    max_image_pixels: int = Field(
        DEFAULT_MAX_IMAGE_PIXELS, ge=1, description="The most pixels (width x height) an image file may declare; "
        "a larger one (a decompression bomb, or a scan far above the model's size) is a bad line in `preprocess` "
        "and an error in the image tasks, found before it is decoded.")
    train: Path | None = Field(None, description="Training TSV for fine-tuning.")
    dev: Path | None = Field(None, description="Development TSV, evaluated during fine-tuning.")
    test: Path | None = Field(None, description="Test TSV for evaluation or inference.")
