"""TencentPretrain (and UER-py) checkpoints <-> pentad.

A TencentPretrain model is a ``.bin`` state dict written by ``torch.save`` (read here with
``weights_only=True``) plus the flat JSON config it was trained with, which loads through
:func:`pentad.tencentpretrain.config.import_config` into the same architecture. Put both (and the
vocabulary file the model was trained with) in one directory and convert it; the way back writes
the three files again (``pentad convert pentad-to-tencentpretrain``).

The key scheme (TencentPretrain's ``model_builder`` and its HF conversion scripts), with ``E`` for
the encoder layers ``encoder.transformer.N`` (``encoder.transformer`` alone with
``parameter_sharing``) and ``D`` for the decoder layers ``decoder.transformer_decoder.N``:

==============================================================  ========================================
TencentPretrain                                                 pentad
==============================================================  ========================================
``embedding.word.embedding.weight``                             ``embedding.word.weight``
``embedding.pos.embedding.weight``                              ``embedding.pos.weight``
``embedding.seg.embedding.weight`` (rows pad, A, B)             ``embedding.seg.weight`` (rows A, B, pad)
``embedding.layer_norm.gamma`` / ``beta``                       ``embedding.norm.weight`` / ``bias``
``embedding.patch.projection.weight`` / ``cls_emb`` [1, 1, E]   ``embedding.patch.proj.weight`` / ``cls`` [E]
(ViT: no projection bias, no word table)
``embedding.speech.conv.conv_layers.<i>.0.weight`` / ``bias``     ``embedding.speech.convs.<i>.weight`` / ``bias``
(S2T: the subsampler's convolutions; no word table)
``embedding.word_patch.language_embedding.embedding.weight``     ``embedding.word_patch.word.weight``
``embedding.word_patch.vision_embedding.projection.weight`` /    ``embedding.word_patch.patch.proj.weight`` / ``cls``
``cls_emb`` (ViLT: the caption's words, then ViT's patches)
``embedding.dual.embedding_0`` / ``_1`` ``.*`` (CLIP: the names   ``embedding.*`` / ``streams.S.embedding.*``
above under each stream; S: the second stream's name)
``embedding.dual.stream_0_layer_norm`` / ``stream_1_...``         ``embedding.second_norm`` / ``streams.S.embedding...``
``encoder.encoder_0`` / ``_1`` ``.transformer.N``, ``.layer_norm``    ``encoder.*`` / ``streams.S.encoder.*``
``target.clr.logit_scale``, ``encoder_0_projection`` [H, F]      ``targets.clr.logit_scale``, ``projection_0`` [F, H]
``tgt_embedding.*`` (the same names)                            ``target_embedding.*``
``encoder.linear`` (``factorized_embedding_parameterization``)  ``embedding.project``
``E.self_attn.linear_layers.0..2``                              ``encoder.layers.N.attention.qkv`` (q; k; v)
``E.self_attn.final_linear``                                    ``encoder.layers.N.attention.out``
``E.layer_norm_1`` / ``layer_norm_2``                           ``...attention_norm`` / ``...ffn_norm``
``E.feed_forward.linear_gate`` / ``linear_1`` / ``linear_2``    ``...ffn.gate`` / ``...ffn.up`` / ``...ffn.down``
``E.relative_pos_emb.relative_attention_bias`` (every layer)    ``encoder.relative_bias``
``encoder.layer_norm`` (pre-norm)                               ``encoder.final_norm``
``D.self_attn`` / ``D.context_attn.linear_layers.0``            ``decoder.layers.N.attention`` / ``cross_attention.q``
``D.context_attn.linear_layers.1, 2`` / ``final_linear``        ``...cross_attention.kv`` (k; v) / ``...out``
``D.layer_norm_1`` / ``_2`` / ``_3``                            ``...attention_norm`` / ``cross_attention_norm`` /
                                                                ``ffn_norm``
``decoder.self_pos_emb.relative_attention_bias``                ``decoder.relative_bias``
``decoder.layer_norm``                                          ``decoder.final_norm``
``target.mlm.linear_1``, ``layer_norm``, ``linear_2``           ``targets.mlm.dense``, ``norm``, ``output``
``target.sp.linear_1`` / ``linear_2``                           ``targets.{sp,sop}.pooler`` / ``classifier``
``target.lm.output_layer``                                      ``targets.lm.output``
``target.cls.linear_1`` / ``linear_2``                          ``targets.cls.pooler`` / ``classifier``
``output_layer_1`` / ``output_layer_2`` (a classifier           ``targets.cls.pooler`` / ``classifier``
fine-tuned with ``finetune/run_classifier.py``)
``output_layer`` (a tagger fine-tuned with ``run_ner.py``)      ``targets.tagger.classifier``
``output_layer`` with 2 outputs and no ``crf`` (the start/end   ``targets.span.qa_outputs``
layer of ``run_cmrc.py``; a tagger when ``label2id.json``
lies beside it)
``crf.start_transitions`` / ``end_transitions`` /               ``targets.tagger.crf.*`` (the same names)
``transitions`` (``run_ner.py --crf_target``)
==============================================================  ========================================

LayerNorms are ``gamma`` / ``beta``; T5 and RMS norms ``weight``. Tied tensors appear under every
name (``tie_weights``: the output layer; ``share_embedding``: ``tgt_embedding.word``; T5's relative
bias in every encoder layer): the import checks the copies are equal (one shared tensor or separate
equal copies), the export writes one tensor under every name, sharing its storage as TencentPretrain's
own files do (``torch.save`` stores it once).
T5's encoder also holds ``encoder.relative_pos_emb``, a second table its layers never read (kept in
``interop_extra.safetensors`` when it differs, else written back as a copy). A checkpoint written
by TencentPretrain's own T5 converter has only that table (no per-layer one); it is then what
pentad reads (TencentPretrain itself would run such a checkpoint without position bias).

**Segments.** TencentPretrain's segment table has three rows, 0 = padding, 1 = A, 2 = B. The
imported config keeps three (``num_segments: 3``) ordered (A, B, pad), so that pentad's segment ids
0/1 read TencentPretrain's rows 1/2 and the round trip is exact; a pentad model with two segment
rows exports with a zero padding row (or the one kept from an import).

**Rotary.** TencentPretrain rotates dimension pairs (2i, 2i+1) (Meta's LLaMA code); pentad, like
Hugging Face, pairs i with i + D/2. The query and key rows of each head are permuted accordingly
(``fuse_qkv:A:K:meta``), as TencentPretrain's LLaMA converters do.

**Dual streams (CLIP).** Untied dual-stream pre-training checkpoints convert; TencentPretrain's
``DualEmbedding`` normalises each stream twice (LN after LN), which the converted slot reproduces
with ``second_norm``. A stream with one embedding LayerNorm cannot be written (TencentPretrain always
adds the second), and tied streams (SBERT) are refused: their two outer norms have no place in
pentad's one shared slot.

**Numerics.** TencentPretrain's ``normal`` LayerNorm divides by ``std + eps`` with the *unbiased*
standard deviation, unlike torch's (``sqrt(var + eps)``, biased variance): its checkpoints import with
pentad's ``layernorm_unbiased`` norm wherever TencentPretrain builds that LayerNorm (the import of the
config decides, see :mod:`pentad.tencentpretrain.config`), so they reproduce TencentPretrain's forward
pass, and export back as ``normal``. A pentad model with torch's LayerNorm exports as ``normal`` too,
which TencentPretrain computes slightly differently (a note says where, and the conversion measures by
how much). The other differences of behaviour (T5 without output rescaling, ALiBi, sinusoidal
positions) are the config import's, and it reports them.
"""

from __future__ import annotations

import collections
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pentad.components.stream import shares, stream_embedding, stream_encoder, stream_names, stream_sizes
from pentad.errors import UserError
from pentad.files import atomic_path
from pentad.interop.keymap import WB, Rule, RuleSpec, expand, to_foreign

WEIGHTS_NAME = "model.bin"
CONFIG_NAME = "config.json"
WEIGHT_SUFFIXES = (".bin", ".pt", ".pth")
FINETUNED_MARKER = "output_layer_2.weight"
TAGGER_MARKER = "output_layer.weight"  # finetune/run_ner.py
CRF_MARKER = "crf.transitions"
# TencentPretrain tokenizer names -> pentad's (the vocabulary file decides the rest).
TOKENIZERS = {"bert": "wordpiece", "char": "char", "space": "space", "bpe": "bpe"}
RELATIVE_PER_LAYER = "encoder.transformer.0.relative_pos_emb.relative_attention_bias.weight"
RELATIVE_UNUSED = "encoder.relative_pos_emb.relative_attention_bias.weight"

