"""The linear-chain CRF against brute force over every tag sequence, and the tagger head with it."""

from __future__ import annotations

import itertools

import torch

from pentad.components.base import IGNORE_INDEX, Batch
from pentad.components.targets.tagger import TaggerTarget
from pentad.layers.crf import LinearChainCRF, compact


def brute_scores(crf: LinearChainCRF, emissions: torch.Tensor) -> dict[tuple[int, ...], float]:
    n, L = emissions.shape
    out = {}
    for tags in itertools.product(range(L), repeat=n):
        s = crf.start_transitions[tags[0]] + crf.end_transitions[tags[-1]]
        s = s + sum(emissions[t, y] for t, y in enumerate(tags))
        s = s + sum(crf.transitions[a, b] for a, b in zip(tags, tags[1:]))
        out[tags] = float(s.detach())
    return out


def test_likelihood_viterbi_and_marginals_equal_brute_force():
    torch.manual_seed(0)
    crf = LinearChainCRF(3)
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_()
    lengths = [4, 2, 1, 0]
    emissions = torch.randn(len(lengths), 4, 3)
    mask = torch.arange(4)[None, :] < torch.tensor(lengths)[:, None]
    tags = torch.randint(0, 3, (len(lengths), 4))
    nll = crf.nll(emissions, tags, mask).detach()
    paths = crf.decode(emissions, mask)
    for b, n in enumerate(lengths):
        if n == 0:
            assert float(nll[b]) == 0.0 and paths[b] == []
            continue
        scores = brute_scores(crf, emissions[b, :n])
        log_z = torch.logsumexp(torch.tensor(list(scores.values())), 0)
        gold = tuple(tags[b, :n].tolist())
        torch.testing.assert_close(nll[b], log_z - scores[gold], atol=1e-5, rtol=0)
        assert tuple(paths[b]) == max(scores, key=scores.get)
        marginals = crf.marginals(emissions[b, :n])
        expected = torch.zeros(n, 3)
        for seq, s in scores.items():
            for t, y in enumerate(seq):
                expected[t, y] += torch.exp(torch.tensor(s) - log_z)
        torch.testing.assert_close(marginals, expected, atol=1e-5, rtol=0)


def test_compact_moves_kept_positions_to_the_front():
    values = torch.arange(10).reshape(2, 5)
    keep = torch.tensor([[False, True, False, True, True], [True, False, False, False, False]])
    packed, mask = compact(values, keep)
    assert packed[0].tolist() == [1, 3, 4] and packed[1, 0] == 5
    assert mask.tolist() == [[True, True, True], [True, False, False]]


def test_tagger_with_crf_trains_on_scored_positions_only():
    torch.manual_seed(0)
    head = TaggerTarget("tagger", hidden_size=8, num_labels=3, dropout=0.0, crf=True)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    labels = torch.tensor([[IGNORE_INDEX, 1, IGNORE_INDEX, 2, IGNORE_INDEX], [IGNORE_INDEX, 0, 0, IGNORE_INDEX,
                                                                              IGNORE_INDEX]])
    out = head(hidden, Batch(labels={"tagger": labels}))
    keep = labels != IGNORE_INDEX
    emissions, mask = compact(out.logits, keep)
    tags, _ = compact(labels, keep)
    torch.testing.assert_close(out.loss, head.crf.nll(emissions, tags, mask).sum() / 4)
    out.loss.backward()
    assert hidden.grad[~keep].abs().sum() == 0 and hidden.grad[keep].abs().sum() > 0
    assert head.crf.transitions.grad.abs().sum() > 0
    assert int(out.metrics["count"]) == 4 and 0 <= int(out.metrics["correct"]) <= 4
