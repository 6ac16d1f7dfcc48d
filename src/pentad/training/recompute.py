"""Activation checkpointing (``train.activation_checkpointing``): each block of the model keeps only
its input in forward and recomputes its activations in backward.

The blocks are :meth:`pentad.model.Model.blocks`. Each block's ``forward`` is replaced on the
instance by one that runs the original under ``torch.utils.checkpoint`` (``use_reentrant=False``:
correct with inputs that need no gradient, with keyword arguments, and with dropout, whose random
numbers are replayed), so parameter names, state dicts and checkpoints are unchanged, and sharding
wrappers applied afterwards see the same modules. Gradients are bitwise those without it.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpoint_blocks(model: nn.Module) -> int:
    """Recompute every block of ``model`` in backward (while training); returns how many blocks."""
    blocks = model.blocks() if hasattr(model, "blocks") else []
    for block in blocks:
        if getattr(block, "_pentad_recomputed", False):
            continue
        original = block.forward

        def forward(*args: Any, _original=original, _block=block, **kwargs: Any) -> Any:
            if not (_block.training and _needs_grad(_block)):
                return _original(*args, **kwargs)
            return checkpoint(_original, *args, use_reentrant=False, **kwargs)

        block.forward = forward
        block._pentad_recomputed = True  # noqa: SLF001
    return len(blocks)


def _needs_grad(block: nn.Module) -> bool:
    import torch

    return torch.is_grad_enabled() and any(p.requires_grad for p in block.parameters())
