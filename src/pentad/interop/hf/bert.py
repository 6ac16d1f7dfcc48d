"""BERT (``model_type: bert``): key map and config translation, both ways.

Architectures read and written:

==================================  =========================================================
Hugging Face                        pentad targets
==================================  =========================================================
``BertForPreTraining``              ``mlm`` + ``sp`` (pooler -> ``sp.pooler``, NSP -> ``sp.classifier``)
``BertForMaskedLM``                 ``mlm``
``BertForNextSentencePrediction``   ``sp``
``BertForSequenceClassification``   ``cls`` (pooling ``first``, HF pooler -> ``cls.pooler``)
``BertForTokenClassification``      ``tagger`` (HF ``classifier`` -> ``tagger.classifier``; no pooler)
``BertForQuestionAnswering``        ``span`` (HF ``qa_outputs`` -> ``span.qa_outputs``; no pooler)
``BertModel``                       ``sp`` whose classifier is not in the checkpoint: it is written
                                    as zeros, recorded in ``interop.json``, and left out again on
                                    export while it is still zero (pentad needs a target; ``sp``
                                    is where pentad's own BERT keeps its pooler)
==================================  =========================================================

HF's separate query/key/value Linears become pentad's fused ``attention.qkv`` (rows [q; k; v]).
The MLM decoder weight is the word embedding when ``tie_word_embeddings`` (HF's default); HF
5 checkpoints then omit it and older ones repeat it (checked equal). Buffers (``position_ids``,
``token_type_ids``) carry no learned data and are skipped.
"""

from __future__ import annotations

from typing import Any

from pentad.errors import UserError
from pentad.interop.hf import (
    HF_ACTIVATIONS,
    PENTAD_ACTIVATIONS,
    ExportPlan,
    Field,
    HFFamily,
    ImportPlan,
    KeyLayout,
    export_fields,
    import_fields,
    merge_config,
    one_segment_with_positions,
    owned_keys,
    part_types,
    shared_or_factorised,
    text_kind,
)
from pentad.interop.keymap import WB, Rule, RuleSpec, expand