# ------------------------------------------------------------------------------ key map (data)
EMBEDDING_PARTS: dict[str, list[RuleSpec]] = {
    "word": [("{slot}.word.weight", "{tslot}.word.embedding.weight")],
    "pos": [("{slot}.pos.weight", "{tslot}.pos.embedding.weight")],
    "sinusoidal": [],  # a fixed table, not in the state dict
    # ViT: a Conv2d without bias, and the CLS vector [1, 1, E].
    "patch": [("{slot}.patch.proj.weight", "{tslot}.patch.projection.weight"),
              ("{slot}.patch.cls", "{tslot}.patch.cls_emb", "leading_ones:2")],
    # ViLT: WordPatchEmbedding's word table, then a PatchEmbedding as ViT's.
    "word_patch": [("{slot}.word_patch.word.weight", "{tslot}.word_patch.language_embedding.embedding.weight"),
                   ("{slot}.word_patch.patch.proj.weight", "{tslot}.word_patch.vision_embedding.projection.weight"),
                   ("{slot}.word_patch.patch.cls", "{tslot}.word_patch.vision_embedding.cls_emb", "leading_ones:2")],
}
WORD_PATCH_WORDS = "embedding.word_patch.language_embedding.embedding.weight"
PATCH_MARKER = "embedding.patch.projection.weight"
# S2T's subsampler (SpeechEmbedding's Conv1dModule): each convolution is the first module of a
# Sequential (followed by a GELU where there is no GLU).
SPEECH_CONV: list[RuleSpec] = [("{slot}.speech.convs.{conv}.{wb}", "{tslot}.speech.conv.conv_layers.{conv}.0.{wb}")]
SPEECH_MARKER = "embedding.speech.conv.conv_layers.0.0.weight"
TARGET_WORDS = "tgt_embedding.word.embedding.weight"
# Dual-stream models (CLIP): DualEmbedding's streams and second LayerNorms live under this prefix.
DUAL_PREFIX = "embedding.dual."
# The segment table: pentad keeps TencentPretrain's three rows in the order (A, B, pad), or two
# rows (A, B) with the padding row kept aside.
SEGMENTS = {3: [("{slot}.seg.weight", "{tslot}.seg.embedding.weight", "rotate_rows:1")],
            2: [("{slot}.seg.weight", "{tslot}.seg.embedding.weight", "seg_pad_row")]}
SHARED_WORDS: list[RuleSpec] = [("embedding.word.weight", "tgt_embedding.word.embedding.weight", "tied")]
PROJECTION: list[RuleSpec] = [("embedding.project.{wb}", "encoder.linear.{wb}")]
# {L}: pentad's layer prefix, {T}: TencentPretrain's; {lwb}: weight and bias, or weight alone with
# remove_transformer_bias; {qkv}: the fuse_qkv transform (with head counts and rotary layout).
ATTENTION: list[RuleSpec] = [
    ("{L}.attention.qkv.{lwb}",
     ("{T}.self_attn.linear_layers.0.{lwb}", "{T}.self_attn.linear_layers.1.{lwb}",
      "{T}.self_attn.linear_layers.2.{lwb}"), "{qkv}"),
    ("{L}.attention.out.{lwb}", "{T}.self_attn.final_linear.{lwb}"),
]
CROSS_ATTENTION: list[RuleSpec] = [
    ("{L}.cross_attention.q.{lwb}", "{T}.context_attn.linear_layers.0.{lwb}"),
    ("{L}.cross_attention.kv.{lwb}", ("{T}.context_attn.linear_layers.1.{lwb}",
                                      "{T}.context_attn.linear_layers.2.{lwb}"), "fuse_kv"),
    ("{L}.cross_attention.out.{lwb}", "{T}.context_attn.final_linear.{lwb}"),
]
FEED_FORWARD: dict[str, list[RuleSpec]] = {
    "dense": [("{L}.ffn.up.{lwb}", "{T}.feed_forward.linear_1.{lwb}"),
              ("{L}.ffn.down.{lwb}", "{T}.feed_forward.linear_2.{lwb}")],
    "gated": [("{L}.ffn.gate.{lwb}", "{T}.feed_forward.linear_gate.{lwb}"),
              ("{L}.ffn.up.{lwb}", "{T}.feed_forward.linear_1.{lwb}"),
              ("{L}.ffn.down.{lwb}", "{T}.feed_forward.linear_2.{lwb}")],
}
# pentad norm -> TencentPretrain parameter names (weight, bias).
NORM_NAMES = {"layernorm": ("gamma", "beta"), "layernorm_unbiased": ("gamma", "beta"), "t5": ("weight", None),
              "rmsnorm": ("weight", None)}
TARGETS: dict[str, list[RuleSpec]] = {
    "mlm": [("targets.{name}.dense.{wb}", "target.mlm.linear_1.{wb}"),
            ("targets.{name}.norm.weight", "target.mlm.layer_norm.gamma"),
            ("targets.{name}.norm.bias", "target.mlm.layer_norm.beta"),
            ("targets.{name}.output.bias", "target.mlm.linear_2.bias")],
    "sp": [("targets.{name}.pooler.{wb}", "target.sp.linear_1.{wb}"),
           ("targets.{name}.classifier.{wb}", "target.sp.linear_2.{wb}")],
    "lm": [],
    "bilm": [],
    "cls": [("targets.{name}.pooler.{wb}", "target.cls.linear_1.{wb}"),
            ("targets.{name}.classifier.{wb}", "target.cls.linear_2.{wb}")],
}
TARGETS["sop"] = TARGETS["sp"]  # ALBERT's sentence-order head is TencentPretrain's sp target
# The vocabulary projection: tied to a word table (saved under both names) or a tensor of its own.
OUTPUT_TIED: dict[str, list[RuleSpec]] = {
    "mlm": [("{encoder_words}", "target.mlm.linear_2.weight", "tied")],
    "lm": [("{words}", "target.lm.output_layer.weight", "tied")],
    "bilm": [("{words}", "target.bilm.output_layer.weight", "tied")],
}
OUTPUT_UNTIED: dict[str, list[RuleSpec]] = {
    "mlm": [("targets.{name}.output.weight", "target.mlm.linear_2.weight")],
    "lm": [("targets.{name}.output.weight", "target.lm.output_layer.weight")],
    "bilm": [("targets.{name}.output.weight", "target.bilm.output_layer.weight")],
}
LM_BIAS: list[RuleSpec] = [("targets.{name}.output.bias", "target.{type}.output_layer.bias")]
# pentad's recurrent encoders keep TencentPretrain's parameter names (torch's RNN modules).
RECURRENT = ("rnn", "lstm", "gru", "birnn", "bilstm", "bigru")
FINETUNED_CLASSIFIER: list[RuleSpec] = [
    ("targets.{name}.pooler.{wb}", "output_layer_1.{wb}"),
    ("targets.{name}.classifier.{wb}", "output_layer_2.{wb}"),
]
# run_ner.py's NerTagger: one output layer, and pytorch-crf's CRF with --crf_target.
TAGGER: list[RuleSpec] = [("targets.{name}.classifier.{wb}", "output_layer.{wb}")]
TAGGER_CRF: list[RuleSpec] = [("targets.{name}.crf.{p}", "crf.{p}")]
CRF_PARAMETERS = ("start_transitions", "end_transitions", "transitions")
# run_cmrc.py's MachineReadingComprehension: one output layer of 2 (start, end) scores per token.
SPAN: list[RuleSpec] = [("targets.{name}.qa_outputs.{wb}", "output_layer.{wb}")]


@dataclass
class Layout:
    """Choices a TencentPretrain checkpoint makes that its config does not say.

    finetuned: the cls head is stored as ``output_layer_1/2`` (``finetune/run_classifier.py``);
    relative_bias: "layers" (every encoder layer holds T5's bias table, as TencentPretrain builds
    it) or "encoder" (only ``encoder.relative_pos_emb``, as its T5 converter writes it).
    """

    finetuned: bool = False
    relative_bias: str = "layers"

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> Layout:
        record = record or {}
        return cls(**{k: v for k, v in record.items() if k in ("finetuned", "relative_bias")})


def _substitute(specs: list[RuleSpec], **values: str) -> list[RuleSpec]:
    """Specs with ``{name}`` replaced by text that may hold placeholders of its own (a layer
    prefix ``encoder.transformer.{layer}``), for :func:`expand` to fill in next."""
    def sub(text: str) -> str:
        for name, value in values.items():
            text = text.replace("{" + name + "}", value)
        return text

    out: list[RuleSpec] = []
    for spec in specs:
        ours = tuple(sub(t) for t in ((spec[0],) if isinstance(spec[0], str) else spec[0]))
        theirs = tuple(sub(t) for t in ((spec[1],) if isinstance(spec[1], str) else spec[1]))
        out.append((ours, theirs, *(sub(t) for t in spec[2:])))
    return out


def _norm(ours: str, theirs: str, kind: str) -> list[RuleSpec]:
    weight, bias = NORM_NAMES.get(kind, ("gamma", "beta"))
    specs: list[RuleSpec] = [(f"{ours}.weight", f"{theirs}.{weight}")]
    if bias is not None:
        specs.append((f"{ours}.bias", f"{theirs}.{bias}"))
    return specs


