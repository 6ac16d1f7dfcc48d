"""ViT (``model_type: vit``): key map and config translation, both ways.

==================================  =========================================================
Hugging Face                        pentad
==================================  =========================================================
``ViTForImageClassification``       ``cls`` target, ``pooling: first``, ``pooler: false`` (HF
                                    classifies the final-norm CLS state; no pooler)
``ViTModel``                        ``cls`` target whose classifier is not in the checkpoint: it is
                                    written as zeros, recorded in ``interop.json`` and left out again
                                    on export while still zero. The pooler (dense + tanh over the
                                    CLS state) is the target's ``pooler`` (``pooler: true``); a
                                    ViTModel saved without one gets ``pooler: false``
==================================  =========================================================

Embeddings: the patch projection (a Conv2d, its bias kept) and ``cls_token`` [1, 1, H] are the
``patch`` part's ``proj`` and ``cls`` [H]; ``position_embeddings`` [1, 1 + N, H] is the ``pos``
part's table [1 + N, H] (``max_seq_length`` is 1 + the number of patches). Layers are pre-norm
(``layernorm_before`` -> ``attention_norm``, ``layernorm_after`` -> ``ffn_norm``) with a final
norm (``vit.layernorm``); separate query/key/value Linears become pentad's fused ``qkv``.

Weights are read and written in the layout ``save_pretrained`` writes and the Hub holds
(``vit.encoder.layer.N.attention.attention.query``, ...); transformers 5 renames them to its
in-memory names when it loads them. The image processor (``preprocessor_config.json``) is not a
model weight: its mean/std choose the run's ``task.normalise`` when they are one pentad knows.
"""

from __future__ import annotations

from typing import Any

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
)
from pentad.interop.keymap import WB, Rule, RuleSpec, expand


def read_config(config: dict[str, Any], defaults: dict[str, Any], supported: Any
                ) -> tuple[dict[str, Any], list[str], str]:
    """A timm-style vision config (ViT, ViLT) with its defaults filled in, the problems found so far (keys
    pentad cannot honour, the activation, query/key/value without biases) and the pentad activation."""
    c = {**defaults, **config}
    problems = hinted_problems(config, supported)
    act = activation(c["hidden_act"], problems)
    if not c.get("qkv_bias", True):
        problems.append("qkv_bias false (query/key/value without biases while the other layers have them) "
                        "is not supported")
    return c, problems, act


# pentad's encoder of HF's timm-style vision encoders (ViT, ViLT), besides its ENCODER_FIELDS: pre-norm
# layers with a final norm, bidirectional, biases everywhere.
ENCODER: dict[str, Any] = {"type": "transformer", "norm_position": "pre", "final_norm": True, "mask": "bidirectional",
                           "bias": True}
# config.json <-> pentad rows that ViT and ViLT share, in the order both write them (hidden_dropout_prob is
# the embedding's dropout too).
ENCODER_FIELDS: list[Field] = [
    Field("hidden_size", "hidden_size", int),
    Field("num_hidden_layers", "encoder.num_layers", int),
    Field("num_attention_heads", "encoder.num_heads", int),
    Field("intermediate_size", "encoder.ffn_size", int, lambda m: m.encoder.ffn_size or 4 * m.hidden_size),
    activation_field("hidden_act", "encoder.activation"),
    Field("hidden_dropout_prob", "encoder.dropout", float, also=("embedding.dropout",)),
    Field("attention_probs_dropout_prob", "encoder.attention_dropout", float,
          lambda m: float(m.encoder.attention_dropout if m.encoder.attention_dropout is not None
                          else m.encoder.dropout)),
    Field("initializer_range", "init_std", float),
    Field("layer_norm_eps", "encoder.layer_norm_eps", float),
]


def encoder_problems(model: Any, name: str, problems: list[str]) -> str | None:
    """Add to ``problems`` what keeps ``model``'s encoder from HF's timm-style vision encoder (``name``:
    ViT or ViLT): pre-norm, bidirectional, a final norm, biases, a stack HF can hold; returns the HF
    name of its activation (None, with a problem, when there is none)."""
    enc = model.encoder
    final_norm = enc.final_norm if enc.final_norm is not None else enc.norm_position == "pre"
    if enc.type != "transformer" or enc.norm_position != "pre" or not final_norm or enc.mask != "bidirectional":
        problems.append(f"model.encoder must be a pre-norm bidirectional transformer with a final norm (found "
                        f"{enc.type}, norm_position {enc.norm_position}, final_norm {final_norm}, mask {enc.mask})")
    if not enc.bias:
        problems.append(f"model.encoder.bias is off; HF {name} layers have biases")
    problems += stack_problems(enc, "model.encoder", name.lower(), model.hidden_size)
    act = activation_name(None, enc.activation)
    if act is None:
        problems.append(f"activation '{enc.activation}' has no HF name")
    return act


