"""Image helpers: the random resized crop, normalisation, and the MNIST subset's CSV reader (the
download itself is exercised by bench/vision_digits.py)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from pentad.data.assets import read_mnist_csv
from pentad.data.images import AugmentConfig, augment, random_resized_crop, to_pixels
from pentad.errors import UserError


def test_random_resized_crop_keeps_the_shape_and_the_full_scale_is_the_image():
    image = np.arange(16 * 12 * 3, dtype=np.uint8).reshape(16, 12, 3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert random_resized_crop(image, (0.08, 1.0), rng).shape == (16, 12, 3)
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8, 1)
    square = np.random.default_rng(1)
    same = [random_resized_crop(gray, (1.0, 1.0), square) for _ in range(10)]
    # the whole image at aspect ratio 1 is the only fitting draw of full scale on a square image
    assert any(np.array_equal(s, gray) for s in same)


def test_augment_copies_and_flip_mirrors():
    images = np.random.default_rng(0).integers(0, 256, (6, 4, 4, 1), dtype=np.uint8)
    kept = images.copy()
    out = augment(images, AugmentConfig(crop_scale=None, flip=True), np.random.default_rng(0))
    assert np.array_equal(images, kept)
    assert all(np.array_equal(o, i) or np.array_equal(o, i[:, ::-1]) for o, i in zip(out, images))
    assert any(not np.array_equal(o, i) for o, i in zip(out, images))
    assert augment(images, None, np.random.default_rng(0)) is images
    with pytest.raises(ValueError):
        AugmentConfig(crop_scale=[0.5, 1.5])


def test_to_pixels_normalises_channels_first():
    images = np.zeros((2, 3, 5, 3), dtype=np.uint8)
    images[..., 1] = 255
    pixels = to_pixels(images, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    assert pixels.shape == (2, 3, 3, 5) and pixels.dtype == torch.float32
    assert torch.all(pixels[:, 0] == -1) and torch.all(pixels[:, 1] == 1)


def test_mnist_csv_rows_become_images_and_labels():
    row = ",".join(["0"] * 783 + ["255", "7"])
    images, labels = read_mnist_csv(gzip.compress((row + "\n" + row.replace(",7", ",3") + "\n").encode()))
    assert labels == [7, 3] and len(images[0]) == 784 and images[0][783] == 255
    with pytest.raises(UserError, match="line 1: expected 784 pixels and a label, found 3"):
        read_mnist_csv(gzip.compress(b"1,2,3\n"))