def _qkv(stack: Any, hidden: int) -> str:
    """The fuse_qkv transform of a stack: head counts with grouped-query attention or rotary, and
    the Meta -> rotate-half permutation with rotary."""
    heads = stack.num_heads
    kv_heads = stack.num_kv_heads or heads
    rotary = getattr(stack, "positions", "none") == "rotary"
    if kv_heads == heads and not rotary:
        return "fuse_qkv"
    return f"fuse_qkv:{heads}:{kv_heads}" + (":meta" if rotary else "")


def _embedding_specs(slot: Any, pentad: str, tp: str, shared_words: bool, problems: list[str],
                     stream_norm: str | None = None) -> list[Rule]:
    """The rules of an embedding slot; ``stream_norm``: TencentPretrain's name of the second
    LayerNorm a dual-stream model puts on this slot (``DualEmbedding.stream_i_layer_norm``)."""
    specs: list[RuleSpec] = []
    for part in slot.parts:
        if part.type == "word" and shared_words:
            specs += SHARED_WORDS
        elif part.type == "seg":
            if part.num_segments not in SEGMENTS:
                problems.append(f"{pentad}.seg has {part.num_segments} rows; TencentPretrain's segment table has "
                                "three (padding, A, B)")
            specs += SEGMENTS.get(part.num_segments, [])
        elif part.type == "word_patch" and (part.own_positions or part.text_norm or part.text_segments):
            problems.append(f"{pentad}.word_patch has Hugging Face ViLT's layout (the caption's own positions, "
                            "token type or norm, the image's own positions); TencentPretrain's WordPatchEmbedding "
                            "has none of them (export the model with pentad-to-hf)")
        elif part.type in ("patch", "word_patch") and (_patch(part).bias or not _patch(part).cls):
            problems.append(f"{pentad}.{part.type} has " + ("a bias in its projection (Hugging Face's ViT layout)"
                                                             if _patch(part).bias else "no CLS vector")
                            + "; TencentPretrain's PatchEmbedding has a bias-free projection and a CLS vector (its "
                            "Hugging Face converter drops the bias, which changes the model)")
        elif part.type == "speech":
            problems += _speech_problems(part, pentad)
        elif part.type in EMBEDDING_PARTS:
            specs += EMBEDDING_PARTS[part.type]
        else:
            problems.append(f"{pentad} part '{part.type}' has no TencentPretrain key map")
    if slot.norm:
        specs += _norm("{slot}.norm", "{tslot}.layer_norm", "layernorm")
    if getattr(slot, "second_norm", False):
        if stream_norm is None:
            problems.append(f"{pentad}.second_norm: TencentPretrain applies a second embedding LayerNorm only in "
                            "a dual-stream model (DualEmbedding's stream_i_layer_norm)")
        else:
            specs += _norm("{slot}.second_norm", stream_norm, "layernorm")
    elif slot.norm and stream_norm is not None:
        problems.append(f"{pentad} has one embedding LayerNorm, and TencentPretrain's DualEmbedding always applies "
                        f"a second one on top of it ({stream_norm}, LN after LN), which is not the identity whatever "
                        "its weights: this stream cannot be written exactly (a stream without an embedding norm, "
                        "or with second_norm as a converted TencentPretrain checkpoint has, can)")
    out = expand(_substitute(specs, slot=pentad, tslot=tp))
    for part in slot.parts:
        if part.type == "speech":
            out += expand(_substitute(SPEECH_CONV, slot=pentad, tslot=tp), conv=range(len(part.kernel_sizes)), wb=WB)
    return out


def _patch(part: Any) -> Any:
    """The patch config of a ``patch`` or ``word_patch`` part."""
    return part.patch if part.type == "word_patch" else part


