"""The asr task's transcripts against the tokenizer's vocabulary: text outside it (what would become
the unknown token without being it literally) fails by file, line, characters and tokenizer with
exit status 2 and nothing written, or is skipped and counted with ``task.audio.on_bad: skip``.
Audio is a short tone per utterance, so no speech synthesiser is needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("soundfile")
pytest.importorskip("kaldi_native_fbank")
pytest.importorskip("jiwer")

import soundfile  # noqa: E402

from pentad.cli.main import main  # noqa: E402
from pentad.errors import UserError  # noqa: E402
from pentad.layout import LOCK

WORDS = ["zero", "one", "two", "three"]
S2T = ["model.hidden_size=32", "model.encoder.num_layers=1", "model.decoder.num_layers=1",
       "model.encoder.num_heads=2", "model.decoder.num_heads=2", "model.encoder.ffn_size=64",
       "model.decoder.ffn_size=64", "model.embedding.parts.0.conv_channels=[64,64]",
       "model.embedding.parts.0.feature_size=40", "task.audio.feature_size=40", "model.max_seq_length=16",
       "task.target_seq_length=8", "task.audio.specaugment=null", "train.progress=false", "train.threads=1"]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("asr_vocab")
    (root / "wav").mkdir()
    t = np.arange(1600) / 16000
    for i in range(4):
        soundfile.write(root / "wav" / f"u{i}.wav", (0.3 * np.sin(2 * np.pi * (300 + 200 * i) * t)).astype(np.float32),
                        16000)
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    (root / "chars.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"zeronthw"]) + "\n")
    return root


def _tsv(root: Path, name: str, texts: list[str]) -> Path:
    path = root / f"{name}.tsv"
    path.write_text("text\tpath\n" + "".join(f"{t}\twav/u{i % 4}.wav\n" for i, t in enumerate(texts)),
                    encoding="utf-8")
    return path


def _task(root: Path, tokenizer: str, *overrides: str):
    from pentad.assembly import load_config
    from pentad.data.tokenizers import load_tokenizer
    from pentad.registry import TASKS

    cfg = load_config("s2t/small", [*S2T, *overrides])
    vocab = root / ("chars.txt" if tokenizer == "char" else "vocab.txt")
    task = TASKS.get("asr")(cfg.task, load_tokenizer({"type": tokenizer, "vocab": str(vocab)}), 16)
    task.bind(cfg)
    return task


def test_text_outside_the_vocabulary_is_refused_by_file_line_characters_and_tokenizer(root):
    path = _tsv(root, "bad_wordpiece", ["one two", "zero", "one twø", "ßero"])
    with pytest.raises(UserError) as caught:
        _task(root, "wordpiece").read(path)
    message = str(caught.value)
    assert f"{path}, line 4:" in message and "'ø' (U+00F8)" in message and "(1 more line(s) like it)" in message
    assert "wordpiece tokenizer (vocab" in message and "'[UNK]'" in message and "on_bad: skip" in message
    # a char vocabulary: the characters it lacks, each once; a space vocabulary: the words
    path = _tsv(root, "bad_char", ["one", "zero two", "oxo x"])
    with pytest.raises(UserError, match=r"line 4: .*'x' \(U\+0078\); it would"):
        _task(root, "char").read(path)
    path = _tsv(root, "bad_space", ["one", "one four"])
    with pytest.raises(UserError, match="line 3: .*the word 'four'; it would"):
        _task(root, "space").read(path)


def test_the_literal_unknown_token_is_not_outside_the_vocabulary(root):
    path = _tsv(root, "literal", ["one [UNK] two", "zero"])
    data = _task(root, "wordpiece").read(path)
    assert data.lines == [2, 3] and 1 in data.targets[0].tolist()


def test_skip_leaves_such_lines_out_and_counts_them(root, capsys):
    path = _tsv(root, "skip", ["one two", "one twø", "zero", "thrø", "three"])
    data = _task(root, "wordpiece", "task.audio.on_bad=skip").read(path)
    assert data.lines == [2, 4, 6] and data.references == ["one two", "zero", "three"]
    assert len(data.targets) == len(data.audio.features) == 3
    assert "skipped 2 utterance(s) whose transcript has text outside the vocabulary" in capsys.readouterr().err
    with pytest.raises(UserError, match="every utterance was skipped .*'transcript outside the vocabulary': 1"):
        _task(root, "wordpiece", "task.audio.on_bad=skip").read(_tsv(root, "all_bad", ["øne"]))


def test_finetune_exits_2_and_writes_nothing(root, tmp_path, capsys):
    train = _tsv(root, "train_bad", ["one", "two thrø"])
    out = tmp_path / "run"
    code = main(["finetune", "--task", "asr", "--config", "s2t/small", *S2T, "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={root / 'vocab.txt'}", f"data.train={train}", f"output={out}", "train.epochs=1"])
    err = capsys.readouterr().err
    assert code == 2 and f"{train}, line 3:" in err and "'ø' (U+00F8)" in err, err
    # the run directory holds at most its lock (taken before the data is read), no config or weights
    assert {p.name for p in out.iterdir()} <= {LOCK}
