"""Text generation from a run directory and the ``pentad generate`` command."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from pentad.cli import generate as generate_cli
from pentad.errors import UserError
from pentad.generation import TextGenerator, generate
from pentad.generation.text import IncrementalText, StopStrings
from pentad.layout import WEIGHTS
from pentad.run_config import validate_raw
from pentad.runs import prepare_run_dir
from pentad.training.checkpoint import save_weights

from .models import CONFIGS, VOCAB, tiny_model

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(VOCAB - len(SPECIALS))]


def make_run(root: Path, family: str, objective: dict | None = None) -> Path:
    """A run directory: config.yaml with a space tokenizer, tokenizer files and weights."""
    from pentad.data.tokenizers import load_tokenizer

    vocab = root / f"{family}-vocab.txt"
    vocab.write_text("\n".join(SPECIALS + WORDS) + "\n", encoding="utf-8")
    raw = {"model": copy.deepcopy(CONFIGS[family]), "tokenizer": {"type": "space", "vocab": str(vocab)}}
    if objective is not None:
        raw["data"] = {"objective": objective}
    cfg = validate_raw(raw, {}, "test")
    run_dir = root / family
    prepare_run_dir(run_dir, cfg, load_tokenizer(cfg.tokenizer))
    save_weights(tiny_model(family), run_dir / WEIGHTS)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {"gpt2": make_run(root, "gpt2"), "t5": make_run(root, "t5", {"type": "mt", "decoder_start": "pad"})}


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="pentad")
    generate_cli.add_parser(parser.add_subparsers(dest="command"))
    return generate_cli.run(parser.parse_args(["generate", *argv]))


def test_framing_follows_the_objectives(runs) -> None:
    gen = TextGenerator.from_run(runs["gpt2"])
    cls_id, sep_id, pad_id = 2, 3, 0
    assert gen.encode("w1 w2") == [cls_id, 5 + 1, 5 + 2]  # [CLS] text; stops at [SEP]
    assert gen.stop_token_ids == [sep_id] and gen.decoder_start_token_id is None
    seq2seq = TextGenerator.from_run(runs["t5"])
    assert seq2seq.encode("w1") == [cls_id, 6, sep_id]  # [BOS] source [EOS]
    assert seq2seq.decoder_start_token_id == pad_id  # the mt objective's decoder_start: pad
    assert TextGenerator.from_run(runs["t5"], decoder_start="eos").decoder_start_token_id == sep_id


def test_text_generation_matches_token_generation(runs) -> None:
    gen = TextGenerator.from_run(runs["gpt2"])
    texts = ["w1 w2 w3", "w7"]
    completions = gen.generate(texts, max_new_tokens=8)
    ids = generate(gen.model, [gen.encode(t) for t in texts], gen.config(max_new_tokens=8)).sequences()
    for group, expected in zip(completions, ids):
        (completion,) = group
        assert completion.token_ids == expected
        body = expected[:-1] if completion.finish_reason == "stop" else expected
        assert completion.text == gen.tokenizer.decode(body, skip_special_tokens=True)
    # Streaming pieces add up to the same text.
    pieces = list(gen.stream("w1 w2 w3", max_new_tokens=8))
    assert "".join(pieces) == completions[0][0].text
    streamed: list[str] = []
    one = gen.generate_streaming("w1 w2 w3", streamed.append, max_new_tokens=8)
    assert "".join(streamed) == one.text == completions[0][0].text


def test_stop_strings_cut_the_text_and_end_early(runs) -> None:
    gen = TextGenerator.from_run(runs["gpt2"])
    free = gen.generate(["w1 w2 w3"], max_new_tokens=10, stop_token_ids=[])[0][0]
    words = free.text.split()
    assert len(words) >= 4
    stop = words[2]
    first = words.index(stop)
    cut = gen.generate(["w1 w2 w3"], max_new_tokens=10, stop_token_ids=[], stop_strings=[stop])[0][0]
    assert cut.finish_reason == "stop_string"
    assert cut.text == free.text[:free.text.index(stop)]
    assert len(cut.token_ids) == first + 1  # decoding ended at the token that completed the stop string
    assert "".join(gen.stream("w1 w2 w3", max_new_tokens=10, stop_token_ids=[], stop_strings=[stop])) == cut.text


class BytesTokenizer:
    """Tokens are UTF-8 bytes: a character may take several tokens (like byte-level BPE)."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_incremental_text_holds_back_partial_characters_and_stop_prefixes() -> None:
    text = "héllo wörld"
    ids = list(text.encode("utf-8"))
    pieces = IncrementalText(BytesTokenizer())
    out = [pieces.feed(i)[0] for i in ids] + [pieces.finish()]
    assert "".join(out) == text and all("\ufffd" not in p for p in out)
    stopper = IncrementalText(BytesTokenizer(), ["wör"])
    emitted = []
    for i in ids:
        piece, hit = stopper.feed(i)
        emitted.append(piece)
        if hit:
            break
    assert hit and "".join(emitted) == "héllo "
    check = StopStrings(BytesTokenizer(), ["ll"])
    import torch

    tokens = torch.tensor([list(b"hello"), list(b"heyyo")])
    assert check(tokens, torch.tensor([False, False])).tolist() == [True, False]


