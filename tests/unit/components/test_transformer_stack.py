"""Module-level checks of the transformer stack: norms, positions, grouped-query attention,
causality, and cached incremental decoding against a full forward."""

from __future__ import annotations

import math

import pytest
import torch

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.layers.attention import AttentionInputs, SelfAttention
from pentad.layers.cache import KVCache
from pentad.layers.feed_forward import FeedForward
from pentad.layers.norms import RMSNorm
from pentad.layers.positions import (
    RelativePositionBias,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    relative_buckets,
    rotary_cos_sin,
)
from pentad.layers.transformer import TransformerLayer, TransformerStack
from pentad.model import count_parameters

torch.set_grad_enabled(True)


def model_cfg(encoder: dict, **over):
    d = {"hidden_size": 32, "vocab_size": 61, "max_seq_length": 48,
         "embedding": {"parts": ["word"], "norm": False, "dropout": 0.0},
         "encoder": {"type": "transformer", "num_layers": 2, "num_heads": 4, "ffn_size": 48, "dropout": 0.0,
                     "mask": "causal", "norm_position": "pre", **encoder},
         "targets": [{"type": "lm"}]}
    d.update(over)
    return model_config_class().model_validate(d)


LLAMA = {"norm": "rmsnorm", "ffn": "gated", "activation": "silu", "bias": False, "positions": "rotary",
         "num_kv_heads": 2, "layer_norm_eps": 1e-6}
BLOOM = {"positions": "alibi", "activation": "gelu_tanh"}
T5_DEC = {"norm": "t5", "bias": False, "attention_scale": False, "positions": "relative", "relative_buckets": 8,
          "relative_max_distance": 20, "activation": "relu"}


def test_rmsnorm_formula_and_initialisation():
    norm = RMSNorm(8, eps=1e-6)
    assert torch.equal(norm.weight, torch.ones(8))
    x = torch.randn(3, 8)
    expected = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), expected)
    model = build_model(model_cfg(LLAMA))
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 5 and all(torch.equal(n.weight, torch.ones_like(n.weight)) for n in norms)


def test_relative_buckets_match_the_t5_reference():
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    relative = torch.arange(-300, 300)[None, :] - torch.arange(0, 7)[:, None]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20)):
            ours = relative_buckets(relative, bidirectional, buckets, distance)
            theirs = t5.T5Attention._relative_position_bucket(relative, bidirectional, buckets, distance)
            assert torch.equal(ours, theirs)


def test_relative_bias_changes_scores_as_the_formula_says():
    layer = TransformerLayer(SelfAttention(16, 2), FeedForward(16, 32), lambda: torch.nn.LayerNorm(16), dropout=0.0)
    stack = TransformerStack([layer], 1, mask="bidirectional", positions=RelativePositionBias(2, 8, 16))
    inputs = stack.attention_inputs(5, None, None, None, 0, torch.device("cpu"))
    buckets = relative_buckets(torch.arange(5)[None, :] - torch.arange(5)[:, None], True, 8, 16)
    expected = stack.relative_bias.weight[buckets].permute(2, 0, 1)  # [heads, q, k]
    torch.testing.assert_close(inputs.mask[0], expected)


def test_alibi_slopes_and_bias():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 12 heads: 8 from the power of two, then every other slope of the 16-head sequence.
    twelve = alibi_slopes(12)
    assert torch.allclose(twelve[:8], alibi_slopes(8))
    assert torch.allclose(twelve[8:], torch.tensor([2.0 ** (-0.5 * (2 * i + 1)) for i in range(4)]))
    bias = alibi_bias(4, 3, 5, offset=2)
    slopes = alibi_slopes(4)
    for h in range(4):
        for q in range(3):
            for k in range(5):
                assert math.isclose(float(bias[0, h, q, k]), -float(slopes[h]) * max(q + 2 - k, 0), abs_tol=1e-6)


def test_alibi_changes_outputs_and_is_applied():
    torch.manual_seed(0)
    with_alibi = build_model(model_cfg(BLOOM)).eval()
    without = build_model(model_cfg({"activation": "gelu_tanh"})).eval()
    without.load_state_dict(with_alibi.state_dict())
    batch = Batch(tokens=torch.randint(0, 61, (2, 10)))
    a, b = with_alibi.encode(batch)[0], without.encode(batch)[0]
    assert torch.allclose(a[:, 0], b[:, 0], atol=1e-6)  # the first position attends only to itself
    assert not torch.allclose(a[:, 1:], b[:, 1:], atol=1e-3)


def _meta_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Reference: Meta's LLaMA rotary on interleaved pairs (2i, 2i+1) through complex numbers."""
    d = x.shape[-1]
    freqs = 1.0 / base ** (torch.arange(0, d, 2).float() / d)
    angles = positions.float()[:, None] * freqs[None, :]
    rotation = torch.polar(torch.ones_like(angles), angles)  # [S, d/2]
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], d // 2, 2))
    return torch.view_as_real(pairs * rotation).flatten(-2)


