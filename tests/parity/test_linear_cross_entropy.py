"""The fused, chunked vocabulary projection + cross-entropy (``pentad.layers.cross_entropy``)
against the unfused reference ``F.linear`` + ``F.cross_entropy``: loss, metrics and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pentad.layers import cross_entropy as ce
from pentad.layers.cross_entropy import IGNORE_INDEX, linear_cross_entropy


def inputs(n_rows: int, vocab: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n_rows, 16, generator=g).requires_grad_()
    weight = (0.3 * torch.randn(vocab, 16, generator=g)).requires_grad_()
    b = torch.randn(vocab, generator=g).requires_grad_() if bias else None
    labels = torch.randint(0, vocab, (n_rows,), generator=g)
    labels[::3] = IGNORE_INDEX
    return hidden, weight, b, labels


def grads(loss: torch.Tensor, *tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("min_rows", [4, 256], ids=["chunks", "one-chunk"])
def test_matches_reference(monkeypatch, label_smoothing: float, bias: bool, min_rows: int) -> None:
    monkeypatch.setattr(ce, "MIN_CHUNK_ROWS", min_rows)
    monkeypatch.setattr(ce, "CHUNK_BYTES", 1)  # chunks of MIN_CHUNK_ROWS rows: several for 4
    hidden, weight, b, labels = inputs(23, 37, bias)
    loss, correct, count = linear_cross_entropy(hidden, weight, b, labels, label_smoothing)
    logits = F.linear(hidden, weight, b)
    ref = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-6)
    valid = labels != IGNORE_INDEX
    assert int(count) == int(valid.sum())
    assert int(correct) == int(((logits.argmax(-1) == labels) & valid).sum())
    # A gradient other than 1 reaches the loss (e.g. a weighted sum of target losses).
    for ours, theirs in zip(grads(2.5 * loss, hidden, weight, b), grads(2.5 * ref, hidden, weight, b)):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


def test_no_grad_and_empty() -> None:
    hidden, weight, b, labels = inputs(10, 37, True)
    with torch.no_grad():
        loss, _, _ = linear_cross_entropy(hidden, weight, b, labels)
    ref = F.cross_entropy(F.linear(hidden, weight, b), labels)
    torch.testing.assert_close(loss, ref.detach(), atol=1e-6, rtol=1e-6)
    assert not loss.requires_grad
    # No scored row: NaN loss as F.cross_entropy gives, and zero (not garbage) gradients.
    loss, correct, count = linear_cross_entropy(hidden[:0], weight, b, labels[:0])
    assert torch.isnan(loss) and int(count) == 0 and int(correct) == 0
    (g_weight,) = torch.autograd.grad(loss, [weight], allow_unused=True)
    assert g_weight is not None and not bool(g_weight.any())


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours.float() - theirs.float()).norm() / theirs.float().norm().clamp(min=1e-12))


@pytest.mark.parametrize("mode", ["bf16-weights", "bf16-autocast"])
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_matches_reference(monkeypatch, mode: str, bias: bool) -> None:
    """bf16 products (bf16 weights, or fp32 weights under bf16 autocast), float32 statistics: the
    reference computes the same products in one piece and ``F.cross_entropy`` in float32."""
    monkeypatch.setattr(ce, "MIN_CHUNK_ROWS", 8)
    monkeypatch.setattr(ce, "CHUNK_BYTES", 1)  # several chunks, so the float32 sum over chunks is exercised
    monkeypatch.setattr(ce, "BF16_ROWS", 8)  # 45 rows padded to 48: unscored padding rows in the last chunk
    hidden, weight, b, labels = inputs(45, 211, bias, seed=3)
    if mode == "bf16-weights":
        hidden, weight, b = (t.detach().bfloat16().requires_grad_() if t is not None else None
                             for t in (hidden, weight, b))
        context = torch.autocast("cpu", enabled=False)
    else:
        context = torch.autocast("cpu", dtype=torch.bfloat16)
    with context:
        assert ce.fused_dtype(hidden, weight, b) == torch.bfloat16
        loss, correct, count = linear_cross_entropy(hidden, weight, b, labels, 0.1)
        ref, ref_correct, ref_count = ce._reference(hidden, weight, b, labels, 0.1)
    assert loss.dtype == torch.float32 and ref.dtype == torch.float32
    torch.testing.assert_close(loss, ref, atol=2e-3, rtol=2e-3)
    assert int(count) == int(ref_count)
    assert abs(int(correct) - int(ref_correct)) <= 1  # a bf16 tie may fall either way
    ours, theirs = grads(3.0 * loss, hidden, weight, b), grads(3.0 * ref, hidden, weight, b)
    for o, t in zip(ours, theirs):
        assert o.dtype == t.dtype
        assert _relative_error(o, t) < 2e-2


def test_bf16_close_to_float32() -> None:
    """What bf16 costs in accuracy: the loss of bf16 products against exact float32 ones."""
    hidden, weight, b, labels = inputs(64, 301, True, seed=5)
    exact, _, _ = linear_cross_entropy(hidden, weight, b, labels)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        approx, _, _ = linear_cross_entropy(hidden, weight, b, labels)
    torch.testing.assert_close(approx, exact, atol=2e-2, rtol=1e-2)


def test_reference_where_not_fused() -> None:
    """float16 and mixed dtypes outside autocast take the reference path (the same result)."""
    hidden, weight, b, labels = inputs(12, 37, True)
    assert ce.fused_dtype(hidden, weight, b) == torch.float32
    assert ce.fused_dtype(hidden.half(), weight.half(), b.half()) is None
    assert ce.fused_dtype(hidden.bfloat16(), weight, b) is None
    with torch.autocast("cpu", dtype=torch.float16):
        assert ce.fused_dtype(hidden, weight, b) is None


def test_scored_rows_padded_only_for_bf16_products() -> None:
    """An MLM head's rows: exactly the scored ones in float32; under bf16 on a CPU padded to a multiple of
    BF16_ROWS with unscored rows, which change neither the loss nor any gradient."""
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(3, 10, 16, generator=g).requires_grad_()
    labels = torch.full((3, 10), IGNORE_INDEX)
    labels[0, 2], labels[1, 5], labels[2, 9] = 4, 11, 0
    rows, scored = ce.scored_rows(hidden, labels)
    assert rows.shape == (3, 16) and scored.tolist() == [4, 11, 0]
    weight = torch.randn(37, 16, generator=g).requires_grad_()
    plain = linear_cross_entropy(rows.bfloat16(), weight.bfloat16(), None, scored)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        padded_rows, padded = ce.scored_rows(hidden, labels)
        assert padded_rows.shape == (ce.BF16_ROWS, 16) and padded[3:].eq(IGNORE_INDEX).all()
        torch.testing.assert_close(padded_rows[:3], rows)
        loss = linear_cross_entropy(padded_rows, weight, None, padded)[0]
    torch.testing.assert_close(loss, plain, atol=1e-2, rtol=1e-2)
    (g_hidden,) = torch.autograd.grad(loss, hidden)
    assert int((g_hidden.abs().sum(-1) > 0).sum()) == 3  # only the scored positions get a gradient
