"""pentad's CPU dropout (``pentad.layers.dropout``): the drop rate, the scale, the backward, seeding and
recomputation, and where torch's ``F.dropout`` still runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from pentad.layers import dropout as dropout_module
from pentad.layers.dropout import LEVELS, Dropout, drop_mask, dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_rate_and_expectation(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(600_001)  # not a multiple of three: the last draw is cut
    y = dropout(x, p)
    dropped = float((y == 0).float().mean())
    assert dropped == pytest.approx(p, abs=4e-3)  # ~5 standard deviations at 600k draws
    kept = y[y != 0]
    threshold = round(p * LEVELS)
    torch.testing.assert_close(kept, torch.full_like(kept, LEVELS / (LEVELS - threshold)))
    assert float(y.mean()) == pytest.approx(1.0, abs=1e-2)  # unbiased: E[y] = x


def test_mask_lanes_are_uniform_and_independent() -> None:
    """Each of the three 16-bit lanes of a draw is uniform (a biased lane, e.g. one holding the sign
    bit of the draw, would shift the rate of every third element)."""
    torch.manual_seed(1)
    mask = drop_mask((3 * 200_000,), LEVELS // 2).view(-1, 3).float()
    for lane in range(3):
        assert float(mask[:, lane].mean()) == pytest.approx(0.5, abs=5e-3)
    both = float((mask[:, 0] * mask[:, 1]).mean())
    assert both == pytest.approx(0.25, abs=5e-3)


def test_backward_uses_the_forward_mask() -> None:
    torch.manual_seed(2)
    x = torch.randn(4, 33, requires_grad=True)
    y = dropout(x, 0.3)
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    scale = LEVELS / (LEVELS - round(0.3 * LEVELS))
    torch.testing.assert_close(g, torch.where(y == 0, 0.0, scale))
    torch.testing.assert_close(y, torch.where(y == 0, 0.0, x.detach() * scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtype_and_shape_kept(dtype: torch.dtype) -> None:
    x = torch.randn(2, 3, 5, 7, dtype=dtype)
    y = dropout(x, 0.2)
    assert y.dtype == dtype and y.shape == x.shape


def test_seeded_and_recomputed_alike() -> None:
    x = torch.randn(8, 16, requires_grad=True)
    torch.manual_seed(3)
    a = dropout(x, 0.5)
    torch.manual_seed(3)
    b = dropout(x, 0.5)
    torch.testing.assert_close(a, b)
    # Activation checkpointing recomputes the forward in backward: the same mask, so the same gradient.
    layer = torch.nn.Linear(16, 16)
    torch.manual_seed(4)
    plain = layer(dropout(layer(x), 0.5)).sum()
    (g_plain,) = torch.autograd.grad(plain, x)
    torch.manual_seed(4)
    recomputed = checkpoint(lambda t: layer(dropout(layer(t), 0.5)), x, use_reentrant=False).sum()
    (g_recomputed,) = torch.autograd.grad(recomputed, x)
    torch.testing.assert_close(g_plain, g_recomputed)


def test_identity_and_fallbacks(monkeypatch) -> None:
    x = torch.randn(5, 5)
    assert dropout(x, 0.0) is x
    assert dropout(x, 0.5, training=False) is x
    calls = []
    monkeypatch.setattr(dropout_module.F, "dropout", lambda t, p, training: calls.append(p) or t)
    dropout(x, 1e-6)  # below 16 bits' resolution: torch's dropout
    dropout(x, 1.0)
    assert calls == [1e-6, 1.0]


def test_module_is_a_drop_in_for_nn_dropout() -> None:
    module = Dropout(0.25)
    assert isinstance(module, torch.nn.Dropout) and module.p == 0.25
    x = torch.randn(10, 10)
    module.eval()
    assert module(x) is x
    module.train()
    assert float((module(x) == 0).float().mean()) > 0


def test_attention_dropout_on_cpu_uses_the_explicit_path(monkeypatch) -> None:
    """Training-time attention dropout on a CPU runs the explicit attention with pentad's dropout, not
    SDPA's (whose CPU dropout is bernoulli_); at rate 0 the explicit path equals SDPA."""
    from pentad.layers import attention as attention_module
    from pentad.layers.attention import AttentionInputs, SelfAttention, explicit_attention

    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 3, 6, 4) for _ in range(3))
    explicit, _, _ = explicit_attention(q, k, v, None, True, None, 0.0)
    torch.testing.assert_close(explicit, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=1e-6, rtol=1e-5)

    real_sdpa, rates, masks = F.scaled_dot_product_attention, [], []

    def sdpa(*args, dropout_p=0.0, **kwargs):
        rates.append(dropout_p)
        return real_sdpa(*args, dropout_p=dropout_p, **kwargs)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(attention_module, "dropout_fn", lambda t, p: masks.append(p) or dropout(t, p))
    layer = SelfAttention(16, 4, dropout=0.25)
    x = torch.randn(2, 6, 16)
    layer.train()
    layer(x, AttentionInputs())
    assert rates == [] and masks == [0.25]
    layer.eval()
    layer(x, AttentionInputs())
    assert rates == [0.0]