def test_rotary_matches_the_interleaved_reference_after_permutation():
    torch.manual_seed(0)
    d, s = 16, 7
    x = torch.randn(2, 3, s, d)  # [B, heads, S, D] in Meta's interleaved layout
    positions = torch.arange(s)
    reference = _meta_rotary(x, positions)
    # HF/pentad layout: dimension i pairs with i + d/2; the permutation is what conversion applies.
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    cos, sin = rotary_cos_sin(positions[None], d)
    ours = apply_rotary(x[..., perm], cos, sin)
    torch.testing.assert_close(ours, reference[..., perm], atol=1e-5, rtol=1e-5)
    # Rotation preserves norms and dot products depend only on relative position.
    q, k = torch.randn(d), torch.randn(d)
    def score(i, j):
        cq, sq = rotary_cos_sin(torch.tensor([[i]]), d)
        ck, sk = rotary_cos_sin(torch.tensor([[j]]), d)
        return float((apply_rotary(q.view(1, 1, 1, d), cq, sq) * apply_rotary(k.view(1, 1, 1, d), ck, sk)).sum())
    assert math.isclose(score(3, 1), score(10, 8), rel_tol=1e-4)


def test_grouped_query_attention_equals_repeated_heads():
    torch.manual_seed(0)
    gqa = SelfAttention(32, num_heads=4, num_kv_heads=2)
    mha = SelfAttention(32, num_heads=4)
    q, k, v = gqa.qkv.weight.split([32, 16, 16])
    qb, kb, vb = gqa.qkv.bias.split([32, 16, 16])
    rep = lambda t: t.view(2, 8, *t.shape[1:]).repeat_interleave(2, dim=0).reshape(32, *t.shape[1:])  # noqa: E731
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([q, rep(k), rep(v)]))
        mha.qkv.bias.copy_(torch.cat([qb, rep(kb), rep(vb)]))
        mha.out.load_state_dict(gqa.out.state_dict())
    x = torch.randn(2, 5, 32)
    inputs = AttentionInputs(None, True)
    torch.testing.assert_close(gqa(x, inputs)[0], mha(x, inputs)[0])
    assert gqa.qkv.weight.shape == (64, 32)


def test_shared_layers_hold_one_layer():
    shared = build_model(model_cfg({"share_layers": True, "num_layers": 6}), device="meta")
    single = build_model(model_cfg({"num_layers": 1}), device="meta")
    assert count_parameters(shared) == count_parameters(single)
    assert len(shared.encoder.layers) == 1 and shared.encoder.num_layers == 6


def test_residual_attention_runs_and_changes_outputs():
    torch.manual_seed(0)
    plain = build_model(model_cfg({"mask": "bidirectional"})).eval()
    real = build_model(model_cfg({"mask": "bidirectional", "residual_attention": True})).eval()
    real.load_state_dict(plain.state_dict())
    batch = Batch(tokens=torch.randint(0, 61, (2, 6)))
    assert not torch.allclose(plain.encode(batch)[0], real.encode(batch)[0], atol=1e-4)
    single = build_model(model_cfg({"mask": "bidirectional", "num_layers": 1})).eval()
    single_real = build_model(model_cfg({"mask": "bidirectional", "num_layers": 1, "residual_attention": True}))
    single_real.eval().load_state_dict(single.state_dict())
    torch.testing.assert_close(single.encode(batch)[0], single_real.encode(batch)[0])  # nothing to add yet


@pytest.mark.parametrize("encoder", [{}, LLAMA, BLOOM, T5_DEC], ids=["gpt2", "llama", "bloom", "t5-causal"])
def test_causal_output_ignores_later_tokens(encoder):
    torch.manual_seed(0)
    parts = ["word", "pos"] if not encoder else ["word"]
    model = build_model(model_cfg(encoder, embedding={"parts": parts, "norm": False, "dropout": 0.0})).eval()
    tokens = torch.randint(0, 61, (1, 12))
    changed = tokens.clone()
    changed[0, 7:] = (changed[0, 7:] + 1) % 61
    a, b = model.encode(Batch(tokens=tokens))[0], model.encode(Batch(tokens=changed))[0]
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def _left_padded(lengths, width, vocab=61, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (len(lengths), width), generator=g)
    padding = torch.arange(width)[None, :] < (width - torch.tensor(lengths))[:, None]
    tokens[padding] = 0
    return tokens, padding


@pytest.mark.parametrize("encoder", [{}, LLAMA, BLOOM, T5_DEC, {"mask": "prefix"}],
                         ids=["gpt2", "llama", "bloom", "t5-causal", "prefix-lm"])