# The pre-norm layers and final norm of HF's timm-style vision encoders (ViT, ViLT); {prefix} as below.
LAYERS: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention_norm.{wb}", "{prefix}encoder.layer.{layer}.layernorm_before.{wb}"),
    ("encoder.layers.{layer}.attention.qkv.{wb}",
     ("{prefix}encoder.layer.{layer}.attention.attention.query.{wb}",
      "{prefix}encoder.layer.{layer}.attention.attention.key.{wb}",
      "{prefix}encoder.layer.{layer}.attention.attention.value.{wb}"), "fuse_qkv"),
    ("encoder.layers.{layer}.attention.out.{wb}", "{prefix}encoder.layer.{layer}.attention.output.dense.{wb}"),
    ("encoder.layers.{layer}.ffn_norm.{wb}", "{prefix}encoder.layer.{layer}.layernorm_after.{wb}"),
    ("encoder.layers.{layer}.ffn.up.{wb}", "{prefix}encoder.layer.{layer}.intermediate.dense.{wb}"),
    ("encoder.layers.{layer}.ffn.down.{wb}", "{prefix}encoder.layer.{layer}.output.dense.{wb}"),
    ("encoder.final_norm.{wb}", "{prefix}layernorm.{wb}"),
]
# {prefix}: "vit." inside ViTForImageClassification, "" for a bare ViTModel checkpoint.
BODY: list[RuleSpec] = [
    ("embedding.patch.cls", "{prefix}embeddings.cls_token", "leading_ones:2"),
    ("embedding.pos.weight", "{prefix}embeddings.position_embeddings", "leading_ones:1"),
    ("embedding.patch.proj.{pb}", "{prefix}embeddings.patch_embeddings.projection.{pb}"),
    *LAYERS,
]
POOLER: list[RuleSpec] = [("targets.{cls}.pooler.{wb}", "{prefix}pooler.dense.{wb}")]
CLASSIFIER: list[RuleSpec] = [("targets.{cls}.classifier.{wb}", "classifier.{wb}")]
UNUSED_POOLER: list[RuleSpec] = [((), ("{prefix}pooler.dense.weight?", "{prefix}pooler.dense.bias?"), "ignore")]

DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12, "image_size": 224, "patch_size": 16, "num_channels": 3,
    "qkv_bias": True, "pooler_output_size": None, "pooler_act": "tanh",
}
# config.json <-> pentad, in the order config.json is written. Computed by the planners: the image size
# (one number or [height, width]) on import; the patch part is parts.0.
FIELDS: list[Field] = [
    *ENCODER_FIELDS,
    Field("image_size", write=lambda m: m.embedding.parts[0].image_size[0]
          if m.embedding.parts[0].image_size[0] == m.embedding.parts[0].image_size[1]
          else list(m.embedding.parts[0].image_size)),
    Field("patch_size", "embedding.parts.0.patch_size", int),
    Field("num_channels", "embedding.parts.0.channels", int),
    Field("qkv_bias", write=lambda m: True),
    Field("pooler_output_size", kept=True, write=lambda m: None),  # pentad's pooler is H -> H
    Field("pooler_act", write=lambda m: "tanh"),
]
OWNED = owned_keys(FIELDS, "id2label", "label2id", "num_labels")
SUPPORTED = ("ViTForImageClassification", "ViTModel")


def _pair(value: Any, key: str, problems: list[str]) -> list[int]:
    """HF's image_size / patch_size: one number or [height, width]."""
    if isinstance(value, int):
        return [value, value]
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return [int(v) for v in value]
    problems.append(f"{key} {value!r} (expected an integer or [height, width])")
    return [1, 1]


