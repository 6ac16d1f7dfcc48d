"""Hidden-state and attention transfer: the recomputed attention distributions are the ones the block
uses, a student identical to its teacher has no transfer loss, a different one has a positive loss with
gradients, the layer map, and taps that are off unless asked for."""

from __future__ import annotations

import copy

import pytest
import torch

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import TargetOutput
from pentad.errors import UserError
from pentad.layers.attention import attention_probabilities
from pentad.training.distill import LayerTransfer, attention_loss, default_layer_map, hidden_loss

from .test_quantized import _batch


def _model(layers=2, hidden=32, heads=2, seed=0):
    torch.manual_seed(seed)
    cfg = load_config("bert/tiny", ["model.vocab_size=50", f"model.hidden_size={hidden}",
                                    f"model.encoder.num_layers={layers}", f"model.encoder.num_heads={heads}",
                                    "model.encoder.ffn_size=64", "model.max_seq_length=16"]).model
    return build_model(cfg, training=False)


def _padded_batch():
    batch = _batch()
    batch.padding_mask[0, -3:] = True
    return batch


def test_default_layer_map():
    assert default_layer_map(2, 4) == [1, 3]
    assert default_layer_map(3, 12) == [3, 7, 11]
    assert default_layer_map(4, 4) == [0, 1, 2, 3]


def test_recomputed_attention_is_what_the_block_uses():
    model = _model().eval()
    attention = model.encoder.layers[0].attention
    seen = {}

    def hook(module, args, output):
        seen["probs"] = attention_probabilities(module, args[0], args[1])
        seen["x"], seen["out"] = args[0], output[0]

    handle = attention.register_forward_hook(hook)
    with torch.no_grad():
        model(_padded_batch())
    handle.remove()
    probs, x = seen["probs"], seen["x"]
    assert torch.allclose(probs.sum(-1), torch.ones_like(probs.sum(-1)))
    assert float(probs[0, :, :, -3:].abs().max()) == 0.0  # padding keys get nothing
    _, _, v = attention.qkv(x).split((attention.q_dim, attention.kv_dim, attention.kv_dim), dim=-1)
    v = attention._heads(v, attention.num_kv_heads)
    context = (probs @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], attention.q_dim)
    assert torch.allclose(attention.out(context), seen["out"], atol=1e-5)


def _scored():
    return {"head": TargetOutput(loss=torch.tensor(1.0))}


def test_an_identical_student_has_no_transfer_loss_a_different_one_learns():
    teacher = _model().eval()
    transfer = LayerTransfer(teacher, hidden_weight=1.0, attention_weight=1.0)
    student = copy.deepcopy(teacher).train()
    for m in student.modules():  # no dropout, so that the student computes what the teacher does
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    transfer.attach(student)
    batch = _padded_batch()
    with torch.no_grad():
        teacher(batch)
    student(batch)
    loss = transfer.losses(student, _scored(), {}, batch)["head"]
    assert float(loss.detach()) < 1e-4  # float rounding of the KL over near-zero probabilities

    other = _model(layers=1, hidden=48, heads=3, seed=1).train()
    transfer = LayerTransfer(teacher, hidden_weight=1.0, attention_weight=1.0)
    transfer.attach(other)
    assert transfer.layer_map == [1]
    with torch.no_grad():
        teacher(batch)
    other(batch)
    loss = transfer.losses(other, _scored(), {}, batch)["head"]
    assert float(loss.detach()) > 0.01
    loss.backward()
    assert other.encoder.layers[0].attention.qkv.weight.grad.abs().sum() > 0
    # evaluation forwards of the student are not kept
    other.eval()
    with torch.no_grad():
        other(batch)
    assert transfer.student_tap.take() == ([], [])


def test_bad_layer_map_and_losses():
    teacher = _model(layers=2)
    with pytest.raises(UserError, match="layer_map"):
        LayerTransfer(teacher, 1.0, 0.0, layer_map=[0, 5]).attach(_model(layers=2))
    with pytest.raises(UserError, match="layer_map"):
        LayerTransfer(teacher, 1.0, 0.0, layer_map=[0]).attach(_model(layers=2))
    mask = torch.ones(2, 5)
    h = torch.randn(2, 5, 8)
    assert float(hidden_loss(h, h, mask)) == 0.0
    assert float(hidden_loss(h, torch.randn(2, 5, 16), mask)) > 0  # widths differ: token similarities
    p = torch.softmax(torch.randn(2, 2, 5, 5), -1)
    assert float(attention_loss(p, p, mask)) < 1e-6
    assert float(attention_loss(p, torch.softmax(torch.randn(2, 4, 5, 5), -1), mask)) > 0  # head counts differ


def test_no_hooks_without_layer_transfer():
    model = _model()
    assert all(not m._forward_hooks for m in model.modules())