# ---------------------------------------------------------------------------------- key map (data)
# {prefix}: "bert." inside a model with heads, "" for a bare BertModel checkpoint.
EMBEDDINGS: list[RuleSpec] = [
    ("embedding.word.weight", "{prefix}embeddings.word_embeddings.weight"),
    ("embedding.pos.weight", "{prefix}embeddings.position_embeddings.weight", "{position_transform}"),
    ("embedding.seg.weight", "{prefix}embeddings.token_type_embeddings.weight"),
    ("embedding.norm.{wb}", "{prefix}embeddings.LayerNorm.{wb}"),
    ((), ("{prefix}embeddings.position_ids?", "{prefix}embeddings.token_type_ids?"), "ignore"),
]
LAYER: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention.qkv.{wb}",
     ("{prefix}encoder.layer.{layer}.attention.self.query.{wb}",
      "{prefix}encoder.layer.{layer}.attention.self.key.{wb}",
      "{prefix}encoder.layer.{layer}.attention.self.value.{wb}"), "fuse_qkv"),
    ("encoder.layers.{layer}.attention.out.{wb}", "{prefix}encoder.layer.{layer}.attention.output.dense.{wb}"),
    ("encoder.layers.{layer}.attention_norm.{wb}", "{prefix}encoder.layer.{layer}.attention.output.LayerNorm.{wb}"),
    ("encoder.layers.{layer}.ffn.up.{wb}", "{prefix}encoder.layer.{layer}.intermediate.dense.{wb}"),
    ("encoder.layers.{layer}.ffn.down.{wb}", "{prefix}encoder.layer.{layer}.output.dense.{wb}"),
    ("encoder.layers.{layer}.ffn_norm.{wb}", "{prefix}encoder.layer.{layer}.output.LayerNorm.{wb}"),
]
# {pooled}: the pentad target that holds the pooler (sp, or cls for sequence classification).
POOLER: list[RuleSpec] = [("targets.{pooled}.pooler.{wb}", "{prefix}pooler.dense.{wb}")]
MLM_HEAD: list[RuleSpec] = [
    ("targets.{mlm}.dense.{wb}", "cls.predictions.transform.dense.{wb}"),
    ("targets.{mlm}.norm.{wb}", "cls.predictions.transform.LayerNorm.{wb}"),
]
# Tied (HF's default): the decoder weight is the word embedding and the decoder bias is
# ``cls.predictions.bias``; HF 5 saves neither duplicate, older checkpoints both.
MLM_TIED: list[RuleSpec] = [
    ("embedding.word.weight", "cls.predictions.decoder.weight?", "tied"),
    ("targets.{mlm}.output.bias", "cls.predictions.bias"),
    ("targets.{mlm}.output.bias", "cls.predictions.decoder.bias?", "tied"),
]
# Untied: HF 5 ties nothing, so the decoder's own bias is the one it adds and
# ``cls.predictions.bias`` is a parameter it never reads (older checkpoints hold the same values).
MLM_UNTIED: list[RuleSpec] = [
    ("targets.{mlm}.output.weight", "cls.predictions.decoder.weight"),
    ("targets.{mlm}.output.bias", "cls.predictions.decoder.bias"),
    ("targets.{mlm}.output.bias", "cls.predictions.bias", "shadow"),
]
NSP_HEAD: list[RuleSpec] = [("targets.{sp}.classifier.{wb}", "cls.seq_relationship.{wb}")]
SEQUENCE_HEAD: list[RuleSpec] = [("targets.{cls}.classifier.{wb}", "classifier.{wb}")]
TOKEN_HEAD: list[RuleSpec] = [("targets.{tagger}.classifier.{wb}", "classifier.{wb}")]
QA_HEAD: list[RuleSpec] = [("targets.{span}.qa_outputs.{wb}", "qa_outputs.{wb}")]
# A token classifier saved with a pooler it never reads (its encoder built with one).
UNUSED_POOLER: list[RuleSpec] = [((), ("{prefix}pooler.dense.weight?", "{prefix}pooler.dense.bias?"), "ignore")]

# BertConfig's defaults, for config.json files that leave a key out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
    "position_embedding_type": "absolute", "tie_word_embeddings": True, "classifier_dropout": None,
}
# config.json <-> pentad, in the order config.json is written (RoBERTa's too; ALBERT's without the
# decoder rows, see albert.py). Computed by the planners: the activation, the position table's size
# (offset, tokenizer limit), one layer_norm_eps for every norm, the segment rows, the padding id and a
# classifier's dropout.
FIELDS: list[Field] = [
    Field("vocab_size", "vocab_size", int),
    Field("hidden_size", "hidden_size", int),
    Field("num_hidden_layers", "encoder.num_layers", int),
    Field("num_attention_heads", "encoder.num_heads", int),
    Field("intermediate_size", "encoder.ffn_size", int, lambda m: m.encoder.ffn_size or 4 * m.hidden_size),
    Field("hidden_act"),
    Field("hidden_dropout_prob", "encoder.dropout", float),
    Field("attention_probs_dropout_prob", "encoder.attention_dropout", float,
          lambda m: float(m.encoder.attention_dropout if m.encoder.attention_dropout is not None
                          else m.encoder.dropout)),
    Field("max_position_embeddings"),
    Field("type_vocab_size", write=lambda m: part_types(m)["seg"].num_segments),
    Field("initializer_range", "init_std", float),
    Field("layer_norm_eps"),
    Field("tie_word_embeddings", "tie_word_embeddings", bool),
    Field("is_decoder", write=lambda m: False),
    Field("add_cross_attention", write=lambda m: False),
    Field("pad_token_id"),
    Field("classifier_dropout", kept=True, write=lambda m: None),  # a classifier's own: see classifier_dropout
]
# Keys of config.json this module writes; the rest of an imported config.json is kept as it was.
OWNED = owned_keys(FIELDS, "id2label", "label2id", "num_labels")


