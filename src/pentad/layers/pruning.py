"""Structured pruning of transformer blocks: attention heads and feed-forward neurons removed for real
(smaller matrices, so the pruned model is smaller and faster), and unstructured magnitude sparsity.

:func:`keep_heads` and :func:`keep_neurons` slice a block's weights to the heads / neurons in ``keep``
(in that order); a model built at full size and cut with ``keep = range(n)`` has the shapes of a pruned
one, which is how a pruned model is rebuilt before its weights are read. Both find the projections
through the block's ``roles()`` (:class:`~pentad.layers.block.Block`): the rows of every role that
produces heads or units are cut, and the columns of the projection that reads them (``o``, ``down``),
whatever the block calls its projections and however it lays out their rows.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pentad.layers.attention import Attention
from pentad.layers.feed_forward import FeedForward


def _slice_linear(linear: nn.Linear, rows: Tensor | None = None, cols: Tensor | None = None) -> nn.Linear:
    weight = linear.weight.detach()
    bias = linear.bias.detach() if linear.bias is not None else None
    if rows is not None:
        weight = weight[rows]
        bias = bias[rows] if bias is not None else None
    if cols is not None:
        weight = weight[:, cols]
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device,
                    dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        if bias is not None:
            new.bias.copy_(bias)
    return new


# The roles whose projection reads the heads (attention's output) or the units (a feed-forward's down
# projection): their columns are cut; every other role's rows.
READING_ROLES = ("o", "down")


def reading_projection(block: nn.Module) -> nn.Module:
    """The projection of ``block`` that reads its heads or units (its ``roles()`` name ``o`` or ``down``):
    where a gate per head or unit goes, before it; its ``in_features`` is the heads' or units' width."""
    name = next(name for name, roles in block.roles().items() if any(role in READING_ROLES for role in roles))
    return getattr(block, name)


def _keep_units(block: nn.Module, keep: Tensor, width: int) -> None:
    """Cut every projection ``block.roles()`` names to the units ``keep`` (``width`` rows each: a head's
    head_size, a feed-forward unit's 1): their rows in each role that produces them (the roles in row
    order), their columns in the projection that reads them."""
    roles = block.roles()
    device = getattr(block, next(iter(roles))).weight.device
    keep = keep.to(device)
    within = (keep[:, None] * width + torch.arange(width, device=device)[None]).reshape(-1)
    for name, parts in roles.items():
        linear = getattr(block, name)
        if any(role in READING_ROLES for role in parts):
            setattr(block, name, _slice_linear(linear, cols=within))
        else:
            rows = torch.cat([within + start for start, _ in sorted(parts.values())])
            setattr(block, name, _slice_linear(linear, rows=rows))


def prunable_heads(attention: Attention) -> str | None:
    """Why the heads of ``attention`` cannot be pruned, or None when they can."""
    if attention.cross:
        return "it is cross-attention"
    if attention.num_kv_heads != attention.num_heads:
        return f"it has grouped-query heads ({attention.num_heads} queries, {attention.num_kv_heads} keys/values)"
    if attention.residual:
        return "it uses residual attention scores (RealFormer)"
    return None


def keep_heads(attention: Attention, keep: list[int] | Tensor) -> None:
    """Keep the heads ``keep`` of a self-attention block (in place): fewer rows of its query, key and value
    projections (``qkv``), fewer columns of its output projection (``out``). At least one head stays."""
    why = prunable_heads(attention)
    if why is not None:
        raise ValueError(f"cannot prune the heads of this attention block: {why}")
    keep = torch.as_tensor(keep, dtype=torch.long)
    if keep.numel() < 1:
        raise ValueError("at least one attention head must stay")
    _keep_units(attention, keep, attention.head_size)
    attention.resize_heads(int(keep.numel()))


def keep_neurons(ffn: FeedForward, keep: list[int] | Tensor) -> None:
    """Keep the hidden units ``keep`` of a dense or gated feed-forward block (in place): fewer rows of
    ``up`` (and ``gate``), fewer columns of ``down``. At least one unit stays."""
    keep = torch.as_tensor(keep, dtype=torch.long)
    if keep.numel() < 1:
        raise ValueError("at least one feed-forward unit must stay")
    _keep_units(ffn, keep, 1)


def ffn_size(ffn: FeedForward) -> int:
    return reading_projection(ffn).in_features


def magnitude_sparsify(model: nn.Module, fraction: float, prefixes: tuple[str, ...] = ("encoder.", "decoder.")
                       ) -> int:
    """Zero the ``fraction`` of smallest-magnitude weights of every ``nn.Linear`` under ``prefixes`` (each
    matrix on its own; biases kept). Returns how many weights were zeroed. The matrices stay dense: this
    saves nothing on disk or in time without a sparse kernel, it is the unstructured-sparsity option."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {fraction}")
    zeroed = 0
    for name, module in model.named_modules():
        if type(module) is nn.Linear and name.startswith(prefixes):
            w = module.weight
            k = int(fraction * w.numel())
            if k == 0:
                continue
            threshold = w.detach().abs().flatten().kthvalue(k).values
            with torch.no_grad():
                mask = w.abs() <= threshold
                w.masked_fill_(mask, 0.0)
            zeroed += int(mask.sum())
    return zeroed
