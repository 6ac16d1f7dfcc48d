"""Recurrent and convolutional encoders and the bilm target: shapes, padding, causality, losses,
TencentPretrain parameter counts and a short training run. Modules are built directly (not through
the config unions) from a small namespace standing for the model-level config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pentad.components.base import IGNORE_INDEX, Batch
from pentad.components.encoders.cnn import CnnEncoder, CnnEncoderConfig, GatedCnnEncoder, GatedCnnEncoderConfig
from pentad.components.encoders.rnn import (
    BigruEncoder,
    BigruEncoderConfig,
    BilstmEncoder,
    BilstmEncoderConfig,
    BirnnEncoder,
    BirnnEncoderConfig,
    GruEncoder,
    GruEncoderConfig,
    LstmEncoder,
    LstmEncoderConfig,
    RnnEncoder,
    RnnEncoderConfig,
)
from pentad.components.targets.bilm import BilmTarget, BilmTargetConfig

E, H, V = 6, 8, 23  # embedding width differs from hidden width on purpose


pytestmark = pytest.mark.usefixtures("one_thread")


def model_cfg(hidden_size: int = H, embedding_size: int | None = E, vocab_size: int = V) -> SimpleNamespace:
    return SimpleNamespace(hidden_size=hidden_size, embedding_size=embedding_size, vocab_size=vocab_size,
                           max_seq_length=64)


# name -> (class, config, kind): kind "causal" (output at t sees inputs <= t), "split" (first half
# causal, second half anti-causal) or "window" (a centred window).
ENCODERS = {
    "rnn": (RnnEncoder, RnnEncoderConfig(dropout=0.0), "causal"),
    "lstm": (LstmEncoder, LstmEncoderConfig(dropout=0.0), "causal"),
    "gru": (GruEncoder, GruEncoderConfig(dropout=0.0), "causal"),
    "lstm-bidirectional": (LstmEncoder, LstmEncoderConfig(dropout=0.0, bidirectional=True), "window"),
    "gru-bidirectional": (GruEncoder, GruEncoderConfig(dropout=0.0, bidirectional=True), "window"),
    "rnn-bidirectional": (RnnEncoder, RnnEncoderConfig(dropout=0.0, bidirectional=True), "window"),
    "birnn": (BirnnEncoder, BirnnEncoderConfig(dropout=0.0), "split"),
    "bilstm": (BilstmEncoder, BilstmEncoderConfig(dropout=0.0), "split"),
    "bigru": (BigruEncoder, BigruEncoderConfig(dropout=0.0), "split"),
    "gatedcnn": (GatedCnnEncoder, GatedCnnEncoderConfig(num_layers=5, kernel_size=3, block_size=2), "causal"),
    "cnn-causal": (CnnEncoder, CnnEncoderConfig(num_layers=3, padding="causal", dropout=0.0), "causal"),
    "cnn-same": (CnnEncoder, CnnEncoderConfig(num_layers=3, kernel_size=4, padding="same", dropout=0.0), "window"),
}


def build(name: str, **model_over):
    cls, cfg, _ = ENCODERS[name]
    torch.manual_seed(0)
    return cls.from_config(cfg, model_cfg(**model_over)).eval()


def inputs(b: int = 3, s: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [b,s,E]; row 0 unpadded, row 1 padded on the right (3), row 2 on the left (2)."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(b, s, E, generator=g)
    padding = torch.zeros(b, s, dtype=torch.bool)
    padding[1, -3:] = True
    padding[2, :2] = True
    return hidden, padding


@pytest.mark.parametrize("name", list(ENCODERS))
def test_shapes_and_zero_padding_outputs(name):
    encoder = build(name)
    hidden, padding = inputs()
    out = encoder(hidden, padding)
    assert out.shape == (3, 9, H)
    assert torch.all(out[padding] == 0)
    assert encoder(hidden, None).shape == (3, 9, H)
    # embedding_size absent or None: the input is hidden_size wide.
    assert build(name, embedding_size=None)(torch.randn(2, 5, H), None).shape == (2, 5, H)


@pytest.mark.parametrize("name", list(ENCODERS))
def test_padding_never_reaches_real_positions(name):
    encoder = build(name)
    hidden, padding = inputs()
    out = encoder(hidden, padding)
    # 1. Whatever the padding holds, the real positions do not change.
    noisy = torch.where(padding[..., None], torch.randn_like(hidden) * 100, hidden)
    torch.testing.assert_close(encoder(noisy, padding)[~padding], out[~padding], atol=1e-5, rtol=1e-5)
    # 2. Each padded row equals its unpadded real tokens run alone (the backward streams start at
    #    the last real token, rows padded on the left behave as unpadded).
    for row in (1, 2):
        real = ~padding[row]
        alone = encoder(hidden[row, real][None], None)[0]
        torch.testing.assert_close(out[row, real], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(ENCODERS))
def test_causality(name):
    encoder = build(name)
    kind = ENCODERS[name][2]
    hidden = torch.randn(2, 10, E)
    t = 6
    later, earlier = hidden.clone(), hidden.clone()
    later[:, t + 1:] += 1.0
    earlier[:, :t] += 1.0
    base, after, before = encoder(hidden, None), encoder(later, None), encoder(earlier, None)
    if kind == "causal":
        torch.testing.assert_close(after[:, : t + 1], base[:, : t + 1])
        assert not torch.allclose(after[:, t + 1:], base[:, t + 1:])
    elif kind == "split":
        half = H // 2
        torch.testing.assert_close(after[:, : t + 1, :half], base[:, : t + 1, :half])  # forward stream
        torch.testing.assert_close(before[:, t:, half:], base[:, t:, half:])  # backward stream
        assert not torch.allclose(after[:, : t + 1, half:], base[:, : t + 1, half:])
    else:  # a bidirectional stack or a centred window sees the future
        assert not torch.allclose(after[:, : t + 1], base[:, : t + 1])


@pytest.mark.parametrize("name", ["lstm", "bilstm", "gatedcnn", "cnn-same"])
def test_cache_is_refused(name):
    with pytest.raises(ValueError, match="incremental decoding"):
        build(name)(torch.randn(1, 3, E), None, cache=object())


def test_positions_and_prefix_lengths_are_ignored():
    encoder = build("bilstm")
    hidden, padding = inputs()
    torch.testing.assert_close(
        encoder(hidden, padding, prefix_lengths=torch.tensor([1, 2, 3]), positions=torch.zeros(3, 9).long()),
        encoder(hidden, padding))


def test_odd_hidden_sizes_are_reported():
    odd = model_cfg(hidden_size=7)
    assert BilstmEncoderConfig().check(odd) and BilmTargetConfig().check(odd)
    assert LstmEncoderConfig(bidirectional=True).check(odd) and not LstmEncoderConfig().check(odd)
    assert not BilstmEncoderConfig().check(model_cfg())


def test_gatedcnn_and_recurrent_modules_have_sensible_weights_without_the_builder():
    for name in ("gatedcnn", "cnn-causal", "lstm"):
        params = dict(build(name).named_parameters())
        weights = [p for n, p in params.items() if "weight" in n]
        assert weights and all(torch.isfinite(w).all() and w.std() > 0.01 for w in weights)
    assert all(getattr(cls, "takes_embedding_width", False) for cls, _, _ in ENCODERS.values())
    names = set(dict(build("bilstm").named_parameters()))
    assert {"rnn_forward.weight_ih_l0", "rnn_backward.weight_hh_l1"} <= names
    assert "rnn.weight_ih_l0_reverse" in dict(build("lstm-bidirectional").named_parameters())


# ------------------------------------------------------------------------------------ bilm
def bilm_labels(tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """[B,S,2]: next token / previous token among the real ones, IGNORE_INDEX elsewhere."""
    labels = torch.full((*tokens.shape, 2), IGNORE_INDEX)
    labels[:, :-1, 0] = tokens[:, 1:]
    labels[:, 1:, 1] = tokens[:, :-1]
    labels[:, :-1, 0][padding[:, 1:]] = IGNORE_INDEX
    labels[:, 1:, 1][padding[:, :-1]] = IGNORE_INDEX
    labels[padding] = IGNORE_INDEX
    return labels


def test_bilm_loss_is_the_mean_of_the_two_directions():
    torch.manual_seed(0)
    target = BilmTarget.from_config(BilmTargetConfig(bias=True), model_cfg())
    nn.init.normal_(target.output.bias)
    tokens = torch.randint(0, V, (3, 7))
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, -2:] = True
    labels = bilm_labels(tokens, padding)
    hidden = torch.randn(3, 7, H, requires_grad=True)
    out = target(hidden, Batch(tokens=tokens, padding_mask=padding, labels={"bilm": labels}))
    logits_f = F.linear(hidden[..., : H // 2], target.output.weight, target.output.bias)
    logits_b = F.linear(hidden[..., H // 2:], target.output.weight, target.output.bias)
    loss_f = F.cross_entropy(logits_f.reshape(-1, V), labels[..., 0].flatten())
    loss_b = F.cross_entropy(logits_b.reshape(-1, V), labels[..., 1].flatten())
    torch.testing.assert_close(out.loss, (loss_f + loss_b) / 2)
    scored = labels != IGNORE_INDEX
    assert int(out.metrics["count"]) == int(scored.sum()) == 2 * (6 + 4 + 6)
    predicted = torch.stack([logits_f, logits_b], dim=2).argmax(-1)
    assert int(out.metrics["correct"]) == int(((predicted == labels) & scored).sum())
    out.loss.backward()
    assert hidden.grad is not None and target.output.weight.grad is not None
    # Without labels: logits [B,S,2,V], forward first.
    logits = target(hidden, Batch(tokens=tokens)).logits
    assert logits.shape == (3, 7, 2, V)
    torch.testing.assert_close(logits[:, :, 1], logits_b)


def test_bilm_ties_only_to_a_table_of_half_the_hidden_width():
    target = BilmTarget("bilm", H, V)
    assert not target.tie_to(nn.Parameter(torch.zeros(V, H)))
    table = nn.Parameter(torch.zeros(V, H // 2))
    assert target.tie_to(table) and target.output.weight is table


# ------------------------------------------------------------------------ parameter counts
def rnn_reference(gates: int, emb: int, hidden: int, layers: int, bidirectional: bool = False) -> int:
    """Parameters of torch's recurrent stack: per layer and direction gates*units*(input + units + 2)
    (input and recurrent weights, two bias vectors). TencentPretrain: units = hidden/2 if bidirectional."""
    units = hidden // 2 if bidirectional else hidden
    directions = 2 if bidirectional else 1
    total = 0
    for layer in range(layers):
        width = emb if layer == 0 else units * directions
        total += directions * gates * units * (width + units + 2)
    return total


def gatedcnn_reference(emb: int, hidden: int, layers: int, kernel: int) -> int:
    """TencentPretrain's gatedcnn: conv_1/gate_1 = Conv2d(1, H, (k, E)) with bias, conv_b1/gate_b1
    [1,H,1,1]; then per layer conv/gate = Conv2d(H, H, (k, 1)) with bias, conv_b/gate_b [1,H,1,1]."""
    first = 2 * (hidden * kernel * emb + hidden) + 2 * hidden
    other = 2 * (hidden * hidden * kernel + hidden) + 2 * hidden
    return first + (layers - 1) * other


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# (TencentPretrain config, our module, reference count); sizes from models/rnn and models/cnn.
TP_CONFIGS = {
    "lstm_config": (LstmEncoder, LstmEncoderConfig(), dict(hidden_size=512, embedding_size=512),
                    rnn_reference(4, 512, 512, 2)),
    "gru_config": (GruEncoder, GruEncoderConfig(), dict(hidden_size=512, embedding_size=512),
                   rnn_reference(3, 512, 512, 2)),
    "bilstm_config": (BilstmEncoder, BilstmEncoderConfig(), dict(hidden_size=1536, embedding_size=512),
                      2 * rnn_reference(4, 512, 768, 2)),
    "gatedcnn_9_config": (GatedCnnEncoder, GatedCnnEncoderConfig(num_layers=9, kernel_size=4, block_size=2),
                          dict(hidden_size=807, embedding_size=128), gatedcnn_reference(128, 807, 9, 4)),
    "gatedcnn_13_config": (GatedCnnEncoder, GatedCnnEncoderConfig(num_layers=13, kernel_size=4, block_size=2),
                           dict(hidden_size=1268, embedding_size=128), gatedcnn_reference(128, 1268, 13, 4)),
}


@pytest.mark.parametrize("config", list(TP_CONFIGS))
def test_parameter_counts_match_tencentpretrain(config):
    cls, cfg, sizes, expected = TP_CONFIGS[config]
    with torch.device("meta"):
        encoder = cls.from_config(cfg, model_cfg(**sizes))
    assert count(encoder) == expected


def test_reference_formulas_agree_with_torch_modules():
    with torch.device("meta"):
        assert count(nn.LSTM(512, 512, 2)) == rnn_reference(4, 512, 512, 2) == 4_202_496
        assert count(nn.GRU(512, 512, 2)) == rnn_reference(3, 512, 512, 2) == 3_151_872
        assert count(nn.LSTM(5, 4, 3, bidirectional=True)) == rnn_reference(4, 5, 8, 3, bidirectional=True)
        assert 2 * count(nn.LSTM(512, 768, 2)) == 17_326_080
        h, e, k = 807, 128, 4
        tp_first = 2 * count(nn.Conv2d(1, h, (k, e))) + 2 * h
        tp_other = 2 * count(nn.Conv2d(h, h, (k, 1))) + 2 * h
        assert tp_first + 8 * tp_other == gatedcnn_reference(e, h, 9, k) == 42_535_356
    assert gatedcnn_reference(128, 1268, 13, 4) == 155_715_472
    # The bilm head: one [V, H/2] projection for both directions (TencentPretrain: Linear(H/2, V)).
    assert count(BilmTarget("bilm", 1536, 21128)) == 768 * 21128


def test_bidirectional_stack_matches_tencentpretrain_count():
    encoder = LstmEncoder.from_config(LstmEncoderConfig(bidirectional=True),
                                      model_cfg(hidden_size=16, embedding_size=10))
    assert count(encoder) == rnn_reference(4, 10, 16, 2, bidirectional=True)


# ---------------------------------------------------------------------------------- training
class TinyLm(nn.Module):
    def __init__(self, encoder: nn.Module, target: nn.Module):
        super().__init__()
        self.word = nn.Embedding(V, E)
        self.encoder, self.target = encoder, target

    def forward(self, batch: Batch):
        return self.target(self.encoder(self.word(batch.tokens), batch.padding_mask), batch)


@pytest.mark.parametrize("name", ["bilstm", "gatedcnn"])
def test_a_few_steps_reduce_the_loss(name):
    from pentad.components.targets.lm import LmTarget

    torch.manual_seed(0)
    width = 32  # wide enough to fit the batch in a few dozen steps
    encoder = build(name, hidden_size=width).train()
    tokens = torch.randint(0, V, (4, 12))
    padding = torch.zeros(4, 12, dtype=torch.bool)
    padding[2, -4:] = True
    if name == "bilstm":
        target, labels = BilmTarget("bilm", width, V), bilm_labels(tokens, padding)
    else:
        target = LmTarget("bilm", width, V)
        labels = torch.full_like(tokens, IGNORE_INDEX)
        labels[:, :-1] = tokens[:, 1:].masked_fill(padding[:, 1:], IGNORE_INDEX)
    model = TinyLm(encoder, target)
    batch = Batch(tokens=tokens, padding_mask=padding, labels={"bilm": labels})
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    losses = []
    for _ in range(30):
        loss = model(batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
