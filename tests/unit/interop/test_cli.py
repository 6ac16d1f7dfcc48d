"""``pentad convert`` on the command line: arguments, report, exit status 0 / 1 / 2."""

import argparse

import pytest

from pentad.cli import convert as cli
from pentad.errors import UserError

from .helpers import BERT, make_run


def parse(argv):
    parser = argparse.ArgumentParser(prog="pentad")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.add_parser(sub)
    return parser.parse_args(argv)


def exit_status(argv) -> int:
    """What the entry point does: run the command; a UserError is exit status 2."""
    try:
        return cli.run(parse(argv))
    except UserError as e:
        return e.exit_code


def test_arguments():
    args = parse(["convert", "pentad-to-hf", "in", "out", "--family", "roberta", "--verify", "--tolerance", "1e-4"])
    assert (args.direction, str(args.input), str(args.output), args.family, args.verify, args.tolerance) == \
        ("pentad-to-hf", "in", "out", "roberta", True, 1e-4)
    with pytest.raises(SystemExit):
        parse(["convert", "hf-to-tf", "in", "out"])


def test_success_prints_a_report(tmp_path, capsys):
    make_run(tmp_path / "run", BERT)
    assert exit_status(["convert", "pentad-to-hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    assert "pentad-to-hf" in capsys.readouterr().out and (tmp_path / "hf" / "config.json").is_file()


def test_user_errors_exit_2(tmp_path, capsys):
    assert exit_status(["convert", "hf-to-pentad", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    make_run(tmp_path / "run", BERT)
    assert exit_status(["convert", "pentad-to-hf", str(tmp_path / "run"), str(tmp_path / "o"), "--family", "t5"]) == 2


def test_through_the_entry_point_when_wired(tmp_path, capsys):
    from pentad.cli import main

    try:
        main.build_parser().parse_args(["convert", "hf-to-pentad", "a", "b"])
    except SystemExit:
        pytest.skip("`pentad convert` is not wired into pentad.cli.main yet")
    assert main.main(["convert", "hf-to-pentad", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert "error" in capsys.readouterr().err
