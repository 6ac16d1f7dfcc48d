"""GPT-2 parity: pentad's ``gpt2`` architecture against ``transformers.GPT2LMHeadModel``.

Random weights from config (no download) are copied into pentad; final hidden states (after the
final norm), LM logits, the next-token loss and its gradients must agree to 1e-5 (fp32, eval mode), for HF's
eager and SDPA attention, with and without right padding.
"""

from __future__ import annotations

import pytest
import torch

from pentad.builder import build_model
from pentad.components.base import IGNORE_INDEX, Batch

from .hf_weights import copy_gpt2_weights, gpt2_model_config

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB, HIDDEN, LAYERS, HEADS = 100, 64, 2, 4
BATCH, SEQ = 3, 12
LENGTHS = (12, 9, 4)


def perturb(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Add noise to every parameter so zero biases and unit norm weights become distinct values."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))


def make_pair(attn_implementation: str):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=32,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0,
        attn_implementation=attn_implementation)
    hf = transformers.GPT2LMHeadModel(config)
    perturb(hf, torch.Generator().manual_seed(1))
    hf.eval()
    assert hf.config._attn_implementation == attn_implementation
    ours = build_model(gpt2_model_config(config))
    copy_gpt2_weights(hf, ours)
    ours.eval()
    return hf, ours


def make_inputs(padded: bool) -> dict[str, torch.Tensor]:
    """Right-padded token ids; HF labels (unshifted, -100 at padding) and pentad's (shifted)."""
    g = torch.Generator().manual_seed(2)
    lengths = LENGTHS if padded else (SEQ,) * BATCH
    tokens = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    padding = torch.arange(SEQ)[None, :] >= torch.tensor(lengths)[:, None]
    tokens[padding] = 0
    hf_labels = tokens.masked_fill(padding, IGNORE_INDEX)
    # pentad's objective shifts: position t predicts token t+1; the last position predicts nothing.
    ours = torch.full_like(tokens, IGNORE_INDEX)
    ours[:, :-1] = hf_labels[:, 1:]
    return {"tokens": tokens, "padding": padding, "hf_labels": hf_labels, "labels": ours}


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "full"])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_hidden_states_logits_and_loss(attn_implementation: str, padded: bool) -> None:
    hf, ours = make_pair(attn_implementation)
    x = make_inputs(padded)
    keep = ~x["padding"]
    with torch.no_grad():
        ref = hf(input_ids=x["tokens"], attention_mask=keep.long(), labels=x["hf_labels"],
                 output_hidden_states=True)
        batch = Batch(tokens=x["tokens"], padding_mask=x["padding"] if padded else None)
        hidden, _ = ours.encode(batch)
        logits = ours(batch)["lm"].logits
        batch.labels = {"lm": x["labels"]}
        loss = ours(batch)["lm"].loss
    torch.testing.assert_close(hidden[keep], ref.hidden_states[-1][keep], atol=TOL, rtol=0)
    assert logits.shape == (BATCH, SEQ, VOCAB)
    torch.testing.assert_close(logits[keep], ref.logits[keep], atol=TOL, rtol=0)
    torch.testing.assert_close(loss, ref.loss, atol=TOL, rtol=0)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_gradients(attn_implementation: str) -> None:
    """One backward pass of the LM loss: the same gradients, tied word embedding included."""
    hf, ours = make_pair(attn_implementation)
    x = make_inputs(padded=True)
    hf(input_ids=x["tokens"], attention_mask=(~x["padding"]).long(), labels=x["hf_labels"]).loss.backward()
    batch = Batch(tokens=x["tokens"], padding_mask=x["padding"], labels={"lm": x["labels"]})
    ours(batch)["lm"].loss.backward()
    theirs = {name: p.grad for name, p in hf.named_parameters()}
    mine = {name: p.grad for name, p in ours.named_parameters()}
    pairs = {
        "embedding.word.weight": theirs["transformer.wte.weight"],  # + tied LM head
        "embedding.pos.weight": theirs["transformer.wpe.weight"],
        "encoder.layers.0.attention.qkv.weight": theirs["transformer.h.0.attn.c_attn.weight"].t(),
        f"encoder.layers.{LAYERS - 1}.ffn.down.weight": theirs[f"transformer.h.{LAYERS - 1}.mlp.c_proj.weight"].t(),
        "encoder.final_norm.weight": theirs["transformer.ln_f.weight"],
    }
    for name, expected in pairs.items():
        torch.testing.assert_close(mine[name], expected, atol=TOL, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
