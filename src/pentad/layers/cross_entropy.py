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

The products run in the compute dtype: float32, or bfloat16 under bf16 autocast
(``train.precision=bf16``) or with bf16 weights (``bf16-true``); the log-normaliser, the loss and the
gradient of the logits are always computed in float32 from the compute-dtype logits, as
``F.cross_entropy(logits.float())`` does in the reference, and the weight gradient is accumulated over
chunks in float32 (one rounding to the weights' dtype at the end). With bf16 products each chunk's
logits are copied once into a float32 buffer, and the float32 gradient back into the bf16 one.
On a CPU with bf16 matrix units (AMX) the bf16 products are ~3x faster than float32 ones, and the
fused path avoids the reference's full [N, V] float32 copy of the logits, its log-softmax and the
zero-filled gradients: ``bench/RESULTS.md``, "Precision on a CPU with bf16 matrix units".

The fused path runs where it was measured to pay: on a CPU, in float32 or bfloat16. Elsewhere
(accelerators, fp16) the function computes the unfused reference (``F.linear`` + ``F.cross_entropy``
in float32), so the result never depends on the path beyond rounding.
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
# Row multiple of bf16 products (see the loop).
BF16_ROWS = 64
# exp's argument is clamped here first: below it, float32 results are denormal (see the loop).
EXP_FLOOR = -87.0


def chunk_rows(n_rows: int, row_bytes: int) -> int:
    """Rows per chunk for ``n_rows`` rows of ``row_bytes`` logits each, balanced so that the last
    chunk is not a sliver (the number of chunks is fixed first, then rows are spread evenly)."""
    rows = max(MIN_CHUNK_ROWS, CHUNK_BYTES // max(row_bytes, 1))
    n_chunks = max(1, -(-n_rows // rows))
    return max(1, -(-n_rows // n_chunks))


def linear_cross_entropy(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
                         label_smoothing: float = 0.0, softcap: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Mean cross-entropy of ``hidden @ weight.T + bias`` (soft-capped to ``softcap * tanh(logits /
    softcap)`` when given: Gemma's final logits, computed unfused) against ``labels``.

    hidden [N, H]; weight [V, H]; bias [V] or None; labels [N] long, ``IGNORE_INDEX`` where a row
    is not scored. Returns ``(loss, correct, count)``: the scalar loss (mean over the scored rows,
    as ``F.cross_entropy`` with ``ignore_index=-100`` and ``label_smoothing``), and the number of
    scored rows whose label has the highest score (as argmax, except that a tie counts as correct) and
    of scored rows, as long scalars (no gradient).
    """
    compute = fused_dtype(hidden, weight, bias)
    if compute is None or softcap is not None:
        return _reference(hidden, weight, bias, labels, label_smoothing, softcap)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    return _LinearCrossEntropy.apply(hidden, weight, bias, labels, label_smoothing, needs_grad, compute)


FUSED_DTYPES = (torch.float32, torch.bfloat16)


def fused_dtype(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> torch.dtype | None:
    """The dtype the fused path would run its products in, or None where the reference runs: on a
    CPU, bf16 under bf16 autocast, else the tensors' common dtype when it is float32 or bfloat16."""
    if hidden.device.type != "cpu":
        return None
    if torch.is_autocast_enabled("cpu"):
        compute = torch.get_autocast_dtype("cpu")
        return compute if compute == torch.bfloat16 else None
    dtypes = {t.dtype for t in (hidden, weight, bias) if t is not None}
    return dtypes.pop() if len(dtypes) == 1 and dtypes <= set(FUSED_DTYPES) else None


def bf16_on_cpu(hidden: Tensor) -> bool:
    """Whether products on ``hidden`` run in oneDNN's bf16 kernels: a CPU under bf16 autocast, or bf16 states."""
    return fused_dtype(hidden, hidden, None) == torch.bfloat16


def scored_rows(hidden: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """hidden [..., H] and labels [...] -> the rows whose label is scored [N, H] and their labels [N].

    Where the products run in oneDNN's bf16 kernels (:func:`bf16_on_cpu`), which build a kernel for every
    new row count, N is padded to a multiple of ``BF16_ROWS`` with unscored copies of the first row, so
    a head on masked positions (MLM: a different count every step) meets a few shapes, not one per step.
    Elsewhere the rows are exactly the scored ones."""
    selected = labels != IGNORE_INDEX
    if not bf16_on_cpu(hidden):
        return hidden[selected], labels[selected]
    index = selected.reshape(-1).nonzero().squeeze(1)
    kept = labels.reshape(-1)[index]
    extra = -index.numel() % BF16_ROWS
    if extra:
        index = torch.cat([index, index.new_zeros(extra)])
        kept = torch.cat([kept, kept.new_full((extra,), IGNORE_INDEX)])
    return hidden.reshape(-1, hidden.shape[-1])[index], kept


def _reference(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
               label_smoothing: float, softcap: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The unfused computation: full [N, V] logits (soft-capped when asked), then ``F.cross_entropy``
    in float32."""
    logits = F.linear(hidden, weight, bias)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
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
                label_smoothing: float, needs_grad: bool, compute: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        # Casts are explicit below; autocast must not re-cast the out= products.
        with torch.autocast(hidden.device.type, enabled=False):
            return _LinearCrossEntropy._forward(ctx, hidden, weight, bias, labels, label_smoothing, needs_grad,
                                                compute)

    @staticmethod
    def _forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
                 label_smoothing: float, needs_grad: bool, compute: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        fp32 = torch.float32
        n_rows, vocab = hidden.shape[0], weight.shape[0]
        chunk = chunk_rows(n_rows, vocab * 4)  # the float32 statistics buffer decides the chunk
        valid = labels != IGNORE_INDEX
        count = valid.sum()
        h_all, w, b = (t.to(compute) if t is not None else None for t in (hidden, weight, bias))
        if compute != fp32:
            # bf16 products run in oneDNN, which builds a kernel for every new row count (~30 ms each,
            # ten times the product): rows and chunks are padded to a multiple of BF16_ROWS (unscored
            # zero rows) so that a run whose scored rows vary (MLM) meets a few shapes, not one per step.
            chunk = -(-chunk // BF16_ROWS) * BF16_ROWS
            extra = -n_rows % BF16_ROWS
            if extra:
                h_all = torch.cat([h_all, h_all.new_zeros(extra, h_all.shape[1])])
                valid = torch.cat([valid, valid.new_zeros(extra)])
                labels = torch.cat([labels, labels.new_zeros(extra)])
        safe_labels = labels.masked_fill(~valid, 0)  # gather/scatter need an index; masked below
        # The loss is a mean over scored rows; with none, 0/0 gives NaN as F.cross_entropy does.
        inv_count = 1.0 / count.clamp(min=1).to(fp32)
        loss_sum = hidden.new_zeros((), dtype=fp32)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        n_rows = h_all.shape[0]
        # One float32 buffer reused by every chunk: the logits, turned in place into the softmax and
        # then into the gradient of the logits (fresh N x V buffers are what this function avoids).
        # With bf16 products a second, bf16 buffer receives the products and the gradient's copy.
        rows = min(chunk, max(n_rows, 1))
        stats = hidden.new_empty(rows, vocab, dtype=fp32)
        products = stats if compute == fp32 else hidden.new_empty(rows, vocab, dtype=compute)
        if needs_grad:
            grad_hidden = torch.empty_like(h_all)
            grad_weight = torch.zeros_like(weight, dtype=fp32)
            grad_bias = torch.zeros_like(bias, dtype=fp32) if bias is not None else None
            # bf16 products of a chunk's weight gradient, and their float32 copy (a mixed-dtype add is slower)
            chunk_weight = None if compute == fp32 else (torch.empty_like(w), torch.empty_like(grad_weight))
        w_t = w.t()
        for start in range(0, n_rows, chunk):
            end = min(n_rows, start + chunk)
            h, y, ok = h_all[start:end], safe_labels[start:end, None], valid[start:end]
            product = products[: end - start]
            if b is not None:
                torch.addmm(b, h, w_t, out=product)
            else:
                torch.mm(h, w_t, out=product)
            logits = stats[: end - start]
            if logits is not product:
                logits.copy_(product)  # bf16 -> float32 (a mixed-dtype subtraction below would be ~4x slower)
            row_max = logits.amax(dim=-1, keepdim=True)  # [c, 1]
            target = logits.gather(1, y)  # [c, 1]
            # "The label has the highest score" (a max reduction is several times cheaper than argmax;
            # they differ only on exact ties).
            correct += ((target >= row_max).squeeze(1) & ok).sum()
            mean_logit = logits.mean(dim=-1, keepdim=True) if label_smoothing else None
            # Unnormalised softmax, in place. torch's CPU exp is ~40x slower where its result is
            # denormal or zero (arguments below about -87, common once a trained model is confident):
            # clamping there first changes no float32 sum (exp(-87) ~ 1.6e-38 next to a total >= 1).
            probs = logits.sub_(row_max).clamp_min_(EXP_FLOOR).exp_()
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
            scale = (ok.to(fp32) * inv_count)[:, None]  # [c, 1]
            grad = probs.mul_(scale / total)
            if label_smoothing:
                grad.sub_(scale * (label_smoothing / vocab))
            grad.scatter_add_(1, y, scale * (label_smoothing - 1.0))
            if grad_bias is not None:
                grad_bias += grad.sum(dim=0)
            if product is not grad:
                grad = product.copy_(grad)  # the products run in the compute dtype
            torch.mm(grad, w, out=grad_hidden[start:end])
            if chunk_weight is None:
                grad_weight.addmm_(grad.t(), h)
            else:  # bf16 products of this chunk, summed over chunks in float32
                products_w, widened = chunk_weight
                grad_weight += widened.copy_(torch.mm(grad.t(), h, out=products_w))
        loss = loss_sum / count.to(fp32)
        if needs_grad:
            ctx.save_for_backward(grad_hidden[: hidden.shape[0]].to(hidden.dtype), grad_weight.to(weight.dtype),
                                  grad_bias.to(bias.dtype) if grad_bias is not None else None)
        ctx.mark_non_differentiable(correct, count)
        return loss, correct, count

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, *_: Any) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        # The loss is usually backpropagated with gradient 1 (it is summed into the total loss);
        # then scaling would be a full pass over the [V, H] weight gradient for nothing.
        if not bool(grad_loss == 1):
            grad_hidden = grad_hidden * grad_loss.to(grad_hidden.dtype)
            grad_weight = grad_weight * grad_loss.to(grad_weight.dtype)
            grad_bias = grad_bias * grad_loss.to(grad_bias.dtype) if grad_bias is not None else None
        return (grad_hidden if ctx.needs_input_grad[0] else None,
                grad_weight if ctx.needs_input_grad[1] else None,
                grad_bias if ctx.needs_input_grad[2] else None, None, None, None, None)
