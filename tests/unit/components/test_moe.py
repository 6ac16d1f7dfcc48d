"""Mixture of experts (layers/moe.py, ffn: moe): routing invariants against reference computations
written per token, capacity and dropping, auxiliary losses by hand, gradients, placement, configs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.errors import ConfigError
from pentad.layers.feed_forward import FeedForward
from pentad.layers.moe import MoE
from pentad.model import total_loss

H, FF, N = 8, 12, 4


def moe(**options) -> MoE:
    torch.manual_seed(0)
    module = MoE(H, FF, N, options.pop("top_k", 2), **{"activation": "silu", "bias": True, **options})
    module.reset_parameters(0.3)
    with torch.no_grad():
        module.router.weight.normal_(std=1.0)  # decisive routing
        if module.experts.up_bias is not None:
            module.experts.up_bias.normal_(std=0.3)
            module.experts.down_bias.normal_(std=0.3)
    return module


def tokens(t: int = 10, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, t, H, generator=torch.Generator().manual_seed(seed))


def expert(module: MoE, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert e on one token, written out with its weights."""
    ex = module.experts
    up = F.linear(x, ex.up[e], ex.up_bias[e] if ex.up_bias is not None else None)
    h = ex.act(F.linear(x, ex.gate[e])) * up if ex.gate is not None else ex.act(up)
    return F.linear(h, ex.down[e], ex.down_bias[e] if ex.down_bias is not None else None)


def reference(module: MoE, x: torch.Tensor, route: torch.Tensor | None = None) -> torch.Tensor:
    """Dropless token choice, token by token: sum over the k best experts of gate * expert(x)."""
    flat, source = x.reshape(-1, H), (route if route is not None else x).reshape(-1, H)
    out = []
    for t in range(flat.shape[0]):
        probs = (module.router.weight.float() @ source[t].float()).softmax(-1)
        p, e = probs.topk(module.top_k)
        gates = p / p.sum() if module.normalize else p
        out.append(sum(g * expert(module, int(i), flat[t]) for g, i in zip(gates, e)))
    return torch.stack(out).reshape(x.shape)


@pytest.mark.parametrize("top_k,gated,normalize",
                         [(1, True, False), (2, True, True), (2, False, True), (1, False, True)])
def test_dropless_equals_a_per_token_reference(top_k, gated, normalize):
    module = moe(top_k=top_k, gated=gated, normalize=normalize)
    x = tokens()
    torch.testing.assert_close(module(x), reference(module, x), rtol=1e-5, atol=1e-6)
    assert module.pop_aux()[1]["moe_dropped"] == 0.0


def test_normalised_gates_sum_to_one():
    """With every expert the same function, a token's output is that function (gates sum to one),
    and Switch-style raw gates scale it by the top probability."""
    module = moe(top_k=2)
    with torch.no_grad():
        for p in module.experts.parameters():
            p.copy_(p[:1].expand_as(p))
    x = tokens()
    single = torch.stack([expert(module, 0, v) for v in x[0]])[None]
    torch.testing.assert_close(module(x), single, rtol=1e-5, atol=1e-6)
    module.normalize, module.top_k = False, 1
    top = (x[0] @ module.router.weight.t()).softmax(-1).max(-1).values
    torch.testing.assert_close(module(x), single * top[None, :, None], rtol=1e-5, atol=1e-6)


def _signature_experts(module: MoE) -> None:
    """Expert e outputs e's one-hot (zero weights, a bias that names it): outputs show the routing."""
    with torch.no_grad():
        for p in module.experts.parameters():
            p.zero_()
        module.experts.down_bias.copy_(torch.eye(N, H))


