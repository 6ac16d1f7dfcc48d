"""The names of the sequence poolings (:mod:`pentad.layers.pooling`), in a module without torch: configs
type their fields with it, and reading a config must not import torch (``pentad preprocess`` needs none)."""

from __future__ import annotations

from typing import Literal

PoolingKind = Literal["first", "mean", "max", "last"]
