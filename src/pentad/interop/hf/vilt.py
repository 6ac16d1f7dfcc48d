"""ViLT (``model_type: vilt``): key map and config translation, both ways.

==================================  =========================================================
Hugging Face                        pentad
==================================  =========================================================
``ViltModel``                       ``sp`` target whose classifier is not in the checkpoint: it is
                                    written as zeros, recorded in ``interop.json`` and left out again
                                    on export while still zero. The pooler (dense + tanh over the
                                    first position, the caption's [CLS]) is the target's ``pooler``
                                    (zeros too for a ViltModel saved without one)
``ViltForMaskedLM``                 ``mlm`` (its decoder tied to the word table, HF's only layout) +
                                    that ``sp`` target holding the pooler
``ViltForImageAndTextRetrieval``    ``regression`` (``pooling: first``, ``pooler: true``): the
                                    pooler, then ``rank_output`` (one score per pair) as its classifier
==================================  =========================================================

Embeddings are the ``word_patch`` part in Hugging Face's layout (its ``text_positions``,
``text_segments``, ``text_norm`` and ``image_positions``): ``text_embeddings`` (word, position,
token-type tables and a LayerNorm over the caption alone), then ``cls_token`` [1, 1, H] (the patch
part's ``cls``), the patch Conv2d (its bias kept) and ``position_embeddings`` [1, 1 + N, H] (the
image's own table); a ``seg`` part reading ``Batch.segments`` (caption 0, image 1) is the modality
``token_type_embeddings``, and the slot has no norm. Layers are pre-norm (``layernorm_before`` ->
``attention_norm``, ``layernorm_after`` -> ``ffn_norm``) with a final norm (``vilt.layernorm``);
separate query/key/value Linears become pentad's fused ``qkv``.

Hugging Face's ``visual_embed`` resizes the image position table to each image's unpadded patch
grid (the identity at ``image_size``, the only size pentad reads) and, with ``max_image_length``
-1 or at least the patch count, keeps every patch in a random order (``torch.multinomial``): the
encoder sees the same set of vectors, so the caption's states and the pooled output do not depend
on it, but the image positions of its outputs are shuffled. ``--verify`` therefore compares the
caption positions and the heads over them. The image processor (resize to a shorter side of 384,
pad, ``pixel_mask``) is not a model weight: pentad reads images of one fixed size, unpadded.
"""

from __future__ import annotations

from typing import Any

from pentad.errors import UserError
from pentad.interop.hf import (
    ExportPlan,
    Field,
    HFFamily,
    ImportPlan,
    export_fields,
    import_fields,
    media,
    merge_config,
    owned_keys,
    seq_length,
    with_rows,
)
from pentad.interop.hf.vit import ENCODER, ENCODER_FIELDS, LAYERS, encoder_problems, read_config
from pentad.interop.keymap import WB, Rule, RuleSpec, expand

# {prefix}: "vilt." inside a model with a head, "" for a bare ViltModel checkpoint.
BODY: list[RuleSpec] = [
    ("embedding.word_patch.word.weight", "{prefix}embeddings.text_embeddings.word_embeddings.weight"),
    ("embedding.word_patch.text_pos.weight", "{prefix}embeddings.text_embeddings.position_embeddings.weight"),
    ("embedding.word_patch.text_seg.weight", "{prefix}embeddings.text_embeddings.token_type_embeddings.weight"),
    ("embedding.word_patch.text_norm.{wb}", "{prefix}embeddings.text_embeddings.LayerNorm.{wb}"),
    ((), ("{prefix}embeddings.text_embeddings.position_ids?", "{prefix}embeddings.text_embeddings.token_type_ids?"),
     "ignore"),
    ("embedding.word_patch.patch.cls", "{prefix}embeddings.cls_token", "leading_ones:2"),
    ("embedding.word_patch.patch.proj.{wb}", "{prefix}embeddings.patch_embeddings.projection.{wb}"),
    ("embedding.word_patch.image_pos.weight", "{prefix}embeddings.position_embeddings", "leading_ones:1"),
    ("embedding.seg.weight", "{prefix}embeddings.token_type_embeddings.weight"),
    *LAYERS,
]
# {pooled}: the pentad target holding the pooler (sp, or regression for the retrieval head).
POOLER: list[RuleSpec] = [("targets.{pooled}.pooler.{wb}", "{prefix}pooler.dense.{wb}")]
# HF ties the decoder to the word table (ViltConfig forces tie_word_embeddings); HF 5 saves no copy.
MLM_HEAD: list[RuleSpec] = [
    ("targets.{mlm}.dense.{wb}", "mlm_score.transform.dense.{wb}"),
    ("targets.{mlm}.norm.{wb}", "mlm_score.transform.LayerNorm.{wb}"),
    ("embedding.word_patch.word.weight", "mlm_score.decoder.weight?", "tied"),
    ("targets.{mlm}.output.bias", "mlm_score.decoder.bias"),
]
RANK_HEAD: list[RuleSpec] = [("targets.{rank}.classifier.{wb}", "rank_output.{wb}")]

DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522, "type_vocab_size": 2, "modality_type_vocab_size": 2, "max_position_embeddings": 40,
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12, "image_size": 384, "patch_size": 32, "num_channels": 3,
    "qkv_bias": True, "max_image_length": -1, "tie_word_embeddings": True,
}
# config.json <-> pentad, in the order config.json is written: the word_patch part is parts.0 (its
# image part .patch), the modality types' seg part parts.1; one layer_norm_eps for the caption's norm and
# the layers. Computed by the planners: the sequence length, the image size (square) on import.
FIELDS: list[Field] = [
    Field("vocab_size", "vocab_size", int),
    Field("type_vocab_size", "embedding.parts.0.text_segments", int),
    Field("modality_type_vocab_size", "embedding.parts.1.num_segments", int),
    Field("max_position_embeddings", "embedding.parts.0.text_positions", int),
    *with_rows(ENCODER_FIELDS, Field("layer_norm_eps", "encoder.layer_norm_eps", float,
                                     also=("embedding.parts.0.layer_norm_eps",))),
    Field("image_size", write=lambda m: m.embedding.parts[0].patch.image_size[0]),
    Field("patch_size", "embedding.parts.0.patch.patch_size", int),
    Field("num_channels", "embedding.parts.0.patch.channels", int),
    Field("qkv_bias", write=lambda m: True),
    Field("tie_word_embeddings", write=lambda m: True),
]
OWNED = owned_keys(FIELDS)
SUPPORTED = ("ViltModel", "ViltForMaskedLM", "ViltForImageAndTextRetrieval")
RANK_MARKER = "rank_output.weight"
MLM_MARKER = "mlm_score.transform.dense.weight"


