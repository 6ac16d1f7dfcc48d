"""The downstream suite on real data: every task's score beside a baseline measured in the same run.

Each row is a module in ``bench/downstream_tasks/`` with ``run(out_dir, shared, quick) -> dict``: it
fine-tunes a small CPU-sized model on the task's dataset (most rows start from a small Chinese BERT
pre-trained here once, on TencentPretrain's sampled CLUECorpusSmall; a row says when it starts from
random weights) and reports the dev score, a baseline (majority class, a heuristic or the untrained
model), the fine-tuning time and the number of training examples.

These are small models trained for minutes on 2 CPU cores: the scores show that each task learns and
beats its baseline, not what the task reaches with BERT-base. Published BERT-base numbers need real
pre-trained weights (``pentad convert`` from Hugging Face) and GPU time.

Needs the shared data beside the repository (tests and benchmarks only). Run from the repository root::

    .venv/bin/python bench/downstream.py --quick        # a few minutes
    .venv/bin/python bench/downstream.py                # the table in bench/RESULTS.md
    .venv/bin/python bench/downstream.py --only qa ner  # some rows
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "tencentpretrain"
sys.path.insert(0, str(ROOT))  # the rows are the package bench.downstream_tasks
KEYS = ("task", "dataset", "metric", "score", "baseline_name", "baseline", "seconds", "train_examples")


def row_names() -> list[str]:
    import bench.downstream_tasks as rows

    return sorted(m.name for m in pkgutil.iter_modules(rows.__path__) if m.name != "common")


def table(results: list[dict]) -> str:
    lines = ["| task | dataset | metric | pentad | baseline | train examples | fine-tune s |",
             "|---|---|---|---:|---|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['row']} | — | — | failed: {r['error']} | — | — | — |")
            continue
        lines.append(f"| {r['task']} | {r['dataset']} | {r['metric']} | {r['score']:.3f} | "
                     f"{r['baseline']:.3f} ({r['baseline_name']}) | {r['train_examples']:,} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small slices and short runs (a smoke test)")
    parser.add_argument("--only", nargs="+", metavar="ROW", help=f"rows to run (default all): {row_names()}")
    parser.add_argument("--output", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    if not SHARED.is_dir():
        print(f"missing shared data ({SHARED}): this benchmark needs ../shared/data beside the repository",
              file=sys.stderr)
        return 2
    names = args.only or row_names()
    unknown = sorted(set(names) - set(row_names()))
    if unknown:
        parser.error(f"unknown row(s) {unknown}; the rows are {row_names()}")
    out = args.output or Path(tempfile.mkdtemp(prefix="downstream_"))
    out.mkdir(parents=True, exist_ok=True)
    results, start = [], time.perf_counter()
    for name in names:
        try:
            row = importlib.import_module(f"bench.downstream_tasks.{name}").run(out, SHARED, args.quick)
            missing = [k for k in KEYS if k not in row]
            if missing:
                raise ValueError(f"row {name} did not report {missing}")
        except (Exception, SystemExit) as e:  # one failing row does not hide the others
            traceback.print_exc()
            row = {"row": name, "error": f"{type(e).__name__}: {str(e)[:120]}"}
        results.append(row)
        print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"\n{'quick' if args.quick else 'full'} run, {len(results)} rows, {(time.perf_counter() - start) / 60:.1f} "
          f"min in all (pre-training included), output in {out}\n")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
