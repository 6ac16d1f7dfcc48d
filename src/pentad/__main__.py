"""``python -m pentad`` runs the command-line interface (also how torchrun and the deepspeed launcher
start each rank: ``torchrun ... -m pentad pretrain ...``)."""

import os
import sys

from pentad.cli.main import main

if __name__ == "__main__":
    code = main()
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        # a rank of a launch: its work is done and written (checkpoints are atomic, the process group is
        # closed). Leave without the interpreter's teardown, where a communication thread of torch's or
        # DeepSpeed's still running at exit occasionally aborts the process ("terminate called without an
        # active exception", SIGABRT) and fails a finished run.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
