"""Captions of the image-text objectives and tasks: text outside the vocabulary and captions longer
than the sequence allows are refused by file and line (bad lines for preprocess), as the asr task and
the s2t objective refuse such transcripts; never silently cut or turned into [UNK]."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PIL")

from pentad.data.corpus import BadLine  # noqa: E402
from pentad.data.tokenizers import load_tokenizer  # noqa: E402
from pentad.errors import UserError  # noqa: E402


@pytest.fixture
def captioned(tmp_path):
    from PIL import Image

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "square"]) + "\n")
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "x.png")
    return load_tokenizer({"type": "wordpiece", "vocab": str(vocab)}), tmp_path


def test_clip_and_vilt_objectives_refuse_unknown_or_over_long_captions_as_bad_lines(captioned):
    from pentad.data.objectives.vision import ClipObjective, ClipObjectiveConfig, ViltObjective, ViltObjectiveConfig

    tokenizer, folder = captioned
    for objective in (ClipObjective(ClipObjectiveConfig(image_size=8, seq_length=5), tokenizer),
                      ViltObjective(ViltObjectiveConfig(image_size=8, patch_size=4, seq_length=5), tokenizer)):
        context = (folder, 0)  # header 'text<TAB>path'
        ids, image = objective.parse_line("a red square\tx.png", context)
        assert ids == tokenizer.encode("a red square") and image.shape == (8, 8, 3)
        unknown = r"has a caption with text outside the vocabulary \('b', 'l', 'u', 'e'\), which would become the"
        with pytest.raises(BadLine, match=unknown):
            objective.parse_line("a blue square\tx.png", context)
        with pytest.raises(BadLine, match="has a caption of 4 tokens; data.objective.seq_length allows 3"):
            objective.parse_line("a red red square\tmissing.png", context)  # refused before the image is read
        sequences = objective.build([objective.parse_line("a red\tx.png", context)], np.random.default_rng(0))
        assert list(sequences.sequence(0)) == [tokenizer.cls_id, *tokenizer.encode("a red"), tokenizer.sep_id]


def test_image_text_tasks_refuse_unknown_or_over_long_captions_by_file_and_line(captioned):
    from pentad.tasks.image_text import encode_captions

    tokenizer, folder = captioned
    path = folder / "train.tsv"
    good = encode_captions([("a red square", "x.png", 2)], path, tokenizer, 5)
    assert list(good.sequence(0)) == [tokenizer.cls_id, *tokenizer.encode("a red square"), tokenizer.sep_id]
    with pytest.raises(UserError, match=rf"{path}, line 3: the line has a caption with text outside the vocabulary "
                                        r"\('b', 'l', 'u', 'e'\)"):
        encode_captions([("a red square", "x.png", 2), ("a blue square", "x.png", 3)], path, tokenizer, 5)
    with pytest.raises(UserError, match=rf"{path}, line 2: the line has a caption of 4 tokens; the sequence length"):
        encode_captions([("a red red square", "x.png", 2)], path, tokenizer, 5)


def test_zero_shot_refuses_a_class_text_outside_the_vocabulary(captioned):
    from pentad.tasks.image_text import ZeroShotTask, ZeroShotTaskConfig

    tokenizer, folder = captioned
    task = ZeroShotTask(ZeroShotTaskConfig(labels=["r", "b"], template="a {} square", names={"r": "red"}),
                        tokenizer, 8)
    task.fit(folder / "unused.tsv")
    with pytest.raises(UserError, match=r"zero_shot: the class 'b', whose text is 'a b square' .* has a class text "
                                        r"with text outside the vocabulary \('b'\)"):
        task.encoded_prompts()
    task.cfg.names["b"] = "red"
    assert len(task.encoded_prompts()) == 2
