"""Activation checkpointing recomputes each block in backward and changes nothing else: the same
loss, bitwise the same gradients (dropout included), the same parameter names."""

from __future__ import annotations

import pytest
import torch
from tests.unit.test_zoo import batch_for, shrunk_model_config

from pentad.builder import build_model
from pentad.config.loader import zoo_names
from pentad.model import total_loss
from pentad.training.recompute import checkpoint_blocks


def _gradients(name: str, recompute: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    torch.manual_seed(3)
    model = build_model(shrunk_model_config(name))
    blocks = checkpoint_blocks(model) if recompute else len(model.blocks())
    model.train()
    batch = batch_for(model, 97)
    torch.manual_seed(11)  # the dropout draws
    loss = total_loss(model(batch))
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}, blocks


@pytest.mark.parametrize("name", [n for n in zoo_names() if n.split("/")[0] in
                                  ("bert", "gpt2", "t5", "llama", "bart", "albert", "cnn", "sbert", "mixtral",
                                   "switch")])
def test_recomputed_blocks_give_bitwise_equal_gradients(name):
    loss, grads, blocks = _gradients(name, recompute=False)
    if blocks == 0:
        pytest.skip(f"{name} has no repeated blocks")
    loss2, grads2, recomputed = _gradients(name, recompute=True)
    assert recomputed == blocks
    assert torch.equal(loss, loss2)
    assert grads.keys() == grads2.keys()
    assert all(torch.equal(grads[k], grads2[k]) for k in grads)


def test_blocks_are_the_layers_of_every_stack():
    model = build_model(shrunk_model_config("t5/small"))
    layers = list(model.encoder.layers) + list(model.decoder.layers)
    blocks = model.blocks()
    assert len(blocks) == 4 and [id(b) for b in blocks] == [id(b) for b in layers]
    names = sorted(k for k, _ in model.named_parameters())
    checkpoint_blocks(model)
    assert sorted(k for k, _ in model.named_parameters()) == names  # state dicts and checkpoints unchanged


def test_a_model_without_blocks_refuses_activation_checkpointing(tmp_path):
    from pentad.errors import UserError
    from pentad.training.config import TrainConfig
    from pentad.training.trainer import Trainer

    model = build_model(shrunk_model_config("elmo/base"))
    assert model.blocks() == []
    with pytest.raises(UserError, match="no repeated blocks"):
        Trainer(model, TrainConfig(activation_checkpointing=True), tmp_path, 1)


def test_batch_rows_select_every_batch_major_tensor():
    from pentad.components.base import Batch

    batch = Batch(tokens=torch.arange(12).view(4, 3), padding_mask=torch.zeros(4, 3, dtype=torch.bool),
                  labels={"sp": torch.arange(4)}, pair=Batch(tokens=torch.arange(8).view(4, 2)))
    part = batch.rows(torch.tensor([1, 3]))
    assert part.tokens.tolist() == [[3, 4, 5], [9, 10, 11]]
    assert part.labels["sp"].tolist() == [1, 3] and part.pair.tokens.tolist() == [[2, 3], [6, 7]]
    assert part.segments is None and part.batch_size == 2