def test_cli_text_jsonl_and_stream(runs, tmp_path, capsys) -> None:
    assert cli(str(runs["gpt2"]), "--prompt", "w1 w2", "--max-new-tokens", "5") == 0
    greedy = capsys.readouterr().out
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2\nw3\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert cli(str(runs["gpt2"]), "--prompts", str(prompts), "--max-new-tokens", "5", "--sample", "--top-k", "5",
               "--seed", "1", "--num-return-sequences", "2", "--output", str(out)) == 0
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["index"], r["sequence"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {"text", "tokens", "score", "finish_reason", "num_tokens"} <= set(records[0])
    again = tmp_path / "again.jsonl"
    cli(str(runs["gpt2"]), "--prompts", str(prompts), "--max-new-tokens", "5", "--top-k", "5", "--seed", "1",
        "--num-return-sequences", "2", "--output", str(again))
    assert again.read_text() == out.read_text()  # seeded: reproducible (--top-k implies --sample)
    capsys.readouterr()
    assert cli(str(runs["gpt2"]), "--prompt", "w1 w2", "--max-new-tokens", "5", "--stream") == 0
    assert capsys.readouterr().out == greedy
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"prompt": "w4", "id": 7}\n\n{"prompt": "w5 w6"}\n', encoding="utf-8")
    assert cli(str(runs["t5"]), "--jsonl", str(jsonl), "--num-beams", "3", "--num-return-sequences", "2",
               "--max-new-tokens", "4", "--early-stopping", "--output", "-") == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 4 and records[0]["input"] == {"id": 7} and "input" not in records[2]
    assert records[0]["score"] >= records[1]["score"]


@pytest.mark.parametrize("content,needle", [
    ("", "is empty"),
    ("w1\n\nw2\n", "line 2: empty line"),
])
def test_cli_bad_prompt_files(runs, tmp_path, content, needle) -> None:
    path = tmp_path / "p.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=needle) as info:
        cli(str(runs["gpt2"]), "--prompts", str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content,needle", [
    ('{"prompt": "w1"}\n{"prompt": "w2"\n', "line 2: invalid JSON"),
    ('{"prompt": "w1"}\n["w2"]\n', "line 2: expected a JSON object"),
    ('{"text": "w1"}\n', "line 1: \"prompt\" must be a string; found no \"prompt\" key"),
    ("\n\n", "has no records"),
])
def test_cli_bad_jsonl(runs, tmp_path, content, needle) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=needle) as info:
        cli(str(runs["gpt2"]), "--jsonl", str(path))
    assert str(path) in str(info.value)


