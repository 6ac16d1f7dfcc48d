"""``python -m pentad`` runs the command-line interface."""

import sys

from pentad.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
