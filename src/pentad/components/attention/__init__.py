"""The registered attention variants of a transformer layer (``ATTENTION_BLOCKS``).

Each module of this package registers one variant (``layers/attention.py`` holds the config-free
classes): a class with ``applies(cfg)``, whether the stack config ``cfg`` selects it for the stack's
self-attention, and ``factory(cfg, model)``, a ``BlockFactory`` (layer index -> the built attention
block). The first registered variant whose ``applies`` holds builds the self-attention of every layer,
``self`` otherwise; ``cross`` is asked for by name (decoders). Every module here is imported with the
package, so a new variant is one new file (docs/architecture.md shows one).
"""

from __future__ import annotations

from typing import Any

from pentad.registry import ATTENTION_BLOCKS, import_package_modules


def attention_sizes(cfg: Any, model: Any) -> dict[str, Any]:
    """The arguments every attention variant takes (``Attention.__init__``), from the stack config."""
    dropout = cfg.dropout if cfg.attention_dropout is None else cfg.attention_dropout
    scale = cfg.attention_scale if cfg.attention_scale_size is None else cfg.attention_scale_size ** -0.5
    return dict(hidden_size=model.hidden_size, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                head_size=cfg.head_size, dropout=dropout, bias=cfg.bias, scale=scale, qkv_bias=cfg.qkv_bias)


def self_attention_kind(cfg: Any) -> str:
    """The registered attention variant of the stack's self-attention."""
    return next((name for name, block in ATTENTION_BLOCKS.items() if block.applies(cfg)), "self")


import_package_modules(__name__, __path__)
