"""The block seam: transformer layers assembled from registered attention/feed-forward factories,
blocks that initialise themselves, declared capabilities, and the auxiliary-loss channel of the
model output."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from pentad.builder import build_model, init_t5, init_weights
from pentad.components.base import Batch, Decoder, Encoder, ModelOutput
from pentad.components.blocks import DenseBlock
from pentad.components.model_config import model_config_class
from pentad.layers.attention import Attention, CrossAttention, SelfAttention
from pentad.layers.block import Block
from pentad.layers.feed_forward import FeedForward
from pentad.layers.transformer import LayerInputs
from pentad.model import total_loss
from pentad.registry import ATTENTION_BLOCKS, ENCODERS, FFN_BLOCKS
from pentad.training.trainer import Trainer


def lm_config(**encoder):
    return model_config_class().model_validate({
        "hidden_size": 16, "vocab_size": 31, "max_seq_length": 16,
        "embedding": {"parts": ["word", "pos"], "dropout": 0.0},
        "encoder": {"type": "transformer", "num_layers": 2, "num_heads": 2, "ffn_size": 24, "dropout": 0.0,
                    "mask": "causal", **encoder},
        "targets": [{"type": "lm"}]})


def lm_batch() -> Batch:
    tokens = torch.randint(0, 31, (2, 7), generator=torch.Generator().manual_seed(0))
    return Batch(tokens=tokens, labels={"lm": tokens})


def test_blocks_are_registered_and_assemble_each_layer():
    assert {"dense", "gated"} <= set(FFN_BLOCKS.names())
    assert {"self", "cross", "residual", "reuse"} <= set(ATTENTION_BLOCKS.names())
    model = build_model(lm_config(ffn="gated", num_kv_heads=1))
    for layer in model.encoder.layers:
        assert isinstance(layer.attention, Attention) and layer.attention.num_kv_heads == 1
        assert isinstance(layer.ffn, FeedForward) and layer.ffn.gate is not None
    factory = DenseBlock.factory(lm_config().encoder, lm_config())
    first, second = factory(0), factory(1)
    assert first is not second and first.gate is None and first.up.out_features == 24


def test_qkv_bias_overrides_bias_for_the_query_key_value_projections_alone():
    plain = build_model(lm_config(bias=False))
    qwen = build_model(lm_config(bias=False, qkv_bias=True))
    for layer in qwen.encoder.layers:
        assert layer.attention.qkv.bias is not None and layer.attention.out.bias is None
        assert layer.ffn.up.bias is None
    extra = {k for k, _ in qwen.named_parameters()} - {k for k, _ in plain.named_parameters()}
    assert extra == {f"encoder.layers.{i}.attention.qkv.bias" for i in range(2)}
    cross = CrossAttention(16, 2, bias=True, qkv_bias=False)
    assert cross.q.bias is None and cross.kv.bias is None and cross.out.bias is not None


def test_unknown_ffn_kind_names_the_choices():
    with pytest.raises(Exception, match="dense.*gated"):
        lm_config(ffn="sparse")


def _reference_init(attention: Attention, std: float, t5: bool) -> None:
    """What the builder did before blocks initialised themselves: every Linear N(0, std) with a
    zero bias, then for T5 the query rows and the key/value rows of ``qkv`` and ``out`` rescaled."""
    for module in attention.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=std)
            torch.nn.init.zeros_(module.bias)
    if t5:
        hidden = attention.out.weight.shape[0]
        torch.nn.init.normal_(attention.qkv.weight[:attention.q_dim], std=(hidden * attention.head_size) ** -0.5)
        torch.nn.init.normal_(attention.qkv.weight[attention.q_dim:], std=hidden ** -0.5)
        torch.nn.init.normal_(attention.out.weight, std=attention.q_dim ** -0.5)


@pytest.mark.parametrize("scheme", ["normal", "t5"])
@torch.no_grad()
def test_blocks_initialise_themselves_as_the_builder_did(scheme):
    ours, reference = SelfAttention(16, 4, 2), SelfAttention(16, 4, 2)
    torch.manual_seed(3)
    init_weights(ours, 0.05)
    if scheme == "t5":
        init_t5(ours)
    torch.manual_seed(3)
    _reference_init(reference, 0.05, scheme == "t5")
    for (name, a), b in zip(ours.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name
    assert ours.qkv.weight[:16].std() == pytest.approx(0.05 if scheme == "normal" else 64 ** -0.5, rel=0.3)


def test_capabilities_are_declared():
    model = build_model(lm_config())
    assert model.encoder.mask_kind == "causal" and model.encoder.supports_cache
    assert model.embedding.pos.max_positions == 16 and model.embedding.word.max_positions is None
    assert Encoder.mask_kind == "bidirectional" and not Encoder.supports_cache and not Decoder.supports_cache
    assert not ENCODERS.get("lstm").supports_cache


class Penalised(Block):
    """A feed-forward that reports ``weight * mean(out^2)`` as an auxiliary loss and a metric."""

    has_aux = True

    def __init__(self, inner: FeedForward, weight: float):
        super().__init__()
        self.inner, self.weight, self._aux = inner, weight, None

    def reset_parameters(self, std: float = 0.02, scheme: str = "normal") -> None:
        self.inner.reset_parameters(std, scheme)

    def forward(self, x: Tensor) -> Tensor:
        out = self.inner(x)
        self._aux = self.weight * out.pow(2).mean()
        return out

    def pop_aux(self):
        aux, self._aux = self._aux, None
        return {"penalty": aux}, {"seen": torch.tensor(1.0)}


def test_auxiliary_losses_are_summed_into_the_loss_and_logged():
    torch.manual_seed(0)
    model = build_model(lm_config())
    plain = model(lm_batch())
    assert isinstance(plain, ModelOutput) and plain.aux_losses == {} and set(plain) == {"lm"}
    for layer in model.encoder.layers:
        layer.ffn = Penalised(layer.ffn, 0.5)
    model._aux_blocks = None
    out = model(lm_batch())
    assert torch.equal(out["lm"].loss, plain["lm"].loss)  # the wrapper does not change the outputs
    penalties = []
    hidden = model.embedding(lm_batch()).hidden
    for layer in model.encoder.layers:  # recompute each layer's penalty by hand
        hidden, _ = layer(hidden, LayerInputs(model.encoder.attention_inputs(7, None, None, None, 0, hidden.device)))
        penalties.append(layer.ffn.pop_aux()[0]["penalty"])
    torch.testing.assert_close(out.aux_losses["penalty"], sum(penalties))
    assert out.aux_metrics["seen"] == 1.0
    loss = total_loss(out)
    torch.testing.assert_close(loss, out["lm"].loss + out.aux_losses["penalty"])
    loss.backward()
    assert model.encoder.layers[0].ffn.inner.up.weight.grad is not None
    sums: dict[str, Tensor] = {}
    Trainer._accumulate(sums, out, loss.detach())
    assert torch.equal(sums["penalty_loss"], out.aux_losses["penalty"].detach())
    assert sums["aux_seen"] == 1.0