def test_cached_incremental_decoding_equals_full_forward(encoder):
    torch.manual_seed(0)
    parts = ["word", "pos"] if encoder in ({}, {"mask": "prefix"}) else ["word"]
    model = build_model(model_cfg(encoder, embedding={"parts": parts, "norm": False, "dropout": 0.0})).eval()
    tokens, padding = _left_padded([5, 8, 3], 8)
    more = torch.randint(1, 61, (3, 6))
    full_tokens = torch.cat([tokens, more], dim=1)
    full_padding = torch.cat([padding, torch.zeros(3, 6, dtype=torch.bool)], dim=1)
    positions = (~full_padding).long().cumsum(1).sub(1).clamp(min=0)
    segments = torch.cat([torch.zeros(3, 8), torch.ones(3, 6)], dim=1).long()
    # positional encodings and prefix layout are the same whether or not the cache is used
    with torch.no_grad():
        full = model.encode(Batch(tokens=full_tokens, padding_mask=full_padding, positions=positions,
                                  segments=segments))[0]
        cache = KVCache()
        steps = [model.encode(Batch(tokens=tokens, padding_mask=padding, positions=positions[:, :8],
                                    segments=segments[:, :8]), cache=cache)[0]]
        for i in range(6):
            j = 8 + i
            steps.append(model.encode(Batch(tokens=more[:, i:i + 1], padding_mask=full_padding[:, :j + 1],
                                            positions=positions[:, j:j + 1], segments=segments[:, j:j + 1]),
                                      cache=cache)[0])
    incremental = torch.cat(steps, dim=1)
    keep = ~full_padding
    torch.testing.assert_close(incremental[keep], full[keep], atol=1e-5, rtol=1e-4)
    assert cache.length == 14


def test_decoder_cache_equals_full_forward():
    torch.manual_seed(0)
    dec = {"type": "transformer", "num_layers": 2, "num_heads": 4, "ffn_size": 48, "dropout": 0.0, **T5_DEC,
           "norm_position": "pre", "num_kv_heads": 2}
    cfg = model_cfg({"mask": "bidirectional", **T5_DEC}, target_embedding={"parts": ["word"], "norm": False,
                                                                            "dropout": 0.0},
                    decoder=dec, share_embedding=True)
    model = build_model(cfg).eval()
    assert model.target_embedding.word.weight is model.embedding.word.weight
    source, source_padding = _left_padded([6, 3], 6)
    target = torch.randint(1, 61, (2, 7))
    with torch.no_grad():
        memory, memory_padding = model.encode(Batch(tokens=source, padding_mask=source_padding))
        full = model.decode(Batch(decoder_tokens=target), memory, memory_padding)
        cache = KVCache()
        steps = [model.decode(Batch(decoder_tokens=target[:, i:i + 1]), memory, memory_padding, cache)
                 for i in range(7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
    assert cache.layers[0].cross_keys.shape == (2, 2, 6, 8)


def test_drop_path_rates_rise_linearly_and_shared_layers_take_the_rate():
    from pentad.layers.transformer import drop_path_rate

    model = build_model(model_cfg({"num_layers": 4, "drop_path": 0.3}))
    rates = [layer.drop_path for layer in model.encoder.layers]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])
    shared = build_model(model_cfg({"num_layers": 4, "drop_path": 0.3, "share_layers": True}))
    assert [layer.drop_path for layer in shared.encoder.layers] == [0.3]
    assert drop_path_rate(0.2, 0, 1) == 0.2
    with pytest.raises(Exception, match="drop_path"):
        model_cfg({"drop_path": 1.0})


def test_drop_path_drops_whole_branches_per_example_in_training_only():
    torch.manual_seed(0)
    cfg = model_cfg({"num_layers": 1, "drop_path": 0.5})
    model = build_model(cfg)
    layer = model.encoder.layers[0]
    out = torch.ones(400, 3, 5)
    layer.train()
    branch = layer._branch(out)
    per_example = branch.flatten(1)
    # each example's branch is all dropped (0) or all kept and scaled by 1 / (1 - 0.5)
    assert set(per_example.unique().tolist()) == {0.0, 2.0}
    assert torch.equal(per_example.min(1).values, per_example.max(1).values)
    assert 0.4 < (per_example[:, 0] == 0).float().mean().item() < 0.6
    layer.eval()
    assert torch.equal(layer._branch(out), out)
    # evaluation: the same outputs as the same weights without stochastic depth
    plain = build_model(model_cfg({"num_layers": 1}))
    plain.load_state_dict(model.state_dict())
    model.eval(), plain.eval()
    batch = Batch(tokens=torch.randint(0, 61, (2, 7)))
    torch.testing.assert_close(model.encode(batch)[0], plain.encode(batch)[0], rtol=0, atol=0)
    # training: branches dropped or scaled, so the outputs differ from the undropped model's
    model.train(), plain.train()
    many = Batch(tokens=torch.randint(0, 61, (16, 7)))
    assert not torch.equal(model.encode(many)[0], plain.encode(many)[0])
