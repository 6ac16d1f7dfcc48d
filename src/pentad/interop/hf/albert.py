"""ALBERT (``model_type: albert``): BERT's heads on a factorised embedding and one shared layer.

Architectures read and written, as for BERT (:mod:`.bert`, whose planning this reuses):

================================  ============================================================
Hugging Face                      pentad targets
================================  ============================================================
``AlbertForPreTraining``          ``mlm`` + ``sop`` (``albert.pooler`` -> ``sop.pooler``,
                                  ``sop_classifier.classifier`` -> ``sop.classifier``)
``AlbertForMaskedLM``             ``mlm``
``AlbertForSequenceClassification``  ``cls`` (pooling ``first`` through the pooler)
``AlbertForTokenClassification``  ``tagger`` (``classifier`` -> ``tagger.classifier``; no pooler)
``AlbertForQuestionAnswering``  ``span`` (``qa_outputs`` -> ``span.qa_outputs``; no pooler)
``AlbertModel``                   ``sop`` holding the pooler, its classifier synthesized as zeros
================================  ============================================================

The factorised embedding (Lan et al. 2019, section 3.1): the word, position and segment tables
and their LayerNorm have width ``embedding_size`` E; ``encoder.embedding_hidden_mapping_in``
(E -> H) is the embedding slot's ``project``. The MLM head maps back to E before the (tied)
vocabulary projection. Cross-layer sharing: HF keeps ``num_hidden_groups`` groups of
``inner_group_num`` layers; pentad converts the ALBERT of the paper, one group of one layer applied
``num_hidden_layers`` times (``share_layers``).
"""

from __future__ import annotations

from typing import Any

from pentad.errors import UserError
from pentad.interop.hf import Field, ImportPlan, KeyLayout, owned_keys, shared_or_factorised, stack_problems, text_kind
from pentad.interop.hf.bert import FIELDS as BERT_FIELDS
from pentad.interop.hf.bert import UNUSED_POOLER, BertLikeFamily
from pentad.interop.keymap import WB, Rule, RuleSpec, expand

# {prefix}: "albert." inside a model with heads, "" for a bare AlbertModel checkpoint.
EMBEDDINGS: list[RuleSpec] = [
    ("embedding.word.weight", "{prefix}embeddings.word_embeddings.weight"),
    ("embedding.pos.weight", "{prefix}embeddings.position_embeddings.weight"),
    ("embedding.seg.weight", "{prefix}embeddings.token_type_embeddings.weight"),
    ("embedding.norm.{wb}", "{prefix}embeddings.LayerNorm.{wb}"),
    ("embedding.project.{wb}", "{prefix}encoder.embedding_hidden_mapping_in.{wb}"),
    ((), ("{prefix}embeddings.position_ids?", "{prefix}embeddings.token_type_ids?"), "ignore"),
]
_SHARED = "{prefix}encoder.albert_layer_groups.0.albert_layers.0."
LAYER: list[RuleSpec] = [
    ("encoder.layers.0.attention.qkv.{wb}",
     (_SHARED + "attention.query.{wb}", _SHARED + "attention.key.{wb}", _SHARED + "attention.value.{wb}"), "fuse_qkv"),
    ("encoder.layers.0.attention.out.{wb}", _SHARED + "attention.dense.{wb}"),
    ("encoder.layers.0.attention_norm.{wb}", _SHARED + "attention.LayerNorm.{wb}"),
    ("encoder.layers.0.ffn.up.{wb}", _SHARED + "ffn.{wb}"),
    ("encoder.layers.0.ffn.down.{wb}", _SHARED + "ffn_output.{wb}"),
    ("encoder.layers.0.ffn_norm.{wb}", _SHARED + "full_layer_layer_norm.{wb}"),
]
POOLER: list[RuleSpec] = [("targets.{pooled}.pooler.{wb}", "{prefix}pooler.{wb}")]
MLM_HEAD: list[RuleSpec] = [
    ("targets.{mlm}.dense.{wb}", "predictions.dense.{wb}"),
    ("targets.{mlm}.norm.{wb}", "predictions.LayerNorm.{wb}"),
]
MLM_TIED: list[RuleSpec] = [
    ("embedding.word.weight", "predictions.decoder.weight?", "tied"),
    ("targets.{mlm}.output.bias", "predictions.bias"),
    ("targets.{mlm}.output.bias", "predictions.decoder.bias?", "tied"),
]
MLM_UNTIED: list[RuleSpec] = [
    ("targets.{mlm}.output.weight", "predictions.decoder.weight"),
    ("targets.{mlm}.output.bias", "predictions.decoder.bias"),
    ("targets.{mlm}.output.bias", "predictions.bias", "shadow"),
]
SOP_HEAD: list[RuleSpec] = [("targets.{sp}.classifier.{wb}", "sop_classifier.classifier.{wb}")]
SEQUENCE_HEAD: list[RuleSpec] = [("targets.{cls}.classifier.{wb}", "classifier.{wb}")]
TOKEN_HEAD: list[RuleSpec] = [("targets.{tagger}.classifier.{wb}", "classifier.{wb}")]
QA_HEAD: list[RuleSpec] = [("targets.{span}.qa_outputs.{wb}", "qa_outputs.{wb}")]

