"""The k-means image tokenizer: seeded fitting, encode/decode round trip far better than a random
codebook's, the safetensors file (no pickle) and its errors, bounded patch sampling."""

from __future__ import annotations

import numpy as np
import pytest

from pentad.data.image_tokenizer import ImageTokenizer, _reservoir, fit_image_tokenizer
from pentad.errors import UserError


def blocks(count: int, seed: int) -> np.ndarray:
    """uint8 [count, 16, 16, 3]: two colour regions split at a random column."""
    rng = np.random.default_rng(seed)
    out = np.empty((count, 16, 16, 3), dtype=np.uint8)
    for i in range(count):
        a, b = rng.integers(0, 256, size=(2, 3))
        cut = int(rng.integers(1, 16))
        out[i, :, :cut], out[i, :, cut:] = a, b
    return out


def fit(images, seed=3, **options):
    kw = {"max_patches": 1500, "steps": 60, "batch_size": 256, **options}
    return fit_image_tokenizer([images[:50], images[50:]], 4, 32, seed=seed, **kw)


def test_fit_is_seeded_and_deterministic():
    images = blocks(120, 0)
    one, two, other = fit(images), fit(images), fit(images, seed=4)
    np.testing.assert_array_equal(one.codebook, two.codebook)
    assert not np.array_equal(one.codebook, other.codebook)
    assert one.codebook.shape == (32, 4 * 4 * 3) and one.meta["fit"]["patches_seen"] == 120 * 16
    assert one.meta["fit"]["patches_sampled"] == 1500  # bounded: a reservoir of max_patches


def test_round_trip_error_is_far_below_a_random_codebook():
    train, test = blocks(120, 0), blocks(40, 1)
    tokenizer = fit(train)
    ids = tokenizer.encode(test)
    assert ids.shape == (40, 16) and ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < 32
    error = np.abs(tokenizer.decode(ids).astype(float) - test).mean()
    rng = np.random.default_rng(0)
    random = ImageTokenizer(rng.random((32, 48), dtype=np.float32), 4, 3)
    random_error = np.abs(random.decode(random.encode(test)).astype(float) - test).mean()
    assert error < 35 and error < 0.5 * random_error, (error, random_error)
    # a codebook holding the exact patches decodes them exactly; ids are patches row by row
    exact = ImageTokenizer(tokenizer.patches(test[:1])[0], 4, 3)
    np.testing.assert_array_equal(exact.decode(exact.encode(test[:1])), test[:1])
    wide = np.concatenate([test[:1], test[1:2]], axis=2)  # 16 x 32: a 4 x 8 grid
    np.testing.assert_array_equal(tokenizer.decode(tokenizer.encode(wide), (4, 8)),
                                  np.concatenate([tokenizer.decode(ids[:1]), tokenizer.decode(ids[1:2])], axis=2))


def test_save_load_round_trip_and_errors(tmp_path):
    tokenizer = fit(blocks(120, 0))
    path = tmp_path / "codes.safetensors"
    tokenizer.save(path)
    loaded = ImageTokenizer.load(path)
    np.testing.assert_array_equal(loaded.codebook, tokenizer.codebook)
    assert (loaded.patch_size, loaded.channels, loaded.codebook_size) == (4, 3, 32)
    assert loaded.fingerprint() == tokenizer.fingerprint() and loaded.meta["fit"]["seed"] == 3
    with pytest.raises(UserError, match="does not exist; fit one with `pentad image-tokenizer fit"):
        ImageTokenizer.load(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UserError, match="is not a safetensors file"):
        ImageTokenizer.load(tmp_path / "junk.safetensors")
    from safetensors.numpy import save_file

    save_file({"weight": np.zeros(3, np.float32)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(UserError, match="not a pentad image tokenizer"):
        ImageTokenizer.load(tmp_path / "other.safetensors")
    with pytest.raises(UserError, match="do not divide into the image tokenizer's 4-pixel patches"):
        tokenizer.encode(np.zeros((1, 10, 16, 3), np.uint8))
    with pytest.raises(UserError, match="fewer than the codebook's 32 codes"):
        fit_image_tokenizer([blocks(1, 0)], 4, 32)


def test_reservoir_is_uniform_and_bounded():
    rng = np.random.default_rng(0)
    stream = [np.arange(i, i + 100, dtype=np.float32)[:, None] for i in range(0, 10_000, 100)]
    counts = np.zeros(10_000)
    for _ in range(60):
        sample, seen = _reservoir(iter(stream), 500, rng)
        assert sample.shape == (500, 1) and seen == 10_000 and len(np.unique(sample)) == 500
        counts[sample[:, 0].astype(int)] += 1
    # every part of the stream is sampled at its share (500 / 10,000 per draw)
    shares = counts.reshape(10, 1000).sum(1) / (60 * 500)
    assert np.all(np.abs(shares - 0.1) < 0.02), shares
