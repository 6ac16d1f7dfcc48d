"""Tiny models, run directories and tokenizer files for the conversion tests (no downloads)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from pentad.builder import build_model
from pentad.config.loader import validate_raw
from pentad.data.tokenizers import load_tokenizer
from pentad.runs import prepare_run_dir
from pentad.training.checkpoint import save_weights

H, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 4, 48, 24

BERT: dict[str, Any] = {
    "hidden_size": H, "vocab_size": 60, "max_seq_length": POSITIONS, "tie_word_embeddings": True,
    "embedding": {"parts": ["word", "pos", "seg"], "norm": True, "layer_norm_eps": 1e-12, "dropout": 0.1},
    "encoder": {"type": "transformer", "num_layers": LAYERS, "num_heads": HEADS, "ffn_size": FFN, "activation": "gelu",
                "norm_position": "post", "mask": "bidirectional", "dropout": 0.1, "layer_norm_eps": 1e-12},
    "targets": [{"type": "mlm", "activation": "gelu", "layer_norm_eps": 1e-12}, {"type": "sp"}],
}
ROBERTA: dict[str, Any] = {
    **BERT,
    "embedding": {"parts": ["word", "pos", {"type": "seg", "num_segments": 1}], "norm": True,
                  "layer_norm_eps": 1e-5, "dropout": 0.1},
    "encoder": {**BERT["encoder"], "layer_norm_eps": 1e-5},
    "targets": [{"type": "mlm", "activation": "gelu", "layer_norm_eps": 1e-5}],
}
GPT2: dict[str, Any] = {
    "hidden_size": H, "vocab_size": 60, "max_seq_length": POSITIONS, "tie_word_embeddings": True,
    "embedding": {"parts": ["word", "pos"], "norm": False, "dropout": 0.1},
    "encoder": {"type": "transformer", "num_layers": LAYERS, "num_heads": HEADS, "ffn_size": FFN,
                "activation": "gelu_tanh", "norm_position": "pre", "final_norm": True, "mask": "causal",
                "dropout": 0.1, "layer_norm_eps": 1e-5},
    "targets": [{"type": "lm", "bias": False}],
}


def variant(base: dict[str, Any], **over: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out.update(over)
    return out


# (id, family, model dict): every architecture the exporter writes.
PENTAD_MODELS = [
    ("bert-pretraining", "bert", BERT),
    ("bert-mlm-untied", "bert", variant(BERT, tie_word_embeddings=False, targets=[BERT["targets"][0]])),
    ("bert-nsp", "bert", variant(BERT, targets=[{"type": "sp"}])),
    ("bert-cls", "bert", variant(BERT, targets=[{"type": "cls", "num_labels": 3}])),
    ("roberta-mlm", "roberta", ROBERTA),
    ("roberta-cls", "roberta", variant(ROBERTA, targets=[{"type": "cls", "num_labels": 2}])),
    ("xlm-roberta-mlm", "xlm-roberta", ROBERTA),
    ("gpt2", "gpt2", GPT2),
    ("gpt2-untied", "gpt2", variant(GPT2, tie_word_embeddings=False)),
]


def perturb(module: torch.nn.Module, seed: int = 1) -> None:
    """Noise on every parameter, so that unit norms and zero biases become distinct values and a
    tensor copied to the wrong place changes the numbers."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))


def make_run(run_dir: Path, model: dict[str, Any], tokenizer: dict[str, Any] | None = None, seed: int = 0):
    """A pentad run directory holding a randomly initialised (perturbed) model; returns (cfg, model)."""
    raw: dict[str, Any] = {"model": copy.deepcopy(model)}
    tok = None
    if tokenizer is not None:
        raw["tokenizer"] = tokenizer
        tok = load_tokenizer(tokenizer)
        raw["model"]["vocab_size"] = tok.vocab_size
    cfg = validate_raw(raw, {}, "test")
    torch.manual_seed(seed)
    net = build_model(cfg.model)
    perturb(net, seed + 1)
    prepare_run_dir(run_dir, cfg, tok)
    save_weights(net, run_dir / "model.safetensors")
    return cfg, net.eval()


def resolved(model_cfg: Any) -> dict[str, Any]:
    """A model config with every default made explicit, for comparing two configs that build the
    same model (one may say ``ffn_size: null``, the other ``ffn_size: 4H``)."""
    d = model_cfg.model_dump(mode="json")
    for part in d["embedding"]["parts"]:
        if part["type"] == "pos" and part.get("max_positions") is None:
            part["max_positions"] = d["max_seq_length"]
    enc = d["encoder"]
    enc["ffn_size"] = enc["ffn_size"] or 4 * d["hidden_size"]
    if enc["final_norm"] is None:
        enc["final_norm"] = enc["norm_position"] == "pre"
    if enc["attention_dropout"] is None:
        enc["attention_dropout"] = enc["dropout"]
    for target in d["targets"]:
        target["name"] = target.get("name") or target["type"]
    return d


# ------------------------------------------------------------------------------------ tokenizers
WORDS = ["the", "quick", "brown", "fox", "jump", "##s", "over", "lazy", "dog", "a", "##n", ",", ".", "!"]


def write_wordpiece(directory: Path) -> dict[str, Any]:
    directory.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return {"type": "wordpiece", "vocab": str(directory / "vocab.txt"), "lowercase": True}


def byte_alphabet() -> list[str]:
    """GPT-2's 256 byte symbols (printable Latin-1 bytes stand for themselves)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write_bpe(directory: Path, roberta: bool = False) -> dict[str, Any]:
    directory.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>"] if roberta else []
    merges = ["Ġ t", "h e", "Ġt he", "o x", "f ox"]
    tokens = specials + byte_alphabet() + ["Ġt", "he", "Ġthe", "ox", "fox"]
    tokens += ["<mask>"] if roberta else ["<|endoftext|>"]
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges), encoding="utf-8")
    cfg: dict[str, Any] = {"type": "bpe", "vocab": str(directory / "vocab.json"),
                           "merges": str(directory / "merges.txt")}
    if roberta:
        cfg["special_tokens"] = {"bos": "<s>", "cls": "<s>", "eos": "</s>", "sep": "</s>", "pad": "<pad>",
                                 "unk": "<unk>", "mask": "<mask>"}
    return cfg
