"""How one slot sees the model config's shared sizes (a second stream's width, the target side's
vocabulary): a read-through view with overrides, used by the builder and by configs that size a
slot of their own."""

from __future__ import annotations

from typing import Any


class SlotSizes:
    """The model config as one slot sees it: ``vocab_size`` and ``hidden_size`` replaced where the
    slot differs (the target side's vocabulary, the factorised embedding width); every other
    attribute reads through to the config."""

    def __init__(self, cfg: Any, **overrides: Any):
        self._cfg, self._overrides = cfg, overrides

    def __getattr__(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._cfg, name)
