"""Int8 linear layers: close to fp32, saved and read back as plain tensors (no pickle), rebuilt from
``model.compression`` by the builder, and refused for training."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.layers.quantized import QuantizedLinear, quantizable_linears, quantize_linears, quantize_weight
from pentad.training import checkpoint as ckpt

# int8 weights (per channel) and 7-bit dynamic activations (per tensor): outputs within 5% of the fp32
# logits' scale on these tiny models (measured 0.2-3.3% over seeds)
TOLERANCE = 0.05


def test_quantize_weight_round_trips_within_half_a_step():
    w = torch.randn(16, 8)
    q, scale = quantize_weight(w)
    assert q.dtype == torch.int8 and scale.shape == (16,)
    assert (q.float() * scale[:, None] - w).abs().max() <= scale.max() / 2 + 1e-6


@pytest.mark.parametrize("bias", [True, False])
def test_quantized_linear_is_close_to_fp32(bias):
    torch.manual_seed(0)
    linear = nn.Linear(48, 40, bias=bias)
    q = QuantizedLinear.from_linear(linear)
    x = torch.randn(3, 5, 48)
    ref = linear(x)
    out = q(x)
    assert out.shape == ref.shape
    assert (out - ref).abs().max() <= TOLERANCE * ref.abs().max()
    # the fallback (weight-only int8: other dtypes, GPU) computes with the same int8 weights
    assert (q(x.double()) - ref.double()).abs().max() <= TOLERANCE * ref.abs().max()


def test_repacks_when_the_weights_change():
    torch.manual_seed(0)
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    qa, qb = QuantizedLinear.from_linear(a), QuantizedLinear.from_linear(b)
    x = torch.randn(4, 8)
    qa(x)
    with torch.no_grad():
        for name in ("weight_int8", "weight_scale", "bias"):
            getattr(qa, name).copy_(getattr(qb, name))
    assert torch.equal(qa(x), qb(x))


def _model_cfg(**compression):
    overrides = ["model.vocab_size=50", "model.hidden_size=32", "model.encoder.num_layers=2",
                 "model.encoder.num_heads=2", "model.encoder.ffn_size=64", "model.max_seq_length=16"]
    overrides += [f"model.compression.{k}={v}" for k, v in compression.items()]
    return load_config("bert/tiny", overrides).model


def _batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(5, 50, (2, 12), generator=g)
    return Batch(tokens=tokens, segments=torch.zeros_like(tokens), padding_mask=torch.zeros_like(tokens).bool())


def test_quantized_model_saves_without_pickle_and_reloads_identically(tmp_path):
    torch.manual_seed(0)
    model = build_model(_model_cfg(), training=False).eval()
    tied = {head for head, _ in model.tied}
    names = quantize_linears(model)
    assert names and not any(f"{n}.weight" in tied for n in names)  # tied heads keep the embedding's table
    assert all(isinstance(model.get_submodule(n), QuantizedLinear) for n in names)
    path = tmp_path / "model.safetensors"
    ckpt.save_weights(model, path)
    stored = load_file(str(path))
    assert stored[f"{names[0]}.weight_int8"].dtype == torch.int8
    assert f"{names[0]}.weight" not in stored

    rebuilt = build_model(_model_cfg(quantize="int8"), training=False).eval()
    assert [n for n, m in rebuilt.named_modules() if isinstance(m, QuantizedLinear)] == names
    ckpt.load_weights(rebuilt, ckpt.read_weights(path), str(path))
    with torch.no_grad():
        a, b = model(_batch()), rebuilt(_batch())
    for head in a:
        assert torch.equal(a[head].logits, b[head].logits)


def test_quantized_model_is_close_to_fp32():
    torch.manual_seed(0)
    model = build_model(_model_cfg(), training=False).eval()
    with torch.no_grad():
        ref = model(_batch())
        quantize_linears(model)
        out = model(_batch())
    for head in ref:
        assert (out[head].logits - ref[head].logits).abs().max() <= TOLERANCE * ref[head].logits.abs().max()


def test_fp32_model_refuses_int8_weights(tmp_path):
    torch.manual_seed(0)
    model = build_model(_model_cfg(), training=False)
    quantize_linears(model)
    path = tmp_path / "model.safetensors"
    ckpt.save_weights(model, path)
    plain = build_model(_model_cfg(), training=False)
    with pytest.raises(Exception, match="weight_int8"):
        ckpt.load_weights(plain, ckpt.read_weights(path), str(path))


def test_tied_and_shared_linears_are_left_in_fp32():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), nn.Linear(4, 4))
    model.add_module("again", shared)
    assert quantizable_linears(model) == ["2"]
