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


def test_an_imported_codebook_encodes_as_the_original(tmp_path):
    """A codebook saved elsewhere channel-first in 0..255 (as a convolution's weights) imports to the same
    tokenizer: the same ids for the same images, and the pentad file loads like a fitted one."""
    from safetensors.numpy import save_file

    from pentad.cli.main import main
    from pentad.data.image_tokenizer import import_codebook

    rng = np.random.default_rng(0)
    original = ImageTokenizer(rng.random((12, 4 * 4 * 3)).astype(np.float32), 4, 3)
    images = rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    chw = original.codebook.reshape(12, 4, 4, 3).transpose(0, 3, 1, 2).reshape(12, -1) * 255.0
    np.save(tmp_path / "c.npy", chw)
    imported = import_codebook(tmp_path / "c.npy", 4, 3, layout="chw", pixel_range="0-255")
    np.testing.assert_allclose(imported.codebook, original.codebook, atol=1e-6)
    assert np.array_equal(imported.encode(images), original.encode(images))
    assert imported.meta["imported_from"] == "c.npy" and imported.meta["source_layout"] == "chw"
    save_file({"centroids": original.codebook * 2 - 1}, str(tmp_path / "c.safetensors"))
    assert main(["image-tokenizer", "import", "--codebook", str(tmp_path / "c.safetensors"), "--patch-size", "4",
                 "--pixel-range", "symmetric", "--output", str(tmp_path / "tok.safetensors")]) == 0
    loaded = ImageTokenizer.load(tmp_path / "tok.safetensors")
    assert np.array_equal(loaded.encode(images), original.encode(images)) and loaded.codebook_size == 12


def test_bad_codebooks_are_named(tmp_path):
    from pentad.data.image_tokenizer import import_codebook

    np.save(tmp_path / "wide.npy", np.zeros((4, 10)))
    with pytest.raises(UserError, match=r"expected numbers of shape \[K, 48\].*found float64 \[4, 10\]"):
        import_codebook(tmp_path / "wide.npy", 4, 3)
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(UserError, match="cannot be read without unpickling"):
        import_codebook(tmp_path / "objects.npy", 4, 3)
    np.save(tmp_path / "bytes.npy", np.full((2, 48), 200.0))
    with pytest.raises(UserError, match="outside --pixel-range 0-1"):
        import_codebook(tmp_path / "bytes.npy", 4, 3)
    np.save(tmp_path / "nan.npy", np.full((2, 48), np.nan))
    with pytest.raises(UserError, match="non-finite"):
        import_codebook(tmp_path / "nan.npy", 4, 3)
    with pytest.raises(UserError, match="does not exist"):
        import_codebook(tmp_path / "missing.npy", 4, 3)


def test_fit_refuses_images_past_the_pixel_limit_by_name(tmp_path, capsys):
    from PIL import Image
    from tests.unit.data.test_images import _png_header

    from pentad.cli.main import main

    folder = tmp_path / "img"
    folder.mkdir()
    Image.fromarray(blocks(1, 0)[0]).save(folder / "a.png")
    (folder / "b.png").write_bytes(_png_header(30_000, 30_000))
    fit = ["image-tokenizer", "fit", "--images", str(folder), "--output", str(tmp_path / "t.safetensors"),
           "--image-size", "16", "--patch-size", "4", "--codebook-size", "4", "--steps", "2"]
    assert main(fit) == 2
    assert "b.png is 30000x30000 = 900,000,000 pixels, more than --max-image-pixels" in capsys.readouterr().err
    (folder / "b.png").unlink()
    assert main([*fit, "--max-image-pixels", "100"]) == 2  # a.png: 16x16 = 256 pixels
    assert "a.png is 16x16 = 256 pixels, more than --max-image-pixels 100 allows" in capsys.readouterr().err
    assert main([*fit, "--max-image-pixels", "256"]) == 0
