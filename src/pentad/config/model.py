"""The model section of a config: shared sizes once, then one config per slot."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import Field, create_model

from pentad.config.base import StrictModel
from pentad.config.unions import registry_union
from pentad.registry import EMBEDDINGS, ENCODERS, TARGETS


class EmbeddingConfigBase(StrictModel):
    """The embedding slot: parts are summed, then optional LayerNorm, then dropout."""

    norm: bool = Field(True, description="LayerNorm after summing the parts (off for GPT-2)")
    layer_norm_eps: float = Field(1e-12, gt=0.0)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)


class ModelConfigBase(StrictModel):
    hidden_size: int = Field(..., ge=1)
    vocab_size: int | None = Field(None, ge=1, description="set from the tokenizer when one is given")
    max_seq_length: int = Field(512, ge=1)
    tie_word_embeddings: bool = Field(True, description="output heads share the word embedding table")
    init_std: float = Field(0.02, gt=0.0, description="std of the normal initialisation of weights")


@cache
def model_config_class() -> Any:
    """``ModelConfig``, with its slot unions built from the registries (components imported first)."""
    import pentad.components  # noqa: F401  (registers every component)

    embedding = create_model(
        "EmbeddingConfig", __base__=EmbeddingConfigBase,
        parts=(list[registry_union(EMBEDDINGS)], Field(..., min_length=1,
                                                       description="summed embedding parts")))
    return create_model(
        "ModelConfig", __base__=ModelConfigBase,
        embedding=(embedding, ...),
        encoder=(registry_union(ENCODERS), ...),
        targets=(list[registry_union(TARGETS)], Field(..., min_length=1)),
    )
