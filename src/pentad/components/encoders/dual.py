"""Two-stream (dual, siamese) models: SBERT, InferSent, siamese LSTMs, CLIP-style towers.

A dual model encodes two inputs separately and hands its targets one pooled vector per input.
Stream 0 is the model's own embedding and encoder slots, exactly as in a one-stream model (the
encoder slot holds ``stream_0.encoder``); stream 1 reads ``Batch.pair`` and either shares stream
0's embedding and encoder (``tie: true``, the siamese / SBERT setting) or has its own
(``tie: false``, e.g. a text tower and an image tower). The module registered here as ``dual``
sits beside the encoder slot (``Model.pair``): it holds stream 1's modules when untied and pools
both streams into a :class:`~pentad.components.base.PooledPair` (first [B,H0], second [B,H1]).

Parameter names follow from this layout: a tied dual model has exactly the names of a one-stream
model with the same embedding and encoder (``embedding.*``, ``encoder.*``), so a BERT checkpoint
initialises an SBERT model as it is; an untied one adds ``pair.embedding.*`` and
``pair.encoder.*``. Unlike TencentPretrain's ``DualEmbedding`` there is no second LayerNorm and
dropout on top of each stream's embedding slot: each stream has exactly one embedding norm, unless
its slot sets ``second_norm`` (a converted TencentPretrain CLIP checkpoint does).

Config (``model.encoder``)::

    type: dual
    tie: true                          # stream 1 shares stream 0's embedding and encoder
    stream_0: {encoder: {type: transformer, ...}, pooling: mean}
    stream_1: {pooling: mean}          # untied: also embedding, encoder, hidden_size, ...

The nested ``encoder`` and ``embedding`` configs may be any registered encoder (but ``dual``) and
any embedding slot. Their config classes are only known once every component is registered, so
the fields are typed lazily: they are validated through the registry unions when a config is
loaded, and errors carry the full path (``model.encoder.stream_1.encoder.num_layers``).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import torch
from pydantic import BaseModel, Field, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticCustomError, core_schema
from torch import Tensor, nn

from pentad.components.base import Batch, Encoder, PooledPair
from pentad.components.stream import run_stream
from pentad.config.base import StrictModel
from pentad.config.embedding import embedding_config_class
from pentad.config.schema import class_at
from pentad.config.sizes import SlotSizes
from pentad.config.unions import registry_union
from pentad.errors import closest
from pentad.layers.pooling import PoolingKind, pool
from pentad.registry import ENCODERS

if TYPE_CHECKING:
    from pentad.model import EmbeddingSlot

# Batch fields a tied pair may be merged on (every one is [B,S]); see DualEncoder._merged.
_TOKEN_FIELDS = ("tokens", "segments", "padding_mask", "positions")


# ----------------------------------------------------------------------- lazily typed configs
@cache
def _nested_adapter(kind: str) -> tuple[TypeAdapter, type[BaseModel]]:
    """(validator, holder model) of a nested ``encoder`` or ``embedding`` config.

    Built on first use, when every component has registered; the holder model (one field
    ``value``) lets ``pentad.config.loader`` find the config class at an error's location.
    """
    if kind == "encoder":
        annotation: Any = registry_union(ENCODERS)
    else:
        annotation = embedding_config_class()
    holder = create_model(f"Nested{kind.title()}", value=(annotation, ...))
    return TypeAdapter(annotation), holder


def _validate_nested(kind: str, value: Any) -> Any:
    if isinstance(value, BaseModel):  # already validated (a model_copy, an assignment)
        value = value.model_dump()
    adapter, holder = _nested_adapter(kind)
    try:
        return adapter.validate_python(value)
    except ValidationError as error:
        raise _with_valid_keys(error, holder) from None


def _with_valid_keys(error: ValidationError, holder: type[BaseModel]) -> ValidationError:
    """``error`` with each unknown key's message listing the valid keys there (the config loader
    cannot see through a lazily typed field to find them itself)."""
    details: list[Any] = []
    for err in error.errors():
        detail = {"type": err["type"], "loc": err["loc"], "input": err.get("input")}
        if "ctx" in err:
            detail["ctx"] = err["ctx"]
        if err["type"] == "extra_forbidden":
            parent = class_at(holder, ("value", *err["loc"][:-1]))
            keys = list(parent.model_fields) if parent is not None else []
            hint = closest(str(err["loc"][-1]), keys)
            text = "unknown key" + (f"; valid keys here: {', '.join(keys)}" if keys else "")
            text += f"; did you mean '{hint}'?" if hint else ""
            detail["type"] = PydanticCustomError("unknown_key", text)
            detail.pop("ctx", None)
        details.append(detail)
    return ValidationError.from_exception_data(error.title, details)


class _Nested:
    """Annotation marker: the field holds a config of ``kind`` (``encoder`` or ``embedding``),
    validated through the registry union at validation time (see the module docstring)."""

    def __init__(self, kind: str):
        self.kind = kind

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        kind = self.kind
        return core_schema.no_info_plain_validator_function(lambda value: _validate_nested(kind, value))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        what = "an encoder config (any registered encoder but dual), as model.encoder" if self.kind == "encoder" \
            else "an embedding slot config, as model.embedding"
        return {"type": ["object", "string"], "description": what}


NestedEncoder = Annotated[Any, _Nested("encoder")]
NestedEmbedding = Annotated[Any, _Nested("embedding")]


class StreamZeroConfig(StrictModel):
    """Stream 0: the model's embedding slot, then ``encoder`` (which fills the encoder slot)."""

    encoder: NestedEncoder = Field(..., description="stream 0's encoder: any registered encoder but dual")
    pooling: PoolingKind = Field("mean", description="how the stream's token states become one vector: "
                                 "first, mean, max or last (over real tokens only)")


