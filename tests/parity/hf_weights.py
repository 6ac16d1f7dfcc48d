"""Copy weights from Hugging Face reference models into pentad models, for the parity tests.

This is deliberately minimal and test-only: it knows the two reference classes the parity tests
build from config (``BertForPreTraining`` and ``GPT2LMHeadModel``) and nothing else. Each copy
builds a complete pentad state dict and loads it with ``strict=True``, and it checks that every
Hugging Face parameter was used, so a weight that is forgotten on either side fails loudly
instead of leaving a randomly initialised tensor behind.

It also derives the pentad ``ModelConfig`` that matches a Hugging Face config exactly (norm eps,
activation, norm position, mask kind), so the tests compare the same architecture.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pentad.components.model_config import model_config_class
from pentad.model import Model

# Hugging Face activation names -> pentad's (``gelu_new`` is the tanh approximation).
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def bert_model_config(hf_config: Any) -> Any:
    """The pentad ``ModelConfig`` equal to a ``transformers.BertConfig`` (MLM + NSP targets)."""
    act = HF_ACTIVATIONS[hf_config.hidden_act]
    eps = hf_config.layer_norm_eps
    return model_config_class().model_validate({
        "hidden_size": hf_config.hidden_size,
        "vocab_size": hf_config.vocab_size,
        "max_seq_length": hf_config.max_position_embeddings,
        "tie_word_embeddings": True,
        "embedding": {"parts": [{"type": "word"}, {"type": "pos"},
                                {"type": "seg", "num_segments": hf_config.type_vocab_size}],
                      "norm": True, "layer_norm_eps": eps, "dropout": hf_config.hidden_dropout_prob},
        "encoder": {"type": "transformer", "num_layers": hf_config.num_hidden_layers,
                    "num_heads": hf_config.num_attention_heads, "ffn_size": hf_config.intermediate_size,
                    "activation": act, "norm_position": "post", "final_norm": False,
                    "mask": "bidirectional", "dropout": hf_config.hidden_dropout_prob,
                    "attention_dropout": hf_config.attention_probs_dropout_prob, "layer_norm_eps": eps},
        "targets": [{"type": "mlm", "activation": act, "layer_norm_eps": eps}, {"type": "sp"}],
    })


def gpt2_model_config(hf_config: Any) -> Any:
    """The pentad ``ModelConfig`` equal to a ``transformers.GPT2Config`` (causal LM target)."""
    return model_config_class().model_validate({
        "hidden_size": hf_config.n_embd,
        "vocab_size": hf_config.vocab_size,
        "max_seq_length": hf_config.n_positions,
        "tie_word_embeddings": True,
        "embedding": {"parts": [{"type": "word"}, {"type": "pos"}], "norm": False,
                      "dropout": hf_config.embd_pdrop},
        "encoder": {"type": "transformer", "num_layers": hf_config.n_layer, "num_heads": hf_config.n_head,
                    "ffn_size": hf_config.n_inner or 4 * hf_config.n_embd,
                    "activation": HF_ACTIVATIONS[hf_config.activation_function],
                    "norm_position": "pre", "final_norm": True, "mask": "causal",
                    "dropout": hf_config.resid_pdrop, "attention_dropout": hf_config.attn_pdrop,
                    "layer_norm_eps": hf_config.layer_norm_epsilon},
        "targets": [{"type": "lm", "bias": False}],
    })


class _Source:
    """A Hugging Face state dict that remembers which keys were read."""

    def __init__(self, state: dict[str, Tensor]):
        self.state = state
        self.used: set[str] = set()

    def __getitem__(self, key: str) -> Tensor:
        self.used.add(key)
        return self.state[key]

    def check_all_used(self, ignored: tuple[str, ...] = ()) -> None:
        unused = sorted(k for k in self.state if k not in self.used and not k.endswith(ignored))
        if unused:
            raise AssertionError(f"Hugging Face weights not copied: {unused}")


def _load(model: Model, state: dict[str, Tensor]) -> None:
    """Load ``state`` strictly (tied parameters appear under both names with the same tensor)."""
    with torch.no_grad():
        model.load_state_dict(state, strict=True)


def copy_bert_weights(hf: Any, model: Model) -> None:
    """Copy a ``BertForPreTraining`` into a pentad model built from ``bert_model_config``.

    HF's separate query/key/value Linears [H,H] stack into pentad's fused ``qkv`` [3H,H] in the
    order [q; k; v]; HF's pooler and ``seq_relationship`` become the ``sp`` target's ``pooler`` and
    ``classifier``; the MLM decoder weight is tied to the word embedding on both sides.
    """
    src = _Source(hf.state_dict())
    state: dict[str, Tensor] = {
        "embedding.word.weight": src["bert.embeddings.word_embeddings.weight"],
        "embedding.pos.weight": src["bert.embeddings.position_embeddings.weight"],
        "embedding.seg.weight": src["bert.embeddings.token_type_embeddings.weight"],
        "embedding.norm.weight": src["bert.embeddings.LayerNorm.weight"],
        "embedding.norm.bias": src["bert.embeddings.LayerNorm.bias"],
    }
    for i in range(hf.config.num_hidden_layers):
        h, p = f"bert.encoder.layer.{i}.", f"encoder.layers.{i}."
        for kind in ("weight", "bias"):
            state[p + f"attention.qkv.{kind}"] = torch.cat(
                [src[h + f"attention.self.{name}.{kind}"] for name in ("query", "key", "value")], dim=0)
            state[p + f"attention.out.{kind}"] = src[h + f"attention.output.dense.{kind}"]
            state[p + f"attention_norm.{kind}"] = src[h + f"attention.output.LayerNorm.{kind}"]
            state[p + f"ffn.up.{kind}"] = src[h + f"intermediate.dense.{kind}"]
            state[p + f"ffn.down.{kind}"] = src[h + f"output.dense.{kind}"]
            state[p + f"ffn_norm.{kind}"] = src[h + f"output.LayerNorm.{kind}"]
    for kind in ("weight", "bias"):
        state[f"targets.mlm.dense.{kind}"] = src[f"cls.predictions.transform.dense.{kind}"]
        state[f"targets.mlm.norm.{kind}"] = src[f"cls.predictions.transform.LayerNorm.{kind}"]
        state[f"targets.sp.pooler.{kind}"] = src[f"bert.pooler.dense.{kind}"]
        state[f"targets.sp.classifier.{kind}"] = src[f"cls.seq_relationship.{kind}"]
    decoder = src["cls.predictions.decoder.weight"]
    if not torch.equal(decoder, state["embedding.word.weight"]):
        raise AssertionError("the HF MLM decoder is not tied to the word embedding; pentad's is")
    state["targets.mlm.output.weight"] = decoder
    # HF keeps the decoder bias twice (``predictions.bias`` is tied to ``decoder.bias``).
    state["targets.mlm.output.bias"] = src["cls.predictions.decoder.bias"]
    src["cls.predictions.bias"]
    _load(model, state)
    src.check_all_used(ignored=("position_ids", "token_type_ids"))


def copy_gpt2_weights(hf: Any, model: Model) -> None:
    """Copy a ``GPT2LMHeadModel`` into a pentad model built from ``gpt2_model_config``.

    GPT-2's ``Conv1D`` stores weights as [in, out] (it computes ``x @ W + b``), the transpose of
    ``nn.Linear``'s [out, in]; ``c_attn`` [H, 3H] has columns [q | k | v], so its transpose is
    exactly pentad's fused ``qkv`` [3H, H] with rows [q; k; v].
    """
    src = _Source(hf.state_dict())
    state: dict[str, Tensor] = {
        "embedding.word.weight": src["transformer.wte.weight"],
        "embedding.pos.weight": src["transformer.wpe.weight"],
        "encoder.final_norm.weight": src["transformer.ln_f.weight"],
        "encoder.final_norm.bias": src["transformer.ln_f.bias"],
    }
    for i in range(hf.config.n_layer):
        h, p = f"transformer.h.{i}.", f"encoder.layers.{i}."
        for hf_name, ours in (("attn.c_attn", "attention.qkv"), ("attn.c_proj", "attention.out"),
                              ("mlp.c_fc", "ffn.up"), ("mlp.c_proj", "ffn.down")):
            state[p + ours + ".weight"] = src[h + hf_name + ".weight"].t().contiguous()
            state[p + ours + ".bias"] = src[h + hf_name + ".bias"]
        for hf_name, ours in (("ln_1", "attention_norm"), ("ln_2", "ffn_norm")):
            state[p + ours + ".weight"] = src[h + hf_name + ".weight"]
            state[p + ours + ".bias"] = src[h + hf_name + ".bias"]
    head = src["lm_head.weight"]
    if not torch.equal(head, state["embedding.word.weight"]):
        raise AssertionError("the HF LM head is not tied to the word embedding; pentad's is")
    state["targets.lm.output.weight"] = head
    _load(model, state)
    src.check_all_used(ignored=("attn.bias", "attn.masked_bias"))
