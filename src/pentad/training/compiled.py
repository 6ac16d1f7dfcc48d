"""``train.compile``: the model's forward compiled with ``torch.compile`` (TorchInductor kernels).

``blocks`` compiles each repeated block (:meth:`pentad.model.Model.blocks`: the transformer layers)
on its own: one small graph per layer kind, compiled once and reused by every layer of that kind,
so compilation takes seconds to minutes, and what is not a block (embeddings, heads, the loss) runs
eagerly. ``model`` compiles the whole forward (longer to compile; graph breaks fall back to eager
code). Both compile in place (``nn.Module.compile``): parameter names, state dicts and checkpoints
are those of the eager model, and activation checkpointing, applied before, is compiled with it.
The first steps of each new input shape are slow while compiling; the run's log says so.
Measured numbers (and where compiling does not pay, e.g. small models on a CPU) are in
``bench/RESULTS.md``.
"""

from __future__ import annotations

from torch import nn

from pentad.errors import UserError


def compile_model(model: nn.Module, mode: str) -> int:
    """Compile ``model`` in place as ``mode`` says (``off``, ``blocks`` or ``model``); returns how many
    modules were compiled."""
    if mode == "off":
        return 0
    if mode == "model":
        model.compile()
        return 1
    blocks = model.blocks() if hasattr(model, "blocks") else []
    if not blocks:
        raise UserError("train.compile=blocks, but this model has no repeated blocks to compile (its encoder has "
                        "no layers: an RNN or bag-of-words encoder); use train.compile=model or off")
    for block in blocks:
        block.compile()
    return len(blocks)
