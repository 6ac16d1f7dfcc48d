"""Sliding-window attention: the masks (dynamic, rolling and static), the rolling key/value cache that
keeps only the last window - 1 positions, and a causal stack with local and global layers whose one
forward, incremental decoding (rolling cache) and static-cache decoding agree."""

from __future__ import annotations

import pytest
import torch

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.errors import ConfigError
from pentad.generation import generate
from pentad.layers.cache import KVCache, RollingLayerCache, StaticKVCache
from pentad.layers.masks import attention_mask, static_attention_mask

VOCAB, WINDOW = 50, 4


def reference(q_len: int, key_start: int, key_len: int, window: int) -> torch.Tensor:
    query = torch.arange(key_len - q_len, key_len)[:, None]
    key = torch.arange(key_start, key_len)[None, :]
    return (key <= query) & (key > query - window)


@pytest.mark.parametrize("q_len, key_len, key_start", [(9, 9, 0), (1, 12, 9), (3, 12, 6), (2, 5, 0)])
def test_causal_window_mask(q_len, key_len, key_start):
    mask, causal = attention_mask("causal", q_len, None, key_len=key_len, window=WINDOW, key_start=key_start)
    if key_len - key_start <= WINDOW and key_len == q_len:
        assert mask is None and causal  # the window hides nothing: SDPA's fused causal kernel
        return
    assert not causal
    assert torch.equal(mask[0, 0], reference(q_len, key_start, key_len, WINDOW))


def test_window_mask_with_padding_and_bidirectional():
    padding = torch.zeros(2, 8, dtype=torch.bool)
    padding[1, :3] = True  # left padding
    mask, _ = attention_mask("causal", 8, padding, window=WINDOW)
    expected = reference(8, 0, 8, WINDOW)[None] & ~padding[:, None, :]
    expected[1, :3, :3] |= torch.eye(3, dtype=torch.bool)  # a padding query sees itself (no NaN)
    assert torch.equal(mask[:, 0], expected)
    both, causal = attention_mask("bidirectional", 8, None, window=WINDOW)
    distance = torch.arange(8)[:, None] - torch.arange(8)[None, :]
    assert not causal and torch.equal(both[0, 0], distance.abs() < WINDOW)
    with pytest.raises(ValueError, match="prefix"):
        attention_mask("prefix", 8, None, torch.tensor([3]), window=WINDOW)


def test_static_window_mask():
    mask = static_attention_mask("causal", 3, 16, torch.tensor(7), None, window=WINDOW)
    expected = torch.zeros(3, 16, dtype=torch.bool)
    expected[:, :10] = reference(3, 0, 10, WINDOW)
    assert torch.equal(mask[0, 0], expected)


def test_rolling_cache_keeps_the_last_window_minus_one():
    cache = RollingLayerCache(WINDOW)
    k = torch.arange(30.0).view(1, 1, 30, 1)
    keys, _ = cache.append(k[:, :, :10], -k[:, :, :10])  # a prompt longer than the window
    assert keys.flatten().tolist() == list(range(10))
    assert cache.kept == WINDOW - 1 and cache.length == 10
    for t in range(10, 30):
        keys, values = cache.append(k[:, :, t:t + 1], -k[:, :, t:t + 1])
        assert keys.flatten().tolist() == list(range(t - WINDOW + 1, t + 1))
        assert values.flatten().tolist() == [-x for x in range(t - WINDOW + 1, t + 1)]
        assert cache.keys.shape[2] <= 2 * WINDOW  # memory bounded by the window
    assert cache.length == 30
    cache.reorder(torch.tensor([0, 0]))  # beam search's copies
    assert cache.append(k[:, :, :1].expand(2, 1, 1, 1), k[:, :, :1].expand(2, 1, 1, 1))[0].shape == (2, 1, WINDOW, 1)


