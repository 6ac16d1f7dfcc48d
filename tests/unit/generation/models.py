"""Tiny randomly initialised models of every decoding family, built from pentad configs."""

from __future__ import annotations

from typing import Any

import torch

from pentad.builder import build_model
from pentad.components.model_config import model_config_class
from pentad.model import Model

VOCAB = 61


def _stack(**over: Any) -> dict[str, Any]:
    stack = {"type": "transformer", "num_layers": 2, "num_heads": 4, "ffn_size": 64, "dropout": 0.0,
             "layer_norm_eps": 1e-5}
    stack.update(over)
    return stack


def _model(**fields: Any) -> dict[str, Any]:
    # Untied output weights and a per-family init_std (picked by trying a few) spread the logits,
    # so greedy decoding wanders over many tokens instead of repeating one: a more telling test.
    model = {"hidden_size": 32, "vocab_size": VOCAB, "max_seq_length": 64, "tie_word_embeddings": False}
    model.update(fields)
    return model


CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": _model(
        init_std=0.5,
        embedding={"parts": ["word", "pos"], "norm": False, "dropout": 0.0},
        encoder=_stack(activation="gelu_tanh", norm_position="pre", final_norm=True, mask="causal"),
        targets=[{"type": "lm"}]),
    "llama": _model(
        init_std=0.3,
        embedding={"parts": ["word"], "norm": False, "dropout": 0.0},
        encoder=_stack(num_kv_heads=2, ffn="gated", activation="silu", norm="rmsnorm", norm_position="pre",
                       final_norm=True, mask="causal", bias=False, positions="rotary"),
        targets=[{"type": "lm"}]),
    "bloom": _model(
        init_std=0.1,
        embedding={"parts": ["word"], "norm": True, "layer_norm_eps": 1e-5, "dropout": 0.0},
        encoder=_stack(activation="gelu_tanh", norm_position="pre", final_norm=True, mask="causal",
                       positions="alibi"),
        targets=[{"type": "lm"}]),
    "prefixlm": _model(
        init_std=0.1,
        embedding={"parts": ["word", "pos", "seg"], "dropout": 0.0},
        encoder=_stack(activation="gelu", norm_position="post", mask="prefix"),
        targets=[{"type": "lm"}]),
    "t5": _model(
        init_std=0.02,
        share_embedding=True,
        embedding={"parts": ["word"], "norm": False, "dropout": 0.0},
        encoder=_stack(activation="relu", norm="t5", norm_position="pre", final_norm=True, bias=False,
                       attention_scale=False, positions="relative", relative_buckets=8,
                       relative_max_distance=20, mask="bidirectional"),
        target_embedding={"parts": ["word"], "norm": False, "dropout": 0.0},
        decoder=_stack(activation="relu", norm="t5", norm_position="pre", final_norm=True, bias=False,
                       attention_scale=False, positions="relative", relative_buckets=8, relative_max_distance=20),
        targets=[{"type": "lm", "scale_hidden": True}]),
    "bart": _model(
        init_std=0.1,
        share_embedding=True,
        embedding={"parts": ["word", "pos"], "norm": True, "layer_norm_eps": 1e-5, "dropout": 0.0},
        encoder=_stack(activation="gelu", norm_position="post", mask="bidirectional"),
        target_embedding={"parts": ["word", "pos"], "norm": True, "layer_norm_eps": 1e-5, "dropout": 0.0},
        decoder=_stack(activation="gelu", norm_position="post"),
        targets=[{"type": "lm", "bias": True}]),
    "transformer": _model(
        init_std=0.05,
        share_embedding=True,
        embedding={"parts": [{"type": "word", "scale": True}, "sinusoidal"], "norm": False, "dropout": 0.0},
        encoder=_stack(activation="relu", norm_position="post", mask="bidirectional"),
        target_embedding={"parts": [{"type": "word", "scale": True}, "sinusoidal"], "norm": False,
                          "dropout": 0.0},
        decoder=_stack(activation="relu", norm_position="post"),
        targets=[{"type": "lm"}]),
}
DECODER_ONLY = ("gpt2", "llama", "bloom", "prefixlm")
ENCODER_DECODER = ("t5", "bart", "transformer")


def model_config(family: str) -> Any:
    return model_config_class().model_validate(CONFIGS[family])


def tiny_model(family: str, seed: int = 0) -> Model:
    """A model of ``family`` with seeded random weights (biases and norms perturbed too), in eval mode."""
    torch.manual_seed(seed)
    model = build_model(model_config(family), training=False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


# Prompts of different lengths (token ids 3.. so 0-2 stay free for pad/start/stop roles).
PROMPTS = [[5, 17, 33, 8, 21, 40], [9, 44], [12, 3, 57, 26]]
