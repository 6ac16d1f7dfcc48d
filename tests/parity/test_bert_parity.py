"""BERT parity: pentad's ``bert`` architecture against ``transformers.BertForPreTraining``.

Both models are built from config with random weights (no download), the Hugging Face weights
are copied into pentad, and hidden states, MLM / NSP logits, losses and gradients must agree to 1e-5
(fp32, eval mode) with padded rows and two segments in the batch, for HF's eager and SDPA
attention.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pentad.builder import build_model
from pentad.components.base import IGNORE_INDEX, Batch

from .hf_weights import bert_model_config, copy_bert_weights

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB, HIDDEN, LAYERS, HEADS, FFN = 100, 64, 2, 4, 128
BATCH, SEQ = 3, 12
LENGTHS = (12, 8, 5)  # row lengths: the last two rows are padded


def perturb(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Add noise to every parameter, so zero biases and unit LayerNorm weights become distinct
    values and a bias or norm copied to the wrong place changes the numbers."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))


def make_pair(attn_implementation: str):
    """(HF model, pentad model) in eval mode with the same weights."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=FFN, max_position_embeddings=32, hidden_act="gelu", layer_norm_eps=1e-12,
        attn_implementation=attn_implementation)
    hf = transformers.BertForPreTraining(config)
    perturb(hf, torch.Generator().manual_seed(1))
    hf.eval()
    assert hf.config._attn_implementation == attn_implementation
    ours = build_model(bert_model_config(config))
    copy_bert_weights(hf, ours)
    ours.eval()
    return hf, ours


def make_inputs(padded: bool) -> dict[str, torch.Tensor]:
    """Token ids, padding, segments A/B and MLM / NSP labels for both libraries."""
    g = torch.Generator().manual_seed(2)
    lengths = LENGTHS if padded else (SEQ,) * BATCH
    tokens = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    position = torch.arange(SEQ)[None, :]
    length = torch.tensor(lengths)[:, None]
    padding = position >= length  # True = padding
    tokens[padding] = 0
    segments = ((position >= length // 2) & ~padding).long()  # A for the first half, then B
    masked = (torch.rand(BATCH, SEQ, generator=g) < 0.3) & ~padding
    masked[:, 1] = True  # at least one masked position per row
    mlm = torch.where(masked, torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), IGNORE_INDEX)
    nsp = torch.tensor([0, 1, 1])
    return {"tokens": tokens, "padding": padding, "segments": segments, "mlm": mlm, "nsp": nsp}


def hf_forward(hf, x: dict[str, torch.Tensor], labels: bool):
    kwargs = {"labels": x["mlm"], "next_sentence_label": x["nsp"]} if labels else {}
    return hf(input_ids=x["tokens"], attention_mask=(~x["padding"]).long(), token_type_ids=x["segments"],
              output_hidden_states=True, **kwargs)


def pentad_batch(x: dict[str, torch.Tensor], labels: bool) -> Batch:
    return Batch(tokens=x["tokens"], segments=x["segments"], padding_mask=x["padding"],
                 labels={"mlm": x["mlm"], "sp": x["nsp"]} if labels else {})


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "full"])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_hidden_states_and_logits(attn_implementation: str, padded: bool) -> None:
    hf, ours = make_pair(attn_implementation)
    x = make_inputs(padded)
    keep = ~x["padding"]
    with torch.no_grad():
        ref = hf_forward(hf, x, labels=False)
        batch = pentad_batch(x, labels=False)
        hidden, _ = ours.encode(batch)
        out = ours(batch)
    # Padded positions hold different (meaningless) values in the two libraries; compare the rest.
    torch.testing.assert_close(hidden[keep], ref.hidden_states[-1][keep], atol=TOL, rtol=0)
    assert out["mlm"].logits.shape == (BATCH, SEQ, VOCAB)
    torch.testing.assert_close(out["mlm"].logits[keep], ref.prediction_logits[keep], atol=TOL, rtol=0)
    torch.testing.assert_close(out["sp"].logits, ref.seq_relationship_logits, atol=TOL, rtol=0)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_losses(attn_implementation: str) -> None:
    hf, ours = make_pair(attn_implementation)
    x = make_inputs(padded=True)
    with torch.no_grad():
        ref = hf_forward(hf, x, labels=True)
        out = ours(pentad_batch(x, labels=True))
    # HF scores all positions with -100 as ignore; pentad gathers the masked positions first.
    ref_mlm = F.cross_entropy(ref.prediction_logits.view(-1, VOCAB), x["mlm"].view(-1),
                              ignore_index=IGNORE_INDEX)
    ref_nsp = F.cross_entropy(ref.seq_relationship_logits, x["nsp"])
    torch.testing.assert_close(out["mlm"].loss, ref_mlm, atol=TOL, rtol=0)
    torch.testing.assert_close(out["sp"].loss, ref_nsp, atol=TOL, rtol=0)
    torch.testing.assert_close(out["mlm"].loss + out["sp"].loss, ref.loss, atol=TOL, rtol=0)
    assert int(out["mlm"].metrics["count"]) == int((x["mlm"] != IGNORE_INDEX).sum())


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_gradients(attn_implementation: str) -> None:
    """One backward pass of MLM + NSP loss: the same gradients, tied word embedding included."""
    hf, ours = make_pair(attn_implementation)
    x = make_inputs(padded=True)
    hf_forward(hf, x, labels=True).loss.backward()
    out = ours(pentad_batch(x, labels=True))
    (out["mlm"].loss + out["sp"].loss).backward()
    theirs = {name: p.grad for name, p in hf.named_parameters()}
    mine = {name: p.grad for name, p in ours.named_parameters()}
    last = f"bert.encoder.layer.{LAYERS - 1}."
    pairs = {
        "embedding.word.weight": theirs["bert.embeddings.word_embeddings.weight"],  # + tied decoder
        "embedding.seg.weight": theirs["bert.embeddings.token_type_embeddings.weight"],
        "encoder.layers.0.attention.qkv.weight": torch.cat(
            [theirs[f"bert.encoder.layer.0.attention.self.{n}.weight"] for n in ("query", "key", "value")]),
        f"encoder.layers.{LAYERS - 1}.ffn.down.weight": theirs[last + "output.dense.weight"],
        "targets.mlm.output.bias": theirs["cls.predictions.bias"],
        "targets.mlm.dense.weight": theirs["cls.predictions.transform.dense.weight"],
        "targets.sp.pooler.weight": theirs["bert.pooler.dense.weight"],
    }
    for name, expected in pairs.items():
        torch.testing.assert_close(mine[name], expected, atol=TOL, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