class ViltFamily(HFFamily):
    name = "vilt"
    model_types = ("vilt",)
    tokenizer_kind = "wordpiece"
    tokenizer_class = "BertTokenizer"
    default_special_tokens = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
    token_types = False  # Batch.segments is the modality type; HF's caption token types stay 0
    states_before_final_norm = True  # HF's hidden_states end before ``vilt.layernorm``
    shuffles_image_positions = True

    def describes(self, model: Any) -> bool:
        return media(model) == "image_text"

    def outputs(self, architecture: str) -> dict[str, str]:
        if architecture == "ViltForMaskedLM":
            return {"mlm": "logits"}
        if architecture == "ViltForImageAndTextRetrieval":
            return {"regression": "logits"}
        return {"sp:pooled": "pooler_output"}

    def image_task(self, architecture: str) -> tuple[str, str] | None:
        # image_text_match trains both heads a ViltForMaskedLM run has (mlm, and sp holding the
        # pooler); HF's ViltProcessor normalises with mean and std 0.5 (half)
        return ("image_text_match", "half") if architecture == "ViltForMaskedLM" else None

    def rules(self, *, prefix: str, num_layers: int, heads: set[str], names: dict[str, str]) -> list[Rule]:
        """The key map of one model. heads: subset of {pooler, mlm, rank}."""
        specs = list(BODY)
        if "pooler" in heads:
            specs += POOLER
        if "mlm" in heads:
            specs += MLM_HEAD
        if "rank" in heads:
            specs += RANK_HEAD
        rank = names.get("regression", "regression")
        return expand(specs, prefix=prefix, layer=range(num_layers), wb=WB, mlm=names.get("mlm", "mlm"),
                      rank=rank, pooled=rank if "rank" in heads else names.get("sp", "sp"))

    # -- import -----------------------------------------------------------------------------------
    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c, problems, act = read_config(config, DEFAULTS, SUPPORTED)
        image, patch = c["image_size"], c["patch_size"]
        if not isinstance(image, int) or not isinstance(patch, int):
            problems.append(f"image_size {image!r} / patch_size {patch!r} (ViLT's visual_embed reads one integer "
                            "each)")
            image = patch = 1
        elif image % patch:
            problems.append(f"image_size {image} is not a multiple of patch_size {patch}")
        prefix = "vilt." if any(k.startswith("vilt.") for k in keys) else ""
        has_mlm, has_rank = MLM_MARKER in keys, RANK_MARKER in keys
        has_pooler = f"{prefix}pooler.dense.weight" in keys
        if has_mlm and has_rank:
            problems.append("a checkpoint with both an MLM head and a retrieval head is not a HF architecture")
        if has_rank and int(keys[RANK_MARKER][0]) != 1:
            problems.append(f"rank_output has {keys[RANK_MARKER][0]} outputs; ViltForImageAndTextRetrieval has 1")
        if (has_mlm or has_rank) and not has_pooler:
            problems.append(f"no pooler '{prefix}pooler.dense.weight' (ViltForMaskedLM and "
                            "ViltForImageAndTextRetrieval always have one)")
        if problems:
            raise UserError(f"cannot convert {label} (vilt): " + "; ".join(problems) + ".")
        eps = float(c["layer_norm_eps"])
        notes: list[str] = []
        synthesized: list[str] = []
        heads: set[str] = {"pooler"} if has_pooler else set()
        targets: list[dict[str, Any]] = []
        if has_rank:
            arch = "ViltForImageAndTextRetrieval"
            heads.add("rank")
            targets = [{"type": "regression", "pooling": "first", "pooler": True, "dropout": 0.0}]
            notes.append("rank_output (one image-text score per pair) is the regression target's classifier, after "
                         "the pooler")
        else:
            arch = "ViltForMaskedLM" if has_mlm else "ViltModel"
            if has_mlm:
                heads.add("mlm")
                targets.append({"type": "mlm", "activation": act, "layer_norm_eps": eps})
            targets.append({"type": "sp"})
            synthesized = ["targets.sp.classifier.weight", "targets.sp.classifier.bias"]
            if not has_pooler:
                synthesized += ["targets.sp.pooler.weight", "targets.sp.pooler.bias"]
            notes.append(f"{'+'.join(sorted(synthesized))}: not in the checkpoint (a {arch} has no image-text "
                         f"matching classifier{'' if has_pooler else ' and no pooler'}); written as zeros so that "
                         "pentad's 'sp' target can hold " + ("the pooler" if has_pooler else "its place")
                         + " (left out again on export while still zero)")
        max_image = c.get("max_image_length")
        rows = image // patch
        image_length = rows * rows + 1
        if isinstance(max_image, int) and 0 < max_image < rows * rows:
            notes.append(f"max_image_length {max_image}: Hugging Face feeds a random {max_image} of the {rows * rows} "
                         "patches; pentad feeds every patch (the same model at max_image_length -1)")
        positions = int(c["max_position_embeddings"])
        notes.append("Hugging Face shuffles the image positions (visual_embed's random patch order), so --verify "
                     "compares the caption positions and the heads over them")
        model = import_fields(FIELDS, c, {
            "max_seq_length": seq_length(max_length, positions) + image_length, "tie_word_embeddings": True,
            "embedding": {"parts": [{"type": "word_patch", "patch": {"image_size": [image, image], "bias": True},
                                     "text_norm": True, "image_positions": True}, {"type": "seg"}],
                          "norm": False},
            "encoder": dict(ENCODER),
            "targets": targets,
        })
        names = {t["type"]: t["type"] for t in targets}
        rules = self.rules(prefix=prefix, num_layers=model["encoder"]["num_layers"], heads=heads, names=names)
        return ImportPlan(model, rules, arch, synthesized, notes)

    # -- export -----------------------------------------------------------------------------------
    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        problems: list[str] = []
        notes: list[str] = []
        kinds = [p.type for p in model.embedding.parts]
        parts = {p.type: p for p in model.embedding.parts}
        word_patch = parts.get("word_patch")
        if kinds != ["word_patch", "seg"]:
            problems.append(f"model.embedding.parts is {kinds}; Hugging Face's ViLT is word_patch (with its own "
                            "text and image positions) then seg (the modality type)")
        if word_patch is not None:
            missing = [key for key, on in (("text_positions", word_patch.text_positions is not None),
                                           ("text_segments", word_patch.text_segments is not None),
                                           ("text_norm", word_patch.text_norm),
                                           ("image_positions", word_patch.image_positions)) if not on]
            if missing:
                problems.append(f"the word_patch part has no {', '.join(missing)}: TencentPretrain's ViLT layout "
                                "(one position table over the whole sequence) has no Hugging Face equivalent, "
                                "which numbers the caption and the image apart and normalises the caption alone "
                                "(export it with pentad-to-tencentpretrain)")
            patch = word_patch.patch
            if not patch.bias or not patch.cls:
                problems.append("the word_patch image part needs a projection bias and a CLS vector (Hugging Face's "
                                "ViLT has both)")
            if patch.image_size[0] != patch.image_size[1] or patch.image_size[0] % patch.patch_size:
                problems.append(f"the image is {patch.image_size}; Hugging Face's ViLT reads square images a "
                                f"multiple of patch_size {patch.patch_size}")
        if model.embedding.norm:
            problems.append("model.embedding.norm is on; Hugging Face's ViLT normalises the caption only "
                            "(word_patch text_norm) and not the sum")
        enc = model.encoder
        act = encoder_problems(model, "ViLT", problems)
        if model.decoder is not None or model.embedding_size not in (None, model.hidden_size) \
                or getattr(model, "streams", None):
            problems.append("ViLT is one stream without a decoder or a factorised embedding")
        by_type = {t.type: t for t in model.targets}
        types = sorted(by_type)
        names = {t.type: t.target_name for t in model.targets}
        eps = {float(enc.layer_norm_eps)}
        if word_patch is not None and word_patch.text_norm:
            eps.add(float(word_patch.layer_norm_eps))
        mlm = by_type.get("mlm")
        if mlm is not None:
            eps.add(float(mlm.layer_norm_eps))
            if mlm.activation != enc.activation or mlm.norm != "layernorm":
                problems.append(f"the mlm target's activation '{mlm.activation}' and norm '{mlm.norm}' must be the "
                                f"encoder's '{enc.activation}' and layernorm in ViLT")
            if not model.tie_word_embeddings:
                problems.append("model.tie_word_embeddings is off; ViltForMaskedLM always ties its decoder to the "
                                "word table")
        if len(eps) > 1:
            problems.append(f"ViLT uses one layer_norm_eps, the model has {sorted(eps)} (caption norm, encoder, mlm)")
        regression = by_type.get("regression")
        if regression is not None and (regression.pooling != "first" or not regression.pooler):
            problems.append("the regression target must read the first position through a pooler (pooling: first, "
                            "pooler: true), as ViltForImageAndTextRetrieval's rank_output does")
        sp = names.get("sp", "sp")
        sp_classifier = {f"targets.{sp}.classifier.weight", f"targets.{sp}.classifier.bias"}
        sp_pooler = {f"targets.{sp}.pooler.weight", f"targets.{sp}.pooler.bias"}
        arch = {("mlm", "sp"): "ViltForMaskedLM", ("mlm",): "ViltForMaskedLM", ("sp",): "ViltModel",
                ("regression",): "ViltForImageAndTextRetrieval"}.get(tuple(types))
        if arch is None:
            problems.append(f"targets {types} have no ViLT architecture in Hugging Face (supported: mlm + sp, mlm, "
                            "sp, regression)")
        elif arch == "ViltModel" and not sp_classifier <= omittable:
            problems.append("the sp target has a trained image-text matching classifier, which no Hugging Face ViLT "
                            "class holds (ViltModel would lose it); add an mlm target to export a ViltForMaskedLM "
                            "and leave it out knowingly, or fine-tune a regression head for "
                            "ViltForImageAndTextRetrieval")
        if problems:
            raise UserError(f"cannot export {label} as vilt: " + "; ".join(problems) + ".")
        assert word_patch is not None and arch is not None and act is not None
        heads: set[str] = {"pooler"}
        omit: set[str] = set()
        if "sp" in by_type:
            omit = set(sp_classifier)
            if not sp_classifier <= omittable:
                notes.append(f"targets.{sp}.classifier (the image-text matching head) has no place in {arch}: left "
                             "out of the export")
            if sp_pooler <= omittable:
                omit |= sp_pooler
                heads.discard("pooler")
                if arch == "ViltForMaskedLM":
                    notes.append("the model has no pooler: transformers initialises ViltForMaskedLM's randomly "
                                 "(its logits do not read it)")
        elif arch == "ViltForMaskedLM":
            heads.discard("pooler")
            notes.append("the model has no pooler (no sp target): transformers initialises ViltForMaskedLM's "
                         "randomly (its logits do not read it)")
        if mlm is not None:
            heads.add("mlm")
        if regression is not None:
            heads.add("rank")
        base = dict(base_config or {})
        dropout = float(enc.dropout)
        if float(model.embedding.dropout) != dropout:
            notes.append(f"HF has one hidden_dropout_prob: wrote the encoder's {dropout}, not the embedding's "
                         f"{model.embedding.dropout} (training only)")
        config: dict[str, Any] = {"architectures": [arch], "model_type": "vilt", **export_fields(FIELDS, model, base)}
        if "pad_token_id" not in base and pad_id is not None:
            config["pad_token_id"] = pad_id
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="" if arch == "ViltModel" else "vilt.", num_layers=enc.num_layers, heads=heads,
                           names=names)
        return ExportPlan(config, rules, arch, omit, notes)


FAMILY = ViltFamily()
