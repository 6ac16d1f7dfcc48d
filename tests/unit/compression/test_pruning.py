"""Structured pruning: removing nothing changes nothing; removing a head or unit that contributes nothing
changes nothing either (the slicing is right); a pruned model is smaller, rebuilds from
``model.compression`` and reads its weights back; importance scores and the choice of what goes."""

from __future__ import annotations

import pytest
import torch

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.compression.prune import choose, parse_prune, prunable_blocks
from pentad.config.model import CompressionConfig
from pentad.errors import ConfigError, UserError
from pentad.layers.attention import Attention, AttentionInputs, SelfAttention
from pentad.layers.feed_forward import FeedForward
from pentad.layers.pruning import keep_heads, keep_neurons, magnitude_sparsify, reading_projection
from pentad.training import checkpoint as ckpt

from .test_quantized import _batch


def _model_cfg(**compression):
    cfg = load_config("bert/tiny", ["model.vocab_size=50", "model.hidden_size=32", "model.encoder.num_layers=2",
                                    "model.encoder.num_heads=4", "model.encoder.ffn_size=64",
                                    "model.max_seq_length=16"]).model
    if compression:  # module names have dots: given as a mapping (as config.yaml holds them), not overrides
        cfg.compression = CompressionConfig(**compression)
    return cfg


def _logits(model):
    with torch.no_grad():
        return {k: v.logits for k, v in model(_batch()).items()}


def _same(a, b, atol=0.0):
    return all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


def test_pruning_nothing_gives_identical_outputs():
    torch.manual_seed(0)
    model = build_model(_model_cfg(), training=False).eval()
    before = _logits(model)
    heads, ffns, refused = prunable_blocks(model)
    assert len(heads) == 2 and len(ffns) == 2 and not refused
    for a in heads.values():
        keep_heads(a, list(range(a.num_heads)))
    for f in ffns.values():
        keep_neurons(f, list(range(f.down.in_features)))
    assert _same(before, _logits(model))
    assert choose({"a": torch.rand(4), "b": torch.rand(6)}, 0.0) == {"a": [0, 1, 2, 3], "b": list(range(6))}


def test_removing_silent_heads_and_units_changes_nothing():
    torch.manual_seed(0)
    model = build_model(_model_cfg(), training=False).eval()
    heads, ffns, _ = prunable_blocks(model)
    attention: Attention = next(iter(heads.values()))
    ffn: FeedForward = next(iter(ffns.values()))
    d = attention.head_size
    with torch.no_grad():  # head 1 and units 3, 10 contribute nothing
        attention.out.weight[:, d:2 * d] = 0
        ffn.down.weight[:, [3, 10]] = 0
    before = _logits(model)
    keep_heads(attention, [0, 2, 3])
    keep_neurons(ffn, [i for i in range(64) if i not in (3, 10)])
    assert attention.num_heads == 3 and attention.qkv.weight.shape == (3 * 3 * d, 32)
    assert ffn.up.weight.shape == (62, 32) and ffn.down.weight.shape == (32, 62)
    assert _same(before, _logits(model), atol=1e-5)


def test_pruned_model_rebuilds_from_its_config_and_loads(tmp_path):
    torch.manual_seed(0)
    model = build_model(_model_cfg(), training=False).eval()
    heads, ffns, _ = prunable_blocks(model)
    names = list(heads)
    keep_heads(heads[names[0]], [1, 3])
    keep_heads(heads[names[1]], [2])
    ffn_name = next(iter(ffns))
    keep_neurons(ffns[ffn_name], list(range(0, 64, 2)))
    full = sum(p.numel() for p in build_model(_model_cfg(), device="meta").parameters())
    assert sum(p.numel() for p in model.parameters()) < full
    path = tmp_path / "model.safetensors"
    ckpt.save_weights(model, path)
    rebuilt = build_model(_model_cfg(heads={names[0]: 2, names[1]: 1}, ffn={ffn_name: 32}), training=False).eval()
    ckpt.load_weights(rebuilt, ckpt.read_weights(path), str(path))
    assert _same(_logits(model), _logits(rebuilt))

    with pytest.raises(ConfigError, match="no such module"):
        build_model(_model_cfg(heads={"encoder.nowhere": 1}), training=False)
    with pytest.raises(ConfigError, match="between 1 and"):
        build_model(_model_cfg(heads={names[0]: 9}), training=False)
    with pytest.raises(ConfigError, match="not a FeedForward"):
        build_model(_model_cfg(ffn={names[0]: 9}), training=False)


def test_magnitude_sparsity_zeroes_the_smallest_weights():
    torch.manual_seed(0)
    model = build_model(_model_cfg(), training=False)
    zeroed = magnitude_sparsify(model, 0.5)
    linears = [m for n, m in model.named_modules() if type(m) is torch.nn.Linear and n.startswith("encoder.")]
    total = sum(m.weight.numel() for m in linears)
    assert zeroed == sum(int((m.weight == 0).sum()) for m in linears)
    assert 0.49 * total <= zeroed <= 0.51 * total
    assert magnitude_sparsify(model, 0.0) == 0


