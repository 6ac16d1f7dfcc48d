"""``ModelConfig``: the model section of a run config with its slot unions filled from the component
registries (every component imported first). The schema parts (``ModelConfigBase``, embedding configs)
are in ``pentad.config``, the stream section's in :mod:`pentad.components.stream`; this is where they meet
the registered components."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import Field, create_model

import pentad.components  # noqa: F401  (registers every component)
from pentad.components.stream import StreamConfigBase
from pentad.config.embedding import embedding_config_class
from pentad.config.model import ModelConfigBase
from pentad.config.unions import registry_union
from pentad.registry import DECODERS, ENCODERS, TARGETS


@cache
def model_config_class() -> Any:
    """``ModelConfig``, with its slot unions built from the registries."""
    embedding = embedding_config_class()
    encoder = registry_union(ENCODERS)
    stream = create_model(
        "StreamConfig", __base__=StreamConfigBase,
        embedding=(embedding | None, Field(None, description="the second stream's own embedding slot; default: "
                                           "the same config as model.embedding")),
        encoder=(encoder | None, Field(None, description="the second stream's own encoder; default: the same "
                                       "config as model.encoder")))
    return create_model(
        "ModelConfig", __base__=ModelConfigBase,
        embedding=(embedding, ...),
        encoder=(encoder, ...),
        streams=(dict[str, stream] | None, Field(None, description="two named streams, for a model that reads two "
                                                 "inputs (SBERT, CLIP): the first is model.embedding + "
                                                 "model.encoder over the batch, the second reads Batch.pair "
                                                 "(docs/streams.md)")),
        target_embedding=(embedding | None, Field(None, description="embedding slot of the decoder input")),
        decoder=(registry_union(DECODERS) | None, Field(None, description="decoder slot (encoder-decoder "
                                                         "models)")),
        targets=(list[registry_union(TARGETS)], Field(..., min_length=1)),
    )
