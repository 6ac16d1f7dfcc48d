"""``pentad finetune --task image_classification`` and ``pentad infer`` on PNG files: digits drawn with
Pillow's built-in font at jittered places and in random shades (no tokenizer involved), a tiny ViT
from random weights, its predictions file, top-5, augmentation that is seeded, and bad input
named by file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.unit.data.test_images import _png_header

from pentad.cli.main import main

VIT = ["--config", "vit/tiny-16", "model.embedding.parts.0.image_size=16", "model.embedding.parts.0.patch_size=4",
       "model.max_seq_length=17", "model.hidden_size=32", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
       "model.encoder.ffn_size=64", "train.progress=false", "train.threads=1"]


def draw_digits(root: Path, name: str, count: int, seed: int, mode: str = "RGB") -> Path:
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    (root / "img").mkdir(parents=True, exist_ok=True)
    lines = ["label\tpath"]
    for i in range(count):
        digit = int(rng.integers(0, 3))
        image = Image.new(mode, (16, 16), "black")
        shade = int(rng.integers(150, 256))
        ImageDraw.Draw(image).text((int(rng.integers(2, 6)), int(rng.integers(1, 3))), str(digit),
                                   fill=(shade,) * 3 if mode == "RGB" else shade)
        image.save(root / "img" / f"{name}{i}.png")
        lines.append(f"{digit}\timg/{name}{i}.png")
    path = root / f"{name}.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits")
    return {"root": root, "train": draw_digits(root, "train", 150, 0), "dev": draw_digits(root, "dev", 40, 1),
            "test": draw_digits(root, "test", 40, 2, mode="L")}


def test_vit_learns_digits_and_infers(digits, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["finetune", "--task", "image_classification", *VIT, f"data.train={digits['train']}",
                 f"data.dev={digits['dev']}", f"data.test={digits['test']}", f"output={out}", "train.epochs=20",
                 "train.batch_size=16", "train.lr=2e-3", "task.augment=null", "data.loader_workers=1"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["test"]["accuracy"] > 0.8, results  # three classes: chance is 1/3; measured 0.95
    assert results["test"]["top5"] == 1.0  # three classes: always in the top five
    assert "converted 40 L image(s) to RGB" in capsys.readouterr().err
    assert not (out / "tokenizer").exists()
    unlabelled = tmp_path / "in.tsv"
    rows = digits["test"].read_text().splitlines()[1:6]
    unlabelled.write_text("path\n" + "".join(f"{digits['root'] / r.split(chr(9))[1]}\n" for r in rows))
    pred = tmp_path / "pred.tsv"
    assert main(["infer", "--model", str(out), f"data.test={unlabelled}", "--output", str(pred),
                 "--probabilities"]) == 0
    lines = pred.read_text().splitlines()
    assert lines[0] == "label\tprob_0\tprob_1\tprob_2" and len(lines) == 6


def test_augmentation_is_seeded_and_only_in_training(digits):
    from pentad.assembly import load_config
    from pentad.registry import TASKS

    cfg = load_config("vit/tiny-16", [*VIT[2:-2], f"data.train={digits['train']}"])
    task = TASKS.get("image_classification")(cfg.task, None, 17)
    task.bind(cfg)
    task.fit(digits["train"])
    instances = task.read(digits["train"])
    a = next(task.train_batches(instances, 8, seed=3).iterate(2)).pixels
    b = next(task.train_batches(instances, 8, seed=3).iterate(2)).pixels
    c = next(task.train_batches(instances, 8, seed=4).iterate(2)).pixels
    assert a.equal(b) and not a.equal(c)
    # loader workers build the very same batches, in order, resuming at any micro-batch
    for workers in (1, 2):
        batches = task.train_batches(instances, 8, seed=3)
        batches.num_workers = workers
        stream, alone = batches.iterate(17), task.train_batches(instances, 8, seed=3).iterate(17)
        for _ in range(4):  # across the epoch boundary (19 batches of 8 per epoch)
            ours, reference = next(stream), next(alone)
            assert ours.pixels.equal(reference.pixels) and ours.labels["cls"].equal(reference.labels["cls"])
    assert not a.equal(next(task.train_batches(instances, 8, seed=3).iterate(3)).pixels)
    plain = task.collate(instances, np.arange(8), np.random.default_rng(0)).pixels
    assert plain.equal(task.collate(instances, np.arange(8), np.random.default_rng(1)).pixels)
    assert plain.shape == (8, 3, 16, 16) and float(plain.min()) >= -1.0 and float(plain.max()) <= 1.0


def test_bad_images_are_named_by_file_and_line(digits, tmp_path, capsys):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "broken.png").write_bytes(b"not an image")
    png = (digits["root"] / "img" / "train0.png").read_bytes()
    (tmp_path / "img" / "cut.png").write_bytes(png[: len(png) // 2])
    (tmp_path / "img" / "bomb.png").write_bytes(_png_header(30_000, 30_000))
    good = f"0\t{digits['root'] / 'img' / 'train1.png'}\n"
    cases = {"label\tpath\n1\timg/missing.png\n": "line 2: image", "label\tpath\n1\timg/broken.png\n":
             "not an image file", "label\tpath\n1\timg/cut.png\n": "truncated",
             "label\tpath\n1\timg/bomb.png\n": "is 30000x30000 = 900,000,000 pixels, more than data.max_image_pixels",
             "label\tpath\n1\timg\n": "img is a directory, not an image file",
             "label\ttext\n1\tx.png\n": "expected a header line 'label<TAB>path'",
             "label\tpath\n": "has no examples"}
    for i, (text, expected) in enumerate(cases.items()):
        train = tmp_path / f"train{i}.tsv"
        train.write_text(text + (good if "\n1\t" in text else ""))
        code = main(["finetune", "--task", "image_classification", *VIT, f"data.train={train}",
                     f"output={tmp_path / f'run{i}'}", "train.epochs=1"])
        err = capsys.readouterr().err
        assert code == 2 and expected in err and str(train) in err, err
    single = tmp_path / "single.tsv"
    single.write_text("label\tpath\n" + good)
    assert main(["finetune", "--task", "image_classification", *VIT, f"data.train={single}",
                 f"output={tmp_path / 'single'}"]) == 2
    assert "at least two classes" in capsys.readouterr().err


def test_a_text_model_is_refused_with_the_reason(digits, tmp_path, capsys):
    code = main(["finetune", "--task", "image_classification", "--config", "bert/tiny", "model.vocab_size=100",
                 f"data.train={digits['train']}", f"output={tmp_path / 'run'}"])
    assert code == 2 and "needs a 'patch' part" in capsys.readouterr().err


def test_fine_tuning_at_another_image_size_interpolates_the_positions(digits, tmp_path, capsys):
    first = tmp_path / "at16"
    assert main(["finetune", "--task", "image_classification", *VIT, f"data.train={digits['train']}",
                 f"output={first}", "train.epochs=1", "train.batch_size=32"]) == 0
    bigger = [v for v in VIT if not v.startswith(("model.embedding.parts.0.image_size", "model.max_seq_length"))]
    second = tmp_path / "at24"
    assert main(["finetune", "--task", "image_classification", *bigger, "model.embedding.parts.0.image_size=24",
                 "model.max_seq_length=37", f"init={first}", f"data.train={digits['train']}", f"output={second}",
                 "train.epochs=1", "train.batch_size=32"]) == 0
    assert "embedding.pos.weight: positions of a 4x4 patch grid interpolated to 6x6" in capsys.readouterr().err

    import torch

    from pentad.assembly import load_config
    from pentad.builder import build_model

    small = build_model(load_config("vit/tiny-16", [*VIT[2:-2], "model.targets.0.num_labels=3"]).model)
    big = build_model(load_config("vit/tiny-16", [*bigger[2:-2], "model.embedding.parts.0.image_size=24",
                                                  "model.max_seq_length=37", "model.targets.0.num_labels=3"]).model)
    tensors = dict(small.state_dict())
    notes = big.adapt_checkpoint(tensors)
    table = tensors["embedding.pos.weight"]
    assert len(notes) == 1 and table.shape == (37, 32)
    assert torch.equal(table[0], small.embedding.pos.weight[0])  # CLS kept
    # a constant grid stays constant under bicubic resizing
    tensors = dict(small.state_dict())
    tensors["embedding.pos.weight"] = torch.ones(17, 32)
    big.adapt_checkpoint(tensors)
    torch.testing.assert_close(tensors["embedding.pos.weight"][1:], torch.ones(36, 32))


def test_the_random_affine_is_set_from_the_task_and_seeded(digits):
    from pentad.assembly import load_config
    from pentad.registry import TASKS

    cfg = load_config("vit/tiny-16", [*VIT[2:-2], f"data.train={digits['train']}", "task.augment.crop_scale=null",
                                      "task.augment.flip=false", "task.augment.translate=0.25",
                                      "task.augment.rotate=15", "task.augment.zoom=[0.9,1.1]",
                                      "task.augment.shear=10"])
    assert cfg.task.augment.affine and cfg.task.augment.zoom == [0.9, 1.1]
    task = TASKS.get("image_classification")(cfg.task, None, 17)
    task.bind(cfg)
    task.fit(digits["train"])
    instances = task.read(digits["train"])
    a = next(task.train_batches(instances, 8, seed=3).iterate(2))
    b = next(task.train_batches(instances, 8, seed=3).iterate(2))
    c = next(task.train_batches(instances, 8, seed=4).iterate(2))
    assert a.pixels.equal(b.pixels) and not a.pixels.equal(c.pixels)
    plain = task.collate(instances, np.arange(len(instances)), None).pixels
    # every image of the batch is warped (none equals any stored image), and the shapes are kept
    assert a.pixels.shape == (8, 3, 16, 16)
    assert not any(a.pixels[i].equal(p) for i in range(8) for p in plain)


def test_mixup_and_cutmix_train_from_the_cli_on_soft_targets(digits, tmp_path):
    from pentad.assembly import load_config
    from pentad.registry import TASKS

    cfg = load_config("vit/tiny-16", [*VIT[2:-2], f"data.train={digits['train']}", "task.mix={}"])
    assert cfg.task.mix.mixup == 0.8 and cfg.task.mix.cutmix == 1.0
    task = TASKS.get("image_classification")(cfg.task, None, 17)
    task.bind(cfg)
    task.fit(digits["train"])
    instances = task.read(digits["train"])
    batch = next(task.train_batches(instances, 8, seed=3).iterate(0))
    targets = batch.labels["cls"]
    assert targets.shape == (8, 3) and targets.dtype == torch.float32
    assert targets.sum(1).allclose(torch.ones(8)) and (targets.max(1).values < 1).any()
    # evaluation batches keep the class ids
    assert task.collate(instances, np.arange(4), None).labels["cls"].dtype == torch.int64
    out = tmp_path / "run"
    assert main(["finetune", "--task", "image_classification", *VIT, f"data.train={digits['train']}",
                 f"data.dev={digits['dev']}", f"output={out}", "train.epochs=2", "train.batch_size=16",
                 "task.mix.mixup=0.4", "task.mix.switch=0.3", "model.encoder.drop_path=0.1"]) == 0
    from pentad.runs import load_run

    saved, _ = load_run(out)  # the run records both, so a resumed or repeated run trains the same way
    assert saved.task.mix.mixup == 0.4 and saved.task.mix.switch == 0.3 and saved.model.encoder.drop_path == 0.1
    assert "accuracy" in json.loads((out / "results.json").read_text())["dev"]
