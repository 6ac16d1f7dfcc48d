"""Images from captions: a model pre-trained with the ``dalle`` objective continues ``[CLS] caption
[SEP]`` with image tokens only (every text id is suppressed), one per patch of the image tokenizer's
grid, and the image tokenizer paints the tokens back into pixels
(:class:`pentad.data.image_tokenizer.ImageTokenizer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pentad.data.image_tokenizer import ImageTokenizer
from pentad.generation.config import GenerationInputError
from pentad.generation.search import generate


def generate_images(model: Any, tokenizer: Any, image_tokenizer: ImageTokenizer, captions: Sequence[str],
                    grid: tuple[int, int], text_length: int = 64, **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images ``[len(captions), H, W, C]`` and their image tokens ``[len(captions), rows * cols]``
    (codebook ids) for ``captions``. ``grid``: (rows, cols) of patches (the dataset's, in its manifest);
    ``options``: GenerationConfig fields (greedy by default; ``do_sample=True, top_k=..., seed=...``)."""
    if tokenizer.cls_id is None or tokenizer.sep_id is None:
        raise GenerationInputError("image generation frames the caption as [CLS] caption [SEP]: the tokenizer has "
                                   "no [CLS] or [SEP]")
    offset = int(tokenizer.vocab_size)
    codes = image_tokenizer.codebook_size
    length = grid[0] * grid[1]
    prompts = [[int(tokenizer.cls_id), *ids[:text_length - 2], int(tokenizer.sep_id)]
               for ids in tokenizer.encode_batch(list(captions))]
    output = generate(model, prompts, max_new_tokens=length, min_new_tokens=length, stop_token_ids=[],
                      suppress_tokens=list(range(offset)), **options)
    tokens = output.tokens[:, :length].cpu().numpy() - offset
    if tokens.min() < 0 or tokens.max() >= codes:
        raise GenerationInputError("the model produced ids outside the image tokenizer's codebook (a vocabulary "
                                   f"larger than text + {codes} codes?)")
    return image_tokenizer.decode(tokens, grid), tokens
