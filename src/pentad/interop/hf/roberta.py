"""RoBERTa and XLM-RoBERTa (``model_type: roberta`` / ``xlm-roberta``): the BERT layout with a
different head and an offset position table.

Architectures: ``RobertaForMaskedLM`` / ``XLMRobertaForMaskedLM`` (pentad ``mlm``),
``...ForSequenceClassification`` (pentad ``cls``: HF's ``classifier.dense`` is the pooler and
``classifier.out_proj`` the classifier; both read the first token, as pentad's ``pooling: first``),
``...ForTokenClassification`` (pentad ``tagger``: ``classifier`` -> ``tagger.classifier``),
``...ForQuestionAnswering`` (pentad ``span``: ``qa_outputs`` -> ``span.qa_outputs``),
``RobertaModel`` / ``XLMRobertaModel`` (pentad ``sp`` holding the pooler, classifier zeros, as for
``BertModel``).

**Position offset.** HF RoBERTa (from fairseq) numbers positions from ``padding_idx + 1``: with
``pad_token_id = 1`` a sequence's tokens use rows 2, 3, ... of a table of
``max_position_embeddings`` (514) rows, row 1 is the padding row and row 0 is never used. pentad's
``pos`` part numbers positions from 0, so the import copies HF rows ``2..513`` to pentad rows
``0..511`` (``embedding.pos`` gets ``max_positions`` 512) and keeps HF rows 0 and 1 in
``interop_extra.safetensors``; the export puts them back in front (zeros for a model trained in
pentad). The two numberings agree for right-padded batches, which is how pentad batches are built;
HF derives positions from the token ids, so a padding token *inside* a sequence shifts HF's
positions and not pentad's. The MLM head's activation is always exact GELU in HF
(``RobertaLMHead``), whatever ``hidden_act`` says.
"""

from __future__ import annotations

from typing import Any

from pentad.interop.hf import KeyLayout, one_segment_with_positions, shared_or_factorised, text_kind
from pentad.interop.hf.bert import DEFAULTS as BERT_DEFAULTS
from pentad.interop.hf.bert import BertLikeFamily
from pentad.interop.keymap import RuleSpec

MLM_HEAD: list[RuleSpec] = [
    ("targets.{mlm}.dense.{wb}", "lm_head.dense.{wb}"),
    ("targets.{mlm}.norm.{wb}", "lm_head.layer_norm.{wb}"),
]
MLM_TIED: list[RuleSpec] = [
    ("embedding.word.weight", "lm_head.decoder.weight?", "tied"),
    ("targets.{mlm}.output.bias", "lm_head.bias"),
    ("targets.{mlm}.output.bias", "lm_head.decoder.bias?", "tied"),
]
MLM_UNTIED: list[RuleSpec] = [  # as for BERT: untied, HF 5 adds the decoder's own bias
    ("targets.{mlm}.output.weight", "lm_head.decoder.weight"),
    ("targets.{mlm}.output.bias", "lm_head.decoder.bias"),
    ("targets.{mlm}.output.bias", "lm_head.bias", "shadow"),
]
SEQUENCE_HEAD: list[RuleSpec] = [
    ("targets.{cls}.pooler.{wb}", "classifier.dense.{wb}"),
    ("targets.{cls}.classifier.{wb}", "classifier.out_proj.{wb}"),
]

DEFAULTS: dict[str, Any] = {**BERT_DEFAULTS, "vocab_size": 50265, "pad_token_id": 1}


class RobertaFamily(BertLikeFamily):
    name = "roberta"
    model_types = ("roberta", "xlm-roberta")
    layout = KeyLayout(prefixes=("roberta.", "lm_head.dense."))
    class_prefix = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}
    base_prefix = "roberta."
    defaults = DEFAULTS
    tokenizer_kind = "bpe"
    tokenizer_class = "RobertaTokenizer"
    tokenizer_classes = {"xlm-roberta": "XLMRobertaTokenizer"}
    spm_files = ("sentencepiece.bpe.model",)
    default_special_tokens = {"bos": "<s>", "cls": "<s>", "eos": "</s>", "sep": "</s>", "pad": "<pad>",
                              "unk": "<unk>", "mask": "<mask>"}
    mlm_marker = "lm_head.dense.weight"
    nsp_marker = None
    sequence_marker = "classifier.out_proj.weight"
    token_marker = "classifier.weight"
    mlm_head, mlm_tied, mlm_untied = MLM_HEAD, MLM_TIED, MLM_UNTIED
    nsp_head = None
    sequence_head = SEQUENCE_HEAD
    sequence_head_has_pooler = True
    mlm_activation = "gelu"

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "encoder" and not shared_or_factorised(model) and one_segment_with_positions(model)

    def position_offset(self, pad_token_id: int) -> int:
        return pad_token_id + 1

    def tokenizer_for(self, model_type: str | None) -> tuple[str | None, str]:
        # XLM-R's SentencePiece model, numbered through fairseq's dictionary (see pentad.interop.spm).
        return ("sentencepiece", "fairseq") if model_type == "xlm-roberta" else ("bpe", "plain")

    def pad_token_id(self, config: dict[str, Any]) -> int:
        value = config.get("pad_token_id")
        return int(value) if isinstance(value, int) else int(DEFAULTS["pad_token_id"])

    def _export_architecture(self, types: list[str], headless: bool) -> str | None:
        table = {("mlm",): "ForMaskedLM", ("cls",): "ForSequenceClassification",
                 ("tagger",): "ForTokenClassification", ("span",): "ForQuestionAnswering"}
        if headless:  # a RobertaModel, or a RobertaForMaskedLM checkpoint that also kept a pooler
            table[("sp",)] = "Model"
            table[("mlm", "sp")] = "ForMaskedLM"
        return table.get(tuple(types))

    def _supported_targets(self) -> str:
        return "mlm, cls, tagger, span, or an sp target imported from a RobertaModel"


FAMILY = RobertaFamily()