@pytest.mark.parametrize("top_k,normalize", [(1, False), (2, False), (2, True), (3, True)])
def test_each_token_goes_to_k_distinct_experts_with_the_stated_gates(top_k, normalize):
    module = moe(top_k=top_k, normalize=normalize, gated=False)
    _signature_experts(module)  # output row = sum over the token's experts of gate * one-hot(expert)
    x = tokens(16)
    out = module(x)[0, :, :N]
    assert ((out > 0).sum(-1) == top_k).all()  # k distinct experts per token
    probs = (x[0] @ module.router.weight.t()).softmax(-1)
    top = probs.topk(top_k)
    torch.testing.assert_close(out.gather(1, top.indices), top.values / top.values.sum(-1, keepdim=True)
                               if normalize else top.values)
    if normalize:
        torch.testing.assert_close(out.sum(-1), torch.ones(16))


@pytest.mark.parametrize("top_k,factor", [(1, 1.0), (2, 1.0), (2, 0.5), (1, 0.25)])
def test_capacity_is_respected_in_priority_order_and_dropped_tokens_pass_through(top_k, factor):
    module = moe(top_k=top_k, capacity_factor=factor, normalize=False, gated=False)
    _signature_experts(module)
    x = tokens(12)
    out = module(x)[0]
    capacity = math.ceil(factor * 12 * top_k / N)
    # the reference: first choices of all tokens in order, then second choices; an expert takes
    # assignments until it is full
    probs = (x[0] @ module.router.weight.t()).softmax(-1)
    p, e = probs.topk(top_k)
    load, expected, dropped = [0] * N, torch.zeros(12, H), 0
    for choice in range(top_k):
        for t in range(12):
            i = int(e[t, choice])
            if load[i] < capacity:
                load[i] += 1
                expected[t, i] += p[t, choice]
            else:
                dropped += 1
    torch.testing.assert_close(out, expected)
    assert ((out[:, :N] > 0).sum(0) <= capacity).all()
    assert module.pop_aux()[1]["moe_dropped"] == pytest.approx(dropped / (12 * top_k))
    # a token none of whose assignments fit gets nothing from the block: the residual carries it
    from pentad.layers.transformer import TransformerLayer

    layer = TransformerLayer(torch.nn.Identity(), module, lambda: torch.nn.LayerNorm(H, eps=1e-12), norm_position="pre",
                             dropout=0.0)
    lost = (module(layer.ffn_norm(x))[0] == 0).all(-1)
    through, _ = layer._sublayer(x, layer.ffn_norm, lambda h: (module(h), None))
    assert torch.equal(through[0, lost], x[0, lost]) and not torch.equal(through[0, ~lost], x[0, ~lost])
    if factor < 0.5:
        assert lost.any()


def test_aux_losses_match_hand_computation():
    module = moe(top_k=2, balance_loss_weight=0.1, z_loss_weight=0.01, capacity_factor=0.5)
    x = tokens(16)
    module(x)
    losses, _ = module.pop_aux()
    logits = x[0] @ module.router.weight.t()
    probs = logits.softmax(-1)
    chosen = probs.topk(2).indices
    f = torch.stack([(chosen == e).float().sum() for e in range(N)]) / (16 * 2)  # before capacity
    torch.testing.assert_close(losses["moe_balance"], 0.1 * N * (f * probs.mean(0)).sum())
    torch.testing.assert_close(losses["moe_z"], 0.01 * (torch.logsumexp(logits, -1) ** 2).mean())
    assert module.pop_aux() == ({}, {})  # popped once


def test_uniform_routing_has_unit_balance_loss():
    module = moe(top_k=1, balance_loss_weight=1.0)
    with torch.no_grad():
        module.router.weight.zero_()
    module(tokens(8))
    # equal probabilities: P_e = 1/N; top-1 ties go to expert 0, f = (1, 0, ...): N * 1 * 1/N
    assert module.pop_aux()[0]["moe_balance"].item() == pytest.approx(1.0)


def test_gradients_reach_router_and_experts():
    module = moe(top_k=2, z_loss_weight=0.01)
    out = module(tokens())
    (out.pow(2).mean() + sum(module.pop_aux()[0].values())).backward()
    for name, p in module.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_idle_experts_get_zero_gradients_not_none():
    """ddp needs a gradient for every parameter, also of experts no token chose, and of a layer whose
    rows are all padding."""
    module = moe(top_k=1)
    x = tokens(1)
    module(x).sum().backward()
    grads = [module.experts.up.grad[e].abs().sum().item() for e in range(N)]
    assert sum(g > 0 for g in grads) == 1 and sum(g == 0 for g in grads) == N - 1
    module.zero_grad(set_to_none=True)
    out = module(x, torch.ones(1, 1, dtype=torch.bool))
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert all(p.grad is not None for p in module.parameters())


