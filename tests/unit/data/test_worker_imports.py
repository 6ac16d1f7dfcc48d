"""Preprocess workers import the objectives and tokenizers; none of that may pull in torch (it would
cost every worker seconds and hundreds of MB before the first line is tokenized)."""

import subprocess
import sys


def test_preprocess_modules_do_not_import_torch():
    code = ("import sys, pentad.data.preprocess, pentad.data.objectives, pentad.data.tokenizers; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
