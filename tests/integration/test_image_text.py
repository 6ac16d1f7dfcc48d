"""A two-tower (CLIP-style) model from the clip/base-32 recipe, shrunk, through ``pentad finetune``:
contrastive training on captioned images (digits drawn with Pillow, captions naming them), retrieval
recall in both directions on held-out pairs, zero-shot classification of the same images by class
prompts from the trained run, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pentad.cli.main import main

WORDS = ["zero", "one", "two", "three"]
CLIP = ["--config", "clip/base-32", "model.hidden_size=32", "model.max_seq_length=16",
        "model.encoder.num_layers=1", "model.encoder.num_heads=2",
        "model.encoder.ffn_size=64", "model.streams.image.hidden_size=32",
        "model.streams.image.max_seq_length=17", "model.streams.image.embedding.parts.0.image_size=16",
        "model.streams.image.embedding.parts.0.patch_size=4", "model.streams.image.encoder.num_layers=1",
        "model.streams.image.encoder.num_heads=2", "model.streams.image.encoder.ffn_size=64",
        "model.targets.0.feature_size=16", "train.progress=false", "train.threads=1", "train.batch_size=16"]


def draw(root: Path, name: str, count: int, seed: int, captions: bool) -> Path:
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    (root / "img").mkdir(parents=True, exist_ok=True)
    lines = ["text\tpath" if captions else "label\tpath"]
    for i in range(count):
        digit = int(rng.integers(0, len(WORDS)))
        image = Image.new("RGB", (16, 16), "black")
        ImageDraw.Draw(image).text((int(rng.integers(2, 6)), int(rng.integers(1, 3))), str(digit), fill="white")
        image.save(root / "img" / f"{name}{i}.png")
        first = f"the digit {WORDS[digit]}" if captions else str(digit)
        lines.append(f"{first}\timg/{name}{i}.png")
    path = root / f"{name}.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "digit", *WORDS]) + "\n")
    return {"root": root, "vocab": vocab, "train": draw(root, "train", 200, 0, True),
            "dev": draw(root, "dev", 40, 1, True), "labelled": draw(root, "labelled", 40, 2, False)}


def test_clip_trains_retrieves_and_classifies_zero_shot(data, tmp_path):
    # At this width N(0, 0.02) weights leave every text and image with nearly the same feature, so the
    # in-batch logits start uniform and their gradient vanishes; CLIP's own initialisation scales with
    # width^-0.5 (0.18 here), hence init_std=0.15.
    tokenizer = ["tokenizer.type=wordpiece", f"tokenizer.vocab={data['vocab']}"]
    run = tmp_path / "clip"
    assert main(["finetune", "--task", "image_text", *CLIP, *tokenizer, f"data.train={data['train']}",
                 f"data.dev={data['dev']}", f"output={run}", "train.epochs=10", "train.lr=1e-3",
                 "model.init_std=0.15",
                 "task.augment=null"]) == 0
    results = json.loads((run / "results.json").read_text())
    # four distinct captions: an image or text is right for every pair of the same digit (chance: 1/4)
    assert results["dev"]["i2t_r1"] > 0.6 and results["dev"]["t2i_r1"] > 0.6, results
    assert (run / "retrieval.tsv").exists() is False  # predictions come from `pentad infer`
    zero = tmp_path / "zero"
    assert main(["finetune", "--task", "zero_shot", *CLIP, f"init={run}", f"data.dev={data['labelled']}",
                 f"output={zero}", "task.template=the digit {}",
                 "task.names={'0': zero, '1': one, '2': two, '3': three}"]) == 0
    zs = json.loads((zero / "results.json").read_text())
    assert zs["dev"]["accuracy"] > 0.6, zs  # four classes: chance is 1/4


def test_image_text_refuses_a_one_stream_model(data, tmp_path, capsys):
    code = main(["finetune", "--task", "image_text", "--config", "vit/tiny-16", "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={data['vocab']}", f"data.train={data['train']}", f"output={tmp_path / 'run'}"])
    assert code == 2 and "two-tower model" in capsys.readouterr().err


def test_image_text_refuses_captions_outside_the_vocabulary_by_file_and_line(data, tmp_path, capsys):
    train = tmp_path / "train.tsv"
    rows = data["train"].read_text().splitlines()
    image = data["root"] / "img" / "train0.png"
    train.write_text("\n".join([rows[0], f"the digit one\t{image}", f"the digit five\t{image}"]) + "\n")
    code = main(["finetune", "--task", "image_text", *CLIP, "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={data['vocab']}", f"data.train={train}", f"output={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and f"{train}, line 3: the line has a caption with text outside the vocabulary" in err, err


VILT = ["--config", "vilt/base", "model.hidden_size=32", "model.max_seq_length=40",
        "model.embedding.parts.0.patch.image_size=16", "model.embedding.parts.0.patch.patch_size=4",
        "model.encoder.num_layers=2", "model.encoder.num_heads=2", "model.encoder.ffn_size=64",
        "train.progress=false", "train.threads=1", "train.batch_size=16"]


COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}


def draw_colours(root: Path, name: str, count: int, seed: int) -> Path:
    """A coloured square at a random place on grey, captioned with its colour (a binding of a word to
    what the image shows that a tiny model learns from scratch in a few hundred steps; the digits
    above take far longer to bind through matching alone)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    (root / "img").mkdir(parents=True, exist_ok=True)
    lines = ["text\tpath"]
    for i in range(count):
        colour = list(COLOURS)[int(rng.integers(0, len(COLOURS)))]
        image = Image.new("RGB", (16, 16), (128, 128, 128))
        x, y = int(rng.integers(0, 8)), int(rng.integers(0, 8))
        ImageDraw.Draw(image).rectangle((x, y, x + 7, y + 7), fill=COLOURS[colour])
        image.save(root / "img" / f"{name}{i}.png")
        lines.append(f"a {colour} square\timg/{name}{i}.png")
    path = root / f"{name}.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_vilt_learns_whether_a_caption_matches_its_image(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "square", *COLOURS]) + "\n")
    train, dev = draw_colours(tmp_path, "train", 200, 0), draw_colours(tmp_path, "dev", 60, 1)
    run = tmp_path / "vilt"
    # init_std 0.2: as for CLIP above, narrow towers from N(0, 0.02) barely let the image reach the text
    assert main(["finetune", "--task", "image_text_match", *VILT, "tokenizer.type=wordpiece", "model.init_std=0.2",
                 f"tokenizer.vocab={vocab}", f"data.train={train}", f"data.dev={dev}", f"output={run}",
                 "train.epochs=30", "train.lr=1e-3", "task.augment=null", "model.embedding.dropout=0",
                 "model.encoder.dropout=0"]) == 0
    results = json.loads((run / "results.json").read_text())
    # half the dev captions come with another file's image, which shows another colour 3 times in 4
    assert results["dev"]["itm_accuracy"] > 0.7, results
    pairs = tmp_path / "pairs.tsv"
    rows = dev.read_text().splitlines()[1:5]
    pairs.write_text("text\tpath\n" + "".join(f"{t}\t{tmp_path / p}\n" for t, p in (r.split("\t") for r in rows)))
    pred = tmp_path / "pred.tsv"
    assert main(["infer", "--model", str(run), f"data.test={pairs}", "--output", str(pred)]) == 0
    lines = pred.read_text().splitlines()
    assert lines[0] == "match\tprobability" and len(lines) == 5
