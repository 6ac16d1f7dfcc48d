"""CPU thread settings that degrade gracefully when the machine is shared.

torch runs its intra-op parallel regions (matrix products, element-wise kernels) on an OpenMP
pool, one thread per core by default. GNU OpenMP's default wait policy makes a thread that
finishes its share *spin* at the end of each region until the others catch up. When another
process holds one of the cores, the thread that still has work waits for a time slice while its
partner burns the other core spinning: a fine-tuning step measured 2.5x slower with 2 threads
than with 1 on a loaded machine, using 2.5x the CPU time (bench/RESULTS.md, "Threads on a shared
CPU"). With ``OMP_WAIT_POLICY=PASSIVE`` waiting threads sleep instead, and 2 threads are then as
fast as 1 under load and keep most of their speed-up on an idle machine.

OpenMP reads the variable once, when torch loads it, so :func:`prepare_environment` must run
before ``import torch``: the ``pentad`` entry point calls it first thing. A value the user set
(``OMP_WAIT_POLICY=ACTIVE``) is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

#: Environment defaults applied before torch starts (a variable the user set is left alone).
ENVIRONMENT_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def prepare_environment(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :data:`ENVIRONMENT_DEFAULTS` that are unset; returns those it set.

    Has no effect on an OpenMP pool that already exists, i.e. once torch is imported.
    """
    environ = os.environ if environ is None else environ
    applied = {}
    for key, value in ENVIRONMENT_DEFAULTS.items():
        if key not in environ:
            environ[key] = value
            applied[key] = value
    return applied


def configure_threads(threads: int | None = None) -> int:
    """Apply the environment defaults (if torch has not started yet) and ``train.threads``.

    For programs that use pentad as a library: call it before the first ``import torch`` to get the
    ``pentad`` command's behaviour (``bench/threads_under_load.py`` does).

    Returns the number of intra-op threads torch will use (its default, one per core, when
    ``threads`` is None).
    """
    if "torch" not in sys.modules:
        prepare_environment()
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
