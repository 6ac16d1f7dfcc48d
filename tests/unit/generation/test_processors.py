"""Score filters: top-k and top-p keep exactly the tokens they should, and sampling never emits a
filtered token; exhaustive over small distributions."""

from __future__ import annotations

import itertools

import pytest
import torch

from pentad.generation.processors import (
    forbid,
    mark_seen,
    repetition_penalty,
    sampling_scores,
    top_k_filter,
    top_p_filter,
)

# Every vector over {-1, 0, 1, 2} of length 1..4 (ties included), plus random ones up to length 6.
SMALL = [torch.tensor(v, dtype=torch.float32) for n in range(1, 5)
         for v in itertools.product((-1.0, 0.0, 1.0, 2.0), repeat=n)]
_g = torch.Generator().manual_seed(0)
SMALL += [torch.randn(n, generator=_g) * s for n in range(2, 7) for s in (0.3, 1.0, 4.0) for _ in range(20)]
P_GRID = [0.01, 0.1, 0.25, 1 / 3, 0.5, 0.6, 0.75, 0.9, 0.99, 1.0]


def kept(scores: torch.Tensor) -> set[int]:
    return {i for i, s in enumerate(scores.tolist()) if s != float("-inf")}


def test_top_k_keeps_the_k_best_and_their_ties() -> None:
    for logits in SMALL:
        for k in range(1, len(logits) + 1):
            out = top_k_filter(logits[None], k)[0]
            kth = sorted(logits.tolist(), reverse=True)[k - 1]
            assert kept(out) == {i for i, v in enumerate(logits.tolist()) if v >= kth}
            for i in kept(out):  # kept scores are unchanged
                assert out[i] == logits[i]


def test_top_p_keeps_the_smallest_nucleus() -> None:
    for logits in SMALL:
        probs = logits.softmax(-1).tolist()
        for p in P_GRID:
            out = top_p_filter(logits[None], p)[0]
            keep = kept(out)
            assert keep, "at least one token survives"
            # The kept set is a top set: every kept token is at least as likely as every dropped one.
            if len(keep) < len(probs):
                assert min(probs[i] for i in keep) >= max(probs[i] for i in range(len(probs)) if i not in keep)
            mass = sum(probs[i] for i in keep)
            assert mass >= p - 1e-6 or len(keep) == len(probs)
            # Minimal: without its least likely member the set would fall short of p.
            weakest = min(keep, key=lambda i: probs[i])
            assert mass - probs[weakest] < p + 1e-6


def test_top_p_of_one_keeps_everything() -> None:
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(1))
    assert torch.equal(top_p_filter(logits, 1.0), logits)


@pytest.mark.parametrize("top_k,top_p,temperature", [(1, None, 1.0), (2, None, 0.7), (None, 0.5, 1.0),
                                                      (3, 0.8, 1.5), (None, 0.05, 0.3)])
def test_sampling_never_emits_filtered_tokens(top_k, top_p, temperature) -> None:
    g = torch.Generator().manual_seed(2)
    for logits in SMALL[::7]:
        scores = sampling_scores(logits[None].repeat(200, 1), temperature, top_k, top_p)
        allowed = kept(scores[0])
        draws = torch.multinomial(scores.softmax(-1), 1, generator=g).flatten().tolist()
        assert set(draws) <= allowed


def test_temperature_divides() -> None:
    logits = torch.tensor([[1.0, -2.0, 4.0]])
    torch.testing.assert_close(sampling_scores(logits, temperature=2.0), logits / 2)


def test_repetition_penalty_makes_seen_tokens_less_likely() -> None:
    scores = torch.tensor([[2.0, -2.0, 0.5, -0.5]])
    seen = torch.tensor([[True, True, False, False]])
    out = repetition_penalty(scores, seen, 2.0)
    torch.testing.assert_close(out, torch.tensor([[1.0, -4.0, 0.5, -0.5]]))
    assert torch.equal(repetition_penalty(scores, seen, 1.0), scores)


def test_forbid_and_mark_seen() -> None:
    scores = torch.zeros(2, 5)
    out = forbid(scores, torch.tensor([1, 3]))
    assert kept(out[0]) == {0, 2, 4} and torch.equal(scores, torch.zeros(2, 5))  # not in place
    seen = torch.zeros(2, 5, dtype=torch.bool)
    tokens = torch.tensor([[0, 0, 2], [4, 1, 1]])
    valid = torch.tensor([[False, True, True], [False, True, True]])  # position 0 is padding
    mark_seen(seen, tokens, valid)
    # Token 0 of row 0 is padding once and real once: still seen. Token 4 of row 1 is padding only.
    assert seen.tolist() == [[True, False, True, False, False], [False, True, False, False, False]]
