"""Attention-weight reuse with stochastic recomputation (``attention_reuse``): reusing layers take
the previous layer's attention probabilities; recompute_p = 1 is the plain model bit for bit;
p = 0 is the hand computation; the draws are seeded and rank-independent; masks, the key/value
cache, activation checkpointing and LoRA work; bad configs are clear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.errors import ConfigError
from pentad.layers.attention import AttentionReuse
from pentad.layers.cache import KVCache
from pentad.model import total_loss
from pentad.training.recompute import checkpoint_blocks


def config(reuse=None, *, mask="causal", layers=4, dropout=0.0, **encoder):
    if reuse is not None:
        encoder["attention_reuse"] = reuse
    targets = [{"type": "lm"}] if mask == "causal" else [{"type": "mlm"}]
    return model_config_class().model_validate({
        "hidden_size": 16, "vocab_size": 31, "max_seq_length": 16,
        "embedding": {"parts": ["word", "pos"], "dropout": dropout},
        "encoder": {"type": "transformer", "num_layers": layers, "num_heads": 2, "ffn_size": 24,
                    "dropout": dropout, "mask": mask, **encoder},
        "targets": targets})


def batch(padded: bool = True) -> Batch:
    tokens = torch.randint(1, 31, (3, 7), generator=torch.Generator().manual_seed(0))
    padding = torch.zeros(3, 7, dtype=torch.bool)
    if padded:
        padding[1, 5:] = True
        padding[2, 3:] = True
    labels = tokens.masked_fill(padding, -100)
    return Batch(tokens=tokens, padding_mask=padding, labels={"lm": labels, "mlm": labels})


def built(cfg, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(cfg)


def test_layers_alternate_and_pure_reuse_drops_query_key_projections():
    plain, pure, kept = (built(config(r)) for r in (None, {"every": 2}, {"every": 2, "recompute_p": 0.1}))
    assert [layer.attention.reuse for layer in pure.encoder.layers] == [False, True, False, True]
    assert pure.encoder.layers[1].attention.qkv is None and pure.encoder.layers[1].attention.v is not None
    assert pure.encoder.layers[2].attention.qkv is not None
    assert kept.encoder.layers[1].attention.qkv is not None and not hasattr(kept.encoder.layers[1].attention, "v")
    assert [type(layer.attention).__name__ for layer in pure.encoder.layers] == [
        "SelfAttention", "ValueReuseAttention", "SelfAttention", "ValueReuseAttention"]
    assert type(kept.encoder.layers[1].attention).__name__ == "ReusingAttention"
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(kept) == count(plain)
    assert count(plain) - count(pure) == 2 * 2 * (16 * 16 + 16)  # two layers without q and k (weight, bias)
    every3 = built(config({"every": 3}, layers=6))
    assert [layer.attention.reuse for layer in every3.encoder.layers] == [False, True, True, False, True, True]


@pytest.mark.parametrize("mask", ["causal", "bidirectional"])
def test_recompute_p_one_is_the_plain_model_bit_for_bit(mask):
    plain = built(config(mask=mask, dropout=0.1))
    reuse = built(config({"every": 2, "recompute_p": 1.0, "eval": "recompute"}, mask=mask, dropout=0.1))
    assert plain.state_dict().keys() == reuse.state_dict().keys()
    for a, b in zip(plain.state_dict().values(), reuse.state_dict().values()):
        assert torch.equal(a, b)
    losses = []
    for model in (plain, reuse):
        torch.manual_seed(5)  # the same dropout masks
        loss = total_loss(model(batch()).targets)
        loss.backward()
        losses.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(losses[0][0], losses[1][0])
    for a, b in zip(losses[0][1], losses[1][1]):
        assert torch.equal(a, b)
    plain.eval(), reuse.eval()
    with torch.no_grad():
        assert torch.equal(plain.encode(batch())[0], reuse.encode(batch())[0])


def _manual_probs(attention, x, padding, causal):
    """softmax(Q K^T / sqrt(d)) of ``attention`` on its input x, masked, per head: [B, heads, q, k]."""
    q, k, _ = attention.qkv(x).split((attention.q_dim, attention.kv_dim, attention.kv_dim), dim=-1)
    b, s, _ = x.shape
    q = q.view(b, s, attention.num_heads, -1).transpose(1, 2)
    k = k.view(b, s, attention.num_kv_heads, -1).transpose(1, 2)
    k = k.repeat_interleave(attention.num_heads // attention.num_kv_heads, dim=1)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    allowed = ~padding[:, None, None, :]
    if causal:  # where every key is padding (a padded query) the query sees itself (layers/masks.py)
        allowed = allowed & torch.ones(s, s, dtype=torch.bool).tril() | (torch.eye(s, dtype=torch.bool)
                                                                         & padding[:, None, :, None])
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1)


@pytest.mark.parametrize("mask, extra", [("causal", {}), ("bidirectional", {}),
                                         ("causal", {"num_heads": 4, "num_kv_heads": 2})],
                         ids=["causal", "bidirectional", "grouped-query"])
def test_recompute_p_zero_uses_the_previous_layers_probabilities(mask, extra):
    model = built(config({"every": 3}, mask=mask, layers=3, **extra))
    seen = {}
    for i, layer in enumerate(model.encoder.layers):
        layer.attention.register_forward_hook(
            lambda module, args, output, i=i: seen.__setitem__(i, (args[0].detach(), output[0].detach())))
    b = batch()
    with torch.no_grad():
        model(b)
    first, second, third = (layer.attention for layer in model.encoder.layers)
    probs = _manual_probs(first, seen[0][0], b.padding_mask, mask == "causal")
    for attention, index in ((second, 1), (third, 2)):  # both reuse layer 0's probabilities
        x = seen[index][0]
        v = attention.v(x).view(3, 7, attention.num_kv_heads, -1).transpose(1, 2)
        v = v.repeat_interleave(attention.num_heads // attention.num_kv_heads, dim=1)
        expected = attention.out((probs @ v).transpose(1, 2).reshape(3, 7, -1))
        torch.testing.assert_close(seen[index][1], expected, rtol=1e-5, atol=1e-6)
    # and the computing layer itself is the plain attention
    v = first.qkv(seen[0][0])[..., -first.kv_dim:].view(3, 7, first.num_kv_heads, -1).transpose(1, 2)
    v = v.repeat_interleave(first.num_heads // first.num_kv_heads, dim=1)
    expected = first.out((probs @ v).transpose(1, 2).reshape(3, 7, -1))
    torch.testing.assert_close(seen[0][1], expected, rtol=1e-5, atol=1e-6)


def test_gradients_flow_through_reused_probabilities():
    model = built(config({"every": 2, "keep_qk": True}))
    total_loss(model(batch()).targets).backward()
    first, second = model.encoder.layers[0].attention, model.encoder.layers[1].attention
    q_rows = slice(0, first.q_dim + first.kv_dim)
    assert first.qkv.weight.grad[q_rows].abs().sum() > 0  # layer 1's loss reaches layer 0's queries/keys
    assert second.qkv.weight.grad[q_rows].abs().sum() == 0  # never recomputed: no query/key gradient
    assert second.qkv.weight.grad[first.q_dim + first.kv_dim:].abs().sum() > 0
    assert second.out.weight.grad.abs().sum() > 0
    # the reused probabilities are part of the graph: layer 1's output depends on layer 0's keys
    pure = built(config({"every": 2}))
    total_loss(pure(batch()).targets).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in pure.named_parameters()
               if "attention" in n and "bias" not in n)


def test_stochastic_draws_are_seeded_and_independent_of_the_global_random_state():
    reusing = [False, True, False, True, True]
    a, b = AttentionReuse(0.5, seed=3), AttentionReuse(0.5, seed=3)
    torch.manual_seed(1)
    plans_a = [a.plan(reusing, training=True) for _ in range(20)]
    torch.manual_seed(2)  # another rank's random state
    plans_b = [b.plan(reusing, training=True) for _ in range(20)]
    assert plans_a == plans_b
    assert all(plan[0] and plan[2] for plan in plans_a)  # computing layers always compute
    picks = [plan[i] for plan in plans_a for i in (1, 3, 4)]
    assert 10 < sum(picks) < 50  # both outcomes, about half
    assert len({tuple(p) for p in plans_a}) > 1  # a fresh draw at every forward
    other = AttentionReuse(0.5, seed=4)
    assert [other.plan(reusing, training=True) for _ in range(20)] != plans_a  # the seed matters
    assert a.plan(reusing, training=False) == [True, False, True, False, False]
    assert AttentionReuse(0.5, eval_recompute=True).plan(reusing, training=False) == [True] * 5


def test_stochastic_training_is_replayed_exactly_under_activation_checkpointing():
    cfg = config({"every": 2, "recompute_p": 0.5, "seed": 1}, layers=6)
    grads = []
    for checkpointed in (False, True):
        model = built(cfg)
        if checkpointed:
            assert checkpoint_blocks(model) == 6
        for _ in range(3):  # several forwards: several plans
            model.zero_grad()
            total_loss(model(batch()).targets).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("reuse", [{"every": 2}, {"every": 2, "recompute_p": 0.3, "eval": "recompute"}],
                         ids=["reuse", "eval-recompute"])
def test_cached_decoding_equals_a_full_forward(reuse):
    model = built(config(reuse, layers=4)).eval()
    tokens = torch.randint(1, 31, (2, 9), generator=torch.Generator().manual_seed(0))
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, :2] = True  # left padding
    positions = (~padding).long().cumsum(1).sub(1).clamp(min=0)
    with torch.no_grad():
        full = model.encode(Batch(tokens=tokens, padding_mask=padding, positions=positions))[0]
        cache = KVCache()
        steps = [model.encode(Batch(tokens=tokens[:, :5], padding_mask=padding[:, :5], positions=positions[:, :5]),
                              cache)[0]]
        for i in range(5, 9):
            steps.append(model.encode(Batch(tokens=tokens[:, i:i + 1], padding_mask=padding[:, :i + 1],
                                            positions=positions[:, i:i + 1]), cache)[0])
    keep = ~padding
    torch.testing.assert_close(torch.cat(steps, 1)[keep], full[keep], rtol=1e-5, atol=1e-5)
    reusing = cache.layers[1]
    assert (reusing.keys is None) == (reuse.get("eval") != "recompute") and reusing.length == 9


def test_stochastic_recomputation_with_a_cache_is_refused_in_training_mode():
    model = built(config({"every": 2, "recompute_p": 0.5}))
    with pytest.raises(ValueError, match="eval mode"):
        model.encode(Batch(tokens=torch.ones(1, 3, dtype=torch.long)), KVCache())


def test_lora_adapts_the_value_projection_of_a_pure_reuse_layer():
    from pentad.training.lora import candidates

    found = candidates(built(config({"every": 2})))
    assert found["encoder.layers.1.attention.v"] == {"v": (0, 16)}
    assert set(found["encoder.layers.0.attention.qkv"]) == {"q", "k", "v"}


def test_hf_and_tencentpretrain_export_refuse_attention_reuse():
    from pentad.errors import UserError
    from pentad.interop.hf import stack_problems
    from pentad.tencentpretrain.checkpoint import export_config

    cfg = config({"every": 2})
    assert any("attention_reuse" in p for p in stack_problems(cfg.encoder, "model.encoder", "BERT", 16))
    assert not stack_problems(config().encoder, "model.encoder", "BERT", 16)
    with pytest.raises(UserError, match="model.encoder.attention_reuse"):
        export_config(cfg, label="the run")
    export_config(config(), label="the run")


def test_config_problems_are_clear():
    with pytest.raises(ConfigError, match=r"model.encoder.attention_reuse.every.*5 with 4 layers"):
        build_model(config({"every": 5}), device="meta")
    with pytest.raises(ConfigError, match=r"model.encoder.attention_reuse.*share_layers"):
        build_model(config({"every": 2}, share_layers=True), device="meta")
    with pytest.raises(ConfigError, match=r"model.encoder.attention_reuse.*residual_attention"):
        build_model(config({"every": 2}, residual_attention=True), device="meta")
    with pytest.raises(ConfigError, match=r"attention_reuse.keep_qk.*recompute_p is 0.1"):
        build_model(config({"every": 2, "recompute_p": 0.1, "keep_qk": False}), device="meta")
    with pytest.raises(ConfigError, match=r"attention_reuse.keep_qk.*eval is 'recompute'"):
        build_model(config({"every": 2, "eval": "recompute", "keep_qk": False}), device="meta")
    for bad, key in (({"every": 1}, "every"), ({"recompute_p": 1.5}, "recompute_p"), ({"evry": 2}, "evry"),
                     ({"eval": "sometimes"}, "eval")):
        with pytest.raises(Exception, match=key):
            config(bad)


def test_decoder_self_attention_reuses_and_cross_attention_does_not():
    cfg = model_config_class().model_validate({
        "hidden_size": 16, "vocab_size": 31, "max_seq_length": 16,
        "embedding": {"parts": ["word", "pos"], "dropout": 0.0},
        "encoder": {"type": "transformer", "num_layers": 1, "num_heads": 2, "ffn_size": 24, "dropout": 0.0},
        "target_embedding": {"parts": ["word", "pos"], "dropout": 0.0},
        "decoder": {"type": "transformer", "num_layers": 2, "num_heads": 2, "ffn_size": 24, "dropout": 0.0,
                    "attention_reuse": {"every": 2}},
        "targets": [{"type": "lm"}]})
    model = built(cfg)
    layer = model.decoder.layers[1]
    assert layer.attention.reuse and layer.attention.qkv is None and not layer.cross_attention.reuse
    tokens = torch.randint(1, 31, (2, 5))
    out = model(Batch(tokens=tokens, decoder_tokens=tokens, labels={"lm": tokens}))
    assert torch.isfinite(total_loss(out.targets))


def test_probabilities_are_returned_only_for_a_reusing_next_layer():
    calls = []
    original = F.scaled_dot_product_attention
    model = built(config({"every": 2}))
    try:
        F.scaled_dot_product_attention = lambda *a, **k: calls.append(1) or original(*a, **k)
        with torch.no_grad():
            model(batch())
    finally:
        F.scaled_dot_product_attention = original
    assert calls == []  # layers 0 and 2 feed a reusing layer: the explicit path
    model = built(config({"every": 2, "recompute_p": 1.0}))
    try:
        F.scaled_dot_product_attention = lambda *a, **k: calls.append(1) or original(*a, **k)
        with torch.no_grad():
            model(batch())
    finally:
        F.scaled_dot_product_attention = original
    assert len(calls) == 4  # every layer recomputes: nobody needs probabilities, all fused
