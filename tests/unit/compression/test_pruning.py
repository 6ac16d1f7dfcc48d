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
from pentad.layers.attention import Attention
from pentad.layers.feed_forward import FeedForward
from pentad.layers.pruning import keep_heads, keep_neurons, magnitude_sparsify
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