def _speech_problems(part: Any, path: str) -> list[str]:
    """What TencentPretrain's speech subsampler cannot hold of a pentad ``speech`` part: it strides
    every convolution by 2 and feeds each one after the first ``conv_channels[0] / 2`` channels."""
    problems = []
    strides = getattr(part, "strides", None)
    if strides is not None and any(s != 2 for s in strides):
        problems.append(f"{path}.speech strides {list(strides)}: TencentPretrain's subsampler strides every "
                        "convolution by 2")
    shrink = 2 if part.activation == "glu" else 1
    inputs = [c // shrink for c in part.conv_channels[:-1]]
    if any(i != part.conv_channels[0] // 2 for i in inputs):
        problems.append(f"{path}.speech conv_channels {list(part.conv_channels)} with {part.activation}: "
                        f"TencentPretrain's subsampler feeds every convolution after the first "
                        f"conv_channels[0] / 2 = {part.conv_channels[0] // 2} channels, pentad's gives "
                        f"{inputs}")
    return problems


def rules(model: Any, layout: Layout | bool | None = None) -> list[Rule]:
    """The key map of a pentad ``ModelConfig`` in TencentPretrain's layout (``layout``: a
    :class:`Layout`, or True for the fine-tuned classifier layout)."""
    if not isinstance(layout, Layout):
        layout = Layout(finetuned=bool(layout))
    problems: list[str] = []
    for path, stack in (("model.encoder", model.encoder), ("model.decoder", model.decoder)):
        if getattr(stack, "ffn", None) not in (None, *FEED_FORWARD):
            raise UserError(f"cannot map this model to TencentPretrain's layout: {path}.ffn is '{stack.ffn}', and "
                            f"TencentPretrain's feed-forwards are {' and '.join(FEED_FORWARD)} only (it has no "
                            "mixture of experts); export it to Hugging Face instead (a Mixtral-style decoder).")
        qkv_bias = getattr(stack, "qkv_bias", None)
        if qkv_bias is not None and qkv_bias != stack.bias:
            raise UserError(f"cannot map this model to TencentPretrain's layout: {path}.qkv_bias is {qkv_bias} with "
                            f"bias {stack.bias}, and TencentPretrain has one bias switch for every projection "
                            "(remove_transformer_bias); export it to Hugging Face instead.")
    if model.streams:
        return _dual_rules(model, layout)
    hidden = model.hidden_size
    out = _embedding_specs(model.embedding, "embedding", "embedding", False, problems)
    enc = model.encoder
    if enc.type == "transformer" and model.embedding_size not in (None, hidden):
        out += expand(PROJECTION, wb=WB)
    if enc.type in RECURRENT:
        out += _recurrent_rules(model)
    elif enc.type == "gatedcnn":
        out += _gatedcnn_rules(enc.num_layers)
    elif enc.type != "transformer":
        problems.append(f"encoder '{enc.type}' has no TencentPretrain key map here")
        raise UserError("cannot map this model to TencentPretrain's layout: " + "; ".join(problems) + ".")
    else:
        out += _transformer_rules(model, layout, problems)
    if model.decoder is not None:
        out += _decoder_rules(model, problems)
    words = "embedding.word.weight"
    if any(p.type == "word_patch" for p in model.embedding.parts):
        words = "embedding.word_patch.word.weight"
    encoder_words = words
    if model.target_embedding is not None and not model.share_embedding:
        words = "target_embedding.word.weight"
    tied_done = False
    target_rules: list[Rule] = []
    for target in model.targets:
        head = list(FINETUNED_CLASSIFIER if layout.finetuned and target.type == "cls" else TARGETS.get(target.type, []))
        if target.type == "tagger":
            head = TAGGER + (TAGGER_CRF if target.crf else [])
        elif target.type == "span":
            head = SPAN
        elif target.type not in TARGETS:
            problems.append(f"target '{target.type}' has no TencentPretrain key map")
        elif target.type == "cls" and not target.pooler:
            problems.append(f"the cls target '{target.target_name}' has no pooler; TencentPretrain's classifiers "
                            "pool through a dense + tanh layer (linear_1 / output_layer_1) first")
        if target.type in OUTPUT_TIED:
            if model.tie_word_embeddings and not tied_done:
                head += OUTPUT_TIED[target.type]
                tied_done = True
            elif not model.tie_word_embeddings:
                head += OUTPUT_UNTIED[target.type]
        if target.type in ("lm", "bilm") and target.bias:
            head += LM_BIAS
        target_rules += expand(head, name=target.target_name, wb=WB, words=words, encoder_words=encoder_words,
                               type=target.type, p=CRF_PARAMETERS)
    if problems:
        raise UserError("cannot map this model to TencentPretrain's layout: " + "; ".join(problems) + ".")
    return out + target_rules


def _recurrent_rules(model: Any) -> list[Rule]:
    """A recurrent encoder: its parameters have TencentPretrain's names (``encoder.rnn.weight_ih_l0``...)."""
    from pentad.builder import build_model

    names = [k for k in build_model(model, device="meta").state_dict() if k.startswith("encoder.")]
    return expand([(name, name) for name in names])


def _gatedcnn_rules(num_layers: int) -> list[Rule]:
    """The gated CNN: TencentPretrain's separate convolution / gate tensors <-> pentad's fused ones."""
    specs: list[RuleSpec] = [
        ("encoder.layers.0.conv.weight", ("encoder.conv_1.weight", "encoder.gate_1.weight"), "gated_conv:first"),
        ("encoder.layers.0.conv.bias", ("encoder.conv_1.bias", "encoder.gate_1.bias"), "gated_conv:bias"),
        ("encoder.layers.0.extra_bias", ("encoder.conv_b1", "encoder.gate_b1"), "gated_conv:extra")]
    for i in range(num_layers - 1):
        specs += [
            (f"encoder.layers.{i + 1}.conv.weight", (f"encoder.conv.{i}.weight", f"encoder.gate.{i}.weight"),
             "gated_conv:conv"),
            (f"encoder.layers.{i + 1}.conv.bias", (f"encoder.conv.{i}.bias", f"encoder.gate.{i}.bias"),
             "gated_conv:bias"),
            (f"encoder.layers.{i + 1}.extra_bias", (f"encoder.conv_b.{i}", f"encoder.gate_b.{i}"), "gated_conv:extra")]
    return expand(specs)


def _transformer_rules(model: Any, layout: Layout, problems: list[str], ours: str = "encoder",
                       theirs: str = "encoder") -> list[Rule]:
    """The rules of ``model.encoder`` (a transformer) under pentad's ``ours`` and TencentPretrain's
    ``theirs`` (``pair.encoder`` and ``encoder.encoder_1`` for a dual model's stream 1)."""
    enc = model.encoder
    hidden = model.hidden_size
    out: list[Rule] = []
    lwb = WB if enc.bias else ("weight",)
    shared = bool(enc.share_layers)
    layers = range(1 if shared else enc.num_layers)
    block = f"{theirs}.transformer" if shared else f"{theirs}.transformer.{{layer}}"
    layer_specs = ATTENTION + _norm("{L}.attention_norm", "{T}.layer_norm_1", enc.norm) + FEED_FORWARD[enc.ffn] \
        + _norm("{L}.ffn_norm", "{T}.layer_norm_2", enc.norm)
    out += expand(_substitute(layer_specs, L=f"{ours}.layers.{{layer}}", T=block), lwb=lwb, qkv=_qkv(enc, hidden),
                  layer=layers)
    if enc.positions == "relative" and (ours, theirs) == ("encoder", "encoder"):
        out += _relative_rules(enc, layout)
    elif enc.positions not in ("none", "rotary", "alibi"):
        problems.append(f"{ours} positions '{enc.positions}' have no TencentPretrain key map")
    final = enc.final_norm if enc.final_norm is not None else enc.norm_position == "pre"
    if final:
        out += expand(_norm(f"{ours}.final_norm", f"{theirs}.layer_norm", enc.norm))
    return out


def streams(model: Any) -> list[tuple[Any, str, str]]:
    """(one-stream model config, pentad embedding prefix, pentad encoder prefix) of each stream of a
    model with ``model.streams``: the first is the model's own slots, the second ``streams.<name>.*``
    with its own sizes."""
    name = stream_names(model)[1]
    sizes = stream_sizes(model, name)
    one = model.model_copy(update={"encoder": stream_encoder(model, name), "embedding": stream_embedding(model, name),
                                   "hidden_size": sizes.hidden_size, "embedding_size": sizes.embedding_size,
                                   "vocab_size": sizes.vocab_size, "max_seq_length": sizes.max_seq_length,
                                   "streams": None})
    return [(model.model_copy(update={"streams": None}), "embedding", "encoder"),
            (one, f"streams.{name}.embedding", f"streams.{name}.encoder")]


def _dual_rules(model: Any, layout: Layout) -> list[Rule]:
    """An untied dual model with a ``clr`` target (TencentPretrain's CLIP): each stream's embedding
    under ``embedding.dual.embedding_i`` (its second LayerNorm ``embedding.dual.stream_i_layer_norm``),
    its encoder under ``encoder.encoder_i``, and the clr target's logit scale and projections (stored
    [hidden, feature] by TencentPretrain, a Linear's [feature, hidden] in pentad)."""
    problems: list[str] = []
    if shares(model):
        problems.append("a model whose second stream shares the first's modules: TencentPretrain's tied "
                        "DualEmbedding still has a second LayerNorm of its own per stream (stream_0_layer_norm, "
                        "stream_1_layer_norm), which pentad's shared streams cannot hold")
    out: list[Rule] = []
    for i, (view, emb, enc) in enumerate(streams(model)):
        if view.encoder.type != "transformer":
            problems.append(f"stream {i}'s encoder '{view.encoder.type}': only transformer streams are mapped")
            continue
        if view.embedding_size not in (None, view.hidden_size):
            problems.append(f"stream {i} has a factorised embedding; TencentPretrain's dual streams are not mapped "
                            "with one here")
        out += _embedding_specs(view.embedding, emb, f"embedding.dual.embedding_{i}", False, problems,
                                stream_norm=f"embedding.dual.stream_{i}_layer_norm")
        out += _transformer_rules(view, layout, problems, ours=enc, theirs=f"encoder.encoder_{i}")
    specs: list[RuleSpec] = []
    for target in model.targets:
        if target.type != "clr":
            problems.append(f"target '{target.type}' of a dual model: TencentPretrain's dual-stream pre-training "
                            "checkpoints have the clr target alone")
            continue
        if target.temperature is not None:
            problems.append("a clr target with a fixed temperature: TencentPretrain's always learns logit_scale")
        else:
            specs.append((f"targets.{target.target_name}.logit_scale", "target.clr.logit_scale"))
        if target.projection:
            specs += [(f"targets.{target.target_name}.projection_{i}.weight", f"target.clr.encoder_{i}_projection",
                       "conv1d") for i in (0, 1)]
    if problems:
        raise UserError("cannot map this model to TencentPretrain's layout: " + "; ".join(problems) + ".")
    return out + expand(specs)


def _relative_rules(enc: Any, layout: Layout) -> list[Rule]:
    """T5's encoder bias: every TencentPretrain layer holds the table the first one owns, and the
    encoder holds a second one that no layer reads."""
    bias = "encoder.relative_bias.weight"
    if layout.relative_bias == "encoder":
        return expand([(bias, RELATIVE_UNUSED)])
    layers = 1 if enc.share_layers else enc.num_layers
    specs: list[RuleSpec] = [(bias, RELATIVE_PER_LAYER)]
    specs += [(bias, f"encoder.transformer.{i}.relative_pos_emb.relative_attention_bias.weight", "tied")
              for i in range(1, layers)]
    specs.append((bias, RELATIVE_UNUSED, "shadow"))
    return expand(specs)


def _decoder_rules(model: Any, problems: list[str]) -> list[Rule]:
    dec = model.decoder
    out = _embedding_specs(model.target_embedding, "target_embedding", "tgt_embedding", model.share_embedding,
                           problems)
    lwb = WB if dec.bias else ("weight",)
    layer_specs = ATTENTION + _norm("{L}.attention_norm", "{T}.layer_norm_1", dec.norm) + CROSS_ATTENTION \
        + _norm("{L}.cross_attention_norm", "{T}.layer_norm_2", dec.norm) + FEED_FORWARD[dec.ffn] \
        + _norm("{L}.ffn_norm", "{T}.layer_norm_3", dec.norm)
    out += expand(_substitute(layer_specs, L="decoder.layers.{layer}", T="decoder.transformer_decoder.{layer}"),
                  lwb=lwb, qkv=_qkv(dec, model.hidden_size), layer=range(dec.num_layers))
    if dec.positions == "relative":
        out += expand([("decoder.relative_bias.weight", "decoder.self_pos_emb.relative_attention_bias.weight")])
    elif dec.positions != "none":
        problems.append(f"decoder positions '{dec.positions}': TencentPretrain's decoder has relative positions "
                        "or none")
    final = dec.final_norm if dec.final_norm is not None else dec.norm_position == "pre"
    if final:
        # TencentPretrain's decoder ends with a T5 norm for layernorm "t5", else its normal LayerNorm
        # (gamma and beta), also after "rms" layers.
        kind = dec.final_norm_kind or dec.norm
        if kind == "rmsnorm" or (kind == "t5") != (dec.norm == "t5"):
            problems.append(f"a decoder whose final norm is '{kind}' after '{dec.norm}' layers: TencentPretrain ends "
                            "its decoder with a t5 norm after t5 layers and with its LayerNorm (with a bias) "
                            "otherwise (set model.decoder.final_norm_kind to layernorm_unbiased)")
        out += expand(_norm("decoder.final_norm", "decoder.layer_norm", kind))
    return out


def to_tencentpretrain(model: Any, ours: dict[str, Tensor], extras: dict[str, Tensor] | None = None,
                       finetuned: bool = False, source: str = "pentad weights",
                       layout: Layout | None = None) -> dict[str, Tensor]:
    """A TencentPretrain state dict of pentad weights: the key map run backwards.

    Tensors TencentPretrain ties (the output layer with ``tie_weights``, ``tgt_embedding.word``
    with ``share_embedding``, the relative-position bias every encoder layer shares) are one tensor
    under several names, as in TencentPretrain's own state dicts, so ``torch.save`` stores them once."""
    layout = layout or Layout(finetuned=finetuned)
    key_map = rules(model, layout)
    state = to_foreign(ours, key_map, source=source, layout="TencentPretrain", extras=extras)
    return alias_tied(state, key_map)


def tied_names(key_map: list[Rule]) -> list[tuple[str, str]]:
    """(second name, the name it is a copy of) of every ``tied`` rule: the tensors TencentPretrain
    ties, which its state dicts hold once under both names."""
    owner = {r.ours[0]: r.theirs[0] for r in key_map if r.transform == "copy" and len(r.ours) == len(r.theirs) == 1}
    return [(r.theirs[0], owner[r.ours[0]]) for r in key_map if r.transform == "tied" and r.ours[0] in owner]


def alias_tied(state: dict[str, Tensor], key_map: list[Rule]) -> dict[str, Tensor]:
    """``state`` with each ``tied`` rule's key pointing at the tensor the plain copy of the same
    pentad weight produced (the export writes tied keys as separate copies)."""
    out = dict(state)
    for name, source in tied_names(key_map):
        if name in out and source in out and torch.equal(out[source], out[name]):
            out[name] = out[source]
    return out


# ------------------------------------------------------------------------------------------ files
def read_state_dict(path: Path) -> dict[str, Tensor]:
    """A TencentPretrain ``.bin`` state dict (see ``training.checkpoint.read_torch_state_dict``)."""
    from pentad.training.checkpoint import read_torch_state_dict

    return read_torch_state_dict(path)


def write_state_dict(path: Path, state: dict[str, Tensor]) -> None:
    """``torch.save`` of an ordered state dict, atomically, as TencentPretrain's ``save_model`` writes it."""
    with atomic_path(path) as tmp:
        # One contiguous tensor per distinct input tensor: names that share a tensor still share it
        # in the file (torch.save stores each storage once).
        contiguous: dict[int, Tensor] = {}
        ordered = collections.OrderedDict(
            (k, contiguous.setdefault(id(v), v.contiguous())) for k, v in state.items())
        with tmp.open("wb") as out:  # a file object: records named archive/..., not after the temporary name
            torch.save(ordered, out)


def find_files(in_dir: Path) -> tuple[Path, Path]:
    """(weights file, JSON config) of a TencentPretrain directory."""
    from pentad.interop.hf import read_json
    from pentad.tencentpretrain.config import is_tencentpretrain_config

    if not in_dir.is_dir():
        raise UserError(f"{in_dir} is not a directory (expected a TencentPretrain .bin checkpoint and its "
                        "JSON config in one directory).")
    weights = sorted(p for p in in_dir.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    if len(weights) != 1:
        found = ", ".join(p.name for p in weights) or "none"
        raise UserError(f"{in_dir} must hold exactly one checkpoint file ({', '.join(WEIGHT_SUFFIXES)}); "
                        f"found {found}.")
    configs = [p for p in sorted(in_dir.glob("*.json")) if is_tencentpretrain_config(read_json(p))]
    if len(configs) != 1:
        found = ", ".join(p.name for p in configs) or "none"
        raise UserError(f"{in_dir} must hold exactly one TencentPretrain JSON config (with keys such as "
                        f"layers_num, heads_num, embedding, encoder, target); found {found}.")
    return weights[0], configs[0]


def find_tokenizer(in_dir: Path, raw: dict[str, Any],
                   tok_dir: Path | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    """The pentad tokenizer config of the vocabulary files next to the checkpoint (absolute paths).

    A merges file means GPT-2 BPE; a ``.model`` file SentencePiece (with ``"tokenizer":
    "xlmroberta"`` laid out with fairseq's ids, written into ``tok_dir``); one ``*vocab*.txt`` file
    a WordPiece vocabulary (or ``char`` / ``space`` when the config's ``tokenizer`` says so). Literal
    special tokens in the text are tokenized as text (``special_tokens_in_text: split``), as
    TencentPretrain's own tokenizers do (SentencePiece matches pieces as sentencepiece does, in both).
    """
    from pentad.tencentpretrain.config import SPECIAL_TOKENS_IN_TEXT

    merges = sorted(in_dir.glob("*merges*.txt"))
    vocabs = sorted(p for p in in_dir.glob("*vocab*") if p.suffix in (".txt", ".json"))
    models = sorted(in_dir.glob("*.model"))
    lower = str(raw.get("do_lower_case", "true")).lower() in ("true", "1", "yes")
    if merges:
        if len(merges) != 1 or len(vocabs) != 1:
            raise UserError(f"{in_dir}: a BPE tokenizer needs one *merges*.txt and one *vocab* file; found "
                            f"{[p.name for p in merges + vocabs]}.")
        return {"type": "bpe", "vocab": str(vocabs[0].resolve()), "merges": str(merges[0].resolve()),
                "special_tokens_in_text": SPECIAL_TOKENS_IN_TEXT}, []
    if models:
        if len(models) != 1:
            raise UserError(f"{in_dir}: several SentencePiece models {[p.name for p in models]}; keep one.")
        if raw.get("tokenizer") == "xlmroberta":
            from pentad.interop import spm

            if tok_dir is None:
                raise UserError("an xlmroberta tokenizer needs a directory to write its re-numbered model into")
            tok_dir.mkdir(parents=True, exist_ok=True)
            target = tok_dir / models[0].name
            target.write_bytes(spm.to_fairseq(models[0].read_bytes(), str(models[0])))
            return {"type": "sentencepiece", "model": str(target.resolve())}, [
                f"{models[0].name}: ids laid out as TencentPretrain's xlmroberta tokenizer numbers them (fairseq: "
                "<s> <pad> </s> <unk> first, every other piece one up, <mask> last)"]
        return {"type": "sentencepiece", "model": str(models[0].resolve())}, []
    texts = [p for p in vocabs if p.suffix == ".txt"]
    if len(texts) > 1:
        raise UserError(f"{in_dir}: several vocabulary files {[p.name for p in texts]}; keep the one the model "
                        "was trained with.")
    if texts:
        kind = TOKENIZERS.get(str(raw.get("tokenizer", "bert")), "wordpiece")
        cfg: dict[str, Any] = {"type": kind, "vocab": str(texts[0].resolve()),
                               "special_tokens_in_text": SPECIAL_TOKENS_IN_TEXT}
        if kind == "wordpiece":
            cfg["lowercase"] = lower
        return cfg, []
    return None, [f"no vocabulary file in {in_dir}: the run has no tokenizer (set one in its config to fine-tune)"]


def export_tokenizer(tokenizer: Any, out_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """Write a pentad tokenizer's files as TencentPretrain reads them; returns (config keys to add,
    notes). WordPiece: ``vocab.txt``; byte-level BPE: ``vocab.txt`` (one token per line, TencentPretrain's
    form) + ``merges.txt``; SentencePiece: the model (an XLM-R model in fairseq's id layout goes
    back to its original layout with ``"tokenizer": "xlmroberta"``)."""
    from pentad.interop import spm

    kind = tokenizer.registry_name
    notes: list[str] = []
    if getattr(tokenizer.config(), "special_tokens_in_text", None) == "parse" and kind in ("wordpiece", "bpe", "char"):
        notes.append("the run's tokenizer reads a special token typed in the text ('[CLS]') as the special id "
                     "(special_tokens_in_text: parse); TencentPretrain's tokenizer splits it into ordinary pieces")
    with tempfile.TemporaryDirectory() as tmp:
        saved = tokenizer.save(Path(tmp))
        files = {name: (Path(tmp) / saved[name]).read_bytes() for name in ("vocab", "merges", "model") if name in saved}
    if kind in ("wordpiece", "char", "space"):
        (out_dir / "vocab.txt").write_bytes(files["vocab"])
        return ({"tokenizer": kind} if kind != "wordpiece" else {}), notes
    if kind == "bpe":
        tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
        (out_dir / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
        (out_dir / "merges.txt").write_bytes(files["merges"])
        return {"tokenizer": "bpe"}, notes
    if kind == "sentencepiece":
        data = files["model"]
        if spm.is_fairseq(data):
            (out_dir / "sentencepiece.bpe.model").write_bytes(spm.from_fairseq(data, "the run's tokenizer"))
            return {"tokenizer": "xlmroberta"}, []
        (out_dir / "spm.model").write_bytes(data)
        return {}, []
    return {}, [f"tokenizer not exported: pentad's '{kind}' tokenizer has no TencentPretrain equivalent"]


# ----------------------------------------------------------------------------------------- plans
def _dual_plan(raw: dict[str, Any], state: dict[str, Tensor], label: str
               ) -> tuple[dict[str, Any], Layout, list[str]]:
    """The plan of an untied dual-stream pre-training checkpoint (TencentPretrain's CLIP: a text
    stream and an image stream, the clr target). Where the checkpoint has a stream's second
    LayerNorm (``stream_i_layer_norm``) that slot gets ``second_norm``, so the converted model
    computes LN after LN as TencentPretrain does; a logit scale above the clr target's cap raises
    the cap (TencentPretrain has none)."""
    import math

    from pentad.tencentpretrain.config import import_config

    words = [state.get(f"{DUAL_PREFIX}embedding_{i}.word.embedding.weight") for i in (0, 1)]
    word = next((w for w in words if w is not None), None)
    notes: list[str] = []
    out, _ = import_config(raw, [] if word is None else [f"vocab_size={int(word.shape[0])}"], label, notes)
    model = out["model"]
    slots = [model["embedding"], list(model["streams"].values())[1].get("embedding")]
    doubled = []
    for i, slot in enumerate(slots):
        if slot is None:
            continue
        # the import gives second_norm to every stream TencentPretrain builds one for; the checkpoint decides
        if f"{DUAL_PREFIX}stream_{i}_layer_norm.gamma" in state and slot.get("norm", True):
            slot["second_norm"] = True
            doubled.append(f"stream_{i}_layer_norm")
        else:
            slot.pop("second_norm", None)
    notes[:] = [n for n in notes if not n.startswith("TencentPretrain's DualEmbedding applies a second LayerNorm")]
    if doubled:
        notes.append(f"{', '.join(doubled)}: TencentPretrain's DualEmbedding normalises the stream twice (its "
                     "embedding LayerNorm, then this one); the converted slot has second_norm, so the model computes "
                     "what the checkpoint computes there (TencentPretrain also applies dropout twice, pentad once)")
    scale = state.get("target.clr.logit_scale")
    for target in model.get("targets", []):
        if target.get("type") == "clr" and scale is not None and scale.numel() == 1:
            cap = float(target.get("max_logit_scale", 100.0))
            factor = math.exp(float(scale))
            if factor > cap:
                target["max_logit_scale"] = factor * (1 + 1e-6)  # log() of it stays above the scale
                notes.append(f"target.clr.logit_scale is {float(scale):.4g} (a factor of {factor:.4g}): "
                             f"TencentPretrain never caps it, so the clr target's max_logit_scale is "
                             f"raised from {cap:g}")
    return out, Layout(), notes


def plan(raw: dict[str, Any], state: dict[str, Tensor], label: str, tags: bool = False
         ) -> tuple[dict[str, Any], Layout, list[str]]:
    """(run-config dict, checkpoint layout, notes) of a TencentPretrain config + state dict. ``tags``: a
    ``label2id.json`` lies beside the checkpoint, so an ``output_layer`` of 2 outputs is a tagger's
    (run_ner.py), not the start/end layer of run_cmrc.py."""
    from pentad.tencentpretrain.config import import_config

    word = state.get("embedding.word.embedding.weight")
    if word is None and any(k.startswith(DUAL_PREFIX) for k in state):
        if raw.get("tie_weights") or "target" not in raw:
            raise UserError(f"{label}: a dual-stream (SBERT / siamese) checkpoint with tied streams or a siamese "
                            "classifier, which is not converted: TencentPretrain's DualEmbedding normalises each "
                            "stream twice (the embedding's LayerNorm, then stream_i_layer_norm, one per stream even "
                            "when the streams are tied), and pentad's tied streams share one embedding slot, so no "
                            "pentad model computes what this checkpoint computes. Convert the original "
                            "sentence-transformers model from Hugging Face instead (pentad convert hf-to-pentad), or "
                            "fine-tune pentad's sbert recipe from a one-stream BERT checkpoint (docs/streams.md). "
                            "(Untied dual-stream pre-training checkpoints, TencentPretrain's CLIP, convert.)")
        return _dual_plan(raw, state, label)
    if word is None:
        word = state.get(WORD_PATCH_WORDS)  # ViLT: the words come first in its word_patch embedding
    image = word is None and PATCH_MARKER in state  # a ViT: no vocabulary
    if word is None and SPEECH_MARKER in state:  # S2T: the vocabulary is the decoder's
        word = state.get(TARGET_WORDS)
        if word is None:
            raise UserError(f"{label}: a speech encoder ({SPEECH_MARKER}) without {TARGET_WORDS}: TencentPretrain's "
                            "S2T checkpoints hold the decoder's word table.")
    if word is None and not image:
        raise UserError(f"{label}: no embedding.word.embedding.weight tensor, so this is not a TencentPretrain "
                        f"checkpoint with a word embedding (found e.g. {', '.join(sorted(state)[:4]) or 'nothing'}).")
    notes: list[str] = []
    out, _ = import_config(raw, [] if word is None else [f"vocab_size={int(word.shape[0])}"], label, notes)
    if image and "target.cls.linear_2.weight" in state:
        # The checkpoint's head says how many labels (TencentPretrain's ViT configs leave labels_num out).
        for target in out["model"]["targets"]:
            if target.get("type") == "cls":
                target["num_labels"] = int(state["target.cls.linear_2.weight"].shape[0])
        notes[:] = [n for n in notes if not n.startswith("labels_num is not in the config")]
    model = out["model"]
    if model["encoder"].get("positions") == "alibi":
        # A checkpoint reproduces what TencentPretrain computes with it, and TencentPretrain never
        # applies ALiBi; the config import (for training) keeps what the config asks for.
        model["encoder"]["positions"] = "none"
        notes[:] = [n for n in notes if not n.startswith("alibi_position_embedding")]
        notes.append("alibi_position_embedding: TencentPretrain accepts this flag but never applies ALiBi, so the "
                     "converted model has no position information either, as this checkpoint computes in "
                     "TencentPretrain. If the weights were trained with ALiBi elsewhere (Hugging Face BLOOM), set "
                     "model.encoder.positions: alibi in the converted run's config.yaml")
    layout = Layout(finetuned=FINETUNED_MARKER in state)
    if layout.finetuned:
        labels = int(state[FINETUNED_MARKER].shape[0])
        pooling = next((t.get("pooling") for t in model["targets"] if t.get("type") == "cls"), None)
        model["targets"] = [{"type": "cls", "num_labels": labels, "pooling": pooling or raw.get("pooling", "first"),
                             "dropout": 0.0}]
        model["tie_word_embeddings"] = False
        notes.append(f"output_layer_1/2 found: a classifier fine-tuned with run_classifier.py ({labels} labels); "
                     "it becomes pentad's cls target, replacing the config's pre-training targets")
    elif TAGGER_MARKER in state and int(state[TAGGER_MARKER].shape[0]) == 2 and CRF_MARKER not in state \
            and not tags:
        model["targets"] = [{"type": "span"}]
        model["tie_word_embeddings"] = False
        notes.append("output_layer with 2 outputs found: run_cmrc.py's start/end layer; it becomes pentad's span "
                     "target (qa task), replacing the config's pre-training targets (a run_ner.py tagger of 2 tags "
                     "converts as one when its label2id.json lies beside the checkpoint)")
    elif TAGGER_MARKER in state:
        labels = int(state[TAGGER_MARKER].shape[0])
        crf = CRF_MARKER in state
        model["targets"] = [{"type": "tagger", "num_labels": labels, "dropout": 0.0, "crf": crf}]
        model["tie_word_embeddings"] = False
        with_crf = ", with a CRF" if crf else ""
        notes.append(f"output_layer found: a tagger fine-tuned with run_ner.py ({labels} tags{with_crf}); it becomes "
                     "pentad's tagger target, replacing the config's pre-training targets")
    for target in model["targets"]:
        if target["type"] == "cls" and target.get("num_labels") is None and "target.cls.linear_2.weight" in state:
            target["num_labels"] = int(state["target.cls.linear_2.weight"].shape[0])
    if model["encoder"].get("positions") == "relative" and RELATIVE_PER_LAYER not in state and \
            RELATIVE_UNUSED in state:
        layout.relative_bias = "encoder"
        notes.append("T5's relative position bias is only in encoder.relative_pos_emb (as TencentPretrain's T5 "
                     "converter writes it): pentad reads it there, while TencentPretrain itself reads a per-layer "
                     "copy and would run this checkpoint without the converted bias")
    return out, layout, notes


# TencentPretrain's names for pentad's (the inverse of pentad.tencentpretrain.config's tables).
_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_fast", "relu": "relu", "silu": "silu", "linear": "linear"}
_MASKS = {"bidirectional": "fully_visible", "causal": "causal", "prefix": "causal_with_prefix"}
# TencentPretrain has no option for torch's LayerNorm: "layernorm" exports as "normal", with a note.
_NORMS = {"layernorm_unbiased": "normal", "layernorm": "normal", "t5": "t5", "rmsnorm": "rms"}
_EMBEDDINGS = {"word": "word", "pos": "pos", "seg": "seg", "sinusoidal": "sinusoidalpos", "patch": "patch",
               "speech": "speech", "word_patch": "word_patch"}
_TARGETS = {"mlm": "mlm", "sp": "sp", "sop": "sp", "lm": "lm", "bilm": "bilm", "cls": "cls"}
TP_EPS = 1e-6


def export_config(model: Any, *, label: str, base: dict[str, Any] | None = None,
                  objective: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """TencentPretrain's flat JSON config of a pentad ``ModelConfig`` (the inverse of the import);
    ``base``: the config the model was imported from (its training keys are kept). Options
    TencentPretrain cannot express are one UserError; differences it can only approximate are notes."""
    problems: list[str] = []
    notes: list[str] = []
    enc, dec = model.encoder, model.decoder
    hidden = model.hidden_size
    parts = [p.type for p in model.embedding.parts]
    config: dict[str, Any] = dict(base or {})
    if model.streams:
        return _dual_config(model, config, label)
    _norm_kinds(model, problems, notes)
    if enc.type in RECURRENT or enc.type == "gatedcnn":
        if problems:
            raise UserError(f"cannot export {label} to TencentPretrain: " + "; ".join(problems) + ".")
        return _recurrent_config(model, config, parts, objective), notes
    if enc.type != "transformer":
        raise UserError(f"cannot export {label} to TencentPretrain here: encoder '{enc.type}' (TencentPretrain has "
                        "transformer, recurrent and gated-CNN encoders).")
    act = _ACTIVATIONS.get(enc.activation)
    if act is None:
        problems.append(f"activation '{enc.activation}' has no TencentPretrain name")
    for slot, stack in (("encoder", enc), ("decoder", dec)):
        if getattr(stack, "attention_reuse", None) is not None:
            problems.append(f"model.{slot}.attention_reuse (TencentPretrain has no attention-weight reuse)")
        if getattr(stack, "qk_norm", None) is not None:
            problems.append(f"model.{slot}.qk_norm {stack.qk_norm} (TencentPretrain has no query/key norms)")
        for key, what in (("sliding_window", "sliding-window attention"), ("attention_scale_size", "another score "
                          "scale"), ("attention_softcap", "soft-capped attention scores")):
            if getattr(stack, key, None) is not None:
                problems.append(f"model.{slot}.{key} {getattr(stack, key)} (TencentPretrain has no {what})")
        if getattr(stack, "norm_position", None) == "sandwich":
            problems.append(f"model.{slot}.norm_position sandwich (TencentPretrain has pre and post norms)")
        if stack is not None and getattr(stack, "norm", "layernorm") not in _NORMS:
            problems.append(f"model.{slot}.norm {stack.norm} (TencentPretrain has no such norm)")
    problems += [f"model.targets: {t.target_name} soft-caps its logits (TencentPretrain does not)"
                 for t in model.targets if getattr(t, "logit_softcap", None) is not None]
    positions = {p.type: p for p in model.embedding.parts}
    size = model.max_seq_length
    if "pos" in positions and positions["pos"].max_positions:
        size = positions["pos"].max_positions  # TencentPretrain sizes its position table by max_seq_length
    config.update({
        "emb_size": model.embedding_size or hidden, "hidden_size": hidden,
        "feedforward_size": enc.ffn_size or 4 * hidden, "hidden_act": act, "heads_num": enc.num_heads,
        "layers_num": enc.num_layers, "max_seq_length": size, "dropout": float(enc.dropout),
        "embedding": [_EMBEDDINGS.get(p, p) for p in parts], "encoder": "transformer",
        "mask": _MASKS.get(enc.mask, enc.mask), "layernorm_positioning": enc.norm_position,
        "layernorm": _NORMS.get(enc.norm, enc.norm), "layernorm_eps": float(enc.layer_norm_eps),
        "remove_embedding_layernorm": not model.embedding.norm, "remove_transformer_bias": not enc.bias,
        "remove_attention_scale": not enc.attention_scale, "feed_forward": enc.ffn,
        "tie_weights": bool(model.tie_word_embeddings),
        "target": [_TARGETS.get(t.type, t.type) for t in model.targets],
    })
    for p in parts:
        if p not in _EMBEDDINGS:
            problems.append(f"embedding part '{p}' has no TencentPretrain name")
    if "patch" in positions:
        patch = positions["patch"]
        if parts not in (["patch", "pos"], ["patch"]):
            problems.append(f"embedding parts {parts}: TencentPretrain's ViT embedding is patch then pos")
        config.update({"image_height": patch.image_size[0], "image_width": patch.image_size[1],
                       "patch_size": patch.patch_size, "channels_num": patch.channels, "data_processor": "vit"})
    if "word_patch" in positions:
        patch = positions["word_patch"].patch
        if parts[0] != "word_patch":
            problems.append(f"embedding parts {parts}: TencentPretrain's ViLT embedding starts with word_patch")
        config.update({"image_height": patch.image_size[0], "image_width": patch.image_size[1],
                       "patch_size": patch.patch_size, "channels_num": patch.channels, "data_processor": "vilt"})
    if "speech" in positions:
        problems += _speech_config(model, config, parts, positions["speech"])
    if enc.num_kv_heads not in (None, enc.num_heads):
        config["local_kv_heads_num"] = enc.num_kv_heads
    if enc.head_size not in (None, hidden // enc.num_heads):
        config["attention_head_size"] = enc.head_size
    if model.embedding_size not in (None, hidden):
        config["factorized_embedding_parameterization"] = True
    if enc.share_layers:
        config["parameter_sharing"] = True
    if enc.residual_attention:
        config["has_residual_attention"] = True
    flag = {"relative": "relative_position_embedding", "rotary": "rotary_position_embedding",
            "alibi": "alibi_position_embedding"}.get(enc.positions)
    if flag:
        config[flag] = True
    if enc.positions == "relative":
        config["relative_attention_buckets_num"] = enc.relative_buckets
        if enc.relative_max_distance != 128:
            problems.append(f"relative_max_distance {enc.relative_max_distance}; TencentPretrain's is fixed at 128")
    if enc.positions == "rotary" and (float(enc.rotary_base) != 10000.0 or enc.rotary_dim is not None):
        problems.append("rotary with a base other than 10000 or a partial rotary_dim: TencentPretrain's is fixed")
    if getattr(enc, "rope_scaling", None) is not None:
        problems.append(f"rope_scaling {enc.rope_scaling.type}: TencentPretrain's rotary positions are unscaled")
    final = enc.final_norm if enc.final_norm is not None else enc.norm_position == "pre"
    if final != (enc.norm_position == "pre"):
        problems.append("TencentPretrain puts a final norm exactly after pre-norm encoders")
    if dec is not None:
        config.update({"decoder": "transformer", "decoder_layers_num": dec.num_layers,
                       "tgt_embedding": [_EMBEDDINGS.get(p.type, p.type) for p in model.target_embedding.parts],
                       "share_embedding": bool(model.share_embedding)})
        for f in ("num_heads", "num_kv_heads", "head_size", "ffn_size", "ffn", "activation", "norm", "norm_position",
                  "bias", "attention_scale", "layer_norm_eps", "dropout"):
            if getattr(enc, f) != getattr(dec, f):
                problems.append(f"model.decoder.{f} differs from the encoder's; TencentPretrain's decoder layers read "
                                "the encoder's options")
        if model.tie_word_embeddings and model.share_embedding:
            problems.append("an lm head tied to a shared word table: TencentPretrain's tie_weights with "
                            "share_embedding leaves the head untied")
    else:
        for key in ("decoder", "decoder_layers_num", "tgt_embedding", "share_embedding"):
            config.pop(key, None)
    spans = [t for t in model.targets if t.type == "span"]
    if spans:
        # run_cmrc.py reads the embedding and encoder keys and builds its own 2-output layer.
        config["target"] = [t for t in (base or {}).get("target", ["mlm"]) if t in _TARGETS.values()] or ["mlm"]
        notes.append("a span head is run_cmrc.py's output_layer: the config keeps a pre-training target, which "
                     "run_cmrc.py does not read")
    taggers = [t for t in model.targets if t.type == "tagger"]
    if taggers:
        # run_ner.py reads the embedding and encoder keys and takes its head from the command line.
        config["target"] = [t for t in (base or {}).get("target", ["mlm"]) if t in _TARGETS.values()] or ["mlm"]
        config["labels_num"] = taggers[0].num_labels
        if taggers[0].crf:
            config["crf_target"] = True
        notes.append("a tagger is run_ner.py's output_layer (and crf): the config keeps a pre-training target, "
                     "which run_ner.py does not read")
    for target in model.targets:
        if target.type in ("tagger", "span"):
            continue
        if target.type not in _TARGETS:
            problems.append(f"target '{target.type}' has no TencentPretrain name")
        if target.type == "lm":
            config["has_lmtarget_bias"] = bool(target.bias)
            _export_label_smoothing(target, model.vocab_size, config, notes)
            if target.scale_hidden:
                problems.append("an lm head that rescales its input (T5 v1.0): TencentPretrain's does not")
        if target.type == "cls":
            config["pooling"] = target.pooling
            if target.label_smoothing:
                notes.append(f"the cls head's label_smoothing {target.label_smoothing} is a training setting "
                             "TencentPretrain's classifier does not have (the weights are unaffected)")
            if target.num_labels:
                config["labels_num"] = target.num_labels
        if target.type == "sop":
            config["data_processor"] = "albert"
    if objective and "data_processor" not in config:
        config["data_processor"] = objective
    if problems:
        raise UserError(f"cannot export {label} to TencentPretrain: " + "; ".join(problems) + ".")
    return config, notes


_STREAM_ONLY = ("target", "tie_weights", "data_processor", "labels_num", "pooling")
_IMAGE_KEYS = ("image_height", "image_width", "patch_size", "channels_num")


def _export_label_smoothing(target: Any, vocab_size: int, config: dict[str, Any], notes: list[str]) -> None:
    """TencentPretrain's ``label_smoothing`` of an lm head: it spreads eps over the wrong tokens only
    (lm_target.py, as fairseq), so torch's spread over every token (``all``) is written as the eps
    giving the same loss, eps * (V - 1) / V."""
    eps = float(target.label_smoothing)
    if not eps:
        config.pop("label_smoothing", None)
        return
    if target.label_smoothing_spread == "all":
        eps = eps * (vocab_size - 1) / vocab_size
        notes.append(f"label_smoothing {target.label_smoothing} spread over every token is TencentPretrain's "
                     f"label_smoothing {eps:.6g} (it spreads over the wrong tokens only): the same loss")
    config["label_smoothing"] = eps


def _dual_config(model: Any, config: dict[str, Any], label: str) -> tuple[dict[str, Any], list[str]]:
    """The config of an untied dual model with a clr target (TencentPretrain's CLIP): each stream's
    keys under ``stream_0`` / ``stream_1`` (as a one-stream export writes them, with its pooling), the
    image keys and the clr options at the top level."""
    problems: list[str] = []
    notes: list[str] = []
    poolings = [stream.pooling for stream in model.streams.values()]
    kinds = []
    for i, (view, _, _) in enumerate(streams(model)):
        one = view.model_copy(update={"targets": [], "decoder": None, "target_embedding": None,
                                      "tie_word_embeddings": False})
        try:
            flat, stream_notes = export_config(one, label=f"{label} (stream {i})")
        except UserError as e:
            problems.append(str(e).rstrip("."))
            continue
        notes += stream_notes
        for key in _STREAM_ONLY:
            flat.pop(key, None)
        for key in _IMAGE_KEYS:
            if key in flat:
                config[key] = flat.pop(key)
        previous = config.get(f"stream_{i}")
        config[f"stream_{i}"] = {**(previous if isinstance(previous, dict) else {}), **flat, "pooling": poolings[i]}
        kinds.append({p.type for p in view.embedding.parts})
        if i == 0:
            config["dropout"] = flat["dropout"]
    clr = [t for t in model.targets if t.type == "clr"]
    if len(clr) != 1 or len(model.targets) != 1:
        problems.append(f"targets {[t.type for t in model.targets]}: TencentPretrain's dual-stream pre-training has "
                        "the clr target alone")
    else:
        if clr[0].streams not in (None, list(model.streams)):
            problems.append(f"a clr target reading streams {clr[0].streams}; TencentPretrain's compares stream_0 "
                            "with stream_1")
        if not clr[0].symmetric:
            problems.append("a clr target with symmetric: false; TencentPretrain's averages both directions")
        config.update({"projection": bool(clr[0].projection), "target": ["clr"]})
        if clr[0].projection:
            config["feature_size"] = clr[0].feature_size or model.hidden_size
        else:
            config.pop("feature_size", None)
        notes.append("TencentPretrain's clr target never caps its logit scale (pentad's caps it at "
                     f"{clr[0].max_logit_scale:g})")
    if problems:
        raise UserError(f"cannot export {label} to TencentPretrain: " + "; ".join(problems) + ".")
    config.update({"embedding": ["dual"], "encoder": "dual", "tie_weights": False})
    if len(kinds) == 2 and "word" in kinds[0] and "patch" in kinds[1]:
        config["data_processor"] = "clip"
    for key in ("emb_size", "hidden_size", "feedforward_size", "heads_num", "layers_num", "hidden_act",
                "max_seq_length", "mask", "layernorm_positioning", "remove_embedding_layernorm"):
        config.pop(key, None)  # TencentPretrain's streams name their own
    return config, notes


def _speech_config(model: Any, config: dict[str, Any], parts: list[str], speech: Any) -> list[str]:
    """TencentPretrain's S2T options of a pentad model with a ``speech`` part (written into
    ``config``); what it cannot express, as problems."""
    problems = _speech_problems(speech, "model.embedding")
    if parts not in (["speech", "sinusoidal"], ["speech"]):
        problems.append(f"embedding parts {parts}: TencentPretrain's S2T embedding is speech then sinusoidalpos")
    if speech.activation != "glu":
        problems.append("a speech part with a GELU: TencentPretrain uses one exactly when data_processor is not s2t, "
                        "and then does not import it as a speech-to-text model")
    if bool(speech.scale) != ("sinusoidal" in parts):
        problems.append(f"speech.scale {speech.scale}: TencentPretrain scales the subsampler's output by "
                        "sqrt(emb_size) exactly when sinusoidal positions are added")
    if model.decoder is None:
        problems.append("a speech encoder without a decoder: TencentPretrain's S2T is an encoder-decoder")
    config.update({"data_processor": "s2t", "audio_feature_size": speech.feature_size,
                   "conv_channels": list(speech.conv_channels), "conv_kernel_sizes": list(speech.kernel_sizes)})
    table = next((p for p in model.embedding.parts if p.type == "sinusoidal"), None)
    if table is not None and table.max_positions:
        # The import sizes the table max(max_seq_length, max_audio_frames) + 2 rows.
        frames = int(table.max_positions) - 2
        if frames > int(config.get("max_seq_length", 0)):
            config["max_audio_frames"] = frames
    return problems


def _norm_kinds(model: Any, problems: list[str], notes: list[str]) -> None:
    """Norms TencentPretrain builds differently from the pentad model. Its embedding norms, its mlm
    head's norm and (unless the layers are "t5") its decoder's final norm are always its own
    LayerNorm (pentad's ``layernorm_unbiased``); its layers and encoder final norm follow
    ``layernorm``, which has no value for torch's LayerNorm (pentad's ``layernorm``)."""
    fixed: list[tuple[str, str]] = []  # (config path, pentad kind) where TencentPretrain builds its LayerNorm
    for slot in ("embedding", "target_embedding"):
        cfg = getattr(model, slot, None)
        if cfg is not None and cfg.norm:
            fixed.append((f"model.{slot}.norm_kind", cfg.norm_kind))
    for i, target in enumerate(model.targets):
        if target.type == "mlm":
            fixed.append((f"model.targets.{i}.norm", target.norm))
    enc, dec = model.encoder, model.decoder
    torch_norms = [path for path, kind in fixed if kind == "layernorm"]
    for path, kind in fixed:
        if kind not in ("layernorm", "layernorm_unbiased"):
            problems.append(f"{path} is '{kind}': TencentPretrain always builds a LayerNorm (with a bias) there")
    stacks = [("model.encoder", enc)] + ([("model.decoder", dec)] if dec is not None else [])
    for path, stack in stacks:
        if getattr(stack, "norm", None) == "layernorm":
            torch_norms.append(f"{path}.norm")
    if enc.type == "transformer" and enc.final_norm_kind not in (None, enc.norm):
        problems.append(f"model.encoder.final_norm_kind '{enc.final_norm_kind}' differs from its layers' "
                        f"'{enc.norm}': TencentPretrain's encoder ends with a norm of its layers' kind")
    if dec is not None and (dec.final_norm if dec.final_norm is not None else dec.norm_position == "pre") and \
            (dec.final_norm_kind or dec.norm) == "layernorm":
        torch_norms.append("model.decoder.final_norm_kind")
    if torch_norms:
        notes.append(f"{', '.join(dict.fromkeys(torch_norms))}: torch's LayerNorm (pentad 'layernorm'), which "
                     "TencentPretrain cannot express: its 'normal' LayerNorm (written here) divides by the unbiased "
                     "std + eps, so TencentPretrain's outputs differ slightly from this model's")


def _recurrent_config(model: Any, config: dict[str, Any], parts: list[str], objective: str | None) -> dict[str, Any]:
    """The config of a recurrent or gated-CNN model (no attention keys)."""
    enc = model.encoder
    config.update({"emb_size": model.embedding_size or model.hidden_size, "hidden_size": model.hidden_size,
                   "layers_num": enc.num_layers, "dropout": float(enc.dropout), "max_seq_length": model.max_seq_length,
                   "embedding": [_EMBEDDINGS.get(p, p) for p in parts], "encoder": enc.type,
                   "remove_embedding_layernorm": not model.embedding.norm,
                   "tie_weights": bool(model.tie_word_embeddings),
                   "target": [_TARGETS.get(t.type, t.type) for t in model.targets]})
    if getattr(enc, "bidirectional", None) is not None:
        config["bidirectional"] = bool(enc.bidirectional)
    if enc.type == "gatedcnn":
        config.update(kernel_size=enc.kernel_size, block_size=enc.block_size)
    for target in model.targets:
        if target.type in ("lm", "bilm"):
            config["has_lmtarget_bias"] = bool(target.bias)
    if objective and "data_processor" not in config:
        config["data_processor"] = objective
    return config
