"""Import TencentPretrain's flat JSON model configs through a table.

A TencentPretrain config such as ``models/bert/base_config.json`` names modules per slot
(``"embedding": ["word", "pos", "seg"]``, ``"encoder": "transformer"``, ``"target": ["mlm", "sp"]``)
and flat sizes. Each key maps to a place in pentad's nested config; a module or option pentad does
not have yet is an error that names it, never silently ignored. As in TencentPretrain, the
vocabulary completes the config: pass ``vocab_size=N`` or ``vocab_path=FILE`` (WordPiece),
``spm_model_path=FILE`` or ``vocab_path=FILE merges_path=FILE`` (GPT-2 BPE) as overrides.
"""

from __future__ import annotations

from typing import Any

from pentad.errors import UserError

# Keys that mark a file as a TencentPretrain config (pentad configs nest everything under model/...).
_MARKERS = {"layers_num", "heads_num", "emb_size", "feedforward_size", "data_processor"}

EMBEDDINGS = {"word": "word", "pos": "pos", "seg": "seg", "sinusoidalpos": "sinusoidal"}
ENCODERS = {"transformer": "transformer"}
TARGETS = {"mlm": "mlm", "sp": "sp", "lm": "lm", "cls": "cls"}
MASKS = {"fully_visible": "bidirectional", "causal": "causal", "causal_with_prefix": "prefix", "prefix": "prefix"}
ACTIVATIONS = {"gelu": "gelu", "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "linear": "linear"}
OBJECTIVES = {"bert": "bert", "mlm": "mlm", "lm": "lm", "cls": "cls"}

# Options whose truthy value needs a module pentad does not have yet.
_NOT_YET = {
    "relative_position_embedding": "T5 relative position bias",
    "rotary_position_embedding": "rotary position embedding",
    "alibi_position_embedding": "ALiBi position bias",
    "parameter_sharing": "ALBERT cross-layer parameter sharing",
    "factorized_embedding_parameterization": "ALBERT factorised embedding",
    "has_residual_attention": "residual attention (RealFormer)",
    "decoder": "a decoder slot",
    "tgt_embedding": "a target-embedding slot",
    "share_embedding": "shared encoder/decoder embeddings",
    "local_kv_heads_num": "grouped-query attention",
    "stream_0": "dual-stream models", "stream_1": "dual-stream models",
}
# Options that are fine at their default value.
_DEFAULT_ONLY = {"feed_forward": "dense", "layernorm": "normal", "remove_attention_scale": False,
                 "layer_number_scale": False, "prefix_lm_loss": False}
# Keys that describe preprocessing/training, not the model: accepted and ignored here.
_IGNORED = {"tokenizer", "labels_num", "is_moe"}
_VOCAB_KEYS = {"vocab_size", "vocab_path", "spm_model_path", "merges_path", "do_lower_case"}


def is_tencentpretrain_config(raw: dict[str, Any]) -> bool:
    return bool(_MARKERS & set(raw)) or isinstance(raw.get("encoder"), str) or isinstance(raw.get("target"), list)


def import_config(raw: dict[str, Any], overrides: list[str], label: str) -> tuple[dict[str, Any], list[str]]:
    """Translate a flat TencentPretrain config. Bare vocabulary overrides (``vocab_size=N``,
    ``vocab_path=F`` ...) are consumed here; dotted pentad overrides are returned to apply after."""
    flat = dict(raw)
    rest = []
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        if "=" in text and "." not in key and key in _VOCAB_KEYS:
            value = text.split("=", 1)[1]
            flat[key] = int(value) if key == "vocab_size" and value.strip().isdigit() else value
        else:
            rest.append(text)
    problems: list[str] = []

    def need(key: str, table: dict[str, str], value: Any, what: str) -> str | None:
        if value in table:
            return table[value]
        problems.append(f"'{key}': {what} '{value}' is not available in pentad yet "
                        f"(available: {', '.join(table)})")
        return None

    known = set(_MARKERS) | set(_NOT_YET) | set(_DEFAULT_ONLY) | set(_IGNORED) | _VOCAB_KEYS | {
        "hidden_size", "hidden_act", "max_seq_length", "dropout", "embedding", "remove_embedding_layernorm",
        "encoder", "mask", "layernorm_positioning", "layernorm_eps", "target", "tie_weights",
        "remove_transformer_bias", "has_lmtarget_bias", "pooling", "attention_head_size"}
    for key in flat:
        if key not in known:
            problems.append(f"'{key}': unknown TencentPretrain config key")
    for key, what in _NOT_YET.items():
        if flat.get(key):
            problems.append(f"'{key}': {what} is not available in pentad yet")
    for key, default in _DEFAULT_ONLY.items():
        if key in flat and flat[key] != default:
            problems.append(f"'{key}': value {flat[key]!r} is not available in pentad yet (only {default!r})")

    hidden = flat.get("hidden_size", 768)
    if "emb_size" in flat and flat["emb_size"] != hidden:
        problems.append(f"'emb_size' {flat['emb_size']} differs from hidden_size {hidden}: "
                        "a factorised embedding is not available in pentad yet")
    heads = flat.get("heads_num", 12)
    if "attention_head_size" in flat and flat["attention_head_size"] * heads != hidden:
        problems.append("'attention_head_size' x heads_num must equal hidden_size in pentad")
    eps = flat.get("layernorm_eps", 1e-6)  # TencentPretrain's default for every LayerNorm
    dropout = flat.get("dropout", 0.1)
    activation = need("hidden_act", ACTIVATIONS, flat.get("hidden_act", "gelu"), "activation")
    parts = [need("embedding", EMBEDDINGS, e, "embedding") for e in _as_list(flat.get("embedding", ["word"]))]
    encoder = need("encoder", ENCODERS, flat.get("encoder", "transformer"), "encoder")
    mask = need("mask", MASKS, flat.get("mask", "fully_visible"), "mask")
    target_names = [need("target", TARGETS, t, "target") for t in _as_list(flat.get("target", ["mlm"]))]
    objective = flat.get("data_processor")
    objective_type = need("data_processor", OBJECTIVES, objective, "data processor") if objective else None
    if problems:
        raise UserError(f"cannot import TencentPretrain config {label}: " + "; ".join(problems) + ".")

    targets: list[dict[str, Any]] = []
    for name in target_names:
        t: dict[str, Any] = {"type": name}
        if name == "mlm":
            t.update(activation=activation, layer_norm_eps=eps)
        if name == "lm":
            t["bias"] = bool(flat.get("has_lmtarget_bias", False))
        if name == "cls":
            t["pooling"] = flat.get("pooling", "first")
            if flat.get("labels_num"):
                t["num_labels"] = flat["labels_num"]
        targets.append(t)
    model: dict[str, Any] = {
        "hidden_size": hidden,
        "max_seq_length": flat.get("max_seq_length", 512),
        "tie_word_embeddings": bool(flat.get("tie_weights", False)),
        "embedding": {"parts": parts, "norm": not flat.get("remove_embedding_layernorm", False),
                      "layer_norm_eps": eps, "dropout": dropout},
        "encoder": {"type": encoder, "num_layers": flat.get("layers_num", 12), "num_heads": heads,
                    "ffn_size": flat.get("feedforward_size", 4 * hidden), "activation": activation,
                    "norm_position": flat.get("layernorm_positioning", "post"), "mask": mask,
                    "dropout": dropout, "bias": not flat.get("remove_transformer_bias", False),
                    "layer_norm_eps": eps},
        "targets": targets,
    }
    if "vocab_size" in flat:
        model["vocab_size"] = flat["vocab_size"]
    out: dict[str, Any] = {"model": model}
    tokenizer = _tokenizer(flat)
    if tokenizer is not None:
        out["tokenizer"] = tokenizer
    if objective_type is not None:
        out["data"] = {"objective": {"type": objective_type, "seq_length": flat.get("max_seq_length", 512)}}
    return out, rest


def _tokenizer(flat: dict[str, Any]) -> dict[str, Any] | None:
    lower = str(flat.get("do_lower_case", "true")).lower() in ("true", "1", "yes")
    if flat.get("spm_model_path"):
        return {"type": "sentencepiece", "model": flat["spm_model_path"]}
    if flat.get("vocab_path") and flat.get("merges_path"):
        return {"type": "bpe", "vocab": flat["vocab_path"], "merges": flat["merges_path"]}
    if flat.get("vocab_path"):
        return {"type": "wordpiece", "vocab": flat["vocab_path"], "lowercase": lower}
    return None


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]