# AlbertConfig's defaults.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 30000, "embedding_size": 128, "hidden_size": 4096, "num_hidden_layers": 12,
    "num_hidden_groups": 1, "num_attention_heads": 64, "intermediate_size": 16384, "inner_group_num": 1,
    "hidden_act": "gelu_new", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
    "classifier_dropout_prob": 0.1, "position_embedding_type": "absolute", "pad_token_id": 0,
    "tie_word_embeddings": True,
}
# config.json <-> pentad: BERT's rows but the decoder flags and classifier_dropout, then (after the labels)
# ALBERT's own. Computed by the planners: the embedding width on import (set only where it is not the
# hidden size), a classifier's dropout on export (else the imported config's, else AlbertConfig's).
FIELDS: list[Field] = [row for row in BERT_FIELDS
                       if row.hf not in ("is_decoder", "add_cross_attention", "classifier_dropout")]
OWN_FIELDS: list[Field] = [
    Field("embedding_size", write=lambda m: m.embedding_size or m.hidden_size),
    Field("num_hidden_groups", write=lambda m: 1),
    Field("inner_group_num", write=lambda m: 1),
    Field("classifier_dropout_prob", read=float, kept=True, write=lambda m: DEFAULTS["classifier_dropout_prob"]),
]
OWNED = owned_keys(FIELDS, "id2label", "label2id", "num_labels", *(row.hf for row in OWN_FIELDS))


class AlbertFamily(BertLikeFamily):
    name = "albert"
    model_types = ("albert",)
    layout = KeyLayout(contains=("albert_layer_groups.",))
    class_prefix = {"albert": "Albert"}
    base_prefix = "albert."
    defaults = DEFAULTS
    fields = FIELDS
    own_fields = OWN_FIELDS
    owned = OWNED
    tokenizer_kind = "sentencepiece"
    tokenizer_class = "AlbertTokenizer"
    spm_files = ("spiece.model",)
    spm_text_normalisation = True
    default_special_tokens = {"pad": "<pad>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
    mlm_marker = "predictions.dense.weight"
    nsp_marker = "sop_classifier.classifier.weight"
    sequence_marker = "classifier.weight"
    pooler_key = "pooler.weight"
    sentence_target = "sop"
    classifier_dropout_key = "classifier_dropout_prob"

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "encoder" and shared_or_factorised(model)

    def outputs(self, architecture: str) -> dict[str, str]:
        if architecture.endswith("ForPreTraining"):
            return {"mlm": "prediction_logits", "sop": "sop_logits"}
        if architecture.endswith("ForMaskedLM"):
            return {"mlm": "logits"}
        if architecture.endswith("ForSequenceClassification"):
            return {"cls": "logits"}
        if architecture.endswith("ForTokenClassification"):
            return {"tagger": "logits"}
        if architecture.endswith("ForQuestionAnswering"):
            return {"span:start": "start_logits", "span:end": "end_logits"}
        return {"sop:pooled": "pooler_output"}

    def rules(self, *, prefix: str, num_layers: int, offset: int, heads: set[str], names: dict[str, str],
              pooled: str, tied: bool) -> list[Rule]:
        specs = list(EMBEDDINGS) + list(LAYER)
        if "pooler" in heads:
            specs += POOLER
        if "mlm" in heads:
            specs += MLM_HEAD + (MLM_TIED if tied else MLM_UNTIED)
        if "nsp" in heads:
            specs += SOP_HEAD
        if "sequence" in heads:
            specs += SEQUENCE_HEAD
        if "token" in heads:
            specs += TOKEN_HEAD
        if "qa" in heads:
            specs += QA_HEAD
        if "ignored_pooler" in heads:
            specs += UNUSED_POOLER
        return expand(specs, prefix=prefix, wb=WB, pooled=pooled, mlm=names.get("mlm", "mlm"),
                      sp=names.get("sp", self.sentence_target), cls=names.get("cls", "cls"),
                      tagger=names.get("tagger", "tagger"), span=names.get("span", "span"))

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        if int(c["num_hidden_groups"]) != 1 or int(c["inner_group_num"]) != 1:
            raise UserError(f"cannot convert {label} (albert): num_hidden_groups {c['num_hidden_groups']} and "
                            f"inner_group_num {c['inner_group_num']}; pentad shares one layer across all layers "
                            "(both must be 1, as in every released ALBERT).")
        return super().plan_import(config, keys, label, max_length)

    def adjust_import(self, model: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        width = int(config["embedding_size"])
        if width != model["hidden_size"]:
            model["embedding_size"] = width
        model["encoder"]["share_layers"] = True
        return model

    def classifier_dropout(self, head: float, dropout: float) -> float | None:
        return float(head)

    def export_problems(self, model: Any) -> list[str]:
        problems = stack_problems(model.encoder, "model.encoder", self.name, model.hidden_size, share_layers=True)
        return problems


FAMILY = AlbertFamily()
