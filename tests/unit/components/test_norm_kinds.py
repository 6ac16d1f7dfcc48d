"""Norm kinds: TencentPretrain's LayerNorm (``layernorm_unbiased``) against its formula, in fp32 and
bf16, and selectable everywhere pentad builds a norm (layers, final norms, embedding slots, mlm head)."""

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from pentad.builder import build_model
from pentad.components.model_config import model_config_class
from pentad.components.norms import make_norm, norm_description, norm_kind_of, norm_kinds
from pentad.errors import UserError
from pentad.layers import norms
from pentad.layers.norms import RMSNorm, UnbiasedLayerNorm
from pentad.registry import NORMS


def tencentpretrain_formula(x, gamma, beta, eps):
    """TencentPretrain's LayerNorm as its docs state it: gamma * (x - mean) / (std + eps) + beta,
    std unbiased, computed in float64 here as the reference."""
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    std = ((x - mean) ** 2).sum(-1, keepdim=True).div(x.shape[-1] - 1).sqrt()
    return gamma.double() * (x - mean) / (std + eps) + beta.double()


def trained_like(norm, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(size, generator=g))
        norm.bias.copy_(0.1 * torch.randn(size, generator=g))


@torch.no_grad()
def test_unbiased_layernorm_is_tencentpretrains_formula():
    norm = UnbiasedLayerNorm(16, eps=1e-6)
    assert torch.equal(norm.weight, torch.ones(16)) and torch.equal(norm.bias, torch.zeros(16))
    trained_like(norm, 16)
    x = 3 * torch.randn(4, 5, 16) + 0.5
    expected = tencentpretrain_formula(x, norm.weight, norm.bias, 1e-6)
    out = norm(x)
    assert out.dtype == torch.float32
    assert float((out.double() - expected).abs().max()) < 1e-6
    # It is not torch's LayerNorm: the two differ by about 1/(2H) relative at H = 16.
    torch_ln = nn.LayerNorm(16, eps=1e-6)
    torch_ln.load_state_dict(norm.state_dict())
    relative = float((torch_ln(x) - out).abs().max() / out.abs().max())
    assert 1e-2 < relative < 1e-1
    # eps sits outside the square root: a large eps shows it.
    big = UnbiasedLayerNorm(16, eps=0.5)
    torch.testing.assert_close(big(x).double(), tencentpretrain_formula(x, big.weight, big.bias, 0.5))


@torch.no_grad()
def test_unbiased_layernorm_in_bf16_takes_its_statistics_in_fp32():
    norm = UnbiasedLayerNorm(64)
    trained_like(norm, 64)
    x = (100 + torch.randn(2, 64)).bfloat16()  # a large mean: bf16 statistics would lose the signal
    expected = tencentpretrain_formula(x.float(), norm.weight, norm.bias, 1e-6)
    out = norm(x)  # fp32 parameters (autocast's layout): fp32 result
    assert out.dtype == torch.float32
    assert float((out.double() - expected).abs().max()) < 2e-2
    true_bf16 = UnbiasedLayerNorm(64).bfloat16()
    trained_like(true_bf16, 64)
    out = true_bf16(x)
    assert out.dtype == torch.bfloat16
    expected = tencentpretrain_formula(x.float(), true_bf16.weight.float(), true_bf16.bias.float(), 1e-6)
    assert float((out.double() - expected).abs().max()) < 5e-2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(norm(x)).all()


def test_unbiased_layernorm_gradients_are_the_formulas():
    """Where a gradient is taken the norm runs its written-out backward: values and the gradients of
    input, weight and bias as autograd of the formula gives them (float64 reference; gradcheck)."""
    norm = UnbiasedLayerNorm(32, eps=1e-6)
    trained_like(norm, 32)
    x = (3 * torch.randn(6, 7, 32) + 0.5).requires_grad_()
    upstream = torch.randn(6, 7, 32)
    out = norm(x)
    out.backward(upstream)
    ref_x = x.detach().double().requires_grad_()
    gamma, beta = (p.detach().double().requires_grad_() for p in (norm.weight, norm.bias))
    expected = tencentpretrain_formula(ref_x, gamma, beta, 1e-6)
    expected.backward(upstream.double())
    assert float((out.detach().double() - expected).abs().max()) < 1e-5
    for got, want in ((x.grad, ref_x.grad), (norm.weight.grad, gamma.grad), (norm.bias.grad, beta.grad)):
        assert float((got.double() - want).abs().max() / want.abs().max()) < 1e-5
    # the written-out gradient itself, in float64 (the module computes in float32)
    assert torch.autograd.gradcheck(lambda t: norms._UnbiasedNormalize.apply(t, 0.1),
                                    (torch.randn(3, 5, dtype=torch.float64, requires_grad=True),))
    # a row without spread: the formula's gradient is NaN there (0 / 0 in the std), this one's is finite
    flat = torch.ones(2, 32).requires_grad_()
    norm(flat).sum().backward()
    assert torch.isfinite(flat.grad).all()
    # without a gradient the plain formula runs: the same values
    with torch.no_grad():
        torch.testing.assert_close(norm(x), out.detach(), rtol=1e-6, atol=1e-6)


