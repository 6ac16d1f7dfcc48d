"""Heads that read only the first positions, and an encoder whose last layer then computes only those
(``Target.positions_read``, ``leading_positions``, ``output_positions`` of the transformer stack and
``run_stream``): the same states, logits, loss and gradients as the full computation, to fp32 rounding."""

from __future__ import annotations

import pytest
import torch

from pentad.builder import build_model
from pentad.components.base import Batch, leading_positions
from pentad.components.model_config import model_config_class
from pentad.components.stream import run_stream
from pentad.layers.attention import AttentionInputs, LeadingQueries

torch.set_grad_enabled(True)


def text_model(encoder: dict | None = None, targets: list | None = None):
    d = {"hidden_size": 32, "vocab_size": 61, "max_seq_length": 24,
         "embedding": {"parts": ["word", "pos"], "dropout": 0.0},
         "encoder": {"type": "transformer", "num_layers": 2, "num_heads": 4, "ffn_size": 48, "dropout": 0.0,
                     **(encoder or {})},
         "targets": targets or [{"type": "cls", "num_labels": 3, "pooler": True, "dropout": 0.0}]}
    torch.manual_seed(0)
    return build_model(model_config_class().model_validate(d))


def vit_model():
    d = {"hidden_size": 32, "max_seq_length": 17,
         "embedding": {"parts": [{"type": "patch", "image_size": 16, "patch_size": 4, "channels": 3}, "pos"],
                       "norm": False, "dropout": 0.0},
         "encoder": {"type": "transformer", "num_layers": 2, "num_heads": 2, "ffn_size": 64, "dropout": 0.0,
                     "norm_position": "pre", "final_norm": True},
         "targets": [{"type": "cls", "num_labels": 5, "pooling": "first", "pooler": False, "dropout": 0.0}]}
    torch.manual_seed(0)
    return build_model(model_config_class().model_validate(d))


def text_batch(padded: bool = True) -> Batch:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 61, (3, 9), generator=g)
    mask = torch.zeros(3, 9, dtype=torch.bool)
    if padded:
        mask[1, 6:] = True
        mask[2, 4:] = True
    return Batch(tokens=tokens, padding_mask=mask, segments=(torch.arange(9) >= 5).long().expand(3, 9).clone(),
                 labels={"cls": torch.tensor([0, 2, 1])})


def _compare(model, batch: Batch, n: int) -> None:
    """Encoder states (eval) and the first target's loss and every gradient (train) through
    ``run_stream(output_positions=n)`` against the full encoder output."""
    head = next(iter(model.targets.values()))
    model.eval()
    with torch.no_grad():
        full, mask = model.encode(batch)
        cut, cut_mask = run_stream(model.embedding, model.encoder, batch, output_positions=n)
    assert cut.shape == (full.shape[0], n, full.shape[2])
    assert cut_mask is None if mask is None else torch.equal(cut_mask, mask[:, :n])
    torch.testing.assert_close(cut, full[:, :n], rtol=1e-5, atol=1e-5)
    model.train()
    grads = []
    for trim in (None, n):
        model.zero_grad(set_to_none=True)
        hidden, _ = run_stream(model.embedding, model.encoder, batch, output_positions=trim)
        loss = head(hidden, batch).loss
        loss.backward()
        grads.append((loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    (loss_full, grad_full), (loss_cut, grad_cut) = grads
    torch.testing.assert_close(loss_cut, loss_full, rtol=1e-5, atol=1e-6)
    assert grad_full.keys() == grad_cut.keys() and len(grad_full) > 10
    for key in grad_full:
        torch.testing.assert_close(grad_cut[key], grad_full[key], rtol=1e-4, atol=1e-6, msg=key)


def test_heads_declare_the_leading_positions_they_read():
    first = text_model(targets=[{"type": "cls", "num_labels": 3, "pooling": "first"}])
    mean = text_model(targets=[{"type": "cls", "num_labels": 3, "pooling": "mean"}])
    assert leading_positions(first.targets.values()) == 1
    assert leading_positions(mean.targets.values()) is None
    assert leading_positions([*first.targets.values(), *mean.targets.values()]) is None
    assert leading_positions([]) is None
    mlm = text_model(targets=[{"type": "mlm"}])
    assert leading_positions(mlm.targets.values()) is None  # a head reading every position keeps the default


@pytest.mark.parametrize("encoder", [
    {"norm_position": "post"},
    {"norm_position": "pre", "final_norm": True},
    {"norm_position": "pre", "norm": "rmsnorm", "ffn": "gated", "activation": "silu", "positions": "rotary",
     "num_kv_heads": 2},
    {"positions": "relative", "relative_buckets": 8, "relative_max_distance": 16},
    {"mask": "causal"},
    {"mask": "prefix"},
    {"share_layers": True},
], ids=["post", "pre", "llama", "relative", "causal", "prefix", "shared"])
def test_the_last_layer_at_leading_positions_matches_the_full_stack(encoder):
    model = text_model(encoder)
    assert model.encoder.trims_positions and model.encoder._can_keep(None, None)
    for n in (1, 3):
        _compare(model, text_batch(), n)


def test_vit_logits_loss_and_gradients_match_with_the_cls_row_alone():
    model = vit_model()
    batch = Batch(pixels=torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(2)),
                  labels={"cls": torch.tensor([0, 4, 2, 1])})
    n = leading_positions(model.targets.values())
    assert n == 1
    _compare(model, batch, n)
    model.eval()
    with torch.no_grad():
        reference = model(batch)["cls"].logits
        hidden, _ = run_stream(model.embedding, model.encoder, batch, output_positions=n)
        torch.testing.assert_close(model.targets["cls"](hidden, batch).logits, reference, rtol=1e-5, atol=1e-5)


def test_model_forward_trims_the_last_layer_unless_every_position_is_watched():
    """Model.forward runs the last layer at the rows its heads read; all_positions (set by the
    distiller's layer taps while they are attached) keeps every row; the logits agree."""
    from pentad.training.distill import LayerTap

    model = vit_model().eval()
    batch = Batch(pixels=torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(4)))
    rows: list[int] = []
    handle = model.encoder.layers[-1].register_forward_hook(
        lambda m, i, o: rows.append((o[0] if isinstance(o, tuple) else o).shape[1]))
    with torch.no_grad():
        trimmed = model(batch)["cls"].logits
        tap = LayerTap(model, attention=False)
        assert model.all_positions
        full = model(batch)["cls"].logits
        tap.remove()
        assert not model.all_positions
        hidden, _ = model.encode(batch)  # encode always gives every position
    handle.remove()
    assert rows == [1, 17, 17] and hidden.shape[1] == 17
    torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-6)