def test_kv_cache_rolls_only_windowed_layers():
    cache = KVCache()
    assert isinstance(cache.layer(0, WINDOW), RollingLayerCache)
    assert not isinstance(cache.layer(1), RollingLayerCache)
    assert not StaticKVCache.rolls and KVCache.rolls
    with pytest.raises(ValueError, match="reuse"):
        cache.layer(0, WINDOW).append_values(torch.zeros(1, 1, 1, 1))


def model(**encoder):
    stack = {"type": "transformer", "num_layers": 3, "num_heads": 4, "num_kv_heads": 2, "ffn_size": 64, "dropout": 0.0,
             "ffn": "gated", "activation": "silu", "norm": "rmsnorm", "norm_position": "pre", "mask": "causal",
             "bias": False, "positions": "rotary", "layer_norm_eps": 1e-5, **encoder}
    cfg = model_config_class()(hidden_size=32, vocab_size=VOCAB, max_seq_length=64, init_std=0.3,
                               tie_word_embeddings=False, embedding={"parts": ["word"], "norm": False, "dropout": 0.0},
                               encoder=stack, targets=[{"type": "lm"}])
    torch.manual_seed(0)
    return build_model(cfg).eval()


def logits(ours, tokens, cache=None, seen=0, padding=None):
    if padding is None:
        padding = torch.zeros(tokens.shape[0], seen + tokens.shape[1], dtype=torch.bool)
    batch = Batch(tokens=tokens, padding_mask=padding)
    hidden, _ = ours.encode(batch, cache)
    return ours.targets["lm"](hidden, batch).logits


LOCAL_GLOBAL = dict(sliding_window=WINDOW, window_pattern=["local", "local", "global"], rotary_local_base=100.0)


def test_windowed_stack_full_equals_incremental():
    ours = model(**LOCAL_GLOBAL)
    assert ours.encoder.windows == [WINDOW, WINDOW, None]
    tokens = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = logits(ours, tokens)
        cache = KVCache()
        steps = [logits(ours, tokens[:, :6], cache)]  # a prompt longer than the window
        steps += [logits(ours, tokens[:, t:t + 1], cache, seen=t) for t in range(6, 14)]
        windowed = logits(model(sliding_window=WINDOW, window_pattern=["local", "local", "global"]), tokens)
        unwindowed = logits(model(), tokens)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert isinstance(cache.layers[0], RollingLayerCache) and cache.layers[0].kept == WINDOW - 1
    assert cache.layers[2].length == 14 and not isinstance(cache.layers[2], RollingLayerCache)
    # within the window nothing changes; beyond it the window does; so does the local rotary base
    torch.testing.assert_close(windowed[:, :WINDOW], unwindowed[:, :WINDOW], atol=1e-5, rtol=1e-5)
    assert (windowed[:, WINDOW:] - unwindowed[:, WINDOW:]).abs().max() > 1e-3
    assert (windowed - full).abs().max() > 1e-3


@pytest.mark.parametrize("options", [{}, {"num_beams": 3, "num_return_sequences": 2}], ids=["greedy", "beam"])
def test_windowed_generation_static_equals_dynamic_equals_uncached(options):
    ours = model(**LOCAL_GLOBAL)
    prompts, base = [[5, 6, 7, 8, 9, 10], [11, 12, 13]], dict(max_new_tokens=10, pad_token_id=0, **options)
    dynamic = generate(ours, prompts, **base)
    assert generate(ours, prompts, cache="static", **base).sequences() == dynamic.sequences()
    assert generate(ours, prompts, use_cache=False, **base).sequences() == dynamic.sequences()


def test_window_config_problems():
    with pytest.raises(ConfigError) as e:
        model(window_pattern=["local", "global"])
    assert "window_pattern" in str(e.value) and "sliding_window" in str(e.value)
    with pytest.raises(ConfigError, match="prefix"):
        model(sliding_window=WINDOW, mask="prefix")
    with pytest.raises(ConfigError, match="residual_attention"):
        model(residual_attention=True, **LOCAL_GLOBAL)
    with pytest.raises(ConfigError, match="rotary_local_base"):
        model(rotary_local_base=100.0)