def test_make_norm_builds_every_kind_with_matching_parameter_names():
    assert norm_kinds() == ("gemma_rmsnorm", "layernorm", "layernorm_unbiased", "rmsnorm", "t5") == \
        tuple(NORMS.names())
    for kind in norm_kinds():
        module = make_norm(kind, 8, 1e-6)
        assert norm_kind_of(module) == ("rmsnorm" if kind == "t5" else kind)
    # The same keys as torch's LayerNorm: a checkpoint loads into either kind.
    assert set(make_norm("layernorm_unbiased", 8, 1e-6).state_dict()) == set(nn.LayerNorm(8).state_dict())
    assert isinstance(make_norm("t5", 8, 1e-6), RMSNorm)
    with pytest.raises(UserError, match="unknown norm 'unbiased'.*layernorm_unbiased"):
        make_norm("unbiased", 8, 1e-6)
    assert norm_kind_of(nn.Linear(2, 2)) is None
    assert norm_description().endswith("; rmsnorm / t5: x / sqrt(mean(x^2) + eps) * weight")


def cfg(**over):
    d = {"hidden_size": 32, "vocab_size": 50, "max_seq_length": 16,
         "embedding": {"parts": ["word", "pos"], "norm": True, "norm_kind": "layernorm_unbiased",
                       "layer_norm_eps": 1e-6, "dropout": 0.0},
         "target_embedding": {"parts": ["word"], "norm": True, "norm_kind": "layernorm_unbiased", "dropout": 0.0},
         "encoder": {"type": "transformer", "num_layers": 1, "num_heads": 4, "ffn_size": 48, "dropout": 0.0,
                     "norm": "layernorm_unbiased", "norm_position": "pre"},
         "decoder": {"type": "transformer", "num_layers": 1, "num_heads": 4, "ffn_size": 48, "dropout": 0.0,
                     "norm": "rmsnorm", "norm_position": "pre", "final_norm_kind": "layernorm_unbiased",
                     "final_norm_eps": 1e-6},
         "targets": [{"type": "lm"}]}
    d.update(over)
    return model_config_class().model_validate(d)


def test_every_norm_place_takes_the_kind_from_config():
    model = build_model(cfg())
    kinds = {name: norm_kind_of(m) for name, m in model.named_modules() if norm_kind_of(m)}
    assert kinds["embedding.norm"] == "layernorm_unbiased"
    assert kinds["target_embedding.norm"] == "layernorm_unbiased"
    assert kinds["encoder.layers.0.attention_norm"] == "layernorm_unbiased"
    assert kinds["encoder.final_norm"] == "layernorm_unbiased"
    assert kinds["decoder.layers.0.cross_attention_norm"] == "rmsnorm"
    assert kinds["decoder.final_norm"] == "layernorm_unbiased" and model.decoder.final_norm.eps == 1e-6
    assert model.embedding.norm.eps == 1e-6
    # Initialisation: unit scale, zero shift.
    assert torch.equal(model.encoder.final_norm.weight, torch.ones(32))
    assert torch.equal(model.encoder.final_norm.bias, torch.zeros(32))
    mlm = build_model(cfg(decoder=None, target_embedding=None,
                          targets=[{"type": "mlm", "norm": "layernorm_unbiased", "layer_norm_eps": 1e-6}]))
    assert norm_kind_of(mlm.targets["mlm"].norm) == "layernorm_unbiased"
    plain = build_model(cfg(decoder=None, target_embedding=None, targets=[{"type": "mlm"}],
                            embedding={"parts": ["word"]}))
    assert norm_kind_of(plain.embedding.norm) == "layernorm"
    assert norm_kind_of(plain.targets["mlm"].norm) == "layernorm"


def test_an_unknown_norm_kind_is_a_config_error_naming_the_kinds():
    with pytest.raises(ValidationError, match="layernorm_unbiased"):
        cfg(embedding={"parts": ["word"], "norm_kind": "unbiased"})


def test_the_embedding_config_is_built_after_the_norms_register(monkeypatch):
    from pentad.config import embedding
    from pentad.registry import Registry

    monkeypatch.setattr(embedding, "NORMS", Registry("norms", "norm"))
    with pytest.raises(RuntimeError, match="before any norm is registered: import pentad.components"):
        embedding.embedding_config_class.__wrapped__()
