"""preprocess after kill -9: its workers end with it, and the next run removes its partial directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from pentad.data import preprocess as pp

REPO = Path(__file__).resolve().parents[3]
WORDS = "the film was a delight from start to finish dull lifeless story actors carry weak script".split()

SCRIPT = """
import sys
from pathlib import Path
from pentad.data.objectives import LmObjective
from pentad.data.preprocess import preprocess
from pentad.data.tokenizers import load_tokenizer
config = {"type": "wordpiece", "vocab": sys.argv[1]}
tok = load_tokenizer(config)
objective = LmObjective(LmObjective.Config(seq_length=16), tok)
preprocess(objective, tok, config, Path(sys.argv[2]), Path(sys.argv[3]), workers=2, progress=False,
           chunk_bytes=1024)
"""


def test_workers_end_with_a_killed_main_process(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    corpus = tmp_path / "corpus.txt"
    line = " ".join(WORDS) + "\n"
    corpus.write_text(line * 20000)  # about 2,000 chunks of 1 KB: seconds of work for two workers
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(vocab), str(corpus), str(tmp_path / "ds")],
                            env=env, stderr=subprocess.PIPE)
    main = psutil.Process(proc.pid)
    workers: list[psutil.Process] = []
    deadline = time.monotonic() + 60
    while len(workers) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        helpers = main.children()  # the forkserver and the resource tracker; workers are the forkserver's
        workers = [w for h in helpers for w in h.children()]
        time.sleep(0.05)
    assert len(workers) == 2
    everything = main.children(recursive=True)
    proc.kill()
    proc.wait()
    _, alive = psutil.wait_procs(everything, timeout=10)
    for leftover in alive:  # a failing test must not leave them behind either
        leftover.kill()
    assert not alive, "workers, forkserver or resource tracker outlived the killed main process"
    assert not (tmp_path / "ds").exists()
    partials = list(tmp_path.glob(".ds.*.partial"))
    assert len(partials) == 1

    # the next run over the same output removes the abandoned partial directory
    pp._remove_abandoned_partials(tmp_path / "ds")
    assert not partials[0].exists()


def test_only_abandoned_partial_directories_are_removed(tmp_path, capsys):
    output = tmp_path / "ds"
    running = tmp_path / ".ds.aaaa.partial"
    killed = tmp_path / ".ds.bbbb.partial"
    fresh_unlocked = tmp_path / ".ds.cccc.partial"
    old_unlocked = tmp_path / ".ds.dddd.partial"
    other_output = tmp_path / ".other.eeee.partial"
    for d in (running, killed, fresh_unlocked, old_unlocked, other_output):
        d.mkdir()
    held = pp._lock_partial(running)  # a preprocess writing it right now (another open file: flock conflicts)
    os.close(pp._lock_partial(killed))  # its writer is gone, its lock file stays
    hour_ago = time.time() - 3600
    os.utime(old_unlocked, (hour_ago, hour_ago))
    try:
        pp._remove_abandoned_partials(output)
    finally:
        os.close(held)
    assert running.is_dir() and fresh_unlocked.is_dir() and other_output.is_dir()
    assert not killed.exists() and not old_unlocked.exists()
    assert capsys.readouterr().err.count("left by an interrupted earlier run") == 2


def test_finished_dataset_has_no_lock_file(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((" ".join(WORDS) + "\n") * 20)
    from pentad.data.objectives import LmObjective
    from pentad.data.tokenizers import load_tokenizer

    config = {"type": "wordpiece", "vocab": str(vocab)}
    tok = load_tokenizer(config)
    pp.preprocess(LmObjective(LmObjective.Config(seq_length=16), tok), tok, config, corpus, tmp_path / "ds",
                  progress=False)
    assert not (tmp_path / "ds" / pp.PARTIAL_LOCK).exists() and not list(tmp_path.glob(".ds.*"))
