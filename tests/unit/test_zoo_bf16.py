"""Every zoo family in bf16-true (``train.precision=bf16-true``): the smallest recipe of each family,
shrunk as in test_zoo.py, with bf16 weights on the CPU, trains one step (forward, backward, AdamW)
with a finite loss and bf16 parameters after the step; decoder families also generate with their
KV cache, the same tokens as without it."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.config.loader import zoo_names
from pentad.generation.search import generate
from pentad.generation.session import lm_head
from pentad.model import count_parameters, total_loss
from pentad.training.config import TrainConfig
from pentad.training.optim import build_optimizer

from .test_zoo import batch_for, shrunk_model_config


@cache
def smallest_recipes() -> dict[str, str]:
    """family -> its recipe with the fewest parameters (built on the meta device)."""
    best: dict[str, tuple[int, str]] = {}
    for name in zoo_names():
        family = name.split("/")[0]
        params = count_parameters(build_model(load_config(name).model, device="meta"))
        if family not in best or params < best[family][0]:
            best[family] = (params, name)
    return {family: name for family, (_, name) in sorted(best.items())}


def test_every_family_is_covered():
    families = {name.split("/")[0] for name in zoo_names()}
    assert set(smallest_recipes()) == families and len(families) > 10


@pytest.mark.parametrize("family", sorted({name.split("/")[0] for name in zoo_names()}))
def test_family_trains_a_step_in_bf16_true(family):
    name = smallest_recipes()[family]
    torch.manual_seed(0)
    model = build_model(shrunk_model_config(name)).to(torch.bfloat16)
    batch = batch_for(model, 97).to("cpu", dtype=torch.bfloat16)
    optimizer = build_optimizer(model, TrainConfig(lr=1e-2))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = total_loss(model(batch))
    assert torch.isfinite(loss), f"{name}: loss {loss}"
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    params = dict(model.named_parameters())
    assert all(p.dtype == torch.bfloat16 for p in params.values()), \
        [n for n, p in params.items() if p.dtype != torch.bfloat16]
    assert all(torch.isfinite(p).all() for p in params.values())
    moved = [n for n, p in params.items() if p.requires_grad and not torch.equal(p, before[n])]
    assert len(moved) > len(params) // 2, f"{name}: only {moved} changed"
    for state in optimizer.state.values():  # the AdamW moments are bf16 too: no fp32 copy anywhere
        assert state["exp_avg"].dtype == torch.bfloat16 and state["exp_avg_sq"].dtype == torch.bfloat16
    model.eval()
    with torch.no_grad():  # and evaluation after the step
        assert torch.isfinite(total_loss(model(batch)))


def _generates(name: str) -> bool:
    model = build_model(shrunk_model_config(name), device="meta")
    try:
        lm_head(model)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("family", sorted({name.split("/")[0] for name in zoo_names()}))
def test_decoder_family_generates_in_bf16(family):
    name = smallest_recipes()[family]
    if not _generates(name):
        pytest.skip(f"{name} has no next-token head")
    torch.manual_seed(0)
    model = build_model(shrunk_model_config(name)).to(torch.bfloat16)
    prompts = [[5, 6, 7, 8], [9, 10]]
    speech = getattr(model.embedding, "speech", None)
    if speech is not None:  # speech-to-text: the source is a batch of feature frames, the second row padded
        from pentad.components.base import Batch

        mask = torch.zeros(2, 24, dtype=torch.bool)
        mask[1, 16:] = True
        prompts = Batch(audio=torch.randn(2, 24, speech.convs[0].in_channels).to(torch.bfloat16),
                        audio_padding_mask=mask)
    options = {"max_new_tokens": 6, "decoder_start_token_id": 0}
    cached = generate(model, prompts, **options)
    uncached = generate(model, prompts, use_cache=False, **options)
    assert [len(s) for s in cached.sequences()] == [len(s) for s in uncached.sequences()]
    assert all(len(s) > 0 for s in cached.sequences())
    first = [s[:2] for s in cached.sequences()]
    assert first == [s[:2] for s in uncached.sequences()], name