def test_stacks_that_cannot_trim_compute_everything_and_cut():
    for encoder in ({"residual_attention": True}, {"ffn": "moe", "moe": {"num_experts": 2, "top_k": 1}}):
        model = text_model(encoder)
        assert not model.encoder._can_keep(None, None)
        _compare(model, text_batch(), 2)


def test_a_wrapped_query_key_value_projection_runs_whole_and_is_sliced():
    model = text_model({"norm_position": "pre"})
    attention = model.encoder.layers[-1].attention

    asked = []

    class Wrapped(torch.nn.Module):  # stands for a LoRA-wrapped projection: it says how to give some rows
        def __init__(self, linear):
            super().__init__()
            self.linear = linear

        def forward(self, x):
            return self.linear(x)

        def rows(self, x, start, end):
            asked.append((start, end))
            return self(x)[..., start:end]

    attention.qkv = Wrapped(attention.qkv)
    _compare(model, text_batch(), 1)
    assert (0, 32) in asked  # the query rows, asked of the wrapper (the attention never looks inside it)


def test_output_positions_beyond_the_sequence_or_below_one():
    model = text_model().eval()
    batch = text_batch(padded=False)
    with torch.no_grad():
        full, _ = model.encode(batch)
        whole, _ = run_stream(model.embedding, model.encoder, batch, output_positions=50)
        assert torch.equal(whole, full)
        with pytest.raises(ValueError, match="at least 1"):
            run_stream(model.embedding, model.encoder, batch, output_positions=0)


def test_an_encoder_without_the_capability_has_its_output_cut():
    d = {"hidden_size": 16, "vocab_size": 31, "max_seq_length": 12, "embedding": {"parts": ["word"]},
         "encoder": {"type": "lstm", "num_layers": 1}, "targets": [{"type": "cls", "num_labels": 2}]}
    torch.manual_seed(0)
    model = build_model(model_config_class().model_validate(d)).eval()
    assert not model.encoder.trims_positions
    batch = Batch(tokens=torch.randint(1, 31, (2, 7)))
    with torch.no_grad():
        full, _ = model.encode(batch)
        cut, mask = run_stream(model.embedding, model.encoder, batch, output_positions=2)
    assert torch.equal(cut, full[:, :2]) and mask is None


def test_leading_queries_are_for_self_attention_that_supports_them():
    residual = text_model({"residual_attention": True})
    with pytest.raises(ValueError, match="ResidualAttention does not run for leading queries"):
        LeadingQueries(residual.encoder.layers[0].attention, 1)
    model = text_model({"mask": "causal"})
    x = torch.randn(1, 4, 32)
    assert LeadingQueries(model.encoder.layers[0].attention, 1)(x, AttentionInputs()).shape == (1, 1, 32)


@pytest.mark.parametrize("gated", [False, True], ids=["dense", "gated"])
def test_feed_forward_in_place_activation_outside_autograd_is_bit_identical(gated):
    from pentad.layers.activations import ACTIVATION_NAMES, IN_PLACE_ACTIVATIONS
    from pentad.layers.feed_forward import FeedForward

    assert set(IN_PLACE_ACTIVATIONS) == set(ACTIVATION_NAMES) - {"quick_gelu"}
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(3))
    for activation in ACTIVATION_NAMES:
        torch.manual_seed(0)
        ffn = FeedForward(16, 24, activation, gated=gated)
        reference = ffn(x)  # autograd on: the allocating path
        assert reference.requires_grad
        kept = x.clone()
        with torch.no_grad():
            plain = ffn(x)
        with torch.inference_mode():
            inference = ffn(x)
        assert torch.equal(plain, reference.detach()) and torch.equal(inference, plain), activation
        assert torch.equal(x, kept)  # the input is never overwritten
    calls = []
    ffn.act_in_place = lambda h: calls.append(h.shape) or IN_PLACE_ACTIVATIONS["relu"](h)
    with torch.no_grad():
        ffn(x)
    ffn(x)
    assert calls == [torch.Size([2, 5, 24])]  # taken outside autograd only
