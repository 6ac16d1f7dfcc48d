"""BEiT end to end: ``pentad image-tokenizer fit`` on a folder of synthetic images, ``pentad preprocess``
of a ``path`` corpus into images + visual tokens, and ``pentad pretrain`` of a shrunk TencentPretrain
beit/base config with the beit objective, whose masked-image-modelling loss falls; bad input named."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("PIL")

from pentad.cli.main import main  # noqa: E402
from pentad.data.image_tokenizer import ImageTokenizer  # noqa: E402
from pentad.data.images import load_images  # noqa: E402
from pentad.data.shards import ShardDataset  # noqa: E402

PALETTE = np.array([[0, 0, 0], [255, 255, 255], [220, 40, 40], [40, 40, 220]], dtype=np.uint8)
QUIET = ["train.progress=false", "train.threads=1"]


def draw_shapes(root, count: int, seed: int, jsonl: bool = False):
    """``count`` 16x16 images: a background colour and a rectangle of another (from PALETTE); and a corpus
    naming them (a ``path`` header, or JSON lines)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder = root / "img"
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(count):
        pixels = np.empty((16, 16, 3), dtype=np.uint8)
        back, front = rng.choice(len(PALETTE), size=2, replace=False)
        pixels[:] = PALETTE[back]
        top, left = (int(v) * 4 for v in rng.integers(0, 3, size=2))
        height, width = (int(v) * 4 for v in rng.integers(1, 4 - np.array([top, left]) // 4 + 1))
        pixels[top:top + height, left:left + width] = PALETTE[front]
        Image.fromarray(pixels).save(folder / f"s{i}.png")
        names.append(f"img/s{i}.png")
    corpus = root / ("shapes.jsonl" if jsonl else "shapes.tsv")
    corpus.write_text("".join(json.dumps({"path": n}) + "\n" for n in names) if jsonl else
                      "path\n" + "".join(n + "\n" for n in names), encoding="utf-8")
    return corpus


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    corpus = draw_shapes(root, 160, 0)
    tokenizer = root / "codebook.safetensors"
    assert main(["image-tokenizer", "fit", "--images", str(root / "img"), "--output", str(tokenizer),
                 "--image-size", "16", "--patch-size", "4", "--codebook-size", "16", "--steps", "60",
                 "--batch-size", "256"]) == 0
    return root, corpus, tokenizer


@pytest.fixture(scope="module")
def beit_config(tmp_path_factory):
    """A TencentPretrain BEiT config (beit/base's keys), shrunk: 16-pixel images of 4-pixel patches, width 32,
    one layer, 16 visual tokens."""
    flat = {"emb_size": 32, "feedforward_size": 64, "hidden_size": 32, "hidden_act": "gelu", "heads_num": 2,
            "layers_num": 1, "dropout": 0.0, "data_processor": "beit", "embedding": ["masked_patch", "pos"],
            "encoder": "transformer", "mask": "fully_visible", "target": ["mlm"], "image_height": 16,
            "image_width": 16, "patch_size": 4, "image_preprocess": ["crop"], "tokenizer": "vqgan",
            "image_tokenizer": {"is_gumbel": False, "is_transformer": False, "image_vocab_size": 16,
                                "frame_size": 4}}
    path = tmp_path_factory.mktemp("config") / "beit_tiny.json"
    path.write_text(json.dumps(flat))
    return path


def test_beit_preprocess_and_pretrain(shapes, beit_config, tmp_path):
    root, corpus, tokenizer_file = shapes
    config = ["--config", str(beit_config), "data.objective.type=beit",
              f"data.objective.image_tokenizer={tokenizer_file}"]
    data = tmp_path / "data"
    assert main(["preprocess", *config, f"data.corpus={corpus}", f"data.output={data}", "data.workers=2"]) == 0
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["arrays"] == {"image": {"dtype": "|u1", "shape": [16, 3]}} and manifest["num_instances"] == 160
    tokenizer = ImageTokenizer.load(tokenizer_file)
    paths = [root / line for line in corpus.read_text().splitlines()[1:]]
    images = load_images(paths, list(range(2, len(paths) + 2)), corpus, (16, 16), 3)
    stored = ShardDataset(data).take(np.arange(160))
    np.testing.assert_array_equal(stored.arrays["image"].data.reshape(-1, 16, 16, 3), images)
    np.testing.assert_array_equal(stored.tokens.reshape(160, 16), tokenizer.encode(images))  # the visual tokens
    out = tmp_path / "run"
    assert main(["pretrain", *config, *QUIET, f"data.dataset={data}", f"output={out}", "train.steps=120",
                 "train.batch_size=32", "train.lr=3e-3", "train.warmup=0.05", "train.log_every=10"]) == 0
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert losses[-1] < 0.6 * losses[0], losses
    # below the entropy of the visual tokens' frequencies: the masked tokens are predicted from the visible patches
    shares = np.bincount(stored.tokens, minlength=16) / len(stored.tokens)
    entropy = -(shares[shares > 0] * np.log(shares[shares > 0])).sum()
    assert losses[-1] < 0.8 * entropy, (losses, entropy)


def test_beit_bad_input_is_named(shapes, beit_config, tmp_path, capsys):
    root, corpus, tokenizer_file = shapes
    config = ["--config", str(beit_config), "data.objective.type=beit"]
    missing = tmp_path / "none.safetensors"
    assert main(["preprocess", *config, f"data.objective.image_tokenizer={missing}", f"data.corpus={corpus}",
                 f"data.output={tmp_path / 'a'}"]) == 2
    err = capsys.readouterr().err
    assert f"data.objective.image_tokenizer {missing} does not exist" in err and "image-tokenizer fit" in err
    assert main(["preprocess", *config, f"data.corpus={corpus}", f"data.output={tmp_path / 'b'}"]) == 2
    assert "needs data.objective.image_tokenizer=FILE" in capsys.readouterr().err
    # a codebook of 8-pixel patches for a model of 4-pixel patches
    eight = tmp_path / "eight.safetensors"
    assert main(["image-tokenizer", "fit", "--images", str(corpus), "--output", str(eight), "--image-size", "16",
                 "--patch-size", "8", "--codebook-size", "8", "--steps", "5"]) == 0
    data = tmp_path / "c"
    assert main(["preprocess", *config, f"data.objective.image_tokenizer={eight}", f"data.corpus={corpus}",
                 f"data.output={data}"]) == 0
    assert main(["pretrain", *config, *QUIET, f"data.objective.image_tokenizer={eight}", f"data.dataset={data}",
                 f"output={tmp_path / 'run'}", "train.steps=1"]) == 2
    assert "has 8-pixel patches, but the model's masked_patch part has patch_size 4" in capsys.readouterr().err
    assert main(["image-tokenizer", "fit", "--images", str(corpus), "--output", str(eight)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    # the dataset remembers the codebook: another tokenizer file is refused
    assert main(["pretrain", *config, *QUIET, f"data.objective.image_tokenizer={tokenizer_file}",
                 f"data.dataset={data}", f"output={tmp_path / 'run2'}", "train.steps=1"]) == 2
    assert "image_tokenizer_fingerprint" in capsys.readouterr().err
    bad = root / "two_columns.tsv"
    bad.write_text("label\tpath\n0\timg/s0.png\n")
    assert main(["preprocess", *config, f"data.objective.image_tokenizer={tokenizer_file}", f"data.corpus={bad}",
                 f"data.output={tmp_path / 'd'}"]) == 2
    assert "expected a header naming the column path (e.g. 'path')" in capsys.readouterr().err


def test_beit_json_lines_corpus(shapes, beit_config, tmp_path):
    root, corpus, tokenizer_file = shapes
    jsonl = draw_shapes(root, 160, 0, jsonl=True)  # the same images, named as JSON lines
    config = ["--config", str(beit_config), "data.objective.type=beit",
              f"data.objective.image_tokenizer={tokenizer_file}"]
    for name, source in (("t", corpus), ("j", jsonl)):
        assert main(["preprocess", *config, f"data.corpus={source}", f"data.output={tmp_path / name}"]) == 0
    a, b = (ShardDataset(tmp_path / n).take(np.arange(160)) for n in "tj")
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.arrays["image"].data, b.arrays["image"].data)
