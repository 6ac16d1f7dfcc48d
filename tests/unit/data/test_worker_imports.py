"""Preprocessing needs no torch: neither its workers (importing torch would cost every worker seconds
and hundreds of MB before the first line is tokenized) nor the ``pentad preprocess`` command itself
(seconds of start-up, a large share of preprocessing a corpus of tens of MB)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pentad.cli.main import main

WORDS = "the a film was good bad story music plot end of and it".split()


def test_preprocess_modules_do_not_import_torch():
    code = ("import sys, pentad.data.preprocess, pentad.data.objectives, pentad.data.tokenizers; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _corpus(tmp_path: Path) -> tuple[Path, Path]:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    docs = ["\n".join(" ".join(WORDS[(d + k + j) % len(WORDS)] for j in range(6)) for k in range(3))
            for d in range(20)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return vocab, corpus


def _args(vocab: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["preprocess", "--config", "bert/tiny", "tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}",
            "data.objective.seq_length=16", "train.progress=false", f"data.corpus={corpus}", f"data.output={out}",
            *extra]


def test_preprocess_command_does_not_import_torch(tmp_path):
    vocab, corpus = _corpus(tmp_path)
    code = ("import json, sys; from pentad.cli.main import main; "
            f"rc = main({json.dumps(_args(vocab, corpus, tmp_path / 'ds'))}); "
            "print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 False"
    assert json.loads((tmp_path / "ds" / "manifest.json").read_text())["num_instances"] > 0


def test_preprocess_checks_what_it_reads_only(tmp_path, capsys):
    vocab, corpus = _corpus(tmp_path)
    # the model section is not preprocessing's: a model pretrain would refuse does not stop it ...
    bad_model = "model.encoder.num_heads=3"  # 3 heads do not divide bert/tiny's width
    assert main(_args(vocab, corpus, tmp_path / "ds", bad_model)) == 0
    assert main(["validate", "bert/tiny", bad_model]) == 2
    assert "num_heads" in capsys.readouterr().err
    # ... but its own sections are checked as before
    assert main(_args(vocab, corpus, tmp_path / "ds2", "data.objective.type=no_such_objective")) == 2
    assert "no_such_objective" in capsys.readouterr().err
    assert main(_args(vocab, corpus, tmp_path / "ds3", "data.workers=0")) == 2
    assert not (tmp_path / "ds2").exists() and not (tmp_path / "ds3").exists()


@pytest.mark.parametrize("command", ["preprocess", "pretrain"])
def test_print_config_resolves_the_whole_config(command, capsys):
    assert main([command, "--config", "bert/tiny", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "num_heads:" in out and "ffn_size:" in out  # the model section with its defaults filled in
