"""The ``pentad`` command and its subcommands."""
