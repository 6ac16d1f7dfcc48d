"""Whisper (``model_type: whisper``): key map, config and decoding settings, both ways.

``WhisperForConditionalGeneration`` (and a bare ``WhisperModel``) becomes a pentad encoder-decoder:

* the encoder's ``speech`` part is Whisper's stem, ``conv1`` (kernel 3, stride 1) and ``conv2``
  (kernel 3, stride 2), each followed by an exact GELU, with no scaling; its positions are the fixed
  sinusoidal table transformers stores as ``encoder.embed_positions.weight`` (sines then cosines,
  tensor2tensor spacing, from position 0), checked on import against the one pentad computes;
* the decoder embeds words (``decoder.embed_tokens``) and learned positions (448 rows) without a
  LayerNorm; both stacks are pre-norm with a final LayerNorm, biases everywhere except Whisper's
  key projections (pentad's fused ``qkv``/``kv`` biases get a zero key part; the export drops it,
  which is exact: a key bias shifts every score of a query alike);
* the ``lm`` head is the decoder's word table (``proj_out``, tied), without a bias.

The run gets an ``asr`` task set up as Whisper decodes: Whisper's log-mel features
(``audio.features: whisper``), the decoder start token, the decoder prompt that follows it (the
``forced_decoder_ids`` of ``generation_config.json``, else ``<|notimestamps|>``), and the suppressed
tokens. The tokenizer is the checkpoint's ``tokenizer.json``, run as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from pentad.errors import UserError
from pentad.interop.hf import (
    ExportPlan,
    Field,
    HFFamily,
    ImportPlan,
    KeyLayout,
    activation,
    activation_field,
    activation_name,
    bart,
    encoder_decoder_problems,
    export_fields,
    hinted_problems,
    import_fields,
    media,
    merge_config,
    owned_keys,
    part_types,
    read_json,
)
from pentad.interop.keymap import WB, Rule, RuleSpec, expand

EMBEDDINGS: list[RuleSpec] = [
    ("embedding.speech.convs.0.{wb}", "{p}encoder.conv1.{wb}"),
    ("embedding.speech.convs.1.{wb}", "{p}encoder.conv2.{wb}"),
    ((), "{p}encoder.embed_positions.weight", "sinusoidal:{source_positions}:{hidden}:t2t"),
    ("target_embedding.word.weight", "{p}decoder.embed_tokens.weight"),
    ("target_embedding.pos.weight", "{p}decoder.embed_positions.weight"),
    ("encoder.final_norm.{wb}", "{p}encoder.layer_norm.{wb}"),
    ("decoder.final_norm.{wb}", "{p}decoder.layer_norm.{wb}"),
]
# BART's layer rules (the same module names), but for the query/key/value biases: Whisper has no key bias.
SELF_ATTENTION: list[RuleSpec] = [
    ("{s}.layers.{layer}.attention.qkv.weight",
     ("{p}{s}.layers.{layer}.self_attn.q_proj.weight", "{p}{s}.layers.{layer}.self_attn.k_proj.weight",
      "{p}{s}.layers.{layer}.self_attn.v_proj.weight"), "fuse_qkv"),
    ("{s}.layers.{layer}.attention.qkv.bias",
     ("{p}{s}.layers.{layer}.self_attn.q_proj.bias", "{p}{s}.layers.{layer}.self_attn.v_proj.bias"),
     "qkv_bias_no_k"),
    *[rule for rule in bart.SELF_ATTENTION if ".qkv." not in rule[0]],
]
CROSS_ATTENTION: list[RuleSpec] = [
    ("decoder.layers.{layer}.cross_attention.kv.weight",
     ("{p}decoder.layers.{layer}.encoder_attn.k_proj.weight", "{p}decoder.layers.{layer}.encoder_attn.v_proj.weight"),
     "fuse_kv"),
    ("decoder.layers.{layer}.cross_attention.kv.bias", "{p}decoder.layers.{layer}.encoder_attn.v_proj.bias",
     "kv_bias_no_k"),
    *[rule for rule in bart.CROSS_ATTENTION if ".kv." not in rule[0]],
]
HEAD: list[RuleSpec] = [("target_embedding.word.weight", "proj_out.weight?", "tied")]

# WhisperConfig's defaults (the tiny model's shape).
DEFAULTS: dict[str, Any] = {
    "vocab_size": 51865, "num_mel_bins": 80, "encoder_layers": 4, "encoder_attention_heads": 6,
    "decoder_layers": 4, "decoder_attention_heads": 6, "decoder_ffn_dim": 1536, "encoder_ffn_dim": 1536,
    "activation_function": "gelu", "d_model": 384, "dropout": 0.0, "attention_dropout": 0.0,
    "activation_dropout": 0.0, "init_std": 0.02, "scale_embedding": False, "max_source_positions": 1500,
    "max_target_positions": 448, "pad_token_id": 50256, "bos_token_id": 50256, "eos_token_id": 50256,
    "decoder_start_token_id": 50257, "begin_suppress_tokens": [220, 50256], "tie_word_embeddings": True,
}
LAYER_NORM_EPS = 1e-5
GENERATION_CONFIG = "generation_config.json"
STEM = {"conv_channels": None, "kernel_sizes": [3, 3], "strides": [1, 2], "activation": "gelu", "scale": False}
# pentad's stacks besides the FIELDS: pre-norm with a final LayerNorm, biases everywhere.
STACK: dict[str, Any] = {"type": "transformer", "norm_position": "pre", "final_norm": True, "bias": True,
                         "layer_norm_eps": LAYER_NORM_EPS}
# config.json <-> pentad, in the order config.json is written: the encoder embedding is [speech,
# sinusoidal], the decoder's [word, pos]; one activation and dropout for both stacks and embeddings.
FIELDS: list[Field] = [
    Field("vocab_size", "vocab_size", int, lambda m: m.target_vocab_size or m.vocab_size),
    Field("num_mel_bins", "embedding.parts.0.feature_size", int),
    Field("d_model", "hidden_size", int),
    Field("encoder_layers", "encoder.num_layers", int),
    Field("encoder_attention_heads", "encoder.num_heads", int),
    Field("encoder_ffn_dim", "encoder.ffn_size", int, lambda m: m.encoder.ffn_size or 4 * m.hidden_size),
    Field("decoder_layers", "decoder.num_layers", int),
    Field("decoder_attention_heads", "decoder.num_heads", int),
    Field("decoder_ffn_dim", "decoder.ffn_size", int, lambda m: m.decoder.ffn_size or 4 * m.hidden_size),
    activation_field("activation_function", "encoder.activation", "decoder.activation"),
    Field("dropout", "encoder.dropout", float,
          also=("decoder.dropout", "embedding.dropout", "target_embedding.dropout")),
    Field("attention_dropout", "encoder.attention_dropout", float,
          lambda m: float(m.encoder.attention_dropout if m.encoder.attention_dropout is not None
                          else m.encoder.dropout), also=("decoder.attention_dropout",)),
    Field("init_std", "init_std", float),
    Field("scale_embedding", "target_embedding.parts.0.scale", bool),
    Field("max_source_positions", "embedding.parts.1.max_positions", int,
          lambda m: m.embedding.parts[1].max_positions),
    Field("max_target_positions", "target_embedding.parts.1.max_positions", int,
          lambda m: m.target_embedding.parts[1].max_positions),
    Field("tie_word_embeddings", write=lambda m: True),
    Field("is_encoder_decoder", write=lambda m: True),
]
OWNED = owned_keys(FIELDS)


def decoding(config: dict[str, Any], in_dir: Path | None) -> tuple[dict[str, Any], list[str]]:
    """The asr task's decoding settings of a Whisper checkpoint: from ``generation_config.json`` when
    the directory has one, else from config.json. Returns (task fields, notes)."""
    gen = read_json(in_dir / GENERATION_CONFIG) if in_dir is not None and (in_dir / GENERATION_CONFIG).is_file() \
        else {}
    c = {**DEFAULTS, **config, **gen}
    notes: list[str] = []
    forced = c.get("forced_decoder_ids") or []
    if forced and sorted(int(p) for p, _ in forced) == list(range(1, len(forced) + 1)):
        prompt = [int(t) for _, t in sorted(forced)]
    elif isinstance(c.get("no_timestamps_token_id"), int):
        prompt = [int(c["no_timestamps_token_id"])]
        if c.get("is_multilingual"):
            notes.append("task.decoder_prompt: <|notimestamps|> alone; a multilingual Whisper also reads a "
                         "language and a task token before it (e.g. <|en|> <|transcribe|>): add them")
    else:
        prompt = []
        notes.append("task.decoder_prompt: empty (the checkpoint names no forced decoder ids or no-timestamps "
                     "token); Whisper transcribes after <|notimestamps|>, so set it")
    positions = int(c["max_target_positions"])
    task = {"type": "asr", "decoder_start": int(c["decoder_start_token_id"]), "decoder_prompt": prompt,
            "suppress_tokens": [int(t) for t in c.get("suppress_tokens") or []],
            "begin_suppress_tokens": [int(t) for t in c.get("begin_suppress_tokens") or []],
            "target_seq_length": min(224, positions - len(prompt)), "max_new_tokens": positions - len(prompt) - 1,
            "audio": {"features": "whisper", "cmvn": False, "feature_size": int(c["num_mel_bins"]),
                      "sample_rate": 16000}}
    return task, notes


class WhisperFamily(HFFamily):
    name = "whisper"
    model_types = ("whisper",)
    # BART's cross-attention names and a convolutional stem: tried before BART and PEGASUS
    layout = KeyLayout(suffixes=("encoder.conv1.weight",), rank=30)
    tokenizer_kind = "tokenizer_json"
    tokenizer_class = "WhisperTokenizer"
    default_special_tokens = {"bos": "<|endoftext|>", "eos": "<|endoftext|>", "pad": "<|endoftext|>",
                              "unk": "<|endoftext|>"}
    token_types = False
    speech_padding = False  # Whisper always reads 30 s chunks: no padding mask

    def describes(self, model: Any) -> bool:
        # Whisper's stem has a stride-1 convolution first; Speech2Text subsamples at every layer
        if media(model) != "speech":
            return False
        strides = part_types(model)["speech"].strides
        return bool(strides) and strides[0] == 1

    def outputs(self, architecture: str) -> dict[str, str]:
        return {"lm": "logits"} if architecture == "WhisperForConditionalGeneration" else {}

    def speech_inputs(self, audio: Tensor, padding: Tensor | None) -> dict[str, Tensor]:
        """transformers' Whisper reads features [batch, bins, frames]."""
        return {"input_features": audio.transpose(1, 2).contiguous()}

    def task_config(self, config: dict[str, Any], in_dir: Path | None) -> tuple[dict[str, Any] | None, list[str]]:
        return decoding(config, in_dir)

    def rules(self, *, prefix: str, encoder_layers: int, decoder_layers: int, source_positions: int, hidden: int,
              head: bool) -> list[Rule]:
        rules = expand(EMBEDDINGS + (HEAD if head else []), p=prefix, wb=WB, source_positions=source_positions,
                       hidden=hidden)
        rules += expand(SELF_ATTENTION, p=prefix, s="encoder", layer=range(encoder_layers), wb=WB)
        rules += expand(SELF_ATTENTION + CROSS_ATTENTION, p=prefix, s="decoder", layer=range(decoder_layers), wb=WB)
        return rules

    # -- import -----------------------------------------------------------------------------------
    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, ("WhisperForConditionalGeneration", "WhisperModel"))
        activation(c["activation_function"], problems, "activation_function")
        if not c.get("tie_word_embeddings", True):
            problems.append("tie_word_embeddings false (an output layer apart from the decoder's word table): pentad "
                            "converts Whisper with the tied one")
        if problems:
            raise UserError(f"cannot convert {label} (whisper): " + "; ".join(problems) + ".")
        prefix = "model." if any(k.startswith("model.") for k in keys) else ""
        head = prefix == "model."  # a WhisperModel's keys have no prefix; proj_out is tied (often not saved)
        hidden, source, target = int(c["d_model"]), int(c["max_source_positions"]), int(c["max_target_positions"])
        model = import_fields(FIELDS, c, {
            "max_seq_length": target, "tie_word_embeddings": True,
            "embedding": {"parts": [{"type": "speech", **STEM, "conv_channels": [hidden, hidden]},
                                    {"type": "sinusoidal", "interleave": False, "spacing": "tensor2tensor"}],
                          "norm": False},
            "target_embedding": {"parts": [{"type": "word"}, {"type": "pos"}], "norm": False},
            "encoder": {**STACK, "mask": "bidirectional"}, "decoder": dict(STACK),
            "targets": [{"type": "lm", "bias": False}],
        })
        notes = ["key projections: Whisper's have no bias; pentad's fused projections hold a zero one (the export "
                 "drops it)"]
        if float(c.get("activation_dropout", 0.0)):
            notes.append(f"activation_dropout {c['activation_dropout']} has no pentad counterpart (training only)")
        arch = "WhisperForConditionalGeneration" if head else "WhisperModel"
        rules = self.rules(prefix=prefix, encoder_layers=int(c["encoder_layers"]),
                           decoder_layers=int(c["decoder_layers"]), source_positions=source, hidden=hidden, head=head)
        return ImportPlan(model, rules, arch, [], notes)

    # -- export -----------------------------------------------------------------------------------
    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        problems: list[str] = []
        enc, dec = model.encoder, model.decoder
        if dec is None or model.target_embedding is None:
            raise UserError(f"cannot export {label} as whisper: it has no decoder (Whisper is an encoder-decoder).")
        hidden = model.hidden_size
        parts = list(model.embedding.parts)
        kinds = [p.type for p in parts]
        source = None
        if kinds != ["speech", "sinusoidal"]:
            problems.append(f"model.embedding.parts is {kinds}; Whisper has speech and sinusoidal")
        else:
            speech, table = parts
            stem = {k: getattr(speech, k) for k in STEM if k != "conv_channels"}
            if stem != {k: v for k, v in STEM.items() if k != "conv_channels"} or \
                    list(speech.conv_channels) != [hidden, hidden]:
                problems.append(f"the speech part is {dict(stem, conv_channels=speech.conv_channels)}; Whisper's stem "
                                f"is {dict(STEM, conv_channels=[hidden, hidden])}")
            if table.interleave or table.spacing != "tensor2tensor" or table.offset:
                problems.append("the encoder's sinusoidal positions must be interleave: false, spacing: "
                                "tensor2tensor, offset 0 (Whisper's table)")
            source = table.max_positions
        target_parts = list(model.target_embedding.parts)
        if [p.type for p in target_parts] != ["word", "pos"]:
            problems.append(f"model.target_embedding.parts is {[p.type for p in target_parts]}; Whisper has word "
                            "and pos")
        for path, slot in (("model.embedding", model.embedding), ("model.target_embedding", model.target_embedding)):
            if slot.norm:
                problems.append(f"{path}.norm is on; Whisper does not normalise its embeddings")
        if not model.tie_word_embeddings:
            problems.append("Whisper's output layer is the decoder's word table (tie_word_embeddings: true)")
        problems += encoder_decoder_problems(enc, dec, "whisper", hidden, pre_norm=True, layer_norm_eps=LAYER_NORM_EPS)
        targets = list(model.targets)
        if len(targets) != 1 or targets[0].type != "lm" or targets[0].bias or targets[0].scale_hidden:
            problems.append(f"targets {[t.type for t in targets]}: Whisper has one lm head without a bias")
        base = dict(base_config or {})
        act = activation_name(base.get("activation_function"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as whisper: " + "; ".join(problems) + ".")
        config = {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
                  **export_fields(FIELDS, model, base)}
        for key, value in (("pad_token_id", pad_id), ("eos_token_id", eos_id)):
            if key not in base and value is not None:
                config[key] = value
        notes = ["key projections: pentad's key biases are dropped (Whisper has none; exact, as a key bias shifts "
                 "every score of a query alike)"]
        vocab = config["vocab_size"]
        for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            if key not in base and key not in config and DEFAULTS[key] >= vocab:
                config[key] = vocab - 1  # WhisperConfig's default id is outside a smaller vocabulary
                notes.append(f"{key}: {vocab - 1} (the last id; Whisper's default {DEFAULTS[key]} is outside the "
                             f"{vocab}-entry vocabulary): set it to your tokenizer's")
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="model.", encoder_layers=enc.num_layers, decoder_layers=dec.num_layers,
                           source_positions=source, hidden=hidden, head=True)
        return ExportPlan(config, rules, "WhisperForConditionalGeneration", set(), notes)


FAMILY = WhisperFamily()
