"""The beit objective: blockwise masking as in BEiT (ratio, block sizes and shapes, seeded), and
collate's pixels, patch_mask and mlm labels (the stored visual tokens at masked patches)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pentad.assembly import load_config
from pentad.components.base import IGNORE_INDEX
from pentad.data.image_tokenizer import ImageTokenizer
from pentad.data.objectives.beit import BeitObjective, BeitObjectiveConfig, block_mask, mask_blocks
from pentad.data.shards import Instances, Ragged
from pentad.errors import UserError


def test_blocks_cover_the_ratio_with_large_rectangles():
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(200):
        blocks = mask_blocks(14, 14, int(round(0.4 * 196)), rng)
        covered = np.zeros((14, 14), bool)
        left_over = 78
        for top, left, height, width in blocks:
            assert 0 <= top and top + height <= 14 and 0 <= left and left + width <= 14
            # at least 16 patches, or what was left (rounding of the drawn side lengths aside)
            assert height * width >= min(16, left_over) - 4, (height, width, left_over)
            # aspect ratio within 0.3 .. 1/0.3, up to the rounding of the sides
            assert 0.3 * 0.5 <= height / width <= 2 / 0.3
            new = height * width - covered[top:top + height, left:left + width].sum()
            assert 0 < new <= left_over
            covered[top:top + height, left:left + width] = True
            left_over -= new
        ratios.append(covered.mean())
        assert covered.sum() <= 78
    assert 0.38 <= np.mean(ratios) <= 0.4 and np.min(ratios) > 0.3
    # blocks, not scattered patches: few connected regions
    mask = block_mask(64, 14, 14, 0.4, np.random.default_rng(1)).reshape(64, 14, 14)
    assert np.mean([_regions(m) for m in mask]) < 5


def _regions(mask: np.ndarray) -> int:
    seen, count = np.zeros_like(mask), 0
    for start in zip(*np.nonzero(mask)):
        if seen[start]:
            continue
        count += 1
        stack = [start]
        while stack:
            r, c = stack.pop()
            if 0 <= r < mask.shape[0] and 0 <= c < mask.shape[1] and mask[r, c] and not seen[r, c]:
                seen[r, c] = True
                stack += [(r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)]
    return count


def test_block_mask_is_seeded_and_small_grids_work():
    one, two = (block_mask(8, 4, 4, 0.4, np.random.default_rng(5)) for _ in range(2))
    np.testing.assert_array_equal(one, two)
    assert one.shape == (8, 16) and (one.sum(1) == 6).all()  # 40% of 16: blocks smaller than 16 patches
    assert not np.array_equal(one, block_mask(8, 4, 4, 0.4, np.random.default_rng(6)))
    assert math.isclose(block_mask(1, 2, 3, 0.5, np.random.default_rng(0)).sum(), 3)


@pytest.fixture()
def objective(tmp_path):
    rng = np.random.default_rng(0)
    tokenizer = ImageTokenizer(rng.random((8, 4 * 4 * 3), dtype=np.float32), 4, 3)
    path = tmp_path / "codes.safetensors"
    tokenizer.save(path)
    return BeitObjective(BeitObjectiveConfig(image_size=8, image_tokenizer=path, min_block_patches=2), None), tokenizer


def _instances(objective, tokenizer, count=6):
    images = np.random.default_rng(1).integers(0, 256, size=(count, 8, 8, 3), dtype=np.uint8)
    out = objective.build([(None, image) for image in images], np.random.default_rng(0))
    np.testing.assert_array_equal(out.tokens.reshape(count, 4), tokenizer.encode(images))
    return out, images


def test_collate_labels_the_masked_patches(objective):
    objective, tokenizer = objective
    instances, images = _instances(objective, tokenizer)
    batch = objective.collate(instances, np.random.default_rng(3))
    mask, labels = batch.patch_mask.numpy(), batch.labels["mlm"].numpy()
    assert mask.shape == (6, 4) and labels.shape == (6, 5)  # the CLS position first
    assert (labels[:, 0] == IGNORE_INDEX).all() and (mask.sum(1) == 2).all()
    ids = tokenizer.encode(images)
    np.testing.assert_array_equal(labels[:, 1:], np.where(mask, ids, IGNORE_INDEX))
    assert tuple(batch.pixels.shape) == (6, 3, 8, 8)
    again = objective.collate(instances, np.random.default_rng(3))
    assert again.patch_mask.equal(batch.patch_mask) and again.pixels.equal(batch.pixels)


def test_augmented_views_are_encoded_again(objective, tmp_path):
    _, tokenizer = objective
    from pentad.data.images import AugmentConfig

    path = tmp_path / "codes.safetensors"
    flipping = BeitObjective(BeitObjectiveConfig(image_size=8, image_tokenizer=path, min_block_patches=2,
                                                 augment=AugmentConfig(crop_scale=None, flip=True)), None)
    instances, images = _instances(flipping, tokenizer, 16)
    batch = flipping.collate(instances, np.random.default_rng(3))
    view = (batch.pixels.numpy().transpose(0, 2, 3, 1) * np.array([0.229, 0.224, 0.225]) +
            np.array([0.485, 0.456, 0.406])) * 255
    view = np.rint(view).astype(np.uint8)
    flipped = [not np.array_equal(v, i) for v, i in zip(view, images)]
    assert any(flipped) and not all(flipped)
    mask, labels = batch.patch_mask.numpy(), batch.labels["mlm"].numpy()
    np.testing.assert_array_equal(labels[:, 1:], np.where(mask, tokenizer.encode(view), IGNORE_INDEX))


def test_check_model(objective, shared_data):
    objective, _ = objective
    cfg = load_config(shared_data / "configs" / "beit/base_config.json")
    assert cfg.data.objective.type == "beit" and cfg.data.objective.image_size == [256, 256]
    model = cfg.model
    with pytest.raises(UserError, match="has 4-pixel patches, but the model's masked_patch part has patch_size 16"):
        objective.check_model(model)
    model.embedding.parts[0].patch_size = 4
    with pytest.raises(UserError, match=r"image_size \[8, 8\] / channels 3 differ"):
        objective.check_model(model)
    model.embedding.parts[0].image_size = [8, 8]
    model.vocab_size = 4
    with pytest.raises(UserError, match="model.vocab_size 4 is smaller than"):
        objective.check_model(model)
    model.vocab_size = 8
    model.embedding.parts[0].cls = False
    objective.check_model(model)
    assert objective.first == 0


def test_instances_without_images_build_empty(objective):
    objective, _ = objective
    out = objective.build([None], np.random.default_rng(0))
    assert isinstance(out, Instances) and len(out) == 0 and isinstance(out.arrays["image"], Ragged)