class ViTFamily(HFFamily):
    name = "vit"
    model_types = ("vit",)
    tokenizer_kind = None
    tokenizer_note = "a ViT reads images and has no tokenizer"
    needs_tokenizer = False
    verify_batch = "one seeded batch of images"
    token_types = False
    states_before_final_norm = True  # HF's hidden_states end before ``vit.layernorm``

    def describes(self, model: Any) -> bool:
        return media(model) == "image"

    def outputs(self, architecture: str) -> dict[str, str]:
        if architecture == "ViTForImageClassification":
            return {"cls": "logits"}
        return {"cls:pooled": "pooler_output"}

    def rules(self, *, prefix: str, num_layers: int, heads: set[str], cls: str, proj_bias: bool) -> list[Rule]:
        specs = list(BODY)
        if "pooler" in heads:
            specs += POOLER
        if "classifier" in heads:
            specs += CLASSIFIER
        if "ignored_pooler" in heads:
            specs += UNUSED_POOLER
        return expand(specs, prefix=prefix, layer=range(num_layers), wb=WB, pb=WB if proj_bias else ("weight",),
                      cls=cls)

    # -- import -----------------------------------------------------------------------------------
    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c, problems, _ = read_config(config, DEFAULTS, SUPPORTED)
        hidden = int(c["hidden_size"])
        if c.get("pooler_output_size") not in (None, hidden) or c.get("pooler_act", "tanh") != "tanh":
            problems.append(f"a pooler of width {c.get('pooler_output_size')} or activation "
                            f"'{c.get('pooler_act')}' (pentad's cls pooler is dense H -> H + tanh)")
        image = _pair(c["image_size"], "image_size", problems)
        patch = c["patch_size"]
        if not isinstance(patch, int):
            problems.append(f"patch_size {patch!r} (pentad's patches are square: one integer)")
            patch = 1
        if problems:
            raise UserError(f"cannot convert {label} (vit): " + "; ".join(problems) + ".")
        prefix = "vit." if any(k.startswith("vit.") for k in keys) else ""
        has_classifier = "classifier.weight" in keys
        has_pooler = f"{prefix}pooler.dense.weight" in keys
        proj_bias = f"{prefix}embeddings.patch_embeddings.projection.bias" in keys
        notes: list[str] = []
        synthesized: list[str] = []
        heads: set[str] = set()
        dropout = float(c["hidden_dropout_prob"])
        if has_classifier:
            arch = "ViTForImageClassification"
            heads.add("classifier")
            num_labels = int(keys["classifier.weight"][0])
            if num_labels < 2:
                raise UserError(f"cannot convert {label} (vit): a classifier with {num_labels} output (regression) "
                                "has no pentad target yet; the cls target needs 2 or more labels.")
            if has_pooler:
                heads.add("ignored_pooler")
                notes.append("the checkpoint has a pooler, which ViTForImageClassification does not use; it is "
                             "left out")
            target = {"type": "cls", "num_labels": num_labels, "pooling": "first", "pooler": False,
                      "dropout": dropout}
        else:
            arch = "ViTModel"
            id2label = config.get("id2label")
            num_labels = len(id2label) if isinstance(id2label, dict) and len(id2label) >= 2 else 2
            target = {"type": "cls", "num_labels": num_labels, "pooling": "first", "pooler": has_pooler,
                      "dropout": dropout}
            synthesized = ["targets.cls.classifier.weight", "targets.cls.classifier.bias"]
            if has_pooler:
                heads.add("pooler")
            notes.append("targets.cls.classifier: not in the checkpoint (a ViTModel has no classifier); written as "
                         f"zeros with {num_labels} labels so that pentad's cls target can hold "
                         + ("the pooler (pooler: true)" if has_pooler else "its place (pooler: false: the "
                            "checkpoint has no pooler)")
                         + "; fine-tune it for a task (left out again on export while still zero)")
        rows, cols = image[0] // patch, image[1] // patch
        model = import_fields(FIELDS, c, {
            "max_seq_length": rows * cols + 1,
            "embedding": {"parts": [{"type": "patch", "image_size": image, "bias": proj_bias}, {"type": "pos"}],
                          "norm": False},
            "encoder": dict(ENCODER),
            "targets": [target],
        })
        if not proj_bias:
            notes.append("the patch projection has no bias in the checkpoint (patch part bias: false)")
        rules = self.rules(prefix=prefix, num_layers=model["encoder"]["num_layers"], heads=heads, cls="cls",
                           proj_bias=proj_bias)
        return ImportPlan(model, rules, arch, synthesized, notes)

    # -- export -----------------------------------------------------------------------------------
    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        problems: list[str] = []
        notes: list[str] = []
        parts = {p.type: p for p in model.embedding.parts}
        if [p.type for p in model.embedding.parts] != ["patch", "pos"]:
            problems.append(f"model.embedding.parts is {[p.type for p in model.embedding.parts]}; ViT has patch "
                            "then pos")
        elif not parts["patch"].cls:
            problems.append("the patch part has no CLS vector (cls: false); ViT has one")
        elif parts["patch"].image_size[0] % parts["patch"].patch_size \
                or parts["patch"].image_size[1] % parts["patch"].patch_size:
            problems.append("the image size is not a multiple of the patch size")
        elif (parts["pos"].max_positions or model.max_seq_length) != parts["patch"].length:
            problems.append(f"the pos table has {parts['pos'].max_positions or model.max_seq_length} rows; ViT has "
                            f"one per CLS and patch ({parts['patch'].length})")
        elif not parts["patch"].bias:
            problems.append("the patch projection has no bias (patch part bias: false, TencentPretrain's layout); "
                            "Hugging Face's ViT has one")
        if model.embedding.norm:
            problems.append("model.embedding.norm is on; ViT does not normalise its embeddings")
        enc = model.encoder
        act = encoder_problems(model, "ViT", problems)
        if model.decoder is not None or model.embedding_size not in (None, model.hidden_size):
            problems.append("ViT is one encoder without a decoder or a factorised embedding")
        targets = list(model.targets)
        target = targets[0] if len(targets) == 1 and targets[0].type == "cls" else None
        name = target.target_name if target is not None else "cls"
        headless = target is not None and {f"targets.{name}.classifier.weight",
                                           f"targets.{name}.classifier.bias"} <= omittable
        if target is None:
            problems.append(f"targets {[t.type for t in targets]}: ViT has exactly one cls head")
        elif target.pooling != "first":
            problems.append(f"the cls target pools '{target.pooling}'; ViT reads the CLS position (pooling: first)")
        elif target.pooler and not headless:
            problems.append("the cls target has a pooler (dense + tanh) before its classifier; Hugging Face's "
                            "ViTForImageClassification classifies the CLS state without one (a TencentPretrain "
                            "ViT has one: export it with pentad-to-tencentpretrain)")
        if problems:
            raise UserError(f"cannot export {label} as vit: " + "; ".join(problems) + ".")
        assert target is not None and act is not None
        base = dict(base_config or {})
        config: dict[str, Any] = {"architectures": ["ViTModel" if headless else "ViTForImageClassification"],
                                  "model_type": "vit", **export_fields(FIELDS, model, base)}
        if float(model.embedding.dropout) != float(enc.dropout):
            notes.append(f"HF has one hidden_dropout_prob: wrote the encoder's {enc.dropout}, not the embedding's "
                         f"{model.embedding.dropout} (training only)")
        heads: set[str] = set()
        omit: set[str] = set()
        if headless:
            omit = {k for k in omittable if k.startswith(f"targets.{name}.classifier.")}
            if target.pooler:
                heads.add("pooler")
            else:
                notes.append("the model has no pooler: transformers' ViTModel initialises its pooler randomly unless "
                             "it is loaded with add_pooling_layer=False")
            if isinstance(base.get("id2label"), dict):
                config["id2label"], config["label2id"] = base["id2label"], base.get("label2id")
        else:
            heads.add("classifier")
            n = int(target.num_labels or 2)
            old = base.get("id2label") if isinstance(base.get("id2label"), dict) else None
            names = labels if labels and len(labels) == n else (
                [old[str(i)] for i in range(n)] if old and len(old) == n and all(str(i) in old for i in range(n))
                else [f"LABEL_{i}" for i in range(n)])
            config["id2label"] = {str(i): label_name for i, label_name in enumerate(names)}
            config["label2id"] = {label_name: i for i, label_name in enumerate(names)}
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="" if headless else "vit.", num_layers=enc.num_layers, heads=heads, cls=name,
                           proj_bias=True)
        return ExportPlan(config, rules, config["architectures"][0], omit, notes)


FAMILY = ViTFamily()
