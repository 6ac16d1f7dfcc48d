"""CLIP (``model_type: clip``, ``CLIPModel``): key map and config translation, both ways.

A CLIPModel is a pentad model with two streams, text and image (see ``docs/streams.md``), with a ``clr`` head:

==============================================  ===========================================================
Hugging Face                                    pentad
==============================================  ===========================================================
``text_model.embeddings`` (token, position)     stream 0: the model's ``embedding`` slot (word, pos; no norm)
``text_model.encoder`` + ``final_layer_norm``   ``encoder`` (pre-norm causal transformer, final norm),
                                                pooled at the last real token (``pooling: last``)
``vision_model.embeddings`` (class, patch,      stream 1: ``streams.image.embedding`` (patch part without bias and
position) + ``pre_layrnorm``                    with a CLS vector, pos; the slot's norm)
``vision_model.encoder`` + ``post_layernorm``   ``streams.image.encoder`` (pre-norm bidirectional, final norm),
                                                pooled at CLS (``pooling: first``)
``text_projection`` / ``visual_projection``     ``targets.clr.projection_0`` / ``projection_1`` (no bias)
``logit_scale`` (a log)                         ``targets.clr.logit_scale`` (a log: the same number)
==============================================  ===========================================================

The tokenizer is the checkpoint's ``tokenizer.json`` run as it is (pentad's ``tokenizer_json``), with
CLIP's start and end of text as the bos/cls and eos/sep tokens (padding: the end of text, as
CLIPTokenizer pads). Separate query/key/value Linears become pentad's fused ``qkv``. The ``position_ids`` buffers that
older checkpoints carry are consumed and never written. HF pools the text at the end-of-text token
(the first ``eos_token_id``; with the legacy ``eos_token_id: 2`` the largest id of the row);
pentad pools at the last real (non-padding) token: the two agree on inputs that end with the
end-of-text token and are padded after it, as the CLIP tokenizer writes them. pentad caps
``exp(logit_scale)`` at ``max_logit_scale`` (100, as CLIP's training does); HF's forward does not cap it.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from pentad.components.stream import shares, stream_embedding, stream_encoder, stream_names, stream_sizes
from pentad.errors import UserError
from pentad.interop.hf import (
    ExportPlan,
    Field,
    HFFamily,
    ImportPlan,
    activation,
    activation_field,
    activation_name,
    export_fields,
    hinted_problems,
    import_fields,
    media,
    merge_config,
    owned_keys,
    stack_problems,
    with_rows,
)
from pentad.interop.keymap import WB, Rule, RuleSpec, expand

_LAYER: list[RuleSpec] = [
    ("{ours}encoder.layers.{layer}.attention_norm.{wb}", "{theirs}encoder.layers.{layer}.layer_norm1.{wb}"),
    ("{ours}encoder.layers.{layer}.attention.qkv.{wb}",
     ("{theirs}encoder.layers.{layer}.self_attn.q_proj.{wb}", "{theirs}encoder.layers.{layer}.self_attn.k_proj.{wb}",
      "{theirs}encoder.layers.{layer}.self_attn.v_proj.{wb}"), "fuse_qkv"),
    ("{ours}encoder.layers.{layer}.attention.out.{wb}", "{theirs}encoder.layers.{layer}.self_attn.out_proj.{wb}"),
    ("{ours}encoder.layers.{layer}.ffn_norm.{wb}", "{theirs}encoder.layers.{layer}.layer_norm2.{wb}"),
    ("{ours}encoder.layers.{layer}.ffn.up.{wb}", "{theirs}encoder.layers.{layer}.mlp.fc1.{wb}"),
    ("{ours}encoder.layers.{layer}.ffn.down.{wb}", "{theirs}encoder.layers.{layer}.mlp.fc2.{wb}"),
]
TEXT: list[RuleSpec] = [
    ("embedding.word.weight", "text_model.embeddings.token_embedding.weight"),
    ("embedding.pos.weight", "text_model.embeddings.position_embedding.weight"),
    ("encoder.final_norm.{wb}", "text_model.final_layer_norm.{wb}"),
    ((), ("text_model.embeddings.position_ids?",), "ignore"),
]
VISION: list[RuleSpec] = [
    ("{image}embedding.patch.cls", "vision_model.embeddings.class_embedding"),
    ("{image}embedding.patch.proj.weight", "vision_model.embeddings.patch_embedding.weight"),
    ("{image}embedding.pos.weight", "vision_model.embeddings.position_embedding.weight"),
    ("{image}embedding.norm.{wb}", "vision_model.pre_layrnorm.{wb}"),
    ("{image}encoder.final_norm.{wb}", "vision_model.post_layernorm.{wb}"),
    ((), ("vision_model.embeddings.position_ids?",), "ignore"),
]
HEAD: list[RuleSpec] = [
    ("targets.{clr}.projection_0.weight", "text_projection.weight"),
    ("targets.{clr}.projection_1.weight", "visual_projection.weight"),
    ("targets.{clr}.logit_scale", "logit_scale"),
]

TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
    "num_attention_heads": 8, "max_position_embeddings": 77, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
    "attention_dropout": 0.0, "dropout": 0.0, "initializer_range": 0.02, "pad_token_id": 1, "bos_token_id": 49406,
    "eos_token_id": 49407,
}
VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
    "attention_dropout": 0.0, "dropout": 0.0, "initializer_range": 0.02,
}
SUPPORTED = ("CLIPModel",)
LOGIT_SCALE_INIT = 2.6592  # HF's default logit_scale_init_value, log(1 / 0.07) to 4 decimals

# A tower's sub-config (text_config, vision_config) <-> pentad, in the order it is written. Paths are
# below a tower: the text tower is the model itself; the image tower is the second stream (its hidden
# size, embedding and encoder; pentad has one init_std, the text tower's, so the image tower's
# initializer_range is read into nothing). CLIPModel reads the top-level projection_dim; a tower's own
# is kept as it was. A tower's dropout is written after these rows, and only where it is not zero or
# the imported sub-config has one (transformers 5 writes no dropout key).
TOWER: dict[str, Any] = {"type": "transformer", "norm_position": "pre", "final_norm": True, "bias": True}
TOWER_FIELDS: list[Field] = [
    Field("hidden_size", "hidden_size", int),
    Field("intermediate_size", "encoder.ffn_size", int, lambda t: t.encoder.ffn_size or 4 * t.hidden_size),
    Field("projection_dim", kept=True, write=lambda t: int(t.targets[0].feature_size or t.hidden_size)),
    Field("num_hidden_layers", "encoder.num_layers", int),
    Field("num_attention_heads", "encoder.num_heads", int),
    activation_field("hidden_act", "encoder.activation"),
    Field("layer_norm_eps", "encoder.layer_norm_eps", float),
    Field("attention_dropout", "encoder.attention_dropout", float,
          lambda t: float(t.encoder.attention_dropout if t.encoder.attention_dropout is not None
                          else t.encoder.dropout)),
    Field("initializer_range", "init_std", float),
]
# The token ids are computed by the planner (the tokenizer's, else the imported config's, else CLIP's).
TEXT_FIELDS: list[Field] = [
    *TOWER_FIELDS,
    Field("vocab_size", "vocab_size", int),
    Field("max_position_embeddings", "max_seq_length", int),
    Field("model_type", write=lambda t: "clip_text_model"),
    Field("pad_token_id"), Field("eos_token_id"), Field("bos_token_id"),
]
# The image tower's patch part is parts.0 of its embedding, whose norm has the layers' eps.
VISION_FIELDS: list[Field] = [
    *with_rows(TOWER_FIELDS, Field("layer_norm_eps", "encoder.layer_norm_eps", float,
                                   also=("embedding.layer_norm_eps",))),
    Field("num_channels", "embedding.parts.0.channels", int),
    Field("image_size", write=lambda t: t.embedding.parts[0].image_size[0]),
    Field("patch_size", "embedding.parts.0.patch_size", int),
    Field("model_type", write=lambda t: "clip_vision_model"),
]
# config.json <-> pentad: the clr target is targets.0; the towers' sub-configs are computed.
FIELDS: list[Field] = [
    Field("projection_dim", write=lambda m: int(m.targets[0].feature_size or m.hidden_size)),
    Field("logit_scale_init_value", read=float, kept=True,
          write=lambda m: round(math.log(1.0 / m.targets[0].init_temperature), 4)),
    Field("text_config"),
    Field("vision_config"),
]
OWNED = owned_keys(FIELDS)


def _tower_problems(c: dict[str, Any], which: str, problems: list[str]) -> None:
    """What keeps one CLIP tower (HF's sub-config ``c``, defaults applied) from pentad's transformer."""
    activation(c["hidden_act"], problems, f"{which}_config.hidden_act")
    hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    if hidden % heads:
        problems.append(f"{which}_config.hidden_size {hidden} is not divisible by num_attention_heads {heads}")


def _tower_config(table: list[Field], tower: Any, old: Any, dropout: float, **ids: Any) -> dict[str, Any]:
    """One tower's sub-config: ``old`` (the imported one) with the table's rows written over it."""
    old = dict(old) if isinstance(old, dict) else {}
    own = export_fields(table, tower, old, **ids)
    if dropout or "dropout" in old:
        own["dropout"] = dropout
    kept = {k: v for k, v in old.items() if k not in own and k not in ("dropout", "transformers_version")}
    return {**kept, **own}


class CLIPFamily(HFFamily):
    name = "clip"
    model_types = ("clip",)
    # CLIP's BPE (lower-cased, '</w>' word ends, its own pre-tokenizer) is run from its tokenizer.json as it is
    tokenizer_kind = "tokenizer_json"
    tokenizer_class = "CLIPTokenizer"
    default_special_tokens = {"bos": "<|startoftext|>", "eos": "<|endoftext|>", "cls": "<|startoftext|>",
                              "sep": "<|endoftext|>", "pad": "<|endoftext|>", "unk": "<|endoftext|>"}
    needs_tokenizer = True
    verify_batch = "one seeded batch of images and of texts ending with the end-of-text token, two padded after it"
    two_towers = True
    token_types = False

    def describes(self, model: Any) -> bool:
        return media(model) == "two_towers"  # the only two-tower model Hugging Face has a class for

    def outputs(self, architecture: str) -> dict[str, str]:
        return {"clr": "logits_per_text"}

    def image_task(self, architecture: str) -> tuple[str, str] | None:
        return "image_text", "clip"

    def pad_token_id(self, config: dict[str, Any]) -> int:
        value = (config.get("text_config") or {}).get("pad_token_id", TEXT_DEFAULTS["pad_token_id"])
        return int(value) if isinstance(value, int) else 1

    def rules(self, *, text_layers: int, vision_layers: int, clr: str, image: str = "image") -> list[Rule]:
        """``image``: the name of the image stream (its parameters are ``streams.<image>.*``)."""
        prefix = f"streams.{image}."
        return (expand(TEXT + HEAD, wb=WB, clr=clr)
                + expand(_LAYER, ours="", theirs="text_model.", layer=range(text_layers), wb=WB)
                + expand(VISION, wb=WB, image=prefix)
                + expand(_LAYER, ours=prefix, theirs="vision_model.", layer=range(vision_layers), wb=WB))

    # -- import -----------------------------------------------------------------------------------
    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        problems = hinted_problems(config, SUPPORTED)
        text_raw, vision_raw = config.get("text_config") or {}, config.get("vision_config") or {}
        if not isinstance(text_raw, dict) or not isinstance(vision_raw, dict):
            raise UserError(f"cannot convert {label} (clip): text_config and vision_config must be JSON objects.")
        text, vision = {**TEXT_DEFAULTS, **text_raw}, {**VISION_DEFAULTS, **vision_raw}
        _tower_problems(text, "text", problems)
        _tower_problems(vision, "vision", problems)
        image, patch = vision["image_size"], vision["patch_size"]
        if not isinstance(image, int) or not isinstance(patch, int):
            problems.append(f"vision_config image_size {image!r} / patch_size {patch!r} (CLIP's are one integer each)")
            image = patch = 1
        elif image % patch:
            problems.append(f"vision_config.image_size {image} is not a multiple of patch_size {patch}")
        if "text_projection.weight" not in keys or "visual_projection.weight" not in keys:
            problems.append("no text_projection / visual_projection in the weights (only a whole CLIPModel converts)")
        if problems:
            raise UserError(f"cannot convert {label} (clip): " + "; ".join(problems) + ".")
        init = config.get("logit_scale_init_value", LOGIT_SCALE_INIT)
        init = float(init) if isinstance(init, (int, float)) else LOGIT_SCALE_INIT
        vision_tower = import_fields(VISION_FIELDS, vision, {
            "embedding": {"parts": [{"type": "patch", "image_size": [image, image], "bias": False}, {"type": "pos"}],
                          "norm": True, "dropout": 0.0},
            "encoder": {**TOWER, "mask": "bidirectional", "dropout": float(vision.get("dropout") or 0.0)}})
        model = import_fields(TEXT_FIELDS, text, {
            "tie_word_embeddings": False,
            "embedding": {"parts": ["word", {"type": "pos"}], "norm": False, "dropout": 0.0},
            "encoder": {**TOWER, "mask": "causal", "dropout": float(text.get("dropout") or 0.0)},
            "streams": {"text": {"pooling": "last"},
                        "image": {"hidden_size": vision_tower["hidden_size"],
                                  "max_seq_length": (image // patch) ** 2 + 1, "embedding": vision_tower["embedding"],
                                  "encoder": vision_tower["encoder"], "pooling": "first"}},
            "targets": [{"type": "clr", "projection": True, "feature_size": int(keys["text_projection.weight"][0]),
                         "init_temperature": math.exp(-init), "max_logit_scale": 100.0}],
        })
        notes = ["text pooling: pentad pools the last real token; Hugging Face CLIP pools the end-of-text token. "
                 "They agree on texts that end with the end-of-text token and are padded after it, as the CLIP "
                 "tokenizer writes them"]
        rules = self.rules(text_layers=model["encoder"]["num_layers"],
                           vision_layers=vision_tower["encoder"]["num_layers"], clr="clr")
        return ImportPlan(model, rules, "CLIPModel", [], notes)

    # -- export -----------------------------------------------------------------------------------
    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        problems: list[str] = []
        notes: list[str] = []
        names = stream_names(model)
        if not names or shares(model):
            raise UserError(f"cannot export {label} as clip: CLIP is a two-tower model (model.streams, the second "
                            "stream with modules of its own); found "
                            + ("one stream" if not names else "a second stream sharing the first's modules") + ".")
        first, image = names
        text_stack, vision_stack = model.encoder, stream_encoder(model, image)
        sizes = stream_sizes(model, image)
        vision_embedding = stream_embedding(model, image)
        vision_hidden = int(sizes.hidden_size)
        text_parts = [p.type for p in model.embedding.parts]
        if text_parts != ["word", "pos"] or model.embedding.norm:
            problems.append(f"model.embedding is {text_parts} with norm {model.embedding.norm}; CLIP's text embedding "
                            "is word then pos without a norm")
        elif (model.embedding.parts[1].max_positions or model.max_seq_length) != model.max_seq_length:
            problems.append("the text pos table and model.max_seq_length differ")
        if model.embedding_size not in (None, model.hidden_size) or model.decoder is not None:
            problems.append("CLIP's text tower has no factorised embedding and no decoder")
        parts = {p.type: p for p in vision_embedding.parts}
        if [p.type for p in vision_embedding.parts] != ["patch", "pos"]:
            problems.append(f"model.streams.{image}.embedding.parts is {[p.type for p in vision_embedding.parts]}; "
                            "CLIP's image embedding is patch then pos")
        else:
            patch = parts["patch"]
            if not patch.cls or patch.bias or patch.image_size[0] != patch.image_size[1] \
                    or patch.image_size[0] % patch.patch_size:
                problems.append("the patch part must have a CLS vector, no bias and a square image a multiple of the "
                                "patch size (CLIP's layout)")
            elif (parts["pos"].max_positions or sizes.max_seq_length) != patch.length:
                problems.append(f"the image pos table has {parts['pos'].max_positions or sizes.max_seq_length} rows; "
                                f"CLIP has one per CLS and patch ({patch.length})")
        if not vision_embedding.norm:
            problems.append(f"model.streams.{image}.embedding.norm is off; CLIP normalises the image embedding "
                            "(pre_layrnorm)")
        for path, stack, mask, width in (("model.encoder", text_stack, "causal", model.hidden_size),
                                         (f"model.streams.{image}.encoder", vision_stack, "bidirectional",
                                          vision_hidden)):
            final_norm = stack.final_norm if stack.final_norm is not None else stack.norm_position == "pre"
            if stack.type != "transformer" or stack.norm_position != "pre" or not final_norm or stack.mask != mask \
                    or not stack.bias:
                problems.append(f"{path} must be a pre-norm {mask} transformer with biases and a final norm")
            else:
                problems += stack_problems(stack, path, "clip", width)
                if activation_name(None, stack.activation) is None:
                    problems.append(f"{path}.activation '{stack.activation}' has no HF name")
        pooling = (model.streams[first].pooling, model.streams[image].pooling)
        if pooling != ("last", "first"):
            problems.append(f"the streams pool {pooling}; CLIP pools the text's end token (last) and the "
                            "image's CLS (first)")
        if vision_embedding.norm and vision_embedding.layer_norm_eps != vision_stack.layer_norm_eps:
            problems.append("the image embedding norm's eps differs from the image layers' (CLIP has one)")
        targets = list(model.targets)
        target = targets[0] if len(targets) == 1 and targets[0].type == "clr" else None
        if target is None:
            problems.append(f"targets {[t.type for t in targets]}: CLIP has exactly one clr head")
        elif target.streams not in (None, list(names)):
            problems.append(f"the clr head reads streams {target.streams}; CLIP compares text with image")
        elif not target.projection or target.temperature is not None:
            problems.append("the clr head must project both streams (projection: true) and learn its logit scale "
                            "(no fixed temperature), as CLIPModel does")
        if problems:
            raise UserError(f"cannot export {label} as clip: " + "; ".join(problems) + ".")
        assert target is not None
        base = dict(base_config or {})
        old_text = base.get("text_config") if isinstance(base.get("text_config"), dict) else {}
        ids: dict[str, Any] = {}
        for key, value, fallback in (("pad_token_id", pad_id, 1), ("eos_token_id", eos_id, model.vocab_size - 1),
                                     ("bos_token_id", None, model.vocab_size - 2)):
            ids[key] = old_text.get(key, value if value is not None else fallback)
        if "eos_token_id" not in old_text and eos_id is None:
            notes.append(f"text_config.eos_token_id is {ids['eos_token_id']} (the last id, as in CLIP's vocabulary): "
                         "Hugging Face pools the text at this token; set it to your tokenizer's end-of-text id")
        image_tower = SimpleNamespace(hidden_size=vision_hidden, init_std=model.init_std, targets=model.targets,
                                      embedding=vision_embedding, encoder=vision_stack)
        text_cfg = _tower_config(TEXT_FIELDS, model, old_text, float(text_stack.dropout), **ids)
        vision_cfg = _tower_config(VISION_FIELDS, image_tower, base.get("vision_config"), float(vision_stack.dropout))
        for name, drop in (("text", model.embedding.dropout), ("image", vision_embedding.dropout)):
            if float(drop):
                notes.append(f"the {name} embedding's dropout {drop} has no place in CLIP's config (training only)")
        config = merge_config(base, OWNED, {"architectures": ["CLIPModel"], "model_type": "clip", **export_fields(
            FIELDS, model, base, text_config=text_cfg, vision_config=vision_cfg)})
        if target.max_logit_scale != 100.0:
            notes.append(f"max_logit_scale {target.max_logit_scale:g}: Hugging Face's CLIPModel does not cap the "
                         "logit scale in its forward")
        rules = self.rules(text_layers=text_stack.num_layers, vision_layers=vision_stack.num_layers,
                           clr=target.target_name, image=image)
        return ExportPlan(config, rules, "CLIPModel", set(), notes)


FAMILY = CLIPFamily()
