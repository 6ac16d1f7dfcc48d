"""``pentad embed --images``: image vectors from a ViT run (its encoder, pooled as its cls head pools)
and from a two-tower run's image stream (pooled as the stream is, or the clr head's projected
features), equal to what the model computes itself; image files read and normalised as the run's task
does; runs that read no images refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.data.images import NORMALISE, to_pixels
from pentad.errors import UserError
from pentad.layers.pooling import pool
from pentad.run_config import validate_raw
from pentad.runs import prepare_run_dir
from pentad.tasks.embed import ImageEmbedder, embed_file
from pentad.training.checkpoint import save_weights

TOWER = {"type": "transformer", "num_layers": 1, "num_heads": 2, "ffn_size": 32, "dropout": 0.0,
         "norm_position": "pre", "final_norm": True}
PATCH = {"type": "patch", "image_size": 16, "patch_size": 4, "channels": 3}
VIT = {"hidden_size": 16, "max_seq_length": 17,
       "embedding": {"parts": [PATCH, "pos"], "norm": False, "dropout": 0.0}, "encoder": TOWER,
       "targets": [{"type": "cls", "num_labels": 3, "pooling": "mean", "pooler": False, "dropout": 0.0}]}
CLIP = {"hidden_size": 16, "vocab_size": 30, "max_seq_length": 8, "tie_word_embeddings": False,
        "embedding": {"parts": ["word", "pos"], "norm": False, "dropout": 0.0}, "encoder": {**TOWER, "mask": "causal"},
        "streams": {"text": {"pooling": "last"},
                    "image": {"pooling": "first", "hidden_size": 24, "max_seq_length": 17,
                              "embedding": {"parts": [{**PATCH, "bias": False}, "pos"], "dropout": 0.0},
                              "encoder": TOWER}},
        "targets": [{"type": "clr", "projection": True, "feature_size": 12}]}


def make_run(run_dir: Path, model: dict, task: dict):
    cfg = validate_raw({"model": model, "task": task}, {}, "test")
    torch.manual_seed(0)
    net = build_model(cfg.model).eval()
    prepare_run_dir(run_dir, cfg, None)
    save_weights(net, run_dir / "model.safetensors")
    return cfg, net


def image_files(folder: Path, count: int = 5) -> tuple[Path, np.ndarray]:
    """``count`` random 16x16 RGB PNG files and a TSV naming them (with a label column, ignored)."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (count, 16, 16, 3), dtype=np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["label\tpath"]
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / f"{i}.png")
        lines.append(f"x\t{i}.png")
    (folder / "images.tsv").write_text("\n".join(lines) + "\n")
    return folder / "images.tsv", images


def test_vit_vectors_are_its_pooled_encoder_states(tmp_path):
    cfg, net = make_run(tmp_path / "run", VIT, {"type": "image_classification", "normalise": "imagenet"})
    tsv, images = image_files(tmp_path / "img")
    out = tmp_path / "v.npy"
    described = embed_file(tmp_path / "run", tsv, out, images=True, batch_size=2, device="cpu")
    assert described["images"] == {"stream": None, "size": [16, 16], "channels": 3, "normalise": "imagenet"}
    assert described["pooling"] == "mean" and described["count"] == 5 and not described["projected"]
    assert json.loads(out.with_suffix(".json").read_text()) == described
    with torch.no_grad():
        hidden, mask = net.encode(Batch(pixels=to_pixels(images, *NORMALISE["imagenet"])))
    np.testing.assert_allclose(np.load(out), pool(hidden, mask, "mean").numpy(), rtol=1e-5, atol=1e-6)
    first = embed_file(tmp_path / "run", tsv, tmp_path / "f.npy", pooling="first", images=True, device="cpu")
    assert first["pooling"] == "first"
    np.testing.assert_allclose(np.load(tmp_path / "f.npy"), hidden[:, 0].numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(UserError, match="has one stream; projected features belong to a two-stream"):
        embed_file(tmp_path / "run", tsv, tmp_path / "p.npy", images=True, projected=True, device="cpu")
    with pytest.raises(UserError, match="--similarity scores text pairs"):
        embed_file(tmp_path / "run", tsv, tmp_path / "s.tsv", images=True, similarity=True, device="cpu")


def test_two_tower_vectors_come_from_the_image_stream(tmp_path):
    cfg, net = make_run(tmp_path / "run", CLIP, {"type": "image_text"})
    tsv, images = image_files(tmp_path / "img")
    described = embed_file(tmp_path / "run", tsv, tmp_path / "v.npy", images=True, device="cpu")
    assert described["images"]["stream"] == "image" and described["images"]["normalise"] == "clip"
    assert described["pooling"] == "first" and described["dim"] == 24
    batch = Batch(pixels=to_pixels(images, *NORMALISE["clip"]))
    with torch.no_grad():
        pooled = net.encode_stream(batch, "image")
        features = net.targets["clr"].stream_features(pooled, 1)
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), pooled.numpy(), rtol=1e-5, atol=1e-6)
    projected = embed_file(tmp_path / "run", tsv, tmp_path / "p.npy", images=True, projected=True, device="cpu")
    assert projected["projected"] and projected["dim"] == 12
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), features.numpy(), rtol=1e-5, atol=1e-6)
    assert np.allclose(np.linalg.norm(np.load(tmp_path / "p.npy"), axis=1), 1.0, atol=1e-5)


def test_runs_that_read_no_images_are_refused(tmp_path):
    text = {**VIT, "vocab_size": 30, "embedding": {"parts": ["word", "pos"], "dropout": 0.0}}
    cfg, net = make_run(tmp_path / "text", text, {"type": "classification"})
    with pytest.raises(UserError, match="reads no images: its embedding slot has no patch part"):
        ImageEmbedder(net, cfg, None, torch.device("cpu"), run_dir=tmp_path / "text")
    vilt = {**text, "max_seq_length": 32,
            "embedding": {"parts": [{"type": "word_patch", "patch": {"image_size": 16, "patch_size": 4}}, "pos"],
                          "dropout": 0.0}}
    cfg, net = make_run(tmp_path / "vilt", vilt, {"type": "classification"})
    with pytest.raises(UserError, match="one sequence \\(word_patch, ViLT-style\\)"):
        ImageEmbedder(net, cfg, None, torch.device("cpu"), run_dir=tmp_path / "vilt")


def test_a_missing_image_names_the_file_and_line(tmp_path):
    make_run(tmp_path / "run", VIT, {"type": "image_classification"})
    tsv, _ = image_files(tmp_path / "img", 2)
    (tmp_path / "img" / "1.png").unlink()
    with pytest.raises(UserError, match=r"images.tsv, line 3: image .*1.png"):
        embed_file(tmp_path / "run", tsv, tmp_path / "v.npy", images=True, device="cpu")
