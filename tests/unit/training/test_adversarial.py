"""Adversarial training on the embeddings (FGM, PGD): the step lengths, the ball, exact restoration, and
gradients equal to those of the clean loss plus the loss at the perturbed table, computed by hand."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import tiny_model_dict

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.errors import UserError
from pentad.model import total_loss
from pentad.training.adversarial import Adversary, embedding_parameters, project, unit_step
from pentad.training.config import AdversarialConfig, TrainConfig
from pentad.training.distributed import Dist
from pentad.training.strategies.single import SingleStrategy


def _model(**over):
    torch.manual_seed(0)
    cfg = tiny_model_dict(targets=[{"type": "cls", "num_labels": 3, "dropout": 0.0}], **over)
    return build_model(model_config_class().model_validate(cfg))


def _batch(seed: int = 1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 50, (4, 10), generator=g)
    padding = torch.zeros(4, 10, dtype=torch.bool)
    padding[2, -3:] = True
    return Batch(tokens=tokens, segments=torch.zeros_like(tokens), padding_mask=padding,
                 labels={"cls": torch.tensor([0, 2, 1, 2])})


def _strategy(model):
    strategy = SingleStrategy(TrainConfig(), Dist())
    strategy.setup(model, lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    return strategy


def _loss(module, batch):
    return total_loss(module(batch))


def test_the_default_table_is_the_word_embedding_and_patterns_are_checked():
    model = _model()
    assert [n for n, _ in embedding_parameters(model)] == ["embedding.word.weight"]
    assert [n for n, _ in embedding_parameters(model, "*.pos.weight")] == ["embedding.pos.weight"]
    with pytest.raises(UserError, match=r"matches no parameter.*embedding\.word\.weight"):
        embedding_parameters(model, "embeddings.word_embeddings.weight")
    model.embedding.word.weight.requires_grad_(False)  # as train.lora leaves it
    with pytest.raises(UserError, match=r"perturbs embedding\.word\.weight, which is not trained"):
        embedding_parameters(model)


def test_unit_steps_have_the_asked_length_and_projection_stays_in_the_ball():
    g = torch.randn(50, 32)
    assert torch.linalg.vector_norm(unit_step(g, 0.7)).item() == pytest.approx(0.7, rel=1e-6)
    assert torch.equal(unit_step(torch.zeros(3, 4), 1.0), torch.zeros(3, 4))  # no gradient: no step
    assert torch.equal(unit_step(torch.full((3,), float("inf")), 1.0), torch.zeros(3))  # fp16 overflow
    r = torch.randn(50, 32) * 10
    assert torch.linalg.vector_norm(project(r, 2.0)).item() == pytest.approx(2.0, rel=1e-6)
    small = torch.randn(5) * 1e-3
    assert torch.equal(project(small, 2.0), small)


class _Recorder(Adversary):
    """Records the table as each adversarial forward sees it."""

    seen: list[torch.Tensor]

    def attack(self, loss_of, last):
        self.seen = []
        word = self.params[0][1]

        def recording(module):
            self.seen.append(word.detach().clone())
            return loss_of(module)

        return super().attack(recording, last)


def _clean_backward(adversary, strategy, batch):
    with adversary.capture():
        loss = _loss(strategy.model, batch)
        strategy.backward(loss)
    return loss


def test_fgm_moves_the_table_by_epsilon_and_restores_it_bit_for_bit():
    model = _model()
    strategy = _strategy(model)
    adversary = _Recorder(AdversarialConfig(method="fgm", epsilon=0.5), strategy)
    word = model.embedding.word.weight
    before = word.detach().clone()
    batch = _batch()
    _clean_backward(adversary, strategy, batch)
    adversary.attack(lambda m: _loss(m, batch), last=True)
    assert len(adversary.seen) == 1
    assert torch.linalg.vector_norm(adversary.seen[0] - before).item() == pytest.approx(0.5, rel=1e-4)
    assert torch.equal(word.detach(), before)  # restored exactly


def test_pgd_steps_stay_within_the_ball():
    model = _model()
    strategy = _strategy(model)
    adversary = _Recorder(AdversarialConfig(method="pgd", epsilon=0.5, alpha=0.3, steps=4), strategy)
    word = model.embedding.word.weight
    before = word.detach().clone()
    batch = _batch()
    _clean_backward(adversary, strategy, batch)
    adversary.attack(lambda m: _loss(m, batch), last=True)
    norms = [torch.linalg.vector_norm(seen - before).item() for seen in adversary.seen]
    assert len(norms) == 4  # steps - 1 intermediate gradients, then the one that counts
    assert norms[0] == pytest.approx(0.3, rel=1e-4)  # one step of alpha
    assert all(n <= 0.5 * (1 + 1e-5) for n in norms)
    assert norms[-1] == pytest.approx(0.5, rel=1e-4)  # 4 x 0.3 along similar directions reaches the boundary
    assert torch.equal(word.detach(), before)


def _hand_fgm(model, batch, epsilon):
    """grad(clean) + grad(loss at word + epsilon g/||g||), with plain autograd on a copy."""
    params = dict(model.named_parameters())
    model.zero_grad()
    _loss(model, batch).backward()
    clean = {k: p.grad.clone() for k, p in params.items()}
    g = clean["embedding.word.weight"]
    model.zero_grad()
    with torch.no_grad():
        params["embedding.word.weight"].add_(epsilon * g / g.norm())
    _loss(model, batch).backward()
    return {k: clean[k] + params[k].grad for k in params}


def test_fgm_gradients_are_clean_plus_adversarial():
    batch = _batch()
    expected = _hand_fgm(_model(), batch, 0.8)
    model = _model()
    strategy = _strategy(model)
    adversary = Adversary(AdversarialConfig(method="fgm", epsilon=0.8), strategy)
    _clean_backward(adversary, strategy, batch)
    adversary.attack(lambda m: _loss(m, batch), last=True)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_with_accumulation_the_step_follows_this_micro_batch_only():
    # a second micro-batch: its perturbation is along its own gradient, not the accumulated one
    first, second = _batch(1), _batch(2)
    model = _model()
    strategy = _strategy(model)
    adversary = _Recorder(AdversarialConfig(method="fgm", epsilon=0.8), strategy, grad_accum=2)
    for batch in (first, second):
        with adversary.capture():
            strategy.backward(_loss(strategy.model, batch) / 2)
        adversary.attack(lambda m, b=batch: _loss(m, b), last=batch is second)
    reference = _model()
    reference.zero_grad()
    _loss(reference, second).backward()
    g = reference.embedding.word.weight.grad
    step = adversary.seen[0] - reference.embedding.word.weight.detach()
    torch.testing.assert_close(step, 0.8 * g / g.norm(), rtol=1e-4, atol=1e-7)
    # and the accumulated gradient is the mean of both micro-batches' (clean + adversarial)
    a, b = _hand_fgm(_model(), first, 0.8), _hand_fgm(_model(), second, 0.8)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, (a[name] + b[name]) / 2, rtol=1e-5, atol=1e-6, msg=name)


def test_sharded_strategies_are_refused():
    class Fsdp:
        registry_name = "fsdp"

    with pytest.raises(UserError, match="not available with train.strategy=fsdp"):
        Adversary(AdversarialConfig(method="pgd"), Fsdp())


def test_under_a_gradient_scaler_the_steps_are_those_of_unscaled_gradients():
    # fp16 (on a GPU) scales every backward; the perturbation directions, and so the unscaled gradients,
    # must not change: here a CPU GradScaler stands in for the GPU one
    batch = _batch()
    grads = {}
    for scale in (None, 1024.0):
        model = _model()
        strategy = _strategy(model)
        if scale is not None:
            strategy.scaler = torch.amp.GradScaler("cpu", init_scale=scale)
        adversary = _Recorder(AdversarialConfig(method="pgd", epsilon=0.5, alpha=0.3, steps=3), strategy)
        _clean_backward(adversary, strategy, batch)
        adversary.attack(lambda m: _loss(m, batch), last=True)
        grads[scale] = ({n: p.grad / (scale or 1.0) for n, p in model.named_parameters()}, adversary.seen)
    (plain, seen), (scaled, seen_scaled) = grads[None], grads[1024.0]
    for a, b in zip(seen, seen_scaled):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    for name in plain:
        torch.testing.assert_close(scaled[name], plain[name], rtol=1e-4, atol=1e-7, msg=name)


def test_pgd_with_activation_checkpointing_gives_the_same_gradients():
    from pentad.training.recompute import checkpoint_blocks

    batch = _batch()
    grads = []
    for recompute in (False, True):
        model = _model()
        if recompute:
            assert checkpoint_blocks(model) == 2
        strategy = _strategy(model)
        adversary = Adversary(AdversarialConfig(method="pgd", steps=3), strategy)
        _clean_backward(adversary, strategy, batch)
        adversary.attack(lambda m: _loss(m, batch), last=True)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-6, atol=1e-8, msg=name)
