"""The ``s2t`` objective: ``pentad preprocess`` reads ``text<TAB>path`` utterances in its worker
processes into typed shards (float16 Kaldi filterbank rows, or Whisper's float32 log-mel frames
with their fill value, beside the transcript ids), bit for bit the features the asr task computes;
bad lines fail naming file and line or are skipped; ``pentad pretrain`` trains an S2T from the
memory-mapped features (seeded SpecAugment in the loader) and its loss falls."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("soundfile")
pytest.importorskip("kaldi_native_fbank")

from tests.integration.test_asr import S2T, WHISPER, WORDS, tones, unusable_wavs  # noqa: E402

from pentad.cli.main import main  # noqa: E402
from pentad.data.audio import AudioConfig, load_features  # noqa: E402
from pentad.data.shards import ShardDataset  # noqa: E402
from pentad.data.tsv import read_path_tsv  # noqa: E402

OBJECTIVE = ["data.objective.type=s2t", "data.objective.seq_length=8", "data.objective.audio.feature_size=40"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("s2t")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    return root, vocab, tones(root, "train", 64, 0)


def _config(vocab, recipe=S2T):
    skip = ("task.", "train.")
    return [a for a in recipe if not a.startswith(skip)] + ["tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}",
                                                           "train.progress=false", "train.threads=1"]


def _reference(path, cfg):
    rows = read_path_tsv(path, "text", True, "utterance")
    return load_features([path.parent / r[1] for r in rows], [r[0] for r in rows], path, cfg)


def test_preprocess_stores_the_features_and_pretraining_learns(corpus, tmp_path):
    root, vocab, train = corpus
    data = tmp_path / "data"
    assert main(["preprocess", *_config(vocab), *OBJECTIVE, f"data.corpus={train}", f"data.output={data}",
                 "data.workers=2"]) == 0
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["arrays"] == {"audio": {"dtype": "<f2", "shape": [40]}} and manifest["num_instances"] == 64
    dataset = ShardDataset(data)
    reference = _reference(train, AudioConfig(feature_size=40))
    got = dataset.take(np.arange(64)[::-1])
    for i, k in enumerate(range(63, -1, -1)):
        np.testing.assert_array_equal(got.arrays["audio"].item(i), reference.features[k])
    out = tmp_path / "run"
    assert main(["pretrain", *_config(vocab), *OBJECTIVE, f"data.dataset={data}", f"output={out}",
                 "train.steps=60", "train.batch_size=16", "train.lr=3e-3", "train.warmup=0.05",
                 "train.log_every=10"]) == 0
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert losses[-1] < 0.6 * losses[0], losses


def test_whisper_features_and_the_decoder_prompt(corpus, tmp_path):
    root, vocab, train = corpus
    data = tmp_path / "data"
    options = ["data.objective.type=s2t", "data.objective.seq_length=8", "data.objective.audio.feature_size=40",
               "data.objective.audio.features=whisper", "data.objective.audio.cmvn=false",
               "data.objective.audio.chunk_seconds=1", "data.objective.decoder_start=cls",
               'data.objective.decoder_prompt=["[MASK]"]']
    assert main(["preprocess", *_config(vocab, WHISPER), *options, f"data.corpus={train}", f"data.output={data}"]) == 0
    dataset = ShardDataset(data)
    cfg = AudioConfig(feature_size=40, features="whisper", cmvn=False, chunk_seconds=1)
    reference = _reference(train, cfg)
    from pentad.data.objectives.s2t import S2tObjective, S2tObjectiveConfig
    from pentad.data.tokenizers import load_tokenizer

    tokenizer = load_tokenizer({"type": "wordpiece", "vocab": str(vocab)})
    objective = S2tObjective(S2tObjectiveConfig(seq_length=8, audio=cfg, decoder_start="cls",
                                                decoder_prompt=["[MASK]"]), tokenizer)
    batch = objective.collate(dataset.take([0, 1, 2]), np.random.default_rng(0))
    assert batch.audio_padding_mask is None and tuple(batch.audio.shape) == (3, 100, 40)
    for row in range(3):
        full = np.concatenate([reference.features[row], np.full((100 - len(reference.features[row]), 40),
                                                                 reference.fills[row], np.float32)])
        np.testing.assert_array_equal(batch.audio[row].numpy(), full)
    assert batch.decoder_tokens[:, :2].tolist() == [[2, 4]] * 3 and (batch.labels["lm"][:, 0] == -100).all()
    out = tmp_path / "run"
    assert main(["pretrain", *_config(vocab, WHISPER), *options, f"data.dataset={data}", f"output={out}",
                 "train.steps=4", "train.batch_size=8"]) == 0


def test_bad_lines_are_named_or_skipped(corpus, tmp_path, capsys):
    root, vocab, train = corpus
    bad = root / "bad.tsv"
    lines = train.read_text().splitlines()
    too_long = "one two three four five six seven eight\twav/train0.wav"
    bad.write_text("\n".join(lines[:4] + ["one\twav/missing.wav", too_long, "one zwei\twav/train1.wav"]
                             + lines[4:8]) + "\n")
    code = main(["preprocess", *_config(vocab), *OBJECTIVE, f"data.corpus={bad}", f"data.output={tmp_path / 'a'}"])
    assert code == 2 and not (tmp_path / "a").exists()
    assert "bad.tsv, line 5: the line names the audio file" in capsys.readouterr().err
    assert main(["preprocess", *_config(vocab), *OBJECTIVE, f"data.corpus={bad}", f"data.output={tmp_path / 'b'}",
                 "data.on_bad_line=skip"]) == 0
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["num_instances"] == 7 and manifest["skipped_lines"]["count"] == 3
    reasons = " ".join(e["reason"] for e in manifest["skipped_lines"]["examples"])
    assert "missing.wav, which does not exist" in reasons and "transcript of 8 tokens" in reasons
    assert "outside the vocabulary ('z', 'w', 'e', 'i')" in reasons
    headerless = root / "headerless.tsv"
    headerless.write_text("\n".join(lines[1:4]) + "\n")
    assert main(["preprocess", *_config(vocab), *OBJECTIVE, f"data.corpus={headerless}",
                 f"data.output={tmp_path / 'c'}"]) == 2


def test_json_lines_corpus_gives_the_same_dataset(corpus, tmp_path):
    root, vocab, train = corpus
    rows = train.read_text().splitlines()[1:]
    jsonl = root / "train.jsonl"
    jsonl.write_text("".join(json.dumps({"text": r.split("\t")[0], "path": r.split("\t")[1]}) + "\n" for r in rows))
    for name, source in (("tsv", train), ("jsonl", jsonl)):
        assert main(["preprocess", *_config(vocab), *OBJECTIVE, f"data.corpus={source}",
                     f"data.output={tmp_path / name}"]) == 0
    a, b = ShardDataset(tmp_path / "tsv").take(np.arange(64)), ShardDataset(tmp_path / "jsonl").take(np.arange(64))
    assert a.tokens.tolist() == b.tokens.tolist()
    np.testing.assert_array_equal(a.arrays["audio"].data, b.arrays["audio"].data)
    bad = root / "bad.jsonl"
    bad.write_text(json.dumps({"text": "one", "path": rows[0].split("\t")[1]}) + "\n{\"text\": 3}\n")
    assert main(["preprocess", *_config(vocab), *OBJECTIVE, f"data.corpus={bad}",
                 f"data.output={tmp_path / 'bad'}"]) == 2


def test_unusable_audio_is_named_by_line_or_skipped_and_counted(corpus, tmp_path, capsys):
    root, vocab, train = corpus
    expected = unusable_wavs(tmp_path / "wav")
    good = [f"{r.split(chr(9))[0]}\t{root / r.split(chr(9))[1]}" for r in train.read_text().splitlines()[1:4]]
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(["text\tpath", *good, *(f"one\twav/{name}" for name in expected)]) + "\n")
    for line, name in enumerate(expected, start=5):
        lines = bad.read_text().splitlines()
        only = tmp_path / f"only{line}.tsv"
        only.write_text("\n".join(lines[:4] + [lines[line - 1]]) + "\n")
        code = main(["preprocess", *_config(vocab), *OBJECTIVE, f"data.corpus={only}",
                     f"data.output={tmp_path / name}"])
        err = capsys.readouterr().err
        assert code == 2 and not (tmp_path / name).exists()
        assert f"only{line}.tsv, line 5: the line names the audio file {tmp_path / 'wav' / name}, which " \
               f"{expected[name]}" in err, err
    assert main(["preprocess", *_config(vocab), *OBJECTIVE, f"data.corpus={bad}", f"data.output={tmp_path / 'ok'}",
                 "data.on_bad_line=skip"]) == 0
    manifest = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    assert manifest["num_instances"] == 3 and manifest["skipped_lines"]["count"] == 4
    reasons = {e["line"]: e["reason"] for e in manifest["skipped_lines"]["examples"]}
    assert list(reasons) == [5, 6, 7, 8]
    assert all(text in reason for reason, text in zip(reasons.values(), expected.values())), reasons


def test_resampling_and_downmixing_are_reported_as_the_asr_task_does(corpus, tmp_path, capsys):
    root, vocab, _ = corpus
    stereo = tones(tmp_path, "stereo", 3, 2, rate=22050, channels=2)
    assert main(["preprocess", *_config(vocab), *OBJECTIVE, f"data.corpus={stereo}",
                 f"data.output={tmp_path / 'd'}"]) == 0
    err = capsys.readouterr().err
    for note in ("downmixed to mono", "resampled from 22050 Hz"):
        assert f"preprocess: {stereo}: {note} (the model takes mono 16000 Hz): 3 line(s)" in err, err
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["notes"] == {"downmixed to mono (the model takes mono 16000 Hz)": 3,
                                 "resampled from 22050 Hz (the model takes mono 16000 Hz)": 3}
