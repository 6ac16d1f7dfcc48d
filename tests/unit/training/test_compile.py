"""``train.compile``: torch.compile of each block or of the whole model, in place: the same loss and
gradients as eager (to fp32 rounding: Inductor fuses and reorders), the same parameter names, and a
trainer that compiles, trains and logs it. Compiling on the CPU builds C++ kernels (tens of seconds)."""

from __future__ import annotations

import pytest
import torch
from tests.unit.test_zoo import batch_for, shrunk_model_config

from pentad.builder import build_model
from pentad.errors import UserError
from pentad.model import total_loss
from pentad.training.compiled import compile_model
from pentad.training.config import TrainConfig
from pentad.training.recompute import checkpoint_blocks


def _step(name: str, mode: str, recompute: bool = False
          ) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[str], int]:
    torch.manual_seed(3)
    model = build_model(shrunk_model_config(name))
    for module in model.modules():  # no dropout: compiled kernels draw their random numbers differently
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        elif isinstance(getattr(module, "dropout", None), float):  # attention dropout, given to SDPA
            module.dropout = 0.0
    names = [k for k, _ in model.named_parameters()]
    if recompute:  # as the trainer orders them: activation checkpointing first, then compilation
        checkpoint_blocks(model)
    compiled = compile_model(model, mode)
    model.train()
    loss = total_loss(model(batch_for(model, 97)))
    loss.backward()
    return loss.detach(), {k: p.grad for k, p in model.named_parameters() if p.grad is not None}, names, compiled


@pytest.mark.parametrize("name,mode", [("bert/base", "blocks"), ("gpt2/base", "model")])
def test_compiled_forward_and_backward_equal_eager(name, mode):
    torch._dynamo.reset()
    loss, grads, names, _ = _step(name, "off")
    loss2, grads2, names2, compiled = _step(name, mode)
    assert compiled == (len(build_model(shrunk_model_config(name)).blocks()) if mode == "blocks" else 1)
    assert names2 == names and grads2.keys() == grads.keys()  # checkpoints keep their names
    torch.testing.assert_close(loss2, loss, rtol=1e-5, atol=1e-6)
    for key in grads:  # relative to each gradient's norm: tiny elements of a sum differ by more, relatively
        error = float((grads2[key] - grads[key]).norm() / grads[key].norm().clamp_min(1e-12))
        assert error < 1e-4, (key, error)


def test_trainer_compiles_and_refuses_what_is_not_supported(tmp_path, capsys):
    from pentad.training.trainer import Trainer

    # YAML reads a bare off/on as booleans
    assert TrainConfig(compile=False).compile == "off" and TrainConfig(compile=True).compile == "blocks"
    with pytest.raises(ValueError, match="compile"):
        TrainConfig(compile="graph")

    model = build_model(shrunk_model_config("elmo/base"))
    with pytest.raises(UserError, match="no repeated blocks to compile"):
        Trainer(model, TrainConfig(compile="blocks"), tmp_path, 1)
    model = build_model(shrunk_model_config("bert/base"))
    with pytest.raises(UserError, match="train.compile=blocks with train.strategy=fsdp"):
        Trainer(model, TrainConfig(compile="blocks", strategy="fsdp"), tmp_path, 1)
    trainer = Trainer(model, TrainConfig(compile="blocks", tensorboard=False), tmp_path, 1)
    assert "compile: 2 blocks with torch.compile" in capsys.readouterr().err
    assert trainer.model is model or trainer.forward_model is model


def test_compiled_blocks_with_activation_checkpointing_equal_eager():
    torch._dynamo.reset()
    loss, grads, _, _ = _step("bert/base", "off")
    loss2, grads2, _, _ = _step("bert/base", "blocks", recompute=True)
    torch.testing.assert_close(loss2, loss, rtol=1e-5, atol=1e-6)
    for key in grads:
        assert float((grads2[key] - grads[key]).norm() / grads[key].norm().clamp_min(1e-12)) < 1e-4, key