class BertLikeFamily(HFFamily):
    """BERT and its relatives that share the encoder layout (RoBERTa, XLM-R subclass it)."""

    name = "bert"
    model_types: tuple[str, ...] = ("bert",)
    layout = KeyLayout(prefixes=("bert.", "cls.predictions.", "cls.seq_relationship."))
    class_prefix = {"bert": "Bert"}
    base_prefix = "bert."
    defaults = DEFAULTS
    tokenizer_kind = "wordpiece"
    tokenizer_class = "BertTokenizer"
    default_special_tokens = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
    # Which tensor shows that a head is present.
    mlm_marker = "cls.predictions.transform.dense.weight"
    nsp_marker: str | None = "cls.seq_relationship.weight"
    sequence_marker = "classifier.weight"
    token_marker = "classifier.weight"  # the same tensor as the sequence head's: the pooler tells them apart
    qa_marker = "qa_outputs.weight"
    mlm_head, mlm_tied, mlm_untied = MLM_HEAD, MLM_TIED, MLM_UNTIED
    nsp_head: list[RuleSpec] | None = NSP_HEAD
    sequence_head = SEQUENCE_HEAD
    token_head = TOKEN_HEAD
    sequence_head_has_pooler = False  # RoBERTa's classification head holds its own dense layer
    mlm_activation: str | None = None  # None: the MLM head uses hidden_act (BERT); RoBERTa: always gelu
    unsupported = ("ForMultipleChoice", "LMHeadModel", "ForCausalLM")
    pooler_key = "pooler.dense.weight"  # under the base prefix
    sentence_target = "sp"  # pentad target of the next-sentence head (ALBERT: sop)
    classifier_dropout_key = "classifier_dropout"
    fields: list[Field] = FIELDS
    own_fields: list[Field] = []  # a relative's own config.json keys, written after the labels (ALBERT's)
    owned = OWNED

    # -- helpers ---------------------------------------------------------------------------------
    def describes(self, model: Any) -> bool:
        return text_kind(model) == "encoder" and not shared_or_factorised(model) \
            and not one_segment_with_positions(model)

    def position_offset(self, pad_token_id: int) -> int:
        """Rows of HF's position table before position 0 (RoBERTa: padding_idx + 1)."""
        return 0

    def architecture(self, model_type: str, suffix: str) -> str:
        return self.class_prefix.get(model_type, next(iter(self.class_prefix.values()))) + suffix

    def outputs(self, architecture: str) -> dict[str, str]:
        if architecture.endswith("ForPreTraining"):
            return {"mlm": "prediction_logits", "sp": "seq_relationship_logits"}
        if architecture.endswith("ForMaskedLM"):
            return {"mlm": "logits"}
        if architecture.endswith(("ForSequenceClassification", "ForNextSentencePrediction")):
            return {"cls": "logits", "sp": "logits"}
        if architecture.endswith("ForTokenClassification"):
            return {"tagger": "logits"}
        if architecture.endswith("ForQuestionAnswering"):
            return {"span:start": "start_logits", "span:end": "end_logits"}
        return {"sp:pooled": "pooler_output"}

    def rules(self, *, prefix: str, num_layers: int, offset: int, heads: set[str], names: dict[str, str],
              pooled: str, tied: bool) -> list[Rule]:
        """The key map of one model. heads: subset of {pooler, mlm, nsp, sequence, token}."""
        specs = list(EMBEDDINGS) + list(LAYER)
        if "pooler" in heads:
            specs += POOLER
        if "mlm" in heads:
            specs += self.mlm_head + (self.mlm_tied if tied else self.mlm_untied)
        if "nsp" in heads and self.nsp_head is not None:
            specs += self.nsp_head
        if "sequence" in heads:
            specs += self.sequence_head
        if "token" in heads:
            specs += self.token_head
        if "qa" in heads:
            specs += QA_HEAD
        if "ignored_pooler" in heads:
            specs += UNUSED_POOLER
        return expand(specs, prefix=prefix, layer=range(num_layers), wb=WB, pooled=pooled,
                      position_transform=f"leading_rows:{offset}" if offset else "copy",
                      mlm=names.get("mlm", "mlm"), sp=names.get("sp", "sp"), cls=names.get("cls", "cls"),
                      tagger=names.get("tagger", "tagger"), span=names.get("span", "span"))

    # -- import -----------------------------------------------------------------------------------
    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**self.defaults, **config}
        model_type = str(config.get("model_type", self.model_types[0]))
        hinted = [a for a in config.get("architectures") or [] if isinstance(a, str)]
        bad = [a for a in hinted if a.endswith(self.unsupported)]
        problems = [f"architecture {bad[0]} has a head pentad has no target for yet"] if bad else []
        if c.get("position_embedding_type", "absolute") != "absolute":
            problems.append(f"position_embedding_type '{c['position_embedding_type']}' (pentad has absolute only)")
        if c.get("is_decoder") or c.get("add_cross_attention"):
            problems.append("is_decoder / add_cross_attention (a BERT decoder) is not supported")
        act = HF_ACTIVATIONS.get(str(c["hidden_act"]))
        if act is None:
            problems.append(f"hidden_act '{c['hidden_act']}' (supported: {', '.join(HF_ACTIVATIONS)})")
        prefix = self.base_prefix if any(k.startswith(self.base_prefix) for k in keys) else ""
        has_mlm = self.mlm_marker in keys
        has_nsp = self.nsp_marker is not None and self.nsp_marker in keys
        has_pooler = f"{prefix}{self.pooler_key}" in keys
        token_hint = any(a.endswith("ForTokenClassification") for a in hinted)
        sequence_hint = any(a.endswith("ForSequenceClassification") for a in hinted)
        if self.token_marker not in keys:
            has_token = False
        elif self.token_marker != self.sequence_marker:  # RoBERTa: the heads have different tensors
            has_token = True
        elif token_hint or sequence_hint:
            has_token = token_hint
        else:
            # BERT/ALBERT heads share the name 'classifier'; only the sequence head has a pooler
            # (HF builds a token classifier's encoder without one).
            has_token = not has_pooler
        has_qa = self.qa_marker in keys
        has_seq = self.sequence_marker in keys and not has_token
        if has_seq and not (has_pooler or self.sequence_head_has_pooler):
            problems.append(f"{self.architecture(model_type, 'ForSequenceClassification')} needs the pooler "
                            f"'{prefix}{self.pooler_key}', which the checkpoint lacks")
        if (has_seq or has_token) and (has_mlm or has_nsp):
            problems.append("a checkpoint with both a classifier and pre-training heads is not a HF architecture")
        if has_qa and (has_seq or has_token or has_mlm or has_nsp):
            problems.append("a checkpoint with both a question-answering head (qa_outputs) and another head is not a "
                            "HF architecture")
        if problems:
            raise UserError(f"cannot convert {label} ({self.name}): " + "; ".join(problems) + ".")
        eps = float(c["layer_norm_eps"])
        dropout = float(c["hidden_dropout_prob"])
        heads: set[str] = set()
        targets: list[dict[str, Any]] = []
        synthesized: list[str] = []
        notes: list[str] = []
        mlm_target = {"type": "mlm", "activation": self.mlm_activation or act, "layer_norm_eps": eps}
        sentence = self.sentence_target
        head_dropout = c.get(self.classifier_dropout_key)
        if has_qa:
            arch, heads = "ForQuestionAnswering", {"qa"}
            if int(keys[self.qa_marker][0]) != 2:
                raise UserError(f"cannot convert {label} ({self.name}): qa_outputs has {keys[self.qa_marker][0]} "
                                "outputs; the span target has 2 (start, end).")
            targets = [{"type": "span"}]
            if has_pooler:
                notes.append(f"the checkpoint has a pooler, which {self.architecture(model_type, arch)} does not "
                             "use; it is left out")
                heads.add("ignored_pooler")
        elif has_token:
            arch, heads = "ForTokenClassification", {"token"}
            num_labels = int(keys[self.token_marker][0])
            if num_labels < 2:
                raise UserError(f"cannot convert {label} ({self.name}): a token classifier with {num_labels} "
                                "output; the tagger target needs 2 or more tags.")
            targets = [{"type": "tagger", "num_labels": num_labels,
                        "dropout": float(head_dropout if head_dropout is not None else dropout)}]
            if has_pooler:
                notes.append(f"the checkpoint has a pooler, which {self.architecture(model_type, arch)} does not "
                             "use; it is left out")
                heads.add("ignored_pooler")
        elif has_seq:
            arch = "ForSequenceClassification"
            heads = {"sequence"} | ({"pooler"} if not self.sequence_head_has_pooler else set())
            num_labels = int(keys[self.sequence_marker][0])
            if num_labels < 2:
                raise UserError(f"cannot convert {label} ({self.name}): a classifier with {num_labels} output "
                                "(regression) has no pentad target yet; the cls target needs 2 or more labels.")
            targets = [{"type": "cls", "num_labels": num_labels, "pooling": "first", "pooler": True,
                        "dropout": float(head_dropout if head_dropout is not None else dropout)}]
        elif has_mlm and has_nsp:
            arch, heads = "ForPreTraining", {"mlm", "nsp", "pooler"}
            targets = [mlm_target, {"type": sentence}]
        elif has_nsp:
            arch, heads = "ForNextSentencePrediction", {"nsp", "pooler"}
            targets = [{"type": sentence}]
        else:
            # A bare encoder (or an MLM model that also kept a pooler): the pooler, if any, goes to
            # an ``sp`` target whose missing parts are zeros (see the module docstring).
            arch = "ForMaskedLM" if has_mlm else "Model"
            heads = {"mlm"} if has_mlm else set()
            targets = [mlm_target] if has_mlm else []
            if has_pooler or not has_mlm:
                if has_pooler:
                    heads.add("pooler")
                targets.append({"type": sentence})
                synthesized = [f"targets.{sentence}.classifier.weight", f"targets.{sentence}.classifier.bias"]
                if not has_pooler:
                    synthesized += [f"targets.{sentence}.pooler.weight", f"targets.{sentence}.pooler.bias"]
                notes.append(f"{'+'.join(sorted(synthesized))}: not in the checkpoint (a "
                             f"{self.architecture(model_type, arch)} has no "
                             f"{'next-sentence head' if has_pooler else 'pooler or next-sentence head'}); "
                             f"written as zeros so that pentad's '{sentence}' target can hold "
                             + ("the pooler" if has_pooler else "its place")
                             + " (left out again on export while still zero, where the HF architecture has no "
                             "such head)")
        pad = c.get("pad_token_id")
        offset = self.position_offset(int(pad) if isinstance(pad, int) else int(self.defaults["pad_token_id"]))
        positions = int(c["max_position_embeddings"]) - offset
        seq_len = max_length if max_length is not None and max_length <= positions else positions
        pos: dict[str, Any] = {"type": "pos"}
        if seq_len != positions:
            pos["max_positions"] = positions
        if offset:
            notes.append(f"position table: HF rows {offset}..{positions + offset - 1} are pentad positions "
                         f"0..{positions - 1}; HF rows 0..{offset - 1} (padding_idx {offset - 1} and below, never "
                         "used for a real token) are kept in interop_extra.safetensors for the way back")
        model = import_fields(self.fields, c, {
            "max_seq_length": seq_len,
            "embedding": {"parts": [{"type": "word"}, pos, {"type": "seg", "num_segments": int(c["type_vocab_size"])}],
                          "norm": True, "layer_norm_eps": eps, "dropout": dropout},
            "encoder": {"type": "transformer", "activation": act, "norm_position": "post", "final_norm": False,
                        "mask": "bidirectional", "bias": True, "layer_norm_eps": eps},
            "targets": targets,
        })
        model = self.adjust_import(model, c)
        names = {self.canonical(t["type"]): t["type"] for t in targets}
        rules = self.rules(prefix=prefix, num_layers=model["encoder"]["num_layers"], offset=offset, heads=heads,
                           names=names, pooled="cls" if has_seq else sentence, tied=model["tie_word_embeddings"])
        return ImportPlan(model, rules, self.architecture(model_type, arch), synthesized, notes)

    def canonical(self, target_type: str) -> str:
        """A target type as the BERT planning code names it (ALBERT's sop head plays BERT's sp)."""
        return "sp" if target_type == self.sentence_target else target_type

    def adjust_import(self, model: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """Family-specific additions to the imported model config (ALBERT: factorised, shared)."""
        return model

    def classifier_dropout(self, head: float, dropout: float) -> float | None:
        """config.json's classifier dropout of a head with dropout ``head`` (BERT: None, HF's "use
        hidden_dropout_prob", where it is the layers' ``dropout``)."""
        return None if head == dropout else head

    def export_problems(self, model: Any) -> list[str]:
        """Options of the pentad model the HF architecture cannot express."""
        from pentad.interop.hf import stack_problems

        problems = stack_problems(model.encoder, "model.encoder", self.name, model.hidden_size)
        if model.embedding_size is not None and model.embedding_size != model.hidden_size:
            problems.append(f"model.embedding_size {model.embedding_size} (a factorised embedding; {self.name} has "
                            "none)")
        return problems

    # -- export -----------------------------------------------------------------------------------
    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        model_type = model_type or self.model_types[0]
        problems: list[str] = []
        notes: list[str] = []
        parts = {p.type: p for p in model.embedding.parts}
        if set(parts) != {"word", "pos", "seg"}:
            problems.append(f"model.embedding.parts is {[p.type for p in model.embedding.parts]}; {self.name} "
                            "has word, pos and seg")
        if not model.embedding.norm:
            problems.append(f"model.embedding.norm is off; {self.name} normalises its embeddings")
        enc = model.encoder
        final_norm = enc.final_norm if enc.final_norm is not None else enc.norm_position == "pre"
        if enc.type != "transformer" or enc.norm_position != "post" or final_norm or enc.mask != "bidirectional":
            problems.append(f"model.encoder must be a post-norm bidirectional transformer without a final norm "
                            f"(found {enc.type}, norm_position {enc.norm_position}, final_norm {final_norm}, "
                            f"mask {enc.mask})")
        if not enc.bias:
            problems.append("model.encoder.bias is off; HF BERT layers have biases")
        act = PENTAD_ACTIVATIONS.get(enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        eps = {float(model.embedding.layer_norm_eps), float(enc.layer_norm_eps)}
        problems += self.export_problems(model)
        types = [self.canonical(t.type) for t in model.targets]
        names = {self.canonical(t.type): t.target_name for t in model.targets}
        by_type = {self.canonical(t.type): t for t in model.targets}
        if "mlm" in by_type:
            eps.add(float(by_type["mlm"].layer_norm_eps))
            wanted = self.mlm_activation or enc.activation
            if by_type["mlm"].activation != wanted:
                problems.append(f"the mlm target's activation '{by_type['mlm'].activation}' must be '{wanted}' "
                                f"in {self.name}")
        if len(eps) > 1:
            problems.append(f"{self.name} uses one layer_norm_eps, the model has {sorted(eps)} "
                            "(embedding, encoder, mlm)")
        if "tagger" in by_type and by_type["tagger"].crf:
            problems.append("the tagger target has a CRF, which Hugging Face's token classifiers do not")
        if "cls" in by_type and (by_type["cls"].pooling != "first" or not by_type["cls"].pooler):
            problems.append("the cls target must pool the first token through a pooler (pooling: first, pooler: true)")
        sp = names.get("sp", "sp")
        # An sp target whose classifier was synthesized on import (and is still zero) stands for a
        # bare pooler: the architecture is one without a next-sentence head.
        headless = "sp" in types and {f"targets.{sp}.classifier.weight", f"targets.{sp}.classifier.bias"} <= omittable
        arch = self._export_architecture(sorted(types), headless)
        if arch is None:
            problems.append(f"targets {types} have no {self.name} architecture in Hugging Face (supported: "
                            f"{self._supported_targets()})")
        if problems:
            raise UserError(f"cannot export {label} as {self.name}: " + "; ".join(problems) + ".")
        assert arch is not None and act is not None
        omit: set[str] = set()
        heads: set[str] = set()
        if "mlm" in types:
            heads.add("mlm")
        if "sp" in types:
            heads.add("pooler")
            if headless:
                omit = {k for k in omittable if k.startswith(f"targets.{sp}.")}
                if f"targets.{sp}.pooler.weight" in omit:
                    heads.discard("pooler")
                elif "mlm" in types:
                    notes.append(f"the pooler is written although {self.architecture(model_type, arch or '')} "
                                 "does not use it (transformers reports it as unused), so that no weight is lost")
            else:
                heads.add("nsp")
        if "cls" in types:
            heads |= {"sequence"} | ({"pooler"} if not self.sequence_head_has_pooler else set())
        if "tagger" in types:
            heads.add("token")
        if "span" in types:
            heads.add("qa")
        pad = pad_id if pad_id is not None else int(self.defaults["pad_token_id"])
        base = dict(base_config or {})
        if base.get("pad_token_id") is not None:
            pad = int(base["pad_token_id"])
        offset = self.position_offset(pad)
        positions = parts["pos"].max_positions or model.max_seq_length
        dropout = float(enc.dropout)
        if float(model.embedding.dropout) != dropout:
            notes.append(f"HF has one hidden_dropout_prob: wrote the encoder's {dropout}, not the embedding's "
                         f"{model.embedding.dropout} (training only)")
        given: dict[str, Any] = {"hidden_act": _activation_name(base.get("hidden_act"), enc.activation, act),
                                 "max_position_embeddings": positions + offset, "layer_norm_eps": eps.pop(),
                                 "pad_token_id": pad}
        classifier = by_type.get("cls") or by_type.get("tagger")
        if classifier is not None:
            given[self.classifier_dropout_key] = self.classifier_dropout(classifier.dropout, dropout)
        config = {"architectures": [self.architecture(model_type, arch)], "model_type": model_type,
                  **export_fields(self.fields, model, base, **given)}
        if classifier is not None:
            n = int(classifier.num_labels or 2)
            old = base.get("id2label") if isinstance(base.get("id2label"), dict) else None
            names_ = labels if labels and len(labels) == n else (
                [old[str(i)] for i in range(n)] if old and len(old) == n and all(str(i) in old for i in range(n))
                else [f"LABEL_{i}" for i in range(n)])
            config["id2label"] = {str(i): name for i, name in enumerate(names_)}
            config["label2id"] = {name: i for i, name in enumerate(names_)}
        elif "id2label" in base:
            config["id2label"], config["label2id"] = base["id2label"], base.get("label2id")
        config.update(export_fields(self.own_fields, model, base, **given))
        config = merge_config(base, self.owned, config)
        if offset:
            notes.append(f"position table: pentad positions 0..{positions - 1} are HF rows "
                         f"{offset}..{positions + offset - 1}; HF rows 0..{offset - 1} come from "
                         "interop_extra.safetensors when the model was imported from HF, else zeros (never used "
                         "for a real token)")
        rules = self.rules(prefix="" if arch == "Model" else self.base_prefix, num_layers=enc.num_layers,
                           offset=offset, heads=heads, names=names, pooled=names.get("cls", sp),
                           tied=model.tie_word_embeddings)
        return ExportPlan(config, rules, self.architecture(model_type, arch), omit, notes)

    def _export_architecture(self, types: list[str], headless: bool) -> str | None:
        table = {("mlm", "sp"): "ForMaskedLM" if headless else "ForPreTraining", ("mlm",): "ForMaskedLM",
                 ("cls",): "ForSequenceClassification", ("tagger",): "ForTokenClassification",
                 ("span",): "ForQuestionAnswering",
                 ("sp",): "Model" if headless else "ForNextSentencePrediction"}
        return table.get(tuple(types))

    def _supported_targets(self) -> str:
        return "mlm + sp, mlm, sp, cls, tagger, span"


def _activation_name(original: Any, activation: str, default: str) -> str:
    """The HF activation name to write: the imported config's own spelling when it means the same
    function (``gelu_pytorch_tanh`` stays ``gelu_pytorch_tanh``), else pentad's default name."""
    return str(original) if HF_ACTIVATIONS.get(str(original)) == activation else default


FAMILY = BertLikeFamily()
