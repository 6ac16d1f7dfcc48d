"""DALL-E style text -> image tokens end to end: an image tokenizer fitted on coloured squares,
``pentad preprocess`` of captioned images into ``[CLS] caption [SEP]`` + image tokens (ids after the
text vocabulary), ``pentad pretrain`` of a small prefix LM whose loss over the image tokens falls,
and :func:`pentad.generation.images.generate_images`, whose images for a caption show its colour;
bad input named."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("PIL")

from tests.integration.test_image_text import COLOURS, draw_colours  # noqa: E402

from pentad.cli.main import main  # noqa: E402
from pentad.data.shards import ShardDataset  # noqa: E402

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "square", *COLOURS]
CODES = 8
MODEL = ["model.hidden_size=64", "model.max_seq_length=24",
         "model.embedding.parts=[word, pos, {type: seg, num_segments: 2}]", "model.embedding.norm=false",
         "model.embedding.dropout=0.0", "model.encoder.num_layers=2", "model.encoder.num_heads=4",
         "model.encoder.ffn_size=128", "model.encoder.mask=prefix", "model.encoder.dropout=0.0",
         "model.targets=[{type: lm}]", "train.progress=false", "train.threads=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("dalle")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(WORDS) + "\n")
    train = draw_colours(root, "train", 240, 0)
    codebook = root / "codebook.safetensors"
    assert main(["image-tokenizer", "fit", "--images", str(train), "--output", str(codebook), "--image-size", "16",
                 "--patch-size", "4", "--codebook-size", str(CODES), "--steps", "60", "--batch-size", "256"]) == 0
    return root, vocab, train, codebook


def _objective(vocab, codebook):
    return ["--config", "gpt2/tiny", "tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}",
            "data.objective.type=dalle", "data.objective.image_size=16", "data.objective.seq_length=24",
            "data.objective.text_length=6", f"data.objective.image_tokenizer={codebook}"]


def test_dalle_preprocess_pretrain_and_generate(corpus, tmp_path):
    root, vocab, train, codebook = corpus
    data = tmp_path / "data"
    assert main(["preprocess", *_objective(vocab, codebook), f"data.corpus={train}", f"data.output={data}",
                 "data.workers=2"]) == 0
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["image_tokenizer"]["offset"] == len(WORDS) and manifest["image_tokenizer"]["grid"] == [4, 4]
    first = ShardDataset(data).take([0])
    ids = first.sequence(0).tolist()
    assert ids[0] == 2 and ids[4] == 3 and len(ids) == 5 + 16 and min(ids[5:]) >= len(WORDS)  # [CLS] a c square [SEP]
    out = tmp_path / "run"
    assert main(["pretrain", *_objective(vocab, codebook), *MODEL, f"data.dataset={data}", f"output={out}",
                 "train.steps=200", "train.batch_size=16", "train.lr=3e-3", "train.warmup=0.05",
                 "train.log_every=20"]) == 0
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert losses[-1] < 0.6 * losses[0], losses
    from pentad.data.image_tokenizer import ImageTokenizer
    from pentad.generation.images import generate_images
    from pentad.generation.text import load_model

    model, _, tokenizer = load_model(out)
    captions = [f"a {colour} square" for colour in COLOURS]
    images, tokens = generate_images(model, tokenizer, ImageTokenizer.load(codebook), captions, (4, 4), text_length=6)
    assert images.shape == (4, 16, 16, 3) and tokens.shape == (4, 16) and tokens.max() < CODES
    palette = np.array(list(COLOURS.values()), dtype=np.float64)
    right = 0
    for colour, image in zip(COLOURS, images):  # the most saturated pixels lie nearest the caption's colour
        pixels = image.reshape(-1, 3).astype(np.float64)
        vivid = pixels[np.abs(pixels - 128).sum(axis=1).argsort()[-16:]].mean(axis=0)
        right += list(COLOURS)[int(np.abs(palette - vivid).sum(axis=1).argmin())] == colour
    assert right >= 3, right
    sampled, _ = generate_images(model, tokenizer, ImageTokenizer.load(codebook), captions[:1], (4, 4),
                                 text_length=6, do_sample=True, seed=1)
    assert sampled.shape == (1, 16, 16, 3)


def test_bad_input(corpus, tmp_path, capsys):
    root, vocab, train, codebook = corpus
    args = ["preprocess", "--config", "gpt2/tiny", "tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}",
            "data.objective.type=dalle", "data.objective.image_size=16", f"data.corpus={train}"]
    assert main([*args, f"data.output={tmp_path / 'a'}"]) == 2
    assert "needs data.objective.image_tokenizer=FILE" in capsys.readouterr().err
    assert main([*args, f"data.objective.image_tokenizer={codebook}", "data.objective.seq_length=12",
                 f"data.output={tmp_path / 'b'}"]) == 2
    assert "shorter than text_length 64 plus the image's 16 tokens" in capsys.readouterr().err
    data = tmp_path / "c"
    assert main([*args, f"data.objective.image_tokenizer={codebook}", "data.objective.seq_length=24",
                 "data.objective.text_length=6", f"data.output={data}"]) == 0
    assert main(["pretrain", *_objective(vocab, codebook), *MODEL, "model.max_seq_length=16",
                 f"data.dataset={data}", f"output={tmp_path / 'run'}", "train.steps=1"]) == 2
    assert "model.max_seq_length 16 is shorter than data.objective.seq_length 24" in capsys.readouterr().err
