"""Peak memory of ``pentad embed`` (plain and ``--whitening``) and ``pentad infer --task classification``
against the input's length.

Fine-tunes a tiny classification run (a vocabulary built on the fly, bert/tiny shrunk to width 32), writes
inputs of several lengths, then runs each command in a fresh process per size and reports its peak
resident memory (``ru_maxrss``). With ``--before SRC`` the same commands also run on another source tree
(the code before streaming, say) in the same session, so the two columns compare on one machine.

    python bench/stream_memory.py --lines 2000 20000 [--before OTHER_CHECKOUT/src]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
WORDS = ("the film was a delight from start to finish a dull and lifeless story with no heart actors carry weak "
         "script i loved music colours nothing in this movie works smart funny moving picture plot makes sense "
         "one of best films year ending falls flat warm generous comedy").split()

# runs one pentad command line in this process and prints its peak RSS (KiB on Linux)
PROBE = ("import resource, sys; from pentad.cli.main import main; rc = main(sys.argv[1:]); "
         "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")


def text(i: int) -> str:
    """A deterministic pseudo-sentence of 8-27 words."""
    n = 8 + (i * 7) % 20
    return " ".join(WORDS[(i * 13 + k * 5) % len(WORDS)] for k in range(n))


def pentad(src: Path, *argv: str) -> int:
    """Peak RSS (MiB) of ``pentad argv`` run on the source tree ``src``."""
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pentad {' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    peak = next(line for line in done.stdout.splitlines() if line.startswith("PEAK_KIB"))
    return round(int(peak.split()[1]) / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--before", type=Path, help="another source tree to measure too (its src folder)")
    args = parser.parse_args()
    trees = {"this": SRC} | ({"before": args.before.resolve()} if args.before else {})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "corpus.txt"
        corpus.write_text("".join(text(i) + " .\n" for i in range(400)), encoding="utf-8")
        train = root / "train.tsv"
        train.write_text("label\ttext_a\n" + "".join(f"{i % 2}\t{text(i)}\n" for i in range(64)), encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=str(SRC))
        subprocess.run([sys.executable, "-m", "pentad", "vocab", "build", "--corpus", str(corpus), "--vocab-size",
                        "200", "--min-frequency", "1", "--output", str(root / "vocab")], env=env, check=True,
                       capture_output=True)
        run = root / "run"
        subprocess.run([sys.executable, "-m", "pentad", "finetune", "--task", "classification", "--config",
                        "bert/tiny", "tokenizer.type=wordpiece", f"tokenizer.vocab={root / 'vocab' / 'vocab.txt'}",
                        "model.hidden_size=32", "model.max_seq_length=64", "model.encoder.num_layers=2",
                        "model.encoder.num_heads=2", "model.encoder.ffn_size=64", "data.objective.seq_length=32",
                        "train.batch_size=8", "train.progress=false", "train.epochs=1", f"data.train={train}",
                        f"output={run}"], env=env, check=True, capture_output=True)
        results = []
        for n in args.lines:
            lines = root / f"in{n}.tsv"
            lines.write_text("text_a\n" + "".join(text(i) + "\n" for i in range(n)), encoding="utf-8")
            for name, src in trees.items():
                out = root / f"{name}{n}"
                row = {"lines": n, "tree": name,
                       "embed_mib": pentad(src, "embed", str(run), "--input", str(lines), "--output",
                                           str(out) + ".npy", "--device", "cpu"),
                       "whitened_mib": pentad(src, "embed", str(run), "--input", str(lines), "--output",
                                              str(out) + "w.npy", "--device", "cpu", "--whitening"),
                       "infer_mib": pentad(src, "infer", "--model", str(run), f"data.test={lines}", "--output",
                                           str(out) + ".tsv")}
                results.append(row)
                print(json.dumps(row), flush=True)
        print("\n| lines | tree | embed | embed --whitening | infer --task classification |\n|---:|---|---:|---:|---:|")
        for row in results:
            print(f"| {row['lines']:,} | {row['tree']} | {row['embed_mib']} | {row['whitened_mib']} | "
                  f"{row['infer_mib']} |")


if __name__ == "__main__":
    main()