def test_expert_choice_each_expert_takes_its_capacity():
    module = moe(routing="expert_choice", capacity_factor=1.0, normalize=False, gated=False)
    _signature_experts(module)
    x = tokens(12)
    out = module(x)[0]
    probs = (x[0] @ module.router.weight.t()).softmax(-1)
    capacity = math.ceil(12 / N)
    expected = torch.zeros(12, H)
    for e in range(N):
        for t in probs[:, e].topk(capacity).indices:
            expected[t, e] = probs[t, e]
    torch.testing.assert_close(out, expected)
    assert ((out[:, :N] > 0).sum(0) == capacity).all()
    losses, metrics = module.pop_aux()
    assert "moe_balance" not in losses
    assert metrics["moe_dropped"] == pytest.approx(float((expected == 0).all(-1).float().mean()))


def test_word_vector_routing_reads_the_router_input():
    module = moe(router_input="word", top_k=2)
    x, words = tokens(seed=1), tokens(seed=2)
    torch.testing.assert_close(module(x, None, words), reference(module, x, words), rtol=1e-5, atol=1e-6)
    hidden = moe(top_k=2)
    assert not torch.allclose(hidden(x, None, words), module(x, None, words))


def test_padding_is_not_routed_and_not_counted():
    module = moe(top_k=1, balance_loss_weight=1.0)
    x = tokens(10)
    padding = torch.zeros(1, 10, dtype=torch.bool)
    padding[0, 6:] = True
    out = module(x, padding)
    assert torch.equal(out[0, 6:], torch.zeros(4, H))
    balance = module.pop_aux()[0]["moe_balance"]
    module(x[:, :6])
    assert torch.equal(module.pop_aux()[0]["moe_balance"], balance)
    torch.testing.assert_close(out[:, :6], reference(module, x[:, :6]))


def test_shared_experts_add_a_feed_forward():
    module = moe(top_k=1, shared_ffn_size=2 * FF)
    assert isinstance(module.shared, FeedForward) and module.shared.up.out_features == 2 * FF
    x = tokens()
    routed = reference(module, x)
    torch.testing.assert_close(module(x), routed + module.shared(x), rtol=1e-5, atol=1e-6)


def test_shared_gate_scales_the_shared_experts_per_token():
    module = moe(top_k=2, shared_ffn_size=FF, shared_gate=True)
    assert module.shared_gate.weight.shape == (1, H) and module.shared_gate.bias is None
    assert module.shared_gate.weight.abs().sum() > 0  # initialised by reset_parameters
    x = tokens()
    gate = torch.sigmoid(x @ module.shared_gate.weight.t())  # [1, T, 1]
    torch.testing.assert_close(module(x), reference(module, x) + gate * module.shared(x), rtol=1e-5, atol=1e-6)
    module(x).sum().backward()
    assert module.shared_gate.weight.grad is not None and module.shared_gate.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="shared_gate needs shared experts"):
        MoE(H, FF, N, 2, shared_gate=True)
    assert "shared_gate.weight" not in dict(moe(shared_ffn_size=FF).named_parameters())  # off by default


def test_deterministic():
    x = tokens()
    assert torch.equal(moe(capacity_factor=1.0)(x), moe(capacity_factor=1.0)(x))


def config(moe_section: dict | None = None, **encoder):
    return model_config_class().model_validate({
        "hidden_size": 16, "vocab_size": 31, "max_seq_length": 16,
        "embedding": {"parts": ["word", "pos"], "dropout": 0.0},
        "encoder": {"type": "transformer", "num_layers": 4, "num_heads": 2, "ffn_size": 24, "dropout": 0.0,
                    "mask": "causal", "ffn": "moe", "activation": "silu",
                    **({"moe": moe_section} if moe_section is not None else {}), **encoder},
        "targets": [{"type": "lm"}]})