def test_cli_bad_run_dir_and_options(runs, tmp_path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        cli(str(tmp_path / "missing"), "--prompt", "w1")
    with pytest.raises(UserError, match="not a pentad run directory"):
        cli(str(tmp_path), "--prompt", "w1")
    with pytest.raises(UserError, match="prompt file .* does not exist"):
        cli(str(runs["gpt2"]), "--prompts", str(tmp_path / "none.txt"))
    with pytest.raises(UserError, match="--top-p"):
        cli(str(runs["gpt2"]), "--prompt", "w1", "--top-p", "1.5")
    with pytest.raises(UserError, match="drop --greedy"):
        cli(str(runs["gpt2"]), "--prompt", "w1", "--greedy", "--temperature", "0.5")
    with pytest.raises(UserError, match="--num-return-sequences 3 exceeds --num-beams 2"):
        cli(str(runs["gpt2"]), "--prompt", "w1", "--num-beams", "2", "--num-return-sequences", "3")
    with pytest.raises(UserError, match="--min-new-tokens 5 exceeds --max-new-tokens 3"):
        cli(str(runs["gpt2"]), "--prompt", "w1", "--min-new-tokens", "5", "--max-new-tokens", "3")
    with pytest.raises(UserError, match="--stream"):
        cli(str(runs["gpt2"]), "--prompt", "w1", "--stream", "--num-beams", "2")
    with pytest.raises(UserError, match="plus --max-new-tokens 500 needs .* positions"):
        cli(str(runs["gpt2"]), "--prompt", "w1", "--max-new-tokens", "500")
    with pytest.raises(UserError, match="not an encoder-decoder"):
        cli(str(runs["gpt2"]), "--prompt", "w1", "--decoder-start", "eos")


def test_cli_output_is_checked_before_generating(runs, tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("kept\n", encoding="utf-8")
    with pytest.raises(UserError, match="already exists; pass --overwrite"):
        cli(str(runs["gpt2"]), "--prompt", "w1", "--max-new-tokens", "2", "--output", str(out))
    assert out.read_text(encoding="utf-8") == "kept\n"
    assert cli(str(runs["gpt2"]), "--prompt", "w1", "--max-new-tokens", "2", "--output", str(out),
               "--overwrite") == 0
    assert json.loads(out.read_text(encoding="utf-8").splitlines()[0])["prompt"] == "w1"
    with pytest.raises(UserError, match="is a directory"):
        cli(str(runs["gpt2"]), "--prompt", "w1", "--output", str(tmp_path))


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_cli_static_cache_equals_dynamic(runs, family, capsys) -> None:
    base = (str(runs[family]), "--prompt", "w1 w2 w3", "--max-new-tokens", "6", "--output", "-")
    assert cli(*base) == 0
    dynamic = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert cli(*base, "--cache", "static") == 0
    static = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["tokens"] for r in static] == [r["tokens"] for r in dynamic]
    assert [r["text"] for r in static] == [r["text"] for r in dynamic]
    if family == "gpt2":  # one compiled run (seconds of compilation on a CPU)
        assert cli(*base, "--cache", "static", "--compile") == 0
        compiled = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [r["tokens"] for r in compiled] == [r["tokens"] for r in dynamic]
    assert cli(*base, "--cache", "static", "--num-beams", "2") == 0  # beams re-rank the static cache in place
    assert cli(*base, "--num-beams", "2") == 0
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[0])["tokens"] == json.loads(out[1])["tokens"]


@pytest.mark.parametrize("argv,needle", [
    (("--compile",), "--compile needs --cache static \\(found --cache dynamic\\)"),
    (("--compile", "--cache", "dynamic"), "--compile needs --cache static \\(found --cache dynamic\\)"),
    (("--compile", "--no-cache"), "--compile needs --cache static \\(found --no-cache\\)"),
    (("--no-cache", "--cache", "static"), "--no-cache and --cache static contradict"),
    (("--no-cache", "--cache", "static", "--compile"), "--no-cache and --cache static contradict"),
])
def test_cli_cache_option_contradictions(runs, argv, needle) -> None:
    with pytest.raises(UserError, match=needle) as info:
        cli(str(runs["gpt2"]), "--prompt", "w1", *argv)
    assert "compile=" not in str(info.value) and "cache='" not in str(info.value)


def test_cli_root_validator_messages_name_options() -> None:
    """Should a cross-field check reach GenerationConfig, its message names the options."""
    with pytest.raises(UserError, match=r"--compile needs --cache static \(found --cache dynamic\)"):
        generate_cli.build_config({"compile": True})
    with pytest.raises(UserError, match=r"--cache static needs a key/value cache \(no --no-cache\)"):
        generate_cli.build_config({"cache": "static", "use_cache": False})
    assert generate_cli.build_config({"cache": "static", "compile": True}).compile
    # a model that cannot keep a static cache: the generation error, as pentad generate reports it
    assert generate_cli._cli_terms("the model's encoder (lstm) keeps none; use cache='dynamic' (and compile=false)"
                                   ).endswith("use --cache dynamic (and no --compile)")


def test_cli_refuses_a_model_that_does_not_read_text(runs, tmp_path) -> None:
    """An asr run (speech embedding) has no text prompts to continue: one clear error, not a ValueError from
    the speech embedding's forward."""
    from pentad.assembly import load_config
    from pentad.builder import build_model
    from pentad.data.tokenizers import load_tokenizer

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIALS + WORDS) + "\n", encoding="utf-8")
    cfg = load_config("s2t/small", [
        "model.hidden_size=32", "model.encoder.num_layers=1", "model.decoder.num_layers=1", "model.encoder.num_heads=2",
        "model.decoder.num_heads=2", "model.encoder.ffn_size=64", "model.decoder.ffn_size=64",
        "model.embedding.parts.0.conv_channels=[16,64]", "model.embedding.parts.0.feature_size=8",
        "tokenizer.type=space", f"tokenizer.vocab={vocab}"])
    run_dir = tmp_path / "asr"
    prepare_run_dir(run_dir, cfg, load_tokenizer(cfg.tokenizer))
    save_weights(build_model(cfg.model, training=False), run_dir / WEIGHTS)
    with pytest.raises(UserError, match=r"asr does not read text: its embedding takes speech \(Batch.audio\).*"
                                        r"pentad infer RUN data.test=FILE"):
        cli(str(run_dir), "--prompt", "w1")
