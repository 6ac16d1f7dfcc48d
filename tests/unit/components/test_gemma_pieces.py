"""Gemma's pieces, each a registered module or option usable in any recipe: the (1 + w) RMSNorm
(``gemma_rmsnorm``), sandwich norms (``norm_position: sandwich``), the score scale of
``attention_scale_size``, attention-logit soft-capping (``attention_softcap``) and final-logit
soft-capping (``lm.logit_softcap``); each against its formula, and cached decoding against a full
forward. Parity with transformers' Gemma 3 is in tests/parity/test_gemma3.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.components.norms import make_norm, norm_kind_of
from pentad.errors import ConfigError, UserError
from pentad.interop.hf.families import families
from pentad.layers.cache import KVCache
from pentad.layers.norms import OffsetRMSNorm
from pentad.layers.transformer import LayerInputs

VOCAB = 40


def test_gemma_rmsnorm_is_one_plus_weight_in_fp32():
    norm = make_norm("gemma_rmsnorm", 8, 1e-6)
    assert isinstance(norm, OffsetRMSNorm) and norm_kind_of(norm) == "gemma_rmsnorm"
    assert torch.equal(norm.weight, torch.zeros(8))
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm.weight)
    torch.testing.assert_close(norm(x), expected, rtol=1e-6, atol=1e-6)
    half = x.bfloat16()  # scaled in fp32, then cast (Gemma's order)
    h32 = half.float()
    assert torch.equal(norm(half), (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + 1e-6)
                                    * (1 + norm.weight)).bfloat16())
    norm.reset_parameters()
    assert not norm.weight.any()


def model(targets=None, **encoder):
    stack = {"type": "transformer", "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_size": 16,
             "ffn_size": 48, "dropout": 0.0, "ffn": "gated", "activation": "gelu_tanh", "norm": "gemma_rmsnorm",
             "norm_position": "sandwich", "mask": "causal", "bias": False, "positions": "rotary",
             "layer_norm_eps": 1e-6, **encoder}
    cfg = model_config_class()(hidden_size=32, vocab_size=VOCAB, max_seq_length=32, init_std=0.3,
                               embedding={"parts": [{"type": "word", "scale": True}], "norm": False, "dropout": 0.0},
                               encoder=stack, targets=targets or [{"type": "lm"}])
    torch.manual_seed(0)
    built = build_model(cfg).eval()
    with torch.no_grad():  # the norms' weights away from their zeros
        for name, p in built.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.3)
    return built


def run(ours, tokens, cache=None, seen=0):
    batch = Batch(tokens=tokens, padding_mask=torch.zeros(tokens.shape[0], seen + tokens.shape[1], dtype=torch.bool))
    hidden, _ = ours.encode(batch, cache)
    return hidden, ours.targets["lm"](hidden, batch).logits


TOKENS = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))


def manual_layer(layer, x, rotary, scale, softcap=None):
    """One sandwich layer by hand: x + post(attention(pre(x))), x + post(ffn(pre(x)))."""
    attention = layer.attention
    h = layer.attention_norm(x)
    q, k, v = attention.project(h)
    q, k = rotary.rotate(q, k)
    k, v = (t.repeat_interleave(attention.num_heads // attention.num_kv_heads, 1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    context = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
    x = x + layer.attention_output_norm(attention._output(context))
    return x + layer.ffn_output_norm(layer.ffn(layer.ffn_norm(x)))


@pytest.mark.parametrize("softcap", [None, 0.5], ids=["uncapped", "softcap"])
def test_sandwich_scale_and_softcap_against_their_formulas(softcap):
    ours = model(attention_scale_size=5.0, attention_softcap=softcap)
    layer = ours.encoder.layers[0]
    assert {"attention_output_norm.weight", "ffn_output_norm.weight"} <= set(layer.state_dict())
    with torch.no_grad():
        x = ours.embedding(Batch(tokens=TOKENS)).hidden
        assert torch.allclose(x, F.embedding(TOKENS, ours.embedding.word.weight) * 32 ** 0.5)
        inputs = ours.encoder.attention_inputs(10, None, None, None, 0, x.device)
        assert inputs.softcap == softcap
        out, _ = layer(x, LayerInputs(inputs))
        expected = manual_layer(layer, x, inputs, 5.0 ** -0.5, softcap)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_softcapped_attention_cached_and_leading_positions_equal_a_full_forward():
    ours = model(attention_softcap=0.5)
    with torch.no_grad():
        full_hidden, full = run(ours, TOKENS)
        cache = KVCache()
        steps = [run(ours, TOKENS[:, :6], cache)[1]] + [run(ours, TOKENS[:, t:t + 1], cache, seen=t)[1]
                                                       for t in range(6, 10)]
        leading = ours.encoder(ours.embedding(Batch(tokens=TOKENS)).hidden, None, output_positions=3)
        uncapped = run(model(), TOKENS)[1]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(leading, full_hidden[:, :3], rtol=1e-5, atol=1e-5)
    assert (uncapped - full).abs().max() > 1e-3


def test_logit_softcap_caps_logits_and_loss():
    ours = model(targets=[{"type": "lm", "logit_softcap": 2.0}])
    head = ours.targets["lm"]
    labels = TOKENS.roll(-1, 1)
    with torch.no_grad():
        hidden, logits = run(ours, TOKENS)
        raw = head.output(hidden)
        loss = head(hidden, Batch(tokens=TOKENS, labels={"lm": labels})).loss
    torch.testing.assert_close(logits, torch.tanh(raw / 2.0) * 2.0)
    assert logits.abs().max() < 2.0 < raw.abs().max()
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), labels.flatten()))


def test_options_are_checked_and_refused_where_not_expressible(tmp_path):
    with pytest.raises(ConfigError, match="attention_scale_size"):
        model(attention_scale=False, attention_scale_size=4.0)
    llama = model_config_class().model_validate({
        "hidden_size": 32, "vocab_size": VOCAB, "embedding": {"parts": ["word"], "norm": False},
        "encoder": {"type": "transformer", "num_layers": 1, "num_heads": 4, "ffn": "gated", "activation": "silu",
                    "norm": "rmsnorm", "norm_position": "pre", "mask": "causal", "bias": False, "positions": "rotary",
                    "attention_softcap": 50.0},
        "targets": [{"type": "lm"}]})
    with pytest.raises(UserError, match="attention_softcap is 50.0 where llama has None"):
        families()["llama"].plan_export(llama, label="run", model_type="llama", base_config=None, omittable=set(),
                                        pad_id=0, eos_id=None, labels=None)
