"""The config of an embedding slot (parts summed, optional norm, dropout), shared by the model config
and by components that hold a slot config of their own (a second stream). Its parts union comes from
the embeddings registry, read when the class is first built (after the components registered)."""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import Field, create_model

from pentad.config.base import StrictModel
from pentad.config.unions import registry_union
from pentad.layers.norms import NORM_DESCRIPTION, NORM_KINDS
from pentad.registry import EMBEDDINGS


class EmbeddingConfigBase(StrictModel):
    """An embedding slot: parts are summed, then optional LayerNorm, then dropout."""

    norm: bool = Field(True, description="LayerNorm after summing the parts (off for GPT-2)")
    norm_kind: Literal[NORM_KINDS] = Field(  # type: ignore[valid-type]
        "layernorm", description=f"kind of that norm: {NORM_DESCRIPTION}")
    layer_norm_eps: float = Field(1e-12, gt=0.0)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)


@cache
def embedding_config_class() -> Any:
    """``EmbeddingConfig``: :class:`EmbeddingConfigBase` with its ``parts`` union from the registry."""
    return create_model(
        "EmbeddingConfig", __base__=EmbeddingConfigBase,
        parts=(list[registry_union(EMBEDDINGS)], Field(..., min_length=1, description="summed embedding parts")))
