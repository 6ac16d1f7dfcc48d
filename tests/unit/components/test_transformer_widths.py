"""The transformer path takes built modules, not flags: its constructors stay narrow and every attention
variant has one forward with the same signature (docs/architecture.md, "Built modules, not flags")."""

from __future__ import annotations

import inspect

import pentad.components  # noqa: F401  (registers every variant)
from pentad.layers import attention
from pentad.layers.transformer import TransformerLayer, TransformerStack
from pentad.registry import ATTENTION_BLOCKS, POSITION_SCHEMES


def _width(function) -> int:
    return len([p for p in inspect.signature(function).parameters if p != "self"])


def _variants() -> list[type]:
    return [c for c in vars(attention).values()
            if isinstance(c, type) and issubclass(c, attention.Attention) and c is not attention.Attention]


def test_constructors_take_at_most_eight_parameters():
    assert _width(TransformerStack.__init__) <= 8 and _width(TransformerLayer.__init__) <= 8
    assert _width(TransformerLayer.forward) <= 5
    for cls in [attention.Attention, *_variants()]:
        assert _width(cls.__init__) <= 8, cls.__name__


def test_every_attention_variant_has_one_forward_of_the_same_shape():
    variants = _variants()
    assert {c.__name__ for c in variants} >= {"SelfAttention", "ResidualAttention", "CrossAttention",
                                              "ReusingAttention", "ValueReuseAttention"}
    for cls in variants:
        assert list(inspect.signature(cls.forward).parameters) == ["self", "x", "inputs", "cache", "carried"]


def test_variants_and_position_schemes_are_registered():
    assert {"self", "residual", "reuse", "cross"} <= set(ATTENTION_BLOCKS.names())
    assert {"none", "rotary", "relative", "alibi"} <= set(POSITION_SCHEMES.names())