def test_choose_keeps_one_per_block_and_drops_the_least_important():
    scores = {"a": torch.tensor([0.1, 5.0, 0.2]), "b": torch.tensor([1.0, 1.0, 1.0])}
    kept = choose(scores, 0.5)  # 3 of 6 go
    assert sum(map(len, kept.values())) == 3 and kept["a"] == [1]
    assert all(len(v) >= 1 for v in choose(scores, 0.99).values())


@pytest.mark.parametrize("text,needle", [("heads", "KEY=FRACTION"), ("layers=0.3", "KEY=FRACTION"),
                                         ("heads=x", "not a number"), ("ffn=1.0", "below 1"), (",", "nothing")])
def test_bad_prune_options(text, needle):
    with pytest.raises(UserError, match=needle):
        parse_prune(text)
    assert parse_prune("heads=0.3, ffn=0.25") == {"heads": 0.3, "ffn": 0.25}


def test_pruning_keeps_the_rows_and_columns_of_the_kept_heads_and_units_bit_for_bit():
    torch.manual_seed(0)
    attention, ffn = SelfAttention(32, 4), FeedForward(32, 16, "silu", gated=True)
    qkv, out = attention.qkv.weight.clone(), attention.out.weight.clone()
    qkv_bias = attention.qkv.bias.clone()
    up, gate, down = ffn.up.weight.clone(), ffn.gate.weight.clone(), ffn.down.weight.clone()
    keep_heads(attention, [3, 1])
    within = torch.cat([torch.arange(24, 32), torch.arange(8, 16)])  # heads 3 and 1, 8 rows each
    rows = torch.cat([within, within + 32, within + 64])  # their queries, keys and values in qkv
    assert torch.equal(attention.qkv.weight, qkv[rows]) and torch.equal(attention.qkv.bias, qkv_bias[rows])
    assert torch.equal(attention.out.weight, out[:, within])
    assert (attention.num_heads, attention.num_kv_heads, attention.q_dim, attention.kv_dim) == (2, 2, 16, 16)
    assert attention.roles() == {"qkv": {"q": (0, 16), "k": (16, 32), "v": (32, 48)}, "out": {"o": (0, 32)}}
    keep_neurons(ffn, [0, 5, 9])
    assert torch.equal(ffn.up.weight, up[[0, 5, 9]]) and torch.equal(ffn.gate.weight, gate[[0, 5, 9]])
    assert torch.equal(ffn.down.weight, down[:, [0, 5, 9]])
    assert ffn.roles() == {"gate": {"gate": (0, 3)}, "up": {"up": (0, 3)}, "down": {"down": (0, 32)}}
    assert FeedForward(32, 16).roles() == {"up": {"up": (0, 16)}, "down": {"down": (0, 32)}}
    assert reading_projection(attention) is attention.out and reading_projection(ffn) is ffn.down


class SplitAttention(SelfAttention):
    """Self-attention with separate query, key and value projections under names of its own: pruning
    knows them only through ``roles()``."""

    def _input_projections(self, hidden_size, bias):
        self.wq = torch.nn.Linear(hidden_size, self.q_dim, bias=bias)
        self.wkv = torch.nn.Linear(hidden_size, 2 * self.kv_dim, bias=bias)

    def input_projections(self):
        return (self.wq, self.wkv)

    def _input_roles(self):
        return {"wq": {"q": (0, self.q_dim)}, "wkv": {"k": (0, self.kv_dim), "v": (self.kv_dim, 2 * self.kv_dim)}}

    def project(self, x):
        k, v = self.wkv(x).split(self.kv_dim, dim=-1)
        return (self._heads(self.wq(x), self.num_heads), self._heads(k, self.num_kv_heads),
                self._heads(v, self.num_kv_heads))


def test_pruning_finds_the_projections_through_roles():
    torch.manual_seed(0)
    fused, split = SelfAttention(32, 4), SplitAttention(32, 4)
    with torch.no_grad():
        split.wq.weight.copy_(fused.qkv.weight[:32])
        split.wq.bias.copy_(fused.qkv.bias[:32])
        split.wkv.weight.copy_(fused.qkv.weight[32:])
        split.wkv.bias.copy_(fused.qkv.bias[32:])
        split.out.load_state_dict(fused.out.state_dict())
    for block in (fused, split):
        keep_heads(block, [0, 2])
    assert split.wq.weight.shape == (16, 32) and split.wkv.weight.shape == (32, 32)
    assert torch.equal(split.wkv.weight, fused.qkv.weight[16:])
    x, inputs = torch.randn(2, 5, 32), AttentionInputs(None, True)
    with torch.no_grad():
        torch.testing.assert_close(split(x, inputs)[0], fused(x, inputs)[0])