class StreamOneConfig(StrictModel):
    """Stream 1 (reads ``Batch.pair``). With ``tie: true`` only ``pooling`` may be set."""

    embedding: NestedEmbedding | None = Field(None, description="stream 1's embedding slot (untied); "
                                              "default: the same slot config as model.embedding")
    encoder: NestedEncoder | None = Field(None, description="stream 1's encoder (untied); default: "
                                          "the same config as stream_0.encoder")
    pooling: PoolingKind | None = Field(None, description="default: stream_0.pooling")
    hidden_size: int | None = Field(None, ge=1, description="stream 1's width (untied); default "
                                    "model.hidden_size")
    embedding_size: int | None = Field(None, ge=1, description="stream 1's embedding width (untied); "
                                       "default model.embedding_size")
    vocab_size: int | None = Field(None, ge=1, description="stream 1's vocabulary (untied); default "
                                   "model.vocab_size")
    max_seq_length: int | None = Field(None, ge=1, description="stream 1's longest input (untied); "
                                       "default model.max_seq_length")


_UNTIED_ONLY = ("embedding", "encoder", "hidden_size", "embedding_size", "vocab_size", "max_seq_length")
_SIZE_FIELDS = ("hidden_size", "embedding_size", "vocab_size", "max_seq_length")


class DualEncoderConfig(StrictModel):
    type: Literal["dual"] = "dual"
    tie: bool = Field(True, description="stream 1 shares stream 0's embedding and encoder (siamese, "
                      "SBERT); false gives it its own")
    stream_0: StreamZeroConfig
    stream_1: StreamOneConfig = Field(default_factory=StreamOneConfig)

    @property
    def pooling(self) -> tuple[str, str]:
        """(stream 0's pooling, stream 1's pooling)."""
        return self.stream_0.pooling, self.stream_1.pooling or self.stream_0.pooling

    def stream_1_encoder(self) -> Any:
        """Stream 1's encoder config (stream 0's when tied or not given)."""
        return self.stream_0.encoder if self.tie or self.stream_1.encoder is None else self.stream_1.encoder

    def stream_1_embedding(self, model: Any) -> Any:
        """Stream 1's embedding slot config (the model's when tied or not given)."""
        return model.embedding if self.tie or self.stream_1.embedding is None else self.stream_1.embedding

    def stream_1_sizes(self, model: Any) -> Any:
        """The model config as stream 1 sees it: its own sizes where it sets them."""
        overrides = {} if self.tie else {k: getattr(self.stream_1, k) for k in _SIZE_FIELDS
                                         if getattr(self.stream_1, k) is not None}
        return SlotSizes(model, **overrides)

    def widths(self, model: Any) -> tuple[int, int]:
        """Widths (H0, H1) of the two pooled vectors."""
        return model.hidden_size, self.stream_1_sizes(model).hidden_size

    def check(self, model: Any) -> list[tuple[str, str]]:
        """Problems that need the model-level sizes: (sub-path below model.encoder, message)."""
        problems: list[tuple[str, str]] = []
        problems += _encoder_problems("stream_0.encoder", self.stream_0.encoder, model)
        if self.tie:
            for key in _UNTIED_ONLY:
                if getattr(self.stream_1, key) is not None:
                    problems.append((f"stream_1.{key}", "set, but tie is true: stream 1 shares stream 0's "
                                                        "embedding and encoder (only its pooling may differ); "
                                                        "remove it, or set tie: false to give stream 1 its own"))
            return problems
        sizes = self.stream_1_sizes(model)
        if self.stream_1.encoder is not None:
            problems += _encoder_problems("stream_1.encoder", self.stream_1.encoder, sizes)
        elif any(getattr(self.stream_1, k) is not None for k in _SIZE_FIELDS):
            # stream 0's encoder config, checked again at stream 1's sizes
            problems += [(f"stream_1.{key.removeprefix('stream_0.encoder.')}", msg) for key, msg in
                         _encoder_problems("stream_0.encoder", self.stream_0.encoder, sizes)]
        embedding = self.stream_1_embedding(model)
        where = "stream_1.embedding" if self.stream_1.embedding is not None else "stream_1"
        names = [p.type for p in embedding.parts]
        for i, name in enumerate(names):
            if name in names[:i]:
                problems.append((f"{where}.parts.{i}", f"embedding part '{name}' appears twice"))
        if sizes.vocab_size is None and "word" in names:
            problems.append(("stream_1.vocab_size", "not set, and neither is model.vocab_size: stream 1's "
                                                    "word embedding needs a vocabulary size"))
        return problems


