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
