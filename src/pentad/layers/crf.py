"""A linear-chain conditional random field over tag sequences (Lafferty et al. 2001).

The score of tags ``y_1..y_n`` for emissions ``E`` [n, L] is
``start[y_1] + sum_t E[t, y_t] + sum_t transitions[y_{t-1}, y_t] + end[y_n]``; training minimises
the negative log-likelihood ``logsumexp_y score(y) - score(gold)`` (forward algorithm), prediction
takes the best-scoring sequence (Viterbi). Parameter names and meanings (``transitions[i, j]``: from
tag i to tag j) are those of the ``pytorch-crf`` package that TencentPretrain's NER uses, so its
checkpoints convert one to one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LinearChainCRF(nn.Module):
    """Transition scores between ``num_tags`` tags, with start and end scores."""

    def __init__(self, num_tags: int):
        super().__init__()
        self.num_tags = num_tags
        # Small uniform values, as pytorch-crf initialises them (zeros would make every path tie).
        self.start_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.end_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags).uniform_(-0.1, 0.1))

    def _gold_score(self, emissions: Tensor, tags: Tensor, mask: Tensor) -> Tensor:
        """score(gold) [B] for emissions [B,W,L], tags [B,W], mask [B,W] (a prefix of True per row)."""
        B, W, _ = emissions.shape
        rows = torch.arange(B, device=emissions.device)
        safe = tags.clamp(min=0)
        m = mask.to(emissions.dtype)
        score = self.start_transitions[safe[:, 0]] + emissions[rows, 0, safe[:, 0]]
        for t in range(1, W):
            step = self.transitions[safe[:, t - 1], safe[:, t]] + emissions[rows, t, safe[:, t]]
            score = score + step * m[:, t]
        last = safe[rows, (mask.sum(1) - 1).clamp(min=0)]
        return (score + self.end_transitions[last]) * mask[:, 0].to(emissions.dtype)

    def _log_partition(self, emissions: Tensor, mask: Tensor) -> Tensor:
        """logsumexp over all tag sequences [B]."""
        alpha = self.start_transitions + emissions[:, 0]  # [B, L]
        for t in range(1, emissions.shape[1]):
            nxt = torch.logsumexp(alpha[:, :, None] + self.transitions[None] + emissions[:, t, None, :], dim=1)
            alpha = torch.where(mask[:, t, None], nxt, alpha)
        return torch.logsumexp(alpha + self.end_transitions, dim=1) * mask[:, 0].to(emissions.dtype)

    def nll(self, emissions: Tensor, tags: Tensor, mask: Tensor) -> Tensor:
        """Negative log-likelihood per sequence [B]; a row with no positions gives 0.

        emissions [B,W,L] float; tags [B,W] long; mask [B,W] bool, True for the first n_b positions.
        """
        emissions = emissions.float()
        return self._log_partition(emissions, mask) - self._gold_score(emissions, tags, mask)

    @torch.no_grad()
    def decode(self, emissions: Tensor, mask: Tensor) -> list[list[int]]:
        """The best tag sequence of each row (Viterbi), as many tags as the row's mask has."""
        emissions = emissions.float()
        B, W, L = emissions.shape
        score = self.start_transitions + emissions[:, 0]
        history = []
        for t in range(1, W):
            best, index = (score[:, :, None] + self.transitions[None]).max(dim=1)  # [B, L] over the previous tag
            history.append(index)
            score = torch.where(mask[:, t, None], best + emissions[:, t], score)
        score = score + self.end_transitions
        lengths = mask.sum(1).tolist()
        out = []
        for b in range(B):
            n = int(lengths[b])
            if n == 0:
                out.append([])
                continue
            tag = int(score[b].argmax())
            path = [tag]
            for t in range(n - 1, 0, -1):
                tag = int(history[t - 1][b, tag])
                path.append(tag)
            out.append(path[::-1])
        return out


    @torch.no_grad()
    def marginals(self, emissions: Tensor) -> Tensor:
        """P(y_t = tag | sequence) [n, L] for one row's emissions [n, L] (forward-backward)."""
        emissions = emissions.float()
        n = emissions.shape[0]
        if n == 0:
            return emissions.new_zeros(0, self.num_tags)
        alpha = [self.start_transitions + emissions[0]]
        for t in range(1, n):
            alpha.append(torch.logsumexp(alpha[-1][:, None] + self.transitions, dim=0) + emissions[t])
        beta = [self.end_transitions]
        for t in range(n - 1, 0, -1):
            beta.append(torch.logsumexp(self.transitions + (emissions[t] + beta[-1])[None, :], dim=1))
        beta = beta[::-1]
        log_z = torch.logsumexp(alpha[-1] + self.end_transitions, dim=0)
        return torch.stack([(a + b - log_z).exp() for a, b in zip(alpha, beta)])


def compact(values: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Move the kept positions of each row to its front, in order.

    values [B,S,...], keep [B,S] bool -> (packed [B,W,...], mask [B,W]) with W the most kept in a row.
    """
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices
    width = int(keep.sum(1).max()) if keep.numel() else 0
    order = order[:, :max(width, 1)]
    index = order.reshape(*order.shape, *([1] * (values.dim() - 2))).expand(*order.shape, *values.shape[2:])
    packed = values.gather(1, index)
    mask = keep.gather(1, order)
    return packed, mask