def _encoder_problems(path: str, cfg: Any, sizes: Any) -> list[tuple[str, str]]:
    if cfg.type == "dual":
        return [(f"{path}.type", "a stream of a dual encoder cannot itself be dual; give it a "
                                 "one-stream encoder such as transformer or lstm")]
    return [(f"{path}.{key}", msg) for key, msg in getattr(cfg, "check", lambda m: [])(sizes)]


# ------------------------------------------------------------------------------------ module
@ENCODERS.register("dual")
class DualEncoder(nn.Module):
    """Stream 1 of a two-stream model and the pooling of both streams.

    ``forward(batch, embedding_0, encoder_0) -> PooledPair``: stream 0 runs ``embedding_0`` and
    ``encoder_0`` (the model's slots) over ``batch``; stream 1 runs over ``batch.pair`` through
    this module's own ``embedding`` and ``encoder``, or through stream 0's when tied (both are
    None). Each stream's token states [B,S,H] are pooled over its real tokens into [B,H].

    A tied pair whose inputs are plain token fields runs as one batch of 2B rows (the shorter
    side padded), which gives the same vectors as two passes since every encoder ignores padding.
    Hard negatives (``batch.negative``, supervised SimCSE) run through stream 1 and come back as
    ``PooledPair.negative`` (a tied model stacks them too: 3B rows).
    """

    Config = DualEncoderConfig
    two_streams: ClassVar[bool] = True

    def __init__(self, pooling_0: PoolingKind = "mean", pooling_1: PoolingKind = "mean",
                 embedding: EmbeddingSlot | None = None, encoder: Encoder | None = None):
        super().__init__()
        if (embedding is None) != (encoder is None):
            raise ValueError("give stream 1 both an embedding and an encoder (untied), or neither (tied)")
        self.pooling_0, self.pooling_1 = pooling_0, pooling_1
        self.embedding = embedding
        self.encoder = encoder

    @property
    def tied(self) -> bool:
        return self.encoder is None

    @classmethod
    def from_config(cls, cfg: DualEncoderConfig, model: Any) -> DualEncoder:
        """Not used: the builder assembles both streams' slots and hands them in (``build_pair_stream``);
        a module never calls back into the builder."""
        raise TypeError("a dual model is assembled by pentad.builder.build_model (build_pair_stream), not by "
                        "DualEncoder.from_config")

    def required_fields(self, embedding_0: nn.Module, encoder_0: nn.Module) -> list[tuple[str, str]]:
        """(module description, Batch field) for every field stream 1 reads, as ``pair.<field>``."""
        embedding = embedding_0 if self.embedding is None else self.embedding
        encoder = encoder_0 if self.encoder is None else self.encoder
        out = [(f"stream 1 embedding part '{name}'", f"pair.{f}")
               for name in embedding.part_names for f in getattr(embedding, name).requires]
        out += [(f"stream 1 encoder '{encoder.registry_name}'", f"pair.{f}") for f in getattr(encoder, "requires", ())]
        return out

    def describe(self) -> str:
        """One line for ``pentad.builder.summarize``."""
        if self.tied:
            stream = "stream 1 shares the embedding and encoder (tied)"
        else:
            n = sum(p.numel() for p in self.parameters())
            stream = (f"stream 1 embedding {'+'.join(self.embedding.part_names)}, encoder "
                      f"{self.encoder.registry_name} ({n:,})")
        return f"{stream}; pooling {self.pooling_0} / {self.pooling_1}"

    def forward(self, batch: Batch, embedding_0: EmbeddingSlot, encoder_0: Encoder) -> PooledPair:
        pair, negative = batch.pair, batch.negative
        if pair is None:
            raise ValueError("a dual model reads its second input from batch.pair, which is not set")
        for name, part in (("pair", pair), ("negative", negative)):
            if part is not None and part.batch_size != batch.batch_size:
                raise ValueError(f"batch.{name} has {part.batch_size} rows, the batch {batch.batch_size}; "
                                 f"a dual model needs one {name} row per row")
        parts = [batch, pair] + ([negative] if negative is not None else [])
        merged = self._merged(parts) if self.tied else None
        if merged is not None:
            hidden, mask = run_stream(embedding_0, encoder_0, merged)
            rows = batch.batch_size
            states = [(hidden[i * rows:(i + 1) * rows], None if mask is None else mask[i * rows:(i + 1) * rows])
                      for i in range(len(parts))]
        else:
            states = [run_stream(embedding_0, encoder_0, batch)]
            states += [run_stream(self.embedding or embedding_0, self.encoder or encoder_0, part)
                       for part in parts[1:]]
        pooled = [pool(*states[0], self.pooling_0)] + [pool(*s, self.pooling_1) for s in states[1:]]
        return PooledPair(pooled[0], pooled[1], pooled[2] if len(pooled) > 2 else None)

    def pooled_stream(self, batch: Batch, stream: int, embedding_0: EmbeddingSlot, encoder_0: Encoder) -> Tensor:
        """One stream alone over ``batch`` (its own input, not ``batch.pair``), pooled [B,H]: texts and
        images encoded separately, as retrieval and zero-shot classification need."""
        if stream == 0 or self.tied:
            embedding, encoder = embedding_0, encoder_0
        else:
            embedding, encoder = self.embedding, self.encoder
        return pool(*run_stream(embedding, encoder, batch), self.pooling_0 if stream == 0 else self.pooling_1)

    @staticmethod
    def _merged(parts: list[Batch]) -> Batch | None:
        """The inputs of the streams (stream 0, stream 1, and stream 1's hard negatives when given)
        as one Batch of rows stacked in that order, right-padded to the longest length; None when
        they cannot be stacked (other fields than [B,S] token fields)."""
        has = [name for name in _TOKEN_FIELDS if getattr(parts[0], name) is not None]
        if not has or any(has != [name for name in _TOKEN_FIELDS if getattr(p, name) is not None] for p in parts):
            return None
        if any(getattr(x, name) is not None for x in parts for name in ("decoder_tokens", "pixels", "audio")):
            return None
        refs = [getattr(p, has[0]) for p in parts]
        width = max(ref.shape[1] for ref in refs)
        merged: dict[str, Tensor] = {}
        for name in _TOKEN_FIELDS:
            values = [getattr(p, name) for p in parts]
            if name == "padding_mask":
                # Without a mask a stream has no padding; the added columns are padding.
                values = [torch.zeros(ref.shape, dtype=torch.bool, device=ref.device) if v is None else v
                          for v, ref in zip(values, refs)]
            elif values[0] is None:
                continue
            fill = name == "padding_mask"
            merged[name] = torch.cat([_pad_right(v, width, fill) for v in values])
        return Batch(**merged)


def _pad_right(x: Tensor, width: int, value: bool | int) -> Tensor:
    """[B,S] -> [B,width], new columns set to ``value``."""
    if x.shape[1] == width:
        return x
    return torch.cat([x, x.new_full((x.shape[0], width - x.shape[1]), value)], dim=1)
