"""The registered norms (``NORMS``): the kinds a config's ``norm``, ``final_norm_kind`` (transformer
stacks), ``norm_kind`` (embedding slots) and ``norm`` (the ``mlm`` head) choose from.

Each module of this package registers one kind under its name: a class with ``description`` (what it
computes, for config descriptions and messages), ``module`` (the config-free class of
``layers/norms.py`` or torch it builds, which has ``reset_parameters()``) and ``build(size, eps)``
(the built norm over the last dimension of width ``size``). A kind that builds what another builds
under a second name says so in ``alias_of`` (``t5`` is ``rmsnorm``). Every module here is imported
with the package, so a new norm is one new file (docs/architecture.md shows one).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import nn

from pentad.config.embedding import norm_description as norm_description  # re-exported: the config descriptions
from pentad.registry import NORMS, import_package_modules


def make_norm(kind: str, size: int, eps: float) -> nn.Module:
    """The norm ``kind`` (a registered name) over ``size`` features with ``eps``."""
    return NORMS.get(kind).build(size, eps)


def norm_factory(kind: str, size: int, eps: float) -> Callable[[], nn.Module]:
    """A factory of fresh norms ``kind`` (each call builds one), what a transformer layer receives."""
    return partial(NORMS.get(kind).build, size, eps)


def norm_kinds() -> tuple[str, ...]:
    """Every registered kind, in name order: the configs' choices."""
    return tuple(NORMS.names())


def norm_kind_of(module: nn.Module) -> str | None:
    """The kind that builds ``module`` (the first in name order that is no alias: ``rmsnorm`` for an
    RMSNorm), or None for a module that no registered kind builds."""
    return next((name for name, kind in NORMS.items()
                 if getattr(kind, "alias_of", None) is None and isinstance(module, kind.module)), None)


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a norm some registered kind builds (it has ``reset_parameters()``)."""
    return norm_kind_of(module) is not None


import_package_modules(__name__, __path__)
