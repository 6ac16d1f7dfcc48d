"""Driven by the zoo: every recipe builds on the meta device, and a shrunken copy of it (same modules,
tiny sizes) runs forward and backward and round-trips through save/load bitwise. A new recipe is
tested without new test code."""

from __future__ import annotations

import pytest
import torch

from pentad.builder import build_model
from pentad.components.base import IGNORE_INDEX, Batch
from pentad.config.loader import load_config, zoo_names
from pentad.model import count_parameters, total_loss
from pentad.training import checkpoint as ckpt

SHRINK = ["model.hidden_size=32", "model.vocab_size=97", "model.max_seq_length=32", "model.encoder.num_layers=2",
          "model.encoder.num_heads=2", "model.encoder.ffn_size=48"]


@pytest.mark.parametrize("name", zoo_names())
def test_recipe_builds_on_meta(name):
    cfg = load_config(name)
    assert cfg.description
    model = build_model(cfg.model, device="meta")
    assert count_parameters(model) > 1_000_000


def batch_for(model, vocab: int, b: int = 2, s: int = 12) -> Batch:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (b, s), generator=g)
    padding = torch.zeros(b, s, dtype=torch.bool)
    padding[1, -3:] = True
    labels = {}
    for name, target in model.targets.items():
        kind = target.registry_name
        if kind in ("mlm", "lm"):
            lab = tokens.clone()
            lab[padding] = IGNORE_INDEX
            labels[name] = lab
        elif kind == "sp":
            labels[name] = torch.tensor([0, 1])
        elif kind == "cls":
            labels[name] = torch.tensor([1, 0])
    return Batch(tokens=tokens, segments=torch.zeros(b, s, dtype=torch.long), padding_mask=padding, labels=labels)


@pytest.mark.parametrize("name", zoo_names())
def test_shrunken_recipe_trains_and_round_trips(name, tmp_path):
    cfg = load_config(name, SHRINK)
    for part in cfg.model.embedding.parts:
        if getattr(part, "max_positions", None):
            part.max_positions = 32
    torch.manual_seed(0)
    model = build_model(cfg.model)
    batch = batch_for(model, 97)
    loss = total_loss(model(batch))
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None for g in grads)
    path = tmp_path / "m.safetensors"
    ckpt.save_weights(model, path)
    again = build_model(cfg.model)
    ckpt.load_weights(again, ckpt.read_weights(path), str(path))
    for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k
    model.eval(), again.eval()
    with torch.no_grad():
        assert torch.equal(model.encode(batch)[0], again.encode(batch)[0])
