"""DeepSeek-V3's mixture-of-experts options (layers/moe.py): sigmoid scores, the choice bias and its
auxiliary-loss-free update, group-limited routing and the routed scaling factor, against a reference
written token by token; the bias in checkpoints, the trainer's update hook, and the configs refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pentad.builder import build_model
from pentad.components.model_config import model_config_class
from pentad.errors import ConfigError
from pentad.layers.moe import MoE
from pentad.training.trainer import ExpertBiasUpdate

pytestmark = pytest.mark.usefixtures("one_thread")

H, FF, N = 8, 12, 8


def deepseek(**options) -> MoE:
    torch.manual_seed(0)
    settings = {"activation": "silu", "bias": False, "scoring": "sigmoid", "choice_bias": True, "groups": 4,
                "group_top_k": 2, "routed_scaling": 2.5, "normalize": True, "balance_loss_weight": 0.0, **options}
    module = MoE(H, FF, N, settings.pop("top_k", 3), **settings)
    module.reset_parameters(0.3)
    with torch.no_grad():
        module.router.weight.normal_(std=1.0)
        if module.expert_bias is not None:
            module.expert_bias.copy_(torch.linspace(-0.3, 0.3, N))
    return module


def tokens(t: int = 10, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, t, H, generator=torch.Generator().manual_seed(seed))


def expert(module: MoE, e: int, x: torch.Tensor) -> torch.Tensor:
    ex = module.experts
    return F.linear(ex.act(F.linear(x, ex.gate[e])) * F.linear(x, ex.up[e]), ex.down[e])


def reference(module: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: sigmoid scores; the biased scores pick the best groups (sum of each group's two
    best) and the k best experts in them; the unbiased scores, renormalised and scaled, gate."""
    out = []
    size = N // module.groups
    for row in x.reshape(-1, H):
        scores = (module.router.weight @ row).sigmoid()
        biased = scores + (module.expert_bias if module.expert_bias is not None else 0)
        group_score = [sorted(biased[g * size:(g + 1) * size].tolist())[-2:] for g in range(module.groups)]
        best = sorted(range(module.groups), key=lambda g: -sum(group_score[g]))[:module.group_top_k]
        allowed = [e for e in range(N) if e // size in best]
        chosen = sorted(allowed, key=lambda e: -float(biased[e]))[:module.top_k]
        gates = scores[chosen]
        if module.normalize:
            gates = gates / gates.sum()
        gates = gates * module.routed_scaling
        out.append(sum(g * expert(module, e, row) for g, e in zip(gates, chosen)))
    return torch.stack(out).reshape(x.shape)


@pytest.mark.parametrize("options", [{}, {"normalize": False}, {"choice_bias": False, "groups": 1, "group_top_k": None},
                                     {"groups": 2, "group_top_k": 1, "top_k": 2}],
                         ids=["deepseek-v3", "unnormalised", "plain-sigmoid", "two-groups"])
def test_routing_equals_a_per_token_reference(options):
    module = deepseek(**options).eval()
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(module(x), reference(module, x), rtol=1e-5, atol=1e-6)


def test_the_choice_bias_chooses_but_does_not_gate():
    module = deepseek(groups=1, group_top_k=None, top_k=2)
    probs = F.linear(tokens().reshape(-1, H), module.router.weight).sigmoid()
    with torch.no_grad():
        module.expert_bias.zero_()
        module.expert_bias[5] = 10.0  # expert 5 always chosen
        chosen, gates = module.choose(probs)
    assert (chosen == 5).any(dim=1).all()
    picked = probs.gather(1, chosen)
    torch.testing.assert_close(gates, 2.5 * picked / picked.sum(dim=1, keepdim=True))


def test_the_bias_update_moves_towards_balance_and_only_the_bias_is_saved():
    module = deepseek(bias_update_rate=0.01, groups=1, group_top_k=None)
    with torch.no_grad():
        module.expert_bias.zero_()
    assert set(module.state_dict()) >= {"expert_bias"} and "expert_load" not in module.state_dict()
    module.eval()
    module(tokens())
    assert not module.expert_load.any()  # evaluation counts nothing
    module.train()
    module(tokens(t=40))
    load = module.expert_load.clone()
    assert load.sum() == 40 * 3
    module.update_choice_bias()
    expected = 0.01 * torch.sign(load.mean() - load)
    torch.testing.assert_close(module.expert_bias, expected)
    assert not module.expert_load.any()
    module.update_choice_bias()  # nothing counted since: nothing moves
    torch.testing.assert_close(module.expert_bias, expected)


def test_the_trainer_hook_updates_every_layer_from_the_counts_summed_over_ranks():
    layers = [deepseek(bias_update_rate=0.1, groups=1, group_top_k=None) for _ in range(2)]
    for layer in layers:
        with torch.no_grad():
            layer.expert_bias.zero_()
        layer.expert_load.copy_(torch.arange(N, dtype=torch.float32))

    class Trainer:
        class dist:  # another rank counted the mirror image: the sums are all equal, nothing moves
            @staticmethod
            def all_reduce(t):
                return t.add_(torch.arange(N, dtype=torch.float32).flip(0).repeat(len(layers)))

    assert ExpertBiasUpdate(layers).after_step(Trainer, False) is False
    for layer in layers:
        assert not layer.expert_bias.any() and not layer.expert_load.any()


def config(moe, **encoder):
    return model_config_class().model_validate({
        "hidden_size": 16, "vocab_size": 31, "max_seq_length": 32, "embedding": {"parts": ["word"]},
        "encoder": {"type": "transformer", "num_layers": 3, "num_heads": 2, "ffn_size": 24, "ffn": "moe",
                    "activation": "silu", "norm": "rmsnorm", "norm_position": "pre", "mask": "causal",
                    "positions": "rotary", "moe": moe, **encoder},
        "targets": [{"type": "lm"}]})


def test_first_k_dense_layers_then_deepseek_mixtures_with_the_bias_in_the_state_dict():
    model = build_model(config({"num_experts": 8, "top_k": 2, "first": 1, "scoring": "sigmoid", "choice_bias": True,
                                "groups": 4, "group_top_k": 2, "shared_experts": 1, "routed_scaling": 2.5}))
    kinds = [type(layer.ffn).__name__ for layer in model.encoder.layers]
    assert kinds == ["FeedForward", "MoE", "MoE"]
    assert "encoder.layers.1.ffn.expert_bias" in model.state_dict()
    assert "encoder.layers.0.ffn.expert_bias" not in model.state_dict()


@pytest.mark.parametrize("moe, message", [
    ({"bias_update_rate": 0.001}, "moe.bias_update_rate.*without choice_bias"),
    ({"num_experts": 8, "groups": 3}, "moe.groups.*must be equal"),
    ({"num_experts": 8, "groups": 8}, "moe.groups.*2 experts or more"),
    ({"num_experts": 8, "groups": 4, "group_top_k": 5}, "moe.group_top_k: 5 of 4 groups"),
    ({"num_experts": 8, "top_k": 5, "groups": 4, "group_top_k": 2}, "moe.top_k: 5 experts per token from 2 groups"),
    ({"routing": "expert_choice", "scoring": "sigmoid"}, "moe.scoring.*routing top_k"),
], ids=["rate-without-bias", "unequal-groups", "one-expert-groups", "too-many-groups", "k-beyond-groups",
        "expert-choice"])
def test_routing_options_that_do_not_fit_are_refused_by_name(moe, message):
    with pytest.raises(ConfigError, match=message):
        build_model(config(moe, mask="bidirectional"), device="meta")
