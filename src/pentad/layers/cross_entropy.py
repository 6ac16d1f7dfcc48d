"""Vocabulary projection fused with cross-entropy, computed in row chunks.

The output projection of a language model ``logits = hidden @ weight.T + bias`` followed by
cross-entropy is the largest cost of pre-training at small and medium widths (DESIGN section 7):
``[N, V]`` logits, their log-softmax, the zero-filled gradient of the loss and the gradient of the
logits are four fresh ``N x V`` tensors per step (206 MB each for 1024 tokens of GPT-2's 50257
word vocabulary). On a CPU each fresh buffer of that size is mapped from the kernel page by page,
which costs as much as the arithmetic that fills it.

``linear_cross_entropy`` computes the same loss chunk by chunk: it projects a chunk of rows into
one reused buffer, takes the row maximum, the label's score and the log-normaliser, and (when
gradients are needed) turns the same buffer in place into the gradient of the logits,
``(softmax - target) / n``, which it multiplies at once into the gradients of ``hidden`` and
``weight``. The backward pass only scales these by the incoming gradient. The matrix products are
those of the unfused computation, so the arithmetic does not change; what goes away is the traffic
through fresh ``N x V`` buffers (the idea of Liger Kernel's fused linear cross-entropy, Hsu et al.
2024). Measured on a 2-core AVX2 CPU, one thread: 1024 GPT-2 tokens, forward + backward of the
projection and loss, 1.94 s unfused, 1.46 s fused.

The fused path runs where it was measured to pay: float32 on a CPU without autocast. Elsewhere
(accelerators, bf16 autocast, half-precision weights) the function computes the unfused reference
(``F.linear`` + ``F.cross_entropy``), so the result never depends on the path beyond rounding.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100  # unscored label, as pentad.components.base.IGNORE_INDEX and F.cross_entropy's default

# Rows per chunk: at least MIN_CHUNK_ROWS, so that the three matrix products keep the
# efficiency of a large product (below ~256 rows their speed drops, more so with several
# threads), and more when a chunk of logits is still small (CHUNK_BYTES).
MIN_CHUNK_ROWS = 256
CHUNK_BYTES = 32 * 2**20


def chunk_rows(n_rows: int, row_bytes: int) -> int:
    """Rows per chunk for ``n_rows`` rows of ``row_bytes`` logits each, balanced so that the last
    chunk is not a sliver (the number of chunks is fixed first, then rows are spread evenly)."""
    rows = max(MIN_CHUNK_ROWS, CHUNK_BYTES // max(row_bytes, 1))
    n_chunks = max(1, -(-n_rows // rows))
    return max(1, -(-n_rows // n_chunks))


def linear_cross_entropy(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
                         label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """Mean cross-entropy of ``hidden @ weight.T + bias`` against ``labels``.

    hidden [N, H]; weight [V, H]; bias [V] or None; labels [N] long, ``IGNORE_INDEX`` where a row
    is not scored. Returns ``(loss, correct, count)``: the scalar loss (mean over the scored rows,
    as ``F.cross_entropy`` with ``ignore_index=-100`` and ``label_smoothing``), and the number of
    scored rows whose label has the highest score (as argmax, except that a tie counts as correct) and
    of scored rows, as long scalars (no gradient).
    """
    if not _fused_applies(hidden, weight, bias):
        return _reference(hidden, weight, bias, labels, label_smoothing)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    return _LinearCrossEntropy.apply(hidden, weight, bias, labels, label_smoothing, needs_grad)


def _fused_applies(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    tensors = [t for t in (hidden, weight, bias) if t is not None]
    return (hidden.device.type == "cpu" and not torch.is_autocast_enabled("cpu")
            and all(t.dtype == torch.float32 for t in tensors))


def _reference(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
               label_smoothing: float) -> tuple[Tensor, Tensor, Tensor]:
    """The unfused computation: full [N, V] logits, then ``F.cross_entropy`` in float32."""
    logits = F.linear(hidden, weight, bias)
    loss = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)
    with torch.no_grad():
        valid = labels != IGNORE_INDEX
        target = logits.gather(1, labels.masked_fill(~valid, 0)[:, None])
        correct = ((target >= logits.amax(dim=-1, keepdim=True)).squeeze(1) & valid).sum()
    return loss, correct, valid.sum()


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and, if asked, the gradients; backward scales them."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
                label_smoothing: float, needs_grad: bool) -> tuple[Tensor, Tensor, Tensor]:
        n_rows, vocab = hidden.shape[0], weight.shape[0]
        chunk = chunk_rows(n_rows, vocab * hidden.element_size())
        valid = labels != IGNORE_INDEX
        safe_labels = labels.masked_fill(~valid, 0)  # gather/scatter need an index; masked below
        count = valid.sum()
        # The loss is a mean over scored rows; with none, 0/0 gives NaN as F.cross_entropy does.
        inv_count = 1.0 / count.clamp(min=1).to(hidden.dtype)
        loss_sum = hidden.new_zeros(())
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        # One buffer reused by every chunk: the logits, turned in place into the softmax and then
        # into the gradient of the logits (fresh N x V buffers are what this function avoids).
        buffer = hidden.new_empty(min(chunk, max(n_rows, 1)), vocab)
        if needs_grad:
            grad_hidden = torch.empty_like(hidden)
            grad_weight = torch.zeros_like(weight) if n_rows == 0 else torch.empty_like(weight)
            grad_bias = torch.zeros_like(bias) if bias is not None else None
        weight_t = weight.t()
        for start in range(0, n_rows, chunk):
            end = min(n_rows, start + chunk)
            h, y, ok = hidden[start:end], safe_labels[start:end, None], valid[start:end]
            logits = buffer[: end - start]
            if bias is not None:
                torch.addmm(bias, h, weight_t, out=logits)
            else:
                torch.mm(h, weight_t, out=logits)
            row_max = logits.amax(dim=-1, keepdim=True)  # [c, 1]
            target = logits.gather(1, y)  # [c, 1]
            # "The label has the highest score" (a max reduction is several times cheaper than argmax;
            # they differ only on exact ties).
            correct += ((target >= row_max).squeeze(1) & ok).sum()
            mean_logit = logits.mean(dim=-1, keepdim=True) if label_smoothing else None
            probs = logits.sub_(row_max).exp_()  # unnormalised softmax, in place
            total = probs.sum(dim=-1, keepdim=True)
            log_normalizer = row_max + total.log()  # logsumexp of the row
            row_loss = log_normalizer - target  # -log p(label)
            if label_smoothing:
                # F.cross_entropy's smoothing: (1 - e) * nll + e * mean over classes of -log p.
                row_loss = (1.0 - label_smoothing) * row_loss + label_smoothing * (log_normalizer - mean_logit)
            loss_sum += torch.where(ok, row_loss.squeeze(1), 0.0).sum()
            if not needs_grad:
                continue
            # d loss / d logits = (softmax - smoothed one-hot) / count, zero on unscored rows.
            scale = (ok.to(probs.dtype) * inv_count)[:, None]  # [c, 1]
            grad = probs.mul_(scale / total)
            if label_smoothing:
                grad.sub_(scale * (label_smoothing / vocab))
            grad.scatter_add_(1, y, scale * (label_smoothing - 1.0))
            torch.mm(grad, weight, out=grad_hidden[start:end])
            if start == 0:
                torch.mm(grad.t(), h, out=grad_weight)
            else:
                grad_weight.addmm_(grad.t(), h)
            if grad_bias is not None:
                grad_bias += grad.sum(dim=0)
        loss = loss_sum / count.to(loss_sum.dtype)
        if needs_grad:
            ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.mark_non_differentiable(correct, count)
        return loss, correct, count

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, *_: Any) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        # The loss is usually backpropagated with gradient 1 (it is summed into the total loss);
        # then scaling would be a full pass over the [V, H] weight gradient for nothing.
        if not bool(grad_loss == 1):
            grad_hidden = grad_hidden * grad_loss
            grad_weight = grad_weight * grad_loss
            grad_bias = grad_bias * grad_loss if grad_bias is not None else None
        return (grad_hidden if ctx.needs_input_grad[0] else None,
                grad_weight if ctx.needs_input_grad[1] else None,
                grad_bias if ctx.needs_input_grad[2] else None, None, None, None)
