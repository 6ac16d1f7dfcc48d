"""The model section of a config: shared sizes once, then one config per slot (the schema part; the
slot unions are filled from the component registries by :func:`pentad.components.model_config.model_config_class`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from pentad.config.base import StrictModel
from pentad.config.dual_layout import from_dual_encoder

if TYPE_CHECKING:
    from pentad.components.stream import StreamConfigBase
    from pentad.components.targets.common import TargetConfigBase
    from pentad.config.base import SlotConfig
    from pentad.config.embedding import EmbeddingConfigBase


class CompressionConfig(StrictModel):
    """``model.compression``: what ``pentad compress`` did to a model, so that every reader (infer,
    generate, a teacher, ``init=``) builds the same smaller modules before reading the weights
    (docs/compress.md). Written by ``pentad compress``, not set by hand."""

    quantize: Literal["int8"] | None = Field(None, description="int8: every linear layer not tied to an "
                                             "embedding holds int8 weights and per-channel scales (inference "
                                             "only)")
    heads: dict[str, int] = Field(default_factory=dict, description="attention block (module name) -> the "
                                  "number of heads it kept after structured pruning")
    ffn: dict[str, int] = Field(default_factory=dict, description="feed-forward block (module name) -> its "
                                "width after structured pruning")
    sparsity: float = Field(0.0, ge=0.0, lt=1.0, description="the fraction of each linear weight zeroed by "
                            "magnitude (unstructured sparsity; a record: the weights stay dense)")


class ModelConfigBase(StrictModel):
    hidden_size: int = Field(..., ge=1)
    vocab_size: int | None = Field(None, ge=1, description="set from the tokenizer when one is given")
    target_vocab_size: int | None = Field(None, ge=1, description="vocabulary of the target embedding and "
                                          "output (translation with a separate target tokenizer); default "
                                          "vocab_size")
    embedding_size: int | None = Field(None, ge=1, description="width of the embedding slots when it differs "
                                       "from hidden_size (ALBERT's factorised embedding): a projection maps "
                                       "it to hidden_size")
    max_seq_length: int = Field(512, ge=1)
    tie_word_embeddings: bool = Field(True, description="output heads share the word embedding table (the "
                                      "target embedding's when there is a decoder)")
    share_embedding: bool = Field(False, description="the target embedding's word table is the encoder's "
                                  "(encoder-decoder models with one vocabulary: T5, BART)")
    init_std: float = Field(0.02, gt=0.0, description="std of the normal initialisation of weights")
    init: Literal["normal", "t5"] = Field("normal", description="normal: N(0, init_std) weights (BERT, GPT-2); "
                                          "t5: unit-variance embeddings and fan-in-scaled projections (T5)")
    compression: CompressionConfig | None = Field(None, description="set by pentad compress: pruned block "
                                                  "sizes and int8 quantization (docs/compress.md)")
    if TYPE_CHECKING:  # the slots, added by pentad.components.model_config from the registries
        embedding: EmbeddingConfigBase
        encoder: SlotConfig
        streams: dict[str, StreamConfigBase] | None
        target_embedding: EmbeddingConfigBase | None
        decoder: SlotConfig | None
        targets: list[TargetConfigBase]

    @model_validator(mode="before")
    @classmethod
    def _dual_encoder_is_streams(cls, data: Any) -> Any:
        """The former ``dual`` pseudo-encoder (``stream_0`` / ``stream_1``) as ``model.streams``."""
        return from_dual_encoder(data) if isinstance(data, dict) else data

    @property
    def output_vocab_size(self) -> int | None:
        """Vocabulary the output heads predict: the target side's when there is a decoder."""
        if getattr(self, "decoder", None) is not None:
            return self.target_vocab_size or self.vocab_size
        return self.vocab_size
