"""The config of an embedding slot (parts summed, optional norm, dropout), shared by the model config
and by components that hold a slot config of their own (a second stream). Its parts union comes from
the embeddings registry and its norm kinds from the norms registry, read when the class is first built
(after the components registered)."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, model_validator

from pentad.config.base import SlotConfig, StrictModel
from pentad.config.unions import registry_union
from pentad.registry import EMBEDDINGS, NORMS


class EmbeddingConfigBase(StrictModel):
    """An embedding slot: parts are summed, then optional LayerNorm, then dropout."""

    norm: bool = Field(True, description="LayerNorm after summing the parts (off for GPT-2)")
    norm_kind: str = Field("layernorm", description="kind of that norm (a registered norm; the built class "
                           "lists them)")
    layer_norm_eps: float = Field(1e-12, gt=0.0)
    second_norm: bool = Field(False, description="a second norm of the same kind and eps right after the first "
                              "(LN after LN): TencentPretrain's DualEmbedding applies one (stream_i_layer_norm) on "
                              "top of each stream's embedding LayerNorm; a converted TencentPretrain dual-stream "
                              "checkpoint sets it to compute what it computes there (needs norm)")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    if TYPE_CHECKING:  # added by embedding_config_class() from the registry
        parts: list[SlotConfig]

    @model_validator(mode="after")
    def _second_norm_needs_norm(self) -> EmbeddingConfigBase:
        if self.second_norm and not self.norm:
            raise ValueError("second_norm is true but norm is false: the second norm follows the first")
        return self


@cache
def embedding_config_class() -> Any:
    """``EmbeddingConfig``: :class:`EmbeddingConfigBase` with its ``parts`` union from the embeddings
    registry and its ``norm_kind`` choices from the norms registry (``components/norms``)."""
    if not len(NORMS):
        raise RuntimeError("embedding_config_class() before any norm is registered: import pentad.components "
                           "first (it registers the norms the embedding slot's norm_kind chooses from)")
    kinds = NORMS.names()
    return create_model(
        "EmbeddingConfig", __base__=EmbeddingConfigBase,
        norm_kind=(Literal[tuple(kinds)], Field(  # type: ignore[valid-type]
            "layernorm", description=f"kind of that norm: {norm_description()}")),
        parts=(list[registry_union(EMBEDDINGS)], Field(..., min_length=1, description="summed embedding parts")))


def norm_description() -> str:
    """What each registered norm (``components/norms``) computes, kinds with an alias named together
    (``rmsnorm / t5: ...``): the config descriptions of every norm kind field."""
    names: dict[str, list[str]] = {}
    for name, kind in NORMS.items():
        names.setdefault(getattr(kind, "alias_of", None) or name, []).append(name)
    return "; ".join(f"{' / '.join(sorted(group))}: {NORMS.get(main).description}" for main, group in names.items())
