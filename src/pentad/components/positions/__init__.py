"""The registered position schemes of a transformer stack (``model.encoder.positions``).

Each module of this package registers one scheme in ``POSITION_SCHEMES`` under the name the config
selects: a class whose ``build(cfg, model, mask)`` returns the built
:class:`~pentad.layers.positions.PositionScheme` (or None) from the stack config ``cfg``, the model
sizes and the stack's mask kind. Every module here is imported with the package, so a new scheme is
one new file (docs/architecture.md shows one). ``rope_scaling`` holds the rotary scheme's scaling
kinds (the ``rope_scaling`` section) and registers no scheme.
"""

from __future__ import annotations

from typing import Any

from pentad.registry import POSITION_SCHEMES, import_package_modules


@POSITION_SCHEMES.register("none")
class NoPositions:
    """No position signal inside attention (absolute positions, if any, are embedding parts)."""

    @staticmethod
    def build(cfg: Any, model: Any, mask: str) -> None:
        return None


import_package_modules(__name__, __path__)
