"""Score transforms applied before the next token is chosen, each on a whole batch [rows, V].

All are pure tensor functions (no host synchronisation), so they run unchanged on an accelerator.
Filtered tokens get ``-inf``: softmax gives them probability exactly 0, so neither sampling nor
argmax can emit them.
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")


def repetition_penalty(scores: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """Penalise tokens that already occur (Keskar et al. 2019, CTRL, section 4.1).

    scores [rows, V]; seen [rows, V] bool. A seen token's positive score is divided by ``penalty``
    and a negative one multiplied, so ``penalty > 1`` always makes it less likely.
    """
    if penalty == 1.0:
        return scores
    penalised = torch.where(scores > 0, scores / penalty, scores * penalty)
    return torch.where(seen, penalised, scores)


def forbid(scores: Tensor, token_ids: Tensor) -> Tensor:
    """scores [rows, V] with the columns ``token_ids`` [n] set to -inf (stop tokens before
    ``min_new_tokens``)."""
    if token_ids.numel() == 0:
        return scores
    scores = scores.clone()
    scores[:, token_ids] = NEG_INF
    return scores


def top_k_filter(scores: Tensor, k: int) -> Tensor:
    """Keep the ``k`` highest scores of each row (and any tied with the k-th), -inf elsewhere."""
    if k >= scores.shape[-1]:
        return scores
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, NEG_INF)


def top_p_filter(scores: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keep, per row, the smallest set of most likely
    tokens whose probabilities sum to at least ``p`` (always at least the most likely token).

    In descending order of probability a token is dropped when the tokens before it already hold
    a mass of ``p`` or more.
    """
    if p >= 1.0:
        return scores
    ordered, order = torch.sort(scores, dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, NEG_INF)


def sampling_scores(scores: Tensor, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None) -> Tensor:
    """Temperature, then top-k, then top-p (the order Hugging Face applies them in)."""
    if temperature != 1.0:
        scores = scores / temperature
    if top_k is not None:
        scores = top_k_filter(scores, top_k)
    if top_p is not None:
        scores = top_p_filter(scores, top_p)
    return scores


def mark_seen(seen: Tensor, tokens: Tensor, valid: Tensor | None = None) -> Tensor:
    """seen [rows, V] bool updated in place with ``tokens`` [rows, n] (``valid`` [rows, n]: only
    where True, e.g. not padding). Returns ``seen``."""
    if valid is None:
        seen.scatter_(1, tokens, True)
    else:
        # scatter with a reduction: a padding id that is also a real token stays marked.
        hits = torch.zeros(seen.shape, dtype=torch.uint8, device=seen.device)
        hits.scatter_reduce_(1, tokens, valid.to(torch.uint8), reduce="amax")
        seen |= hits.bool()
    return seen
