"""Image helpers: the random resized crop, normalisation, and the MNIST subset's CSV reader (the
download itself is exercised by bench/vision_digits.py)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from pentad.data.assets import read_mnist_csv
from pentad.data.images import (
    AugmentConfig,
    MixConfig,
    augment,
    mix_batch,
    random_affine,
    random_resized_crop,
    to_pixels,
)
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


class _Draws:
    """A stand-in generator that returns fixed draws: ``angle`` for scalars, ``shift`` for the pair."""

    def __init__(self, angle=0.0, shift=(0.0, 0.0)):
        self.angle, self.shift = angle, shift

    def uniform(self, low, high, size=None):
        return np.asarray(self.shift) if size is not None else self.angle


def test_random_affine_shifts_and_rotates_exactly_and_fills_black():
    image = (np.arange(64, dtype=np.uint8).reshape(8, 8, 1) * 3) + 1
    shift = random_affine(image, AugmentConfig(translate=0.25), _Draws(shift=(0.25, -0.125)))
    # two pixels right (0.25 x 8), one pixel up (-0.125 x 8); the uncovered border is 0
    assert np.array_equal(shift[:7, 2:], image[1:, :6]) and not shift[:, :2].any() and not shift[7].any()
    turned = random_affine(image, AugmentConfig(rotate=90.0), _Draws(angle=90.0))
    assert np.array_equal(turned[..., 0], np.rot90(image[..., 0], k=-1))
    same = random_affine(image, AugmentConfig(zoom=[1.0, 1.0]), np.random.default_rng(0))
    assert np.array_equal(same, image)
    odd = np.arange(81, dtype=np.uint8).reshape(9, 9, 1) + 1
    slanted = random_affine(odd, AugmentConfig(shear=20.0), _Draws(angle=20.0))
    assert np.array_equal(slanted[4], odd[4]) and not np.array_equal(slanted, odd)  # the centre row stays


def test_random_affine_keeps_the_shape_and_is_seeded():
    cfg = AugmentConfig(crop_scale=None, flip=False, rotate=15.0, translate=0.1, zoom=[0.9, 1.1], shear=10.0)
    assert cfg.affine and not AugmentConfig().affine
    images = np.random.default_rng(0).integers(0, 256, (4, 9, 7, 3), dtype=np.uint8)
    out = augment(images, cfg, np.random.default_rng(3))
    assert out.shape == images.shape and out.dtype == np.uint8
    assert np.array_equal(out, augment(images, cfg, np.random.default_rng(3)))
    assert not np.array_equal(out, augment(images, cfg, np.random.default_rng(4)))
    assert all(not np.array_equal(o, i) for o, i in zip(out, images))
    # an option left off draws nothing: crop and flip alone see the same draws as before it existed
    plain = AugmentConfig(crop_scale=[0.5, 1.0])
    assert np.array_equal(augment(images, plain, np.random.default_rng(5)),
                          augment(images, plain.model_copy(update={"shear": 0.0}), np.random.default_rng(5)))
    for bad in ({"zoom": [1.2, 0.8]}, {"zoom": [0.0, 1.0]}, {"translate": 1.0}, {"rotate": -5.0}, {"shear": 90.0}):
        with pytest.raises(ValueError):
            AugmentConfig(**bad)


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


def _two_images():
    pixels = torch.zeros(2, 1, 8, 10)
    pixels[1] = 1.0
    return pixels, np.asarray([0, 2])


def test_mixup_blends_the_reversed_batch_and_weights_the_targets_by_lambda():
    pixels, labels = _two_images()
    mixed, targets = mix_batch(pixels, labels, 3, MixConfig(cutmix=0.0), np.random.default_rng(0))
    lam = float(1.0 - mixed[0].mean())  # row 0 (zeros) blended with row 1 (ones): 1 - lam everywhere
    assert 0.0 < lam < 1.0 and torch.allclose(mixed[0], torch.full_like(mixed[0], 1.0 - lam))
    torch.testing.assert_close(mixed[1], torch.full_like(mixed[1], lam))
    torch.testing.assert_close(targets, torch.tensor([[lam, 0.0, 1.0 - lam], [1.0 - lam, 0.0, lam]]))
    assert pixels[0].sum() == 0  # the input is not changed in place


def test_cutmix_pastes_a_box_and_weights_the_targets_by_area():
    pixels, labels = _two_images()
    for seed in range(20):
        mixed, targets = mix_batch(pixels, labels, 3, MixConfig(mixup=0.0), np.random.default_rng(seed))
        pasted = float(mixed[0].mean())  # the share of row 0 that comes from row 1
        # a box: the pasted pixels of row 0 form a rectangle, and row 1 has the complementary hole
        rows, cols = torch.nonzero(mixed[0, 0], as_tuple=True)
        if len(rows):
            assert mixed[0, 0, rows.min():rows.max() + 1, cols.min():cols.max() + 1].eq(1).all()
        torch.testing.assert_close(mixed[1], 1.0 - mixed[0])
        torch.testing.assert_close(targets[0], torch.tensor([1.0 - pasted, 0.0, pasted]))
        assert targets.sum(1).allclose(torch.ones(2))


def test_mix_is_seeded_and_a_batch_not_drawn_keeps_one_hot_targets():
    pixels, labels = _two_images()
    a = mix_batch(pixels, labels, 3, MixConfig(), np.random.default_rng(5))
    b = mix_batch(pixels, labels, 3, MixConfig(), np.random.default_rng(5))
    assert a[0].equal(b[0]) and a[1].equal(b[1])
    kept, onehot = mix_batch(pixels, labels, 3, MixConfig(prob=0.0), np.random.default_rng(5))
    assert kept.equal(pixels) and onehot.equal(torch.tensor([[1.0, 0, 0], [0, 0, 1.0]]))
    assert not MixConfig(mixup=0.0, cutmix=0.0).on


def test_soft_targets_give_the_expected_cross_entropy_and_accuracy():
    from pentad.components.targets.common import classification_loss

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 3.0]])
    targets = torch.tensor([[0.7, 0.0, 0.3], [0.4, 0.0, 0.6]])
    loss, metrics = classification_loss(logits, targets)
    expected = -(targets * logits.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(loss, expected)
    assert int(metrics["correct"]) == 2 and int(metrics["count"]) == 2
    one_hot, _ = classification_loss(logits, torch.tensor([[1.0, 0, 0], [0, 0, 1.0]]), label_smoothing=0.1)
    ids, _ = classification_loss(logits, torch.tensor([0, 2]), label_smoothing=0.1)
    torch.testing.assert_close(one_hot, ids)


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` 8-bit grayscale pixels and holds none (a bomb's header)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IEND", b""))


def test_sixteen_bit_and_float_images_are_converted_by_their_value_range(tmp_path):
    from PIL import Image

    from pentad.data.images import decode_image

    ramp = np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000  # 0..63000: most of it above 255
    Image.fromarray(ramp).save(tmp_path / "deep.png")
    gray, how = decode_image(tmp_path / "deep.png", "deep", (8, 8), 1)
    np.testing.assert_array_equal(gray[..., 0], np.rint(ramp * (255 / 65535)).astype(np.uint8))
    assert how is not None and "I;16" in how and "255/65535" in how
    rgb, _ = decode_image(tmp_path / "deep.png", "deep", (8, 8), 3)
    assert all(np.array_equal(rgb[..., c], gray[..., 0]) for c in range(3))
    unit = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    Image.fromarray(unit).save(tmp_path / "unit.tiff")
    image, how = decode_image(tmp_path / "unit.tiff", "unit", (8, 8), 1)
    np.testing.assert_array_equal(image[..., 0], np.rint(unit.astype(np.float64) * 255).astype(np.uint8))
    assert "within 0..1" in how
    wide = np.arange(64, dtype=np.int32).reshape(8, 8) * 1000  # an I image within 0..65535: read as 16-bit
    Image.fromarray(wide).save(tmp_path / "wide.tiff")
    image, _ = decode_image(tmp_path / "wide.tiff", "wide", (8, 8), 1)
    np.testing.assert_array_equal(image[..., 0], np.rint(wide * (255 / 65535)).astype(np.uint8))


def test_float_images_outside_a_known_range_are_refused_by_name(tmp_path):
    from PIL import Image

    from pentad.data.images import decode_image

    for name, values in (("signed", np.linspace(-2, 3, 16)), ("nan", np.full(16, np.nan))):
        Image.fromarray(values.astype(np.float32).reshape(4, 4)).save(tmp_path / f"{name}.tiff")
        with pytest.raises(UserError, match=f"{name}.tiff.* float samples"):
            decode_image(tmp_path / f"{name}.tiff", f"image {tmp_path / name}.tiff", (4, 4), 1)


def test_images_past_the_pixel_limit_are_refused_before_decoding(tmp_path):
    from PIL import Image

    from pentad.data.images import decode_image, load_images

    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png_header(20_000, 20_000))  # 400 million pixels in 57 bytes
    with pytest.raises(UserError, match="20000x20000 = 400,000,000 pixels, more than data.max_image_pixels 89,478,485"):
        decode_image(bomb, "bomb", (8, 8), 1)
    Image.new("L", (40, 30)).save(tmp_path / "big.png")
    assert decode_image(tmp_path / "big.png", "big", (8, 8), 1)[0].shape == (8, 8, 1)
    with pytest.raises(UserError, match=r"t.tsv, line 3: image .*big.png is 40x30 = 1,200 pixels, more than "
                                        r"data.max_image_pixels 1,000 allows"):
        load_images([tmp_path / "big.png"], [3], tmp_path / "t.tsv", (8, 8), 1, max_pixels=1000)


def test_a_directory_fifo_or_device_is_named_as_such_without_blocking(tmp_path):
    import os

    from pentad.data.images import decode_image

    (tmp_path / "folder.png").mkdir()
    cases = {tmp_path / "folder.png": "is a directory, not an image file",
             tmp_path / "missing.png": "does not exist"}
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.png")  # no writer: opening it for reading in the usual way would block
        cases[tmp_path / "pipe.png"] = r"is a named pipe \(FIFO\), not an image file"
    if os.path.exists("/dev/zero"):
        cases[Path("/dev/zero")] = "is a character device, not an image file"
    for path, expected in cases.items():
        with pytest.raises(UserError, match=f"image {path}: {expected}"):
            decode_image(path, f"image {path}:", (4, 4), 1)
