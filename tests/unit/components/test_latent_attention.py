"""Multi-head latent attention (components/attention/latent.py): the cached, absorbed path against the
expanded one, what the cache holds, the softmax scale under YaRN, projections replaced from outside, and
the configs it refuses. Parity with transformers' DeepSeek-V3 is in tests/parity/test_deepseek_v3.py."""

from __future__ import annotations

import math

import pytest
import torch

from pentad.builder import build_model
from pentad.components.attention.latent import LatentAttention, softmax_scale
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.errors import ConfigError
from pentad.layers.cache import KVCache, StaticKVCache
from pentad.layers.lora import LoraLinear

pytestmark = pytest.mark.usefixtures("one_thread")

LATENT = {"kv_lora_rank": 16, "q_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6}


def config(latent=None, **encoder):
    stack = {"type": "transformer", "num_layers": 2, "num_heads": 4, "ffn_size": 48, "ffn": "gated",
             "activation": "silu", "norm": "rmsnorm", "norm_position": "pre", "final_norm": True, "mask": "causal",
             "dropout": 0.0, "bias": False, "layer_norm_eps": 1e-6, "positions": "rotary",
             "latent_attention": {**LATENT, **(latent or {})}, **encoder}
    return model_config_class().model_validate({
        "hidden_size": 32, "vocab_size": 61, "max_seq_length": 64, "tie_word_embeddings": False,
        "embedding": {"parts": ["word"], "norm": False, "dropout": 0.0}, "encoder": stack,
        "targets": [{"type": "lm"}]})


def perturbed(cfg):
    torch.manual_seed(0)
    model = build_model(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def left_padded(lengths=(9, 6), seq=9):
    ids = torch.randint(1, 61, (len(lengths), seq), generator=torch.Generator().manual_seed(3))
    padding = torch.arange(seq)[None, :] < seq - torch.tensor(lengths)[:, None]
    positions = (torch.arange(seq)[None, :] - (seq - torch.tensor(lengths))[:, None]).clamp(min=0)
    return ids.masked_fill(padding, 0), padding, positions


def decode(model, ids, padding, positions, cache, prompt=5):
    """A prompt of ``prompt`` positions, then one position per step, through ``cache``."""
    seq = ids.shape[1]
    mask_width = cache.capacity if cache.static else None
    steps = []
    for start, end in [(0, prompt)] + [(i, i + 1) for i in range(prompt, seq)]:
        if mask_width is None:
            pad = padding[:, :end]
        else:
            pad = torch.ones(ids.shape[0], mask_width, dtype=torch.bool)
            pad[:, :seq] = padding
        batch = Batch(tokens=ids[:, start:end], padding_mask=pad, positions=positions[:, start:end])
        steps.append(model.encode(batch, cache)[0])
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("latent, scaling", [
    ({}, None),
    ({"q_lora_rank": None}, None),
    ({}, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
          "mscale_all_dim": 0.7, "beta_fast": 8, "beta_slow": 1}),
], ids=["lora-queries", "plain-queries", "yarn"])
def test_absorbed_decoding_with_the_latent_cache_equals_the_expanded_forward(latent, scaling):
    model = perturbed(config(latent, rope_scaling=scaling))
    ids, padding, positions = left_padded()
    with torch.no_grad():
        full, _ = model.encode(Batch(tokens=ids, padding_mask=padding, positions=positions))
        dynamic = decode(model, ids, padding, positions, KVCache())
        static = decode(model, ids, padding, positions, StaticKVCache(12))
    keep = ~padding
    torch.testing.assert_close(dynamic[keep], full[keep], rtol=0, atol=2e-5)
    torch.testing.assert_close(static[keep], full[keep], rtol=0, atol=2e-5)


def test_the_cache_holds_the_latent_and_the_rotary_key_alone():
    model = perturbed(config())
    cache = KVCache()
    ids, padding, positions = left_padded()
    with torch.no_grad():
        decode(model, ids, padding, positions, cache)
    layer = cache.layers[0]
    assert layer.keys is None and layer.values is None
    assert tuple(layer.latent.shape[:2]) == (2, 1) and layer.latent.shape[3] == 16 + 4  # kv_lora_rank + rope
    assert cache.memory_bytes() == 2 * layer.latent.numel() * 4  # two layers, fp32
    cache.reorder(torch.tensor([1, 1]))
    used = cache.layers[0].latent[:, :, :cache.length]  # the rest of the buffer is unwritten
    assert torch.equal(used[0], used[1])


def test_softmax_scale_takes_deepseeks_yarn_adjustment():
    from pentad.components.positions.rope_scaling import YarnScaling

    assert softmax_scale(12, None) == 12 ** -0.5
    yarn = YarnScaling(factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0)
    assert math.isclose(softmax_scale(192, yarn), 192 ** -0.5 * (0.1 * math.log(40.0) + 1) ** 2)
    assert softmax_scale(192, YarnScaling(factor=40.0, original_max_position_embeddings=4096)) == 192 ** -0.5
    assert softmax_scale(192, YarnScaling(factor=1.0, mscale_all_dim=1.0,
                                          original_max_position_embeddings=8)) == 192 ** -0.5


def test_an_adapted_key_value_expansion_is_absorbed_as_the_map_it_computes():
    model = perturbed(config())
    for layer in model.encoder.layers:
        attention: LatentAttention = layer.attention
        lora = LoraLinear(attention.kv_up, attention.roles()["kv_up"], rank=2, alpha=4.0)
        with torch.no_grad():
            for b in lora.lora_B.values():
                b.normal_(std=0.3)
        attention.kv_up = lora
    ids, padding, positions = left_padded()
    with torch.no_grad():
        full, _ = model.encode(Batch(tokens=ids, padding_mask=padding, positions=positions))
        cached = decode(model, ids, padding, positions, KVCache())
    torch.testing.assert_close(cached[~padding], full[~padding], rtol=0, atol=2e-5)


def test_roles_name_the_query_key_value_and_output_rows():
    attention = perturbed(config()).encoder.layers[0].attention
    assert attention.roles() == {"q_up": {"q": (0, 4 * 12)}, "kv_up": {"k": (0, 4 * 8), "v": (32, 32 + 4 * 6)},
                                 "out": {"o": (0, 32)}}
    with pytest.raises(ValueError, match="not pruned"):
        attention.resize_heads(2)


def test_gradients_reach_every_projection():
    model = perturbed(config()).train()
    ids, padding, positions = left_padded()
    batch = Batch(tokens=ids, padding_mask=padding, positions=positions)
    hidden, _ = model.encode(batch)
    hidden[~padding].pow(2).sum().backward()
    missing = [n for n, p in model.encoder.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert not missing


@pytest.mark.parametrize("encoder, message", [
    ({"rotary_dim": 8}, "rotary_dim.*qk_rope_head_dim"),
    ({"num_kv_heads": 2}, "num_kv_heads: 2 with latent_attention"),
    ({"positions": "none"}, "latent_attention.*positions 'none'"),
    ({"residual_attention": True}, "one attention variant per stack"),
    ({"latent_attention": {**LATENT, "qk_rope_head_dim": 5}}, "qk_rope_head_dim.*odd"),
], ids=["rotary-dim", "kv-heads", "no-rotary", "residual", "odd-rope"])
def test_configs_it_cannot_build_are_refused_by_name(encoder, message):
    with pytest.raises(ConfigError, match=message):
        build_model(config(**encoder), device="meta")
