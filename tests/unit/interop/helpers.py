"""Tiny models, run directories and tokenizer files for the conversion tests (no downloads)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from pentad.builder import build_model
from pentad.data.tokenizers import load_tokenizer
from pentad.run_config import validate_raw
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


_STACK = {"type": "transformer", "num_layers": LAYERS, "num_heads": HEADS, "ffn_size": FFN}
_T5_STACK = {**_STACK, "activation": "relu", "norm": "t5", "norm_position": "pre", "final_norm": True, "bias": False,
             "dropout": 0.1, "layer_norm_eps": 1e-6, "attention_scale": False, "positions": "relative",
             "relative_buckets": 8, "relative_max_distance": 16}
T5: dict[str, Any] = {
    "hidden_size": H, "vocab_size": 60, "max_seq_length": POSITIONS, "tie_word_embeddings": True,
    "share_embedding": True, "embedding": {"parts": ["word"], "norm": False, "dropout": 0.1},
    "target_embedding": {"parts": ["word"], "norm": False, "dropout": 0.1},
    "encoder": {**_T5_STACK, "mask": "bidirectional"}, "decoder": dict(_T5_STACK),
    "targets": [{"type": "lm", "scale_hidden": True}],
}
T5_V1_1: dict[str, Any] = {
    **T5, "tie_word_embeddings": False,
    "encoder": {**_T5_STACK, "mask": "bidirectional", "ffn": "gated", "activation": "gelu_tanh", "head_size": 16},
    "decoder": {**_T5_STACK, "ffn": "gated", "activation": "gelu_tanh", "head_size": 16},
    "targets": [{"type": "lm"}],
}
_SWITCH_MOE = {"num_experts": 4, "top_k": 1, "expert": "dense", "normalize": False, "every": 2,
               "z_loss_weight": 0.001}
SWITCH: dict[str, Any] = {
    **T5, "encoder": {**T5["encoder"], "ffn": "moe", "moe": _SWITCH_MOE},
    "decoder": {**T5["decoder"], "ffn": "moe", "moe": _SWITCH_MOE},
}
_BART_EMBEDDING = {"parts": ["word", {"type": "pos", "max_positions": POSITIONS}], "norm": True,
                   "layer_norm_eps": 1e-5, "dropout": 0.1}
_BART_STACK = {**_STACK, "activation": "gelu", "norm_position": "post", "dropout": 0.1, "attention_dropout": 0.0,
               "layer_norm_eps": 1e-5}
BART: dict[str, Any] = {
    "hidden_size": H, "vocab_size": 60, "max_seq_length": POSITIONS, "tie_word_embeddings": True,
    "share_embedding": True, "embedding": _BART_EMBEDDING, "target_embedding": _BART_EMBEDDING,
    "encoder": {**_BART_STACK, "mask": "bidirectional"}, "decoder": _BART_STACK,
    "targets": [{"type": "lm", "bias": True}],
}
_PEGASUS_EMBEDDING = {"parts": [{"type": "word", "scale": True},
                                {"type": "sinusoidal", "interleave": False, "max_positions": POSITIONS}],
                      "norm": False, "dropout": 0.1}
_PEGASUS_STACK = {**_BART_STACK, "activation": "relu", "norm_position": "pre", "final_norm": True}
PEGASUS: dict[str, Any] = {
    **BART, "embedding": _PEGASUS_EMBEDDING, "target_embedding": _PEGASUS_EMBEDDING,
    "encoder": {**_PEGASUS_STACK, "mask": "bidirectional"}, "decoder": _PEGASUS_STACK,
}
LLAMA: dict[str, Any] = {
    "hidden_size": H, "vocab_size": 60, "max_seq_length": POSITIONS, "tie_word_embeddings": False,
    "embedding": {"parts": ["word"], "norm": False, "dropout": 0.0},
    "encoder": {**_STACK, "num_kv_heads": 2, "ffn": "gated", "activation": "silu", "norm": "rmsnorm",
                "norm_position": "pre", "final_norm": True, "mask": "causal", "dropout": 0.0, "bias": False,
                "layer_norm_eps": 1e-6, "positions": "rotary", "rotary_base": 10000.0},
    "targets": [{"type": "lm"}],
}
MISTRAL: dict[str, Any] = {**LLAMA, "encoder": {**LLAMA["encoder"], "sliding_window": 5}}
GEMMA3: dict[str, Any] = {  # local, local, global; GQA; head width 16 over H 32; scores by 1/sqrt(12)
    **LLAMA, "tie_word_embeddings": True,
    "embedding": {"parts": [{"type": "word", "scale": True}], "norm": False, "dropout": 0.0},
    "encoder": {**LLAMA["encoder"], "num_layers": 3, "head_size": 16, "activation": "gelu_tanh",
                "norm": "gemma_rmsnorm", "norm_position": "sandwich", "qk_norm": "before_rotary",
                "attention_scale_size": 12.0, "sliding_window": 5, "window_pattern": ["local", "local", "global"],
                "rotary_local_base": 100.0, "rotary_base": 1.0e6},
    "targets": [{"type": "lm", "logit_softcap": 3.0}],
}
MIXTRAL: dict[str, Any] = {
    **LLAMA, "encoder": {**LLAMA["encoder"], "ffn": "moe", "layer_norm_eps": 1e-5,
                         "moe": {"num_experts": 4, "top_k": 2, "balance_loss_weight": 0.02}},
}
QWEN2_MOE: dict[str, Any] = {  # layers 0 and 2 sparse, 1 dense; biased qkv alone; a gated shared expert
    **LLAMA, "encoder": {**LLAMA["encoder"], "num_layers": 3, "qkv_bias": True, "ffn_size": 48,
                         "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_size": 16, "normalize": False, "every": 2,
                                 "first": 0, "shared_experts": 2, "shared_gate": True},
                         "ffn": "moe"},
}
DEEPSEEK_V3: dict[str, Any] = {  # latent attention; layer 0 dense, 1-2 DeepSeek mixtures (4 groups of 2, 2 per token)
    **LLAMA, "encoder": {**LLAMA["encoder"], "num_layers": 3, "num_kv_heads": None, "ffn": "moe",
                         "latent_attention": {"kv_lora_rank": 16, "q_lora_rank": 12, "qk_nope_head_dim": 8,
                                              "qk_rope_head_dim": 4, "v_head_dim": 8},
                         "moe": {"num_experts": 8, "top_k": 3, "expert_ffn_size": 16, "first": 1, "shared_experts": 1,
                                 "balance_loss_weight": 0.0, "scoring": "sigmoid", "choice_bias": True, "groups": 4,
                                 "group_top_k": 2, "routed_scaling": 2.5}},
}
BLOOM: dict[str, Any] = {
    "hidden_size": H, "vocab_size": 60, "max_seq_length": POSITIONS, "tie_word_embeddings": True,
    "embedding": {"parts": ["word"], "norm": True, "layer_norm_eps": 1e-5, "dropout": 0.0},
    "encoder": {**_STACK, "ffn_size": 4 * H, "activation": "gelu_tanh", "norm_position": "pre", "final_norm": True,
                "mask": "causal", "dropout": 0.0, "layer_norm_eps": 1e-5, "positions": "alibi"},
    "targets": [{"type": "lm"}],
}
ALBERT: dict[str, Any] = {
    **BERT, "embedding_size": 16,
    "encoder": {**BERT["encoder"], "activation": "gelu_tanh", "share_layers": True},
    "targets": [{"type": "mlm", "activation": "gelu_tanh", "layer_norm_eps": 1e-12}, {"type": "sop"}],
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
    ("albert-pretraining", "albert", ALBERT),
    ("albert-mlm", "albert", variant(ALBERT, targets=[ALBERT["targets"][0]])),
    ("albert-cls", "albert", variant(ALBERT, targets=[{"type": "cls", "num_labels": 3}])),
    ("t5", "t5", T5),
    ("t5-v1_1", "t5", T5_V1_1),
    ("bart", "bart", BART),
    ("pegasus", "pegasus", PEGASUS),
    ("llama", "llama", LLAMA),
    ("llama-tied", "llama", variant(LLAMA, tie_word_embeddings=True)),
    ("mistral", "mistral", MISTRAL),
    ("gemma3", "gemma3_text", GEMMA3),
    ("mixtral", "mixtral", MIXTRAL),
    ("mixtral-window", "mixtral", variant(MIXTRAL, encoder={**MIXTRAL["encoder"], "sliding_window": 5})),
    ("qwen2_moe", "qwen2_moe", QWEN2_MOE),
    ("deepseek_v3", "deepseek_v3", DEEPSEEK_V3),
    ("switch", "switch_transformers", SWITCH),
    ("bloom", "bloom", BLOOM),
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
    hidden = d["hidden_size"]
    for slot in ("embedding", "target_embedding"):
        if d.get(slot) and not d[slot]["norm"]:
            d[slot]["layer_norm_eps"] = None  # no norm, no eps
        for part in (d.get(slot) or {}).get("parts", []):
            if part["type"] in ("pos", "sinusoidal") and part.get("max_positions") is None:
                part["max_positions"] = d["max_seq_length"]
    for stack in ("encoder", "decoder"):
        s = d.get(stack)
        if not s:
            continue
        s["ffn_size"] = s["ffn_size"] or 4 * hidden
        if s["final_norm"] is None:
            s["final_norm"] = s["norm_position"] == "pre"
        if s["attention_dropout"] is None:
            s["attention_dropout"] = s["dropout"]
        s["num_kv_heads"] = s.get("num_kv_heads") or s["num_heads"]
        s["head_size"] = s.get("head_size") or hidden // s["num_heads"]
        if s.get("norm") == "rmsnorm":
            s["norm"] = "t5"  # the same module
    if d.get("embedding_size") == hidden:
        d["embedding_size"] = None
    if not any(p["type"] in ("pos", "sinusoidal") for p in d["embedding"]["parts"]):
        # No position table (T5, LLaMA, BLOOM): max_seq_length only bounds the data pipeline, and
        # HF's config.json has no place for it (the tokenizer's model_max_length carries it).
        d.pop("max_seq_length")
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


def save_perturbed(model: torch.nn.Module, directory: Path, scale: float = 0.05, seed: int = 1) -> torch.nn.Module:
    """A Hugging Face reference model with noise on every trainable parameter (unit norms and zero
    biases become distinct values; fixed tables such as Whisper's sinusoidal positions are left as
    they are), saved with ``save_pretrained``; returned in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = scale * torch.randn(p.shape, generator=g)
            if p.requires_grad:
                p.add_(noise)
    model.save_pretrained(directory)
    return model.eval()