def test_model_places_experts_every_k_layers_and_trains_with_the_aux_losses():
    cfg = config({"num_experts": 4, "top_k": 2, "every": 2, "shared_experts": 1, "expert_ffn_size": 8,
                  "z_loss_weight": 0.001})
    torch.manual_seed(0)
    model = build_model(cfg)
    kinds = [type(layer.ffn).__name__ for layer in model.encoder.layers]
    assert kinds == ["FeedForward", "MoE", "FeedForward", "MoE"]
    assert model.encoder.layers[1].ffn.experts.up.shape == (4, 8, 16)
    assert model.encoder.layers[1].ffn.shared.up.out_features == 8
    ids = torch.randint(0, 31, (2, 9), generator=torch.Generator().manual_seed(0))
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, -3:] = True
    out = model(Batch(tokens=ids, padding_mask=padding, labels={"lm": ids.masked_fill(padding, -100)}))
    assert set(out.aux_losses) == {"moe_balance", "moe_z"} and "moe_dropped" in out.aux_metrics
    loss = total_loss(out)
    torch.testing.assert_close(loss, out["lm"].loss + out.aux_losses["moe_balance"] + out.aux_losses["moe_z"])
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    # the builder's initialisation reached the experts (std init_std), the norms are ones
    assert model.encoder.layers[1].ffn.experts.up.std().item() == pytest.approx(0.02, rel=0.3)
    from pentad.builder import summarize
    from pentad.model import count_active_parameters, count_parameters

    idle = 2 * 2 * (3 * 16 * 8 + 8 + 16)  # two MoE layers, 4 - 2 idle experts: gate/up/down [8, 16], biases
    assert count_parameters(model) - count_active_parameters(model) == idle
    assert f"({count_active_parameters(model):,} active per token)" in summarize(model)


def test_first_places_the_first_moe_layer():
    kinds = lambda cfg: [type(layer.ffn).__name__ for layer in build_model(cfg, device="meta").encoder.layers]  # noqa: E731
    assert kinds(config({"every": 3, "first": 1})) == ["FeedForward", "MoE", "FeedForward", "FeedForward"]
    assert kinds(config({"every": 2, "first": 0})) == ["MoE", "FeedForward", "MoE", "FeedForward"]
    with pytest.raises(ConfigError, match="model.encoder.moe.first.*layer 4"):
        build_model(config({"first": 4}), device="meta")


def test_cached_decoding_equals_a_full_forward():
    from pentad.layers.cache import KVCache

    torch.manual_seed(0)
    model = build_model(config({"num_experts": 4, "top_k": 2, "router_input": "word"})).eval()
    ids = torch.randint(0, 31, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, _ = model.encode(Batch(tokens=ids))
        cache = KVCache()
        steps = [model.encode(Batch(tokens=ids[:, :5], positions=torch.arange(5)[None].expand(2, 5)), cache)[0]]
        for i in range(5, 9):
            steps.append(model.encode(Batch(tokens=ids[:, i:i + 1], positions=torch.full((2, 1), i)), cache)[0])
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_config_problems_are_reported():
    with pytest.raises(ConfigError) as caught:
        build_model(config({"num_experts": 2, "top_k": 3, "every": 5, "routing": "expert_choice"}), device="meta")
    text = str(caught.value)
    for key in ("moe.top_k", "moe.every", "moe.routing"):
        assert f"model.encoder.{key}" in text
    with pytest.raises(ConfigError, match="model.encoder.moe.every.*share_layers"):
        build_model(config({"every": 2}, share_layers=True), device="meta")
    with pytest.raises(ConfigError, match="set ffn: moe"):
        build_model(config({"num_experts": 2}, ffn="gated"), device="meta")
    assert build_model(config(mask="bidirectional", moe={"routing": "expert_choice"}), device="meta")
    with pytest.raises(ConfigError, match="model.encoder.moe.shared_gate.*shared_experts is 0"):
        build_model(config({"shared_gate": True}), device="meta")
