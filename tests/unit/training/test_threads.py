"""pentad.training.threads: OpenMP's wait policy is set before torch starts, unless the user set it."""

from __future__ import annotations

import os
import subprocess
import sys

from pentad.training.threads import ENVIRONMENT_DEFAULTS, prepare_environment


def test_defaults_fill_only_unset_variables():
    environ: dict[str, str] = {}
    assert prepare_environment(environ) == {"OMP_WAIT_POLICY": "PASSIVE"} == ENVIRONMENT_DEFAULTS
    mine = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert prepare_environment(mine) == {} and mine == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_the_command_sets_the_policy_before_torch_is_imported():
    code = ("import os, sys; from pentad.cli.main import main; assert 'torch' not in sys.modules; "
            "rc = main(['list', 'tasks']); assert 'torch' in sys.modules; print(rc, os.environ['OMP_WAIT_POLICY'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 PASSIVE"