def load_pentad_run(run_dir: Path) -> tuple[Any, Any]:
    """(run config, model in eval mode with the run's weights) of a pentad run directory."""
    from pentad.runs import load_run
    from pentad.training.checkpoint import find_weights, load_weights, read_weights

    cfg, _ = load_run(run_dir)
    model = build_model(cfg.model)
    load_weights(model, read_weights(find_weights(run_dir)), str(run_dir))
    return cfg, model.eval()


def relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours - theirs| / max |theirs|, in float64."""
    return float((ours.double() - theirs.double()).abs().max() / theirs.double().abs().max())


def write_tencentpretrain_dir(directory: Path, state: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """A TencentPretrain checkpoint directory as ``tencentpretrain-to-pentad`` reads it: ``model.bin``
    (``torch.save`` of the state dict) beside its JSON config."""
    directory.mkdir(parents=True)
    torch.save(state, directory / "model.bin")
    (directory / "config.json").write_text(json.dumps(config))


def assert_same_hf_checkpoint(original: Path, written: Path) -> dict[str, torch.Tensor]:
    """``written`` (an exported HF folder) holds ``original``'s weights bit for bit, with the same names
    and dtypes, and the same ``config.json`` apart from the version stamp and dtype; returns the weights."""
    from safetensors import torch as safetensors_torch

    before = safetensors_torch.load_file(str(original / "model.safetensors"))
    after = safetensors_torch.load_file(str(written / "model.safetensors"))
    assert sorted(before) == sorted(after)
    for key, tensor in before.items():
        assert after[key].dtype == tensor.dtype and torch.equal(after[key], tensor), key
    skip = {"transformers_version", "dtype"}
    first, second = (json.loads((d / "config.json").read_text()) for d in (original, written))
    assert {k: v for k, v in second.items() if k not in skip} == {k: v for k, v in first.items() if k not in skip}
    return after


def assert_hf_round_trip(tmp_path: Path, architecture: str) -> None:
    """``tmp_path/hf`` (a saved HF model) converted to pentad and back, both verified: the same
    architecture, and the same checkpoint bit for bit (:func:`assert_same_hf_checkpoint`)."""
    from pentad.interop import convert

    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    report = convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back", verify=True)
    assert report.ok, report.render()
    assert report.architecture == architecture
    assert_same_hf_checkpoint(tmp_path / "hf", tmp_path / "back")
