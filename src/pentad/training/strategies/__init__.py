"""Execution strategies (``train.strategy``): importing this package registers them."""

from pentad.training.strategies import deepspeed, fsdp, single  # noqa: F401  (register deepspeed, fsdp; single, ddp)
from pentad.training.strategies.base import STRATEGIES, Strategy

__all__ = ["STRATEGIES", "Strategy"]
