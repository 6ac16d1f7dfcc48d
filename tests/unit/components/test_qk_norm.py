"""Query/key norms (``qk_norm``): a per-head norm of the stack's kind on queries and keys, before or after the
rotary rotation; the order matters, the cache holds the normalised keys, and the config refuses combinations
that would drop the variant."""

from __future__ import annotations

import pytest
import torch

from pentad.builder import build_model, model_problems
from pentad.components.attention.qk_norm import QKNormAttention
from pentad.components.base import Batch
from pentad.errors import ConfigError
from pentad.layers.cache import KVCache
from pentad.run_config import validate_raw


def model_raw(**encoder):
    return {"model": {"hidden_size": 32, "vocab_size": 50, "max_seq_length": 32,
                      "embedding": {"parts": ["word"], "norm": False, "dropout": 0.0},
                      "encoder": {"type": "transformer", "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                                  "head_size": 16, "ffn": "gated", "activation": "silu", "norm": "rmsnorm",
                                  "norm_position": "pre", "mask": "causal", "dropout": 0.0, "bias": False,
                                  "layer_norm_eps": 1e-6, "positions": "rotary", **encoder},
                      "targets": [{"type": "lm"}]}}


def built(order):
    torch.manual_seed(0)
    model = build_model(validate_raw(model_raw(qk_norm=order), {}, "test").model).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norm weights other than ones, so that the order can matter
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def test_the_norms_are_per_head_weights_of_the_stack_kind():
    model = built("before_rotary")
    attention = model.encoder.layers[0].attention
    assert isinstance(attention, QKNormAttention)
    assert attention.q_norm.weight.shape == attention.k_norm.weight.shape == (16,)
    assert attention.q_norm.eps == 1e-6


def test_the_order_matters_and_each_order_decodes_with_its_cache():
    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(2))
    outputs = {}
    for order in ("before_rotary", "after_rotary"):
        model = built(order)
        with torch.no_grad():
            full, _ = model.encode(Batch(tokens=tokens))
            cache, steps = KVCache(), []
            for t in range(tokens.shape[1]):
                mask = torch.zeros(2, t + 1, dtype=torch.bool)
                hidden, _ = model.encode(Batch(tokens=tokens[:, t:t + 1], padding_mask=mask), cache)
                steps.append(hidden)
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
        outputs[order] = full
    # same weights (same seeds), another order: another model
    assert (outputs["before_rotary"] - outputs["after_rotary"]).abs().max() > 1e-3


@pytest.mark.parametrize("extra", [{"residual_attention": True}, {"attention_reuse": {"every": 2}}])
def test_combinations_that_would_drop_the_norms_are_refused(extra):
    cfg = validate_raw(model_raw(qk_norm="after_rotary", **extra), {}, "test")
    problems = [(p.path, p.message) for p in model_problems(cfg.model)]
    assert any(path == "model.encoder.qk_norm" and message.startswith("set with") for path, message in problems)
    with pytest.raises(ConfigError):
        build_model(cfg.model)
