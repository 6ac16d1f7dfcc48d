"""Image objectives: ``pentad preprocess`` decodes ``label<TAB>path`` (``vit``) and ``text<TAB>path``
(``clip``) corpora, or their JSON lines, in its worker processes into typed uint8 shards, the very
pixels the image tasks read; no tokenizer for ``vit``; bad lines named or skipped; ``pentad
pretrain`` trains a ViT (its loss falls) and a CLIP from the memory-mapped images, with seeded
augmentation in the loader."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("PIL")

from tests.integration.test_image_classification import VIT, draw_digits  # noqa: E402
from tests.integration.test_image_text import CLIP, WORDS, draw  # noqa: E402
from tests.unit.data.test_images import _png_header  # noqa: E402

from pentad.cli.main import main  # noqa: E402
from pentad.data.images import load_images  # noqa: E402
from pentad.data.shards import ShardDataset  # noqa: E402

VIT_OBJECTIVE = ["data.objective.type=vit", "data.objective.image_size=16"]


def _no_task(args):
    return [a for a in args if not a.startswith(("task.", "train.batch_size"))]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "digit", *WORDS]) + "\n")
    return root, vocab, draw_digits(root, "digits", 96, 0), draw(root, "captions", 48, 1, True)


def test_vit_preprocess_and_pretrain(images, tmp_path):
    root, _, digits, _ = images
    data = tmp_path / "data"
    assert main(["preprocess", *_no_task(VIT), *VIT_OBJECTIVE, f"data.corpus={digits}", f"data.output={data}",
                 "data.workers=2"]) == 0
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["tokenizer"] is None and manifest["arrays"] == {"image": {"dtype": "|u1", "shape": [16, 3]}}
    rows = [r.split("\t") for r in digits.read_text().splitlines()[1:]]
    reference = load_images([root / p for _, p in rows], list(range(len(rows))), digits, (16, 16), 3)
    got = ShardDataset(data).take(np.arange(len(rows)))
    np.testing.assert_array_equal(got.arrays["image"].data.reshape(-1, 16, 16, 3), reference)
    names = manifest["label_map"]
    assert names["num_labels"] == 3
    out = tmp_path / "run"
    assert main(["pretrain", *_no_task(VIT), *VIT_OBJECTIVE, "data.objective.augment=null",
                 "model.targets=[{type: cls, num_labels: 3, pooler: false}]", f"data.dataset={data}",
                 f"output={out}", "train.steps=150", "train.batch_size=16", "train.lr=2e-3", "train.warmup=0.05",
                 "train.log_every=10"]) == 0
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert losses[-1] < 0.9 < losses[0], losses  # three classes: chance is ln 3 = 1.10


def test_clip_preprocess_and_pretrain_with_augmentation(images, tmp_path):
    root, vocab, _, captions = images
    tokenizer = ["tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}"]
    objective = ["data.objective.type=clip", "data.objective.image_size=16", "data.objective.seq_length=16"]
    data = tmp_path / "data"
    assert main(["preprocess", *_no_task(CLIP), *tokenizer, *objective, f"data.corpus={captions}",
                 f"data.output={data}"]) == 0
    from pentad.data.objectives.vision import ClipObjective, ClipObjectiveConfig
    from pentad.data.tokenizers import load_tokenizer

    objective_ = ClipObjective(ClipObjectiveConfig(image_size=16, seq_length=16),
                               load_tokenizer({"type": "wordpiece", "vocab": str(vocab)}))
    instances = ShardDataset(data).take([0, 1, 2, 3])
    one, two = (objective_.collate(instances, np.random.default_rng(s)) for s in (7, 7))
    assert one.tokens.tolist() == two.tokens.tolist() and one.pair.pixels.equal(two.pair.pixels)  # seeded
    assert tuple(one.pair.pixels.shape) == (4, 3, 16, 16) and one.tokens[0, 0].item() == 2  # [CLS] ...
    other = objective_.collate(instances, np.random.default_rng(8))
    assert not other.pair.pixels.equal(one.pair.pixels)  # another batch seed: other crops and flips
    assert main(["pretrain", *_no_task(CLIP), *tokenizer, *objective, "model.init_std=0.15", f"data.dataset={data}",
                 f"output={tmp_path / 'run'}", "train.steps=4", "train.batch_size=8"]) == 0


def test_json_lines_bad_lines_and_missing_header(images, tmp_path, capsys):
    root, _, digits, _ = images
    rows = [r.split("\t") for r in digits.read_text().splitlines()[1:]]
    jsonl = root / "digits.jsonl"
    jsonl.write_text("".join(json.dumps({"label": a, "path": b}) + "\n" for a, b in rows[:10]))
    assert main(["preprocess", *_no_task(VIT), *VIT_OBJECTIVE, f"data.corpus={jsonl}",
                 f"data.output={tmp_path / 'j'}"]) == 0
    assert main(["preprocess", *_no_task(VIT), *VIT_OBJECTIVE, f"data.corpus={digits}",
                 f"data.output={tmp_path / 't'}"]) == 0
    a = ShardDataset(tmp_path / "j").take(np.arange(10)).arrays["image"].data
    b = ShardDataset(tmp_path / "t").take(np.arange(10)).arrays["image"].data
    np.testing.assert_array_equal(a, b)
    bad = root / "bad.tsv"
    (root / "junk.png").write_bytes(b"not an image")
    (root / "bomb.png").write_bytes(_png_header(30_000, 30_000))  # a decompression bomb's header: 900 MP
    bad.write_text("label\tpath\n" + "\n".join("\t".join(r) for r in rows[:3])
                   + "\n1\tmissing.png\n2\tjunk.png\n3\tbomb.png\n")
    assert main(["preprocess", *_no_task(VIT), *VIT_OBJECTIVE, f"data.corpus={bad}",
                 f"data.output={tmp_path / 'b'}"]) == 2
    assert "bad.tsv, line 5: the line names the image" in capsys.readouterr().err and not (tmp_path / "b").exists()
    assert main(["preprocess", *_no_task(VIT), *VIT_OBJECTIVE, f"data.corpus={bad}", f"data.output={tmp_path / 'b'}",
                 "data.on_bad_line=skip"]) == 0
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["num_instances"] == 3 and manifest["skipped_lines"]["count"] == 3
    assert "more than data.max_image_pixels" in manifest["skipped_lines"]["examples"][2]["reason"]
    headerless = root / "headerless.tsv"
    headerless.write_text("\n".join("\t".join(r) for r in rows[:3]) + "\n")
    assert main(["preprocess", *_no_task(VIT), *VIT_OBJECTIVE, f"data.corpus={headerless}",
                 f"data.output={tmp_path / 'h'}"]) == 2
    assert "expected a header naming the columns label and path" in capsys.readouterr().err


def test_vilt_objective_matching_and_masking(tmp_path):
    from tests.integration.test_image_text import COLOURS, VILT, draw_colours

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "square", *COLOURS]) + "\n")
    corpus = draw_colours(tmp_path, "train", 96, 0)
    tokenizer = ["tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}"]
    objective = ["data.objective.type=vilt", "data.objective.image_size=16", "data.objective.patch_size=4",
                 "data.objective.seq_length=8", "data.objective.augment=null"]
    data = tmp_path / "data"
    assert main(["preprocess", *_no_task(VILT), *tokenizer, *objective, f"data.corpus={corpus}",
                 f"data.output={data}"]) == 0
    from pentad.data.objectives.vision import ViltObjective, ViltObjectiveConfig
    from pentad.data.tokenizers import load_tokenizer

    vilt = ViltObjective(ViltObjectiveConfig(image_size=16, patch_size=4, seq_length=8, augment=None),
                         load_tokenizer({"type": "wordpiece", "vocab": str(vocab)}))
    instances = ShardDataset(data).take(np.arange(32))
    batch = vilt.collate(instances, np.random.default_rng(3))
    negative = batch.labels["sp"].numpy().astype(bool)
    assert 0.2 < negative.mean() < 0.8 and tuple(batch.pixels.shape) == (32, 3, 16, 16)
    own = vilt.collate(instances, np.random.default_rng(3))  # the same seed: the same pairing and masks
    assert own.labels["sp"].equal(batch.labels["sp"]) and own.tokens.equal(batch.tokens)
    plain = vilt.pixels(instances, np.random.default_rng(0))
    for row in range(32):  # matched rows show their own image, mismatched rows another row's
        assert batch.pixels[row].equal(plain[row]) != negative[row]
    texts = batch.tokens.shape[1]
    assert batch.labels["mlm"].shape == (32, texts + 17) and (batch.labels["mlm"][:, texts:] == -100).all()
    assert batch.segments[:, texts:].eq(1).all() and batch.segments[:, :texts].eq(0).all()
    assert (batch.labels["mlm"] != -100).sum() > 0
    out = tmp_path / "run"
    assert main(["pretrain", *_no_task(VILT), *tokenizer, *objective, "model.init_std=0.2", f"data.dataset={data}",
                 f"output={out}", "train.steps=6", "train.batch_size=16"]) == 0
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"mlm_loss", "sp_loss"} <= set(last), last
