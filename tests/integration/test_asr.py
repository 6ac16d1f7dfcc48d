"""``pentad finetune --task asr`` and ``pentad infer`` on WAV files: digit words spoken as tones (each
digit one pitch, between short silences; the test set as 22.05 kHz stereo files, resampled and
downmixed), a tiny S2T from random weights, WER/CER, greedy and beam decoding, the predictions
file, seeded SpecAugment, and bad input named by file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("soundfile")
pytest.importorskip("kaldi_native_fbank")
pytest.importorskip("jiwer")

import soundfile  # noqa: E402

from pentad.cli.main import main  # noqa: E402

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
S2T = ["--config", "s2t/small", "model.hidden_size=32", "model.encoder.num_layers=1", "model.decoder.num_layers=1",
       "model.encoder.num_heads=2", "model.decoder.num_heads=2", "model.encoder.ffn_size=64",
       "model.decoder.ffn_size=64", "model.embedding.parts.0.conv_channels=[64,64]",
       "model.embedding.parts.0.feature_size=40", "task.audio.feature_size=40", "model.embedding.dropout=0.0",
       "model.target_embedding.dropout=0.0", "model.encoder.dropout=0.0", "model.decoder.dropout=0.0",
       "model.max_seq_length=16", "task.target_seq_length=8", "task.audio.specaugment=null",
       "train.progress=false", "train.threads=1"]


def tones(root: Path, name: str, count: int, seed: int, rate: int = 16000, channels: int = 1) -> Path:
    rng = np.random.default_rng(seed)
    (root / "wav").mkdir(parents=True, exist_ok=True)
    lines = ["text\tpath"]
    t = np.arange(int(0.1 * rate)) / rate
    for i in range(count):
        digits = rng.integers(0, 4, size=int(rng.integers(1, 4)))
        gap = np.zeros(int(0.05 * rate))
        wave = np.concatenate([np.concatenate([gap, 0.3 * np.sin(2 * np.pi * (300 + 250 * d) * t)
                                               * rng.uniform(0.6, 1.0)]) for d in digits] + [gap]).astype(np.float32)
        wave += rng.normal(0, 0.01, size=len(wave)).astype(np.float32)
        soundfile.write(root / "wav" / f"{name}{i}.wav", np.stack([wave] * channels, axis=1), rate)
        lines.append(" ".join(WORDS[d] for d in digits) + f"\twav/{name}{i}.wav")
    path = root / f"{name}.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def unusable_wavs(folder) -> dict[str, str]:
    """WAV files libsndfile reads without complaint but that cannot be used, by name: what a refusal says."""
    folder.mkdir(parents=True, exist_ok=True)
    wave = (0.3 * np.sin(np.arange(8000) / 5.0)).astype(np.float32)
    with_nan = wave.copy()
    with_nan[4000] = np.nan
    soundfile.write(folder / "nan.wav", with_nan, 16000, subtype="FLOAT")
    soundfile.write(folder / "cut.wav", wave, 16000, subtype="PCM_16")
    data = (folder / "cut.wav").read_bytes()
    (folder / "cut.wav").write_bytes(data[:len(data) // 2])
    soundfile.write(folder / "slow.wav", wave, 1)
    soundfile.write(folder / "loud.wav", wave * np.float32(1e30), 16000, subtype="FLOAT")
    return {"nan.wav": "holds 1 NaN or infinite sample(s), the first at 0.250 s",
            "cut.wav": "is truncated: its WAV header declares 8000 frames (0.50 s)",
            "slow.wav": "declares a sample rate of 1 Hz; audio is read from 1000 to 384000 Hz",
            "loud.wav": "gives NaN or infinite features: its samples reach 3e+29"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tones")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    return {"root": root, "vocab": vocab, "train": tones(root, "train", 160, 0), "dev": tones(root, "dev", 16, 1),
            "test": tones(root, "test", 24, 2, rate=22050, channels=2)}


def _tok(data) -> list[str]:
    return ["tokenizer.type=wordpiece", f"tokenizer.vocab={data['vocab']}"]


@pytest.mark.heavy  # about 14 s
def test_s2t_learns_tone_digits_and_infers(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["finetune", "--task", "asr", *S2T, *_tok(data), f"data.train={data['train']}",
                 f"data.dev={data['dev']}", f"data.test={data['test']}", f"output={out}", "train.epochs=30",
                 "train.batch_size=16", "train.lr=3e-3", "train.warmup=0.05"]) == 0
    err = capsys.readouterr().err
    assert "downmixed to mono: 24 file(s)" in err and "resampled from 22050 Hz: 24 file(s)" in err
    results = json.loads((out / "results.json").read_text())
    # always the most common word scores a WER above 70 %; measured 0 to 16 % over seeds while tuning
    assert results["test"]["wer"] < 20.0 and results["test"]["cer"] < 20.0, results
    unlabelled = tmp_path / "in.tsv"
    rows = data["test"].read_text().splitlines()[1:6]
    unlabelled.write_text("path\n" + "".join(f"{data['root'] / r.split(chr(9))[1]}\n" for r in rows))
    pred = tmp_path / "pred.tsv"
    assert main(["infer", "--model", str(out), f"data.test={unlabelled}", "--output", str(pred)]) == 0
    lines = pred.read_text().splitlines()
    assert lines[0] == "line\ttext" and len(lines) == 6 and [x.split("\t")[0] for x in lines[1:]] == \
        ["2", "3", "4", "5", "6"]
    right = sum(x.split("\t")[1] == r.split("\t")[0] for x, r in zip(lines[1:], rows))
    assert right >= 3, (lines, rows)
    # decoding options at inference (after --output too); anything that would change the model is refused
    beam = tmp_path / "beam.tsv"
    assert main(["infer", "--model", str(out), f"data.test={unlabelled}", "--output", str(beam),
                 "task.num_beams=3", "task.max_new_tokens=6"]) == 0
    assert len(beam.read_text().splitlines()) == 6
    capsys.readouterr()
    assert main(["infer", "--model", str(out), f"data.test={unlabelled}", "--output", str(tmp_path / "x.tsv"),
                 "task.audio.cmvn=false"]) == 2
    assert "changes only the decoding options of the run's task (asr: " in capsys.readouterr().err
    # beam search through the same task: as good as greedy here
    from pentad.compression.store import load_run_model
    from pentad.registry import TASKS

    model, cfg, tokenizer = load_run_model(out)
    task = TASKS.get("asr")(cfg.task.model_copy(update={"num_beams": 3}), tokenizer, 16)
    task.bind(cfg)
    utterances = task.read(data["test"])
    beams = task.predict(model, utterances, 8, "cpu")
    assert task.score(beams, utterances, task.gold(utterances))["wer"] <= results["test"]["wer"] + 5.0


def test_specaugment_is_seeded_and_only_in_training(data):
    from pentad.assembly import load_config
    from pentad.data.tokenizers import load_tokenizer
    from pentad.registry import TASKS

    cfg = load_config(S2T[1], [*S2T[2:], "task.audio.specaugment={freq_masks: 2, freq_width: 5, time_masks: 2, "
                               "time_width: 10}", f"data.train={data['train']}"])
    tokenizer = load_tokenizer({"type": "wordpiece", "vocab": str(data["vocab"])})
    task = TASKS.get("asr")(cfg.task, tokenizer, 16)
    task.bind(cfg)
    utterances = task.read(data["train"])
    a = next(task.train_batches(utterances, 8, seed=3).iterate(2))
    b = next(task.train_batches(utterances, 8, seed=3).iterate(2))
    c = next(task.train_batches(utterances, 8, seed=4).iterate(2))
    assert a.audio.equal(b.audio) and not a.audio.equal(c.audio)
    plain = task.collate(utterances, np.arange(8), np.random.default_rng(0))
    assert plain.audio.equal(task.collate(utterances, np.arange(8), np.random.default_rng(1)).audio)
    assert plain.audio.shape[2] == 40 and plain.audio_padding_mask.dtype == plain.decoder_padding_mask.dtype
    # the decoder reads [CLS] then the words; the labels are the words then [SEP]
    first = data["train"].read_text().splitlines()[1].split("\t")[0].split()
    ids = [tokenizer.token_to_id(w) for w in first]
    assert plain.decoder_tokens[0, :len(ids) + 1].tolist() == [tokenizer.cls_id, *ids]
    assert plain.labels["lm"][0, :len(ids) + 1].tolist() == [*ids, tokenizer.sep_id]


def test_bad_audio_is_named_by_file_and_line(data, tmp_path, capsys):
    (tmp_path / "wav").mkdir()
    (tmp_path / "wav" / "broken.wav").write_bytes(b"RIFF not audio")
    soundfile.write(tmp_path / "wav" / "empty.wav", np.zeros(10, np.float32), 16000)
    good = f"one\t{data['root'] / 'wav' / 'train0.wav'}\n"
    cases = {"text\tpath\none\twav/missing.wav\n": "line 2: audio", "text\tpath\none\twav/broken.wav\n":
             "could not be decoded", "text\tpath\none\twav/empty.wav\n": "is empty",
             "label\tpath\none\tx.wav\n": "expected a header line 'text<TAB>path'",
             "text\tpath\n": "has no examples",
             "text\tpath\none one one one one one one one\twav/x.wav\n": "more than task.target_seq_length 8"}
    unusable = unusable_wavs(tmp_path / "wav")
    cases.update({f"text\tpath\none\twav/{name}\n": f"line 2: audio {tmp_path / 'wav' / name} {text}"
                  for name, text in unusable.items()})
    for i, (text, expected) in enumerate(cases.items()):
        train = tmp_path / f"train{i}.tsv"
        train.write_text(text + (good if text.count("\n") > 1 else ""))
        code = main(["finetune", "--task", "asr", *S2T, *_tok(data), f"data.train={train}",
                     f"output={tmp_path / f'run{i}'}", "train.epochs=1"])
        err = capsys.readouterr().err
        assert code == 2 and expected in err and str(train) in err, err
        assert not (tmp_path / f"run{i}" / "results.json").exists()
    skip = tmp_path / "skip.tsv"
    skip.write_text("text\tpath\none\twav/empty.wav\n" + "".join(f"one\twav/{name}\n" for name in unusable) + good)
    assert main(["finetune", "--task", "asr", *S2T, *_tok(data), f"data.train={skip}", "task.audio.on_bad=skip",
                 f"output={tmp_path / 'skip'}", "train.epochs=1"]) == 0
    assert "skipped 1 bad-rate, 1 empty, 2 non-finite, 1 truncated utterance(s)" in capsys.readouterr().err
    # pentad infer reads its input the same way, under the run's task.audio.on_bad (here: skip), and says so
    test = tmp_path / "test.tsv"
    test.write_text("path\n" + "".join(f"wav/{name}\n" for name in unusable) + f"{good.split(chr(9))[1]}")
    assert main(["infer", "--model", str(tmp_path / "skip"), f"data.test={test}", "--output",
                 str(tmp_path / "pred.tsv")]) == 0
    assert f"{test}: skipped 1 bad-rate, 2 non-finite, 1 truncated utterance(s)" in capsys.readouterr().err
    assert [row.split("\t")[0] for row in (tmp_path / "pred.tsv").read_text().splitlines()] == ["line", "6"]


def test_a_text_model_is_refused_with_the_reason(data, tmp_path, capsys):
    code = main(["finetune", "--task", "asr", "--config", "t5/small", *_tok(data), f"data.train={data['train']}",
                 f"output={tmp_path / 'run'}"])
    assert code == 2 and "needs a 'speech' part" in capsys.readouterr().err


def test_generation_from_audio_matches_stepwise_decoding():
    """The cached generator over a source Batch (padded audio) gives the tokens that re-running the whole
    model on its own output picks step by step; a decoder-only model refuses a source Batch."""
    import torch

    from pentad.assembly import load_config
    from pentad.builder import build_model
    from pentad.components.base import Batch
    from pentad.generation.config import GenerationInputError
    from pentad.generation.search import generate

    cfg = load_config(S2T[1], [*S2T[2:], "model.vocab_size=15"])
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    audio = torch.randn(3, 37, 40)
    mask = torch.zeros(3, 37, dtype=torch.bool)
    mask[1, 20:] = True
    mask[2, 9:] = True
    output = generate(model, Batch(audio=audio, audio_padding_mask=mask), max_new_tokens=5,
                      decoder_start_token_id=2, stop_token_ids=[], pad_token_id=0)
    with torch.no_grad():
        memory, memory_mask = model.encode(Batch(audio=audio, audio_padding_mask=mask))
        for row in range(3):  # each row alone, unpadded: the padding must not matter
            length = int((~mask[row]).sum())
            alone, _ = model.encode(Batch(audio=audio[row:row + 1, :length]))
            tokens = torch.tensor([[2]])
            for _ in range(5):
                hidden = model.decode(Batch(decoder_tokens=tokens), alone, None)
                step = model.targets["lm"].logits(hidden[:, -1]).argmax(-1)
                tokens = torch.cat([tokens, step[:, None]], dim=1)
            assert output.tokens[row].tolist() == tokens[0, 1:].tolist(), row
    gpt = build_model(load_config("gpt2/tiny", ["model.vocab_size=15", "model.hidden_size=16",
                                                "model.encoder.num_layers=1", "model.encoder.num_heads=2",
                                                "model.encoder.ffn_size=16"]).model)
    with pytest.raises(GenerationInputError, match="needs an encoder-decoder"):
        generate(gpt, Batch(audio=audio), max_new_tokens=2)


WHISPER = ["--config", "whisper/tiny", "model.hidden_size=32", "model.vocab_size=15", "model.encoder.num_layers=1",
           "model.decoder.num_layers=1", "model.encoder.num_heads=2", "model.decoder.num_heads=2",
           "model.encoder.ffn_size=64", "model.decoder.ffn_size=64", "model.embedding.parts.0.conv_channels=[32,32]",
           "model.embedding.parts.0.feature_size=40", "model.embedding.parts.1.max_positions=50",
           "model.target_embedding.parts.1.max_positions=16", "model.max_seq_length=16", "task.audio.feature_size=40",
           "task.audio.chunk_seconds=1", "task.target_seq_length=8", "task.decoder_start=cls",
           "task.decoder_prompt=[\"[MASK]\"]", "task.begin_suppress_tokens=[3]", "task.suppress_tokens=[0,1]",
           "train.progress=false", "train.threads=1"]


@pytest.mark.heavy  # about 20 s
def test_whisper_stem_and_features_learn_tone_digits(data, tmp_path):
    """The Whisper recipe (shrunk; its features over 1-s chunks, its stem, a decoder prompt that is
    read but never scored, suppressed tokens) trains and decodes through the asr task."""
    out = tmp_path / "run"
    assert main(["finetune", "--task", "asr", *WHISPER, *_tok(data), f"data.train={data['train']}",
                 f"data.dev={data['dev']}", f"data.test={data['test']}", f"output={out}", "train.epochs=30",
                 "train.batch_size=16", "train.lr=3e-3", "train.warmup=0.05"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["test"]["wer"] < 40.0, results
    from pentad.compression.store import load_run_model
    from pentad.registry import TASKS

    model, cfg, tokenizer = load_run_model(out)
    task = TASKS.get("asr")(cfg.task, tokenizer, 16)
    task.bind(cfg)
    utterances = task.read(data["dev"])
    batch = task.collate(utterances, np.arange(4), np.random.default_rng(0))
    assert batch.audio.shape[1:] == (100, 40) and batch.audio_padding_mask is None
    assert (batch.decoder_tokens[:, :2] == np.array([2, 4])).all()  # [CLS] then the prompt [MASK]
    assert (batch.labels["lm"][:, 0] == -100).all()  # the prompt's position predicts nothing
    predictions = task.predict(model, utterances, 8, "cpu")
    assert all("[MASK]" not in p and "[PAD]" not in p for p in predictions)
