"""Import TencentPretrain's flat JSON model configs through a table.

A TencentPretrain config such as ``models/bert/base_config.json`` names modules per slot
(``"embedding": ["word", "pos", "seg"]``, ``"encoder": "transformer"``, ``"target": ["mlm", "sp"]``)
and flat sizes. Every key maps to a place in pentad's nested config, and the imported model is the
one TencentPretrain's ``build_model`` builds from the same file: the same modules with the same
parameter shapes, so its checkpoints convert tensor for tensor (``pentad.tencentpretrain.checkpoint``).
The mapping, key by key, and the few places where pentad deliberately differs are listed in
``docs/tencentpretrain_import.md``; in short:

* ``emb_size`` != ``hidden_size`` with ``factorized_embedding_parameterization`` (ALBERT) ->
  ``model.embedding_size`` (the embedding slot projects to ``hidden_size``; the mlm head maps back);
  for recurrent and convolutional encoders ``emb_size`` is the encoder's input width.
* The segment table keeps TencentPretrain's three rows (``num_segments: 3``). pentad's segments are
  0 (A) and 1 (B) with padding in the padding mask, so a converted checkpoint puts TencentPretrain's
  rows (pad, A, B) at pentad rows (2, 0, 1): row 2 is never read and only carries the padding row.
* ``tie_weights`` with ``share_embedding`` in an encoder-decoder (T5, BART, PEGASUS) leaves
  TencentPretrain's LM head *untied* (``Model.__init__`` ties the head to the decoder's table and
  then replaces that table): imported as ``tie_word_embeddings: false`` so that it is the same model.
* T5's second, never-used encoder relative-position table (``encoder.relative_pos_emb``) is not
  reproduced: pentad's count is TencentPretrain's minus ``relative_attention_buckets_num x heads_num``.
* ``alibi_position_embedding`` is applied by pentad but ignored by TencentPretrain, and
  ``layer_number_scale`` is inert in both: importing says so (a notice on stderr and in the run
  config's ``description``), because a checkpoint trained by TencentPretrain learned without ALiBi.

Dual-stream text configs (SBERT, siamese LSTM) import as ``finetune/run_classifier_siamese.py``
builds them: a ``dual`` encoder (tied streams) and a ``pair_cls`` head over (u, v, |u-v|, u*v);
TencentPretrain's second LayerNorm on each stream's embedding (``stream_i_layer_norm``, LN after
LN) is not reproduced for tied streams; untied ones (CLIP) keep it (``second_norm``). Vision and
speech configs (ViT, BEiT, CLIP, ViLT, S2T, DALL-E, Talk2Face) are refused with a message naming
the modality, and saying so where TencentPretrain's own file is stale (BEiT, DALL-E, Talk2Face).
As in TencentPretrain, the vocabulary completes the config: pass ``vocab_size=N`` or
``vocab_path=FILE`` (WordPiece, or ``char`` / ``space`` per the config's ``tokenizer``),
``spm_model_path=FILE`` or ``vocab_path=FILE merges_path=FILE`` (GPT-2 BPE) as overrides.
"""

from __future__ import annotations

import sys
from typing import Any

from pentad.config.dual_layout import default_names
from pentad.errors import UserError, closest, shown

# Keys that mark a file as a TencentPretrain config (pentad configs nest everything under model/...).
_MARKERS = {"layers_num", "heads_num", "emb_size", "feedforward_size", "data_processor", "stream_0"}

# ------------------------------------------------------------------------------- name tables
EMBEDDINGS = {"word": "word", "pos": "pos", "seg": "seg", "sinusoidalpos": "sinusoidal", "patch": "patch",
              "word_patch": "word_patch", "masked_patch": "masked_patch", "speech": "speech"}
ENCODERS = {name: name for name in ("transformer", "rnn", "lstm", "gru", "birnn", "bilstm", "bigru", "gatedcnn")}
RECURRENT = {"rnn", "lstm", "gru", "birnn", "bilstm", "bigru"}
DECODERS = {"transformer": "transformer"}
TARGETS = {"mlm": "mlm", "sp": "sp", "lm": "lm", "cls": "cls", "bilm": "bilm"}
# "prefix" is not one of TencentPretrain's mask names, but its encoder treats every unknown name as
# causal_with_prefix and shipped configs use it; any other unknown name is refused here (a typo).
MASKS = {"fully_visible": "bidirectional", "causal": "causal", "causal_with_prefix": "prefix", "prefix": "prefix"}
ACTIVATIONS = {"gelu": "gelu", "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "linear": "linear"}
# TencentPretrain's "normal" LayerNorm divides by (unbiased std + eps): pentad's layernorm_unbiased.
NORMS = {"normal": "layernorm_unbiased", "t5": "t5", "rms": "rmsnorm"}
# The kind of the norms TencentPretrain builds as its own LayerNorm whatever "layernorm" says: the
# embedding's, the mlm head's, and a decoder's final norm unless "layernorm" is "t5".
TP_LAYERNORM = "layernorm_unbiased"
FEED_FORWARDS = {"dense": "dense", "gated": "gated"}
POSITIONING = {"pre": "pre", "post": "post"}
POOLINGS = {"first": "first", "last": "last", "mean": "mean", "max": "max"}
# data_processor -> pentad objective (the same names: pentad's objectives follow TencentPretrain's).
OBJECTIVES = {name: name for name in ("bert", "mlm", "lm", "albert", "bart", "t5", "gsg", "mt", "bilm", "cls",
                                      "cls_mlm", "prefixlm", "llm_pretrain", "llm_sft")}
# TencentPretrain's text tokenizer names (the vocabulary overrides decide pentad's tokenizer).
TEXT_TOKENIZERS = {name: name for name in ("bert", "bpe", "char", "space", "xlmroberta", "hfpretrained")}

# Evidence that a config is not a text model: (what it names, the modality).
_NON_TEXT_EMBEDDINGS = {"patch": "image patches (ViT)", "word_patch": "text + image patches (ViLT)",
                        "masked_patch": "masked image patches (BEiT)", "speech": "speech features (S2T)"}
_NON_TEXT_PROCESSORS = {"vit": "image classification (ViT)", "beit": "masked image modelling (BEiT)",
                        "clip": "image-text contrastive (CLIP)", "vilt": "image-text (ViLT)",
                        "s2t": "speech-to-text (S2T)", "dalle": "text-to-image tokens (DALL-E)"}
_NON_TEXT_TOKENIZERS = {"image": "VQGAN image tokens", "text_image": "text + VQGAN image tokens",
                        "virtual": "no text (images only)", "vqgan": "VQGAN image tokens",
                        "multimodal": "text + image tokens"}
# A ViT (patch + pos embedding, data_processor vit) imports: TencentPretrain's argparse defaults for
# the image keys (tencentpretrain/opts.py), and the labels its count was measured with.
VIT_DEFAULTS = {"image_height": 256, "image_width": 256, "patch_size": 16, "channels_num": 3,
                "image_preprocess": ["crop", "normalize"]}
VIT_LABELS = 1000
VIT_KEYS = set(VIT_DEFAULTS)
# Tokenizer names the shipped configs use although TencentPretrain never registered them.
_STALE_TOKENIZERS = {"vqgan": "image", "multimodal": "text_image"}

# Model keys read below (anything else must be in one of the sets that follow).
_MODEL_KEYS = {
    "emb_size", "hidden_size", "feedforward_size", "heads_num", "layers_num", "decoder_layers_num",
    "attention_head_size", "local_kv_heads_num", "hidden_act", "dropout", "max_seq_length", "embedding",
    "tgt_embedding", "encoder", "decoder", "target", "mask", "layernorm_positioning", "layernorm", "layernorm_eps",
    "feed_forward", "relative_position_embedding", "relative_attention_buckets_num", "rotary_position_embedding",
    "alibi_position_embedding", "layer_number_scale", "remove_embedding_layernorm", "remove_transformer_bias",
    "remove_attention_scale", "factorized_embedding_parameterization", "parameter_sharing",
    "has_residual_attention", "tie_weights", "share_embedding", "has_lmtarget_bias", "label_smoothing",
    "ignore_index", "prefix_lm_loss", "pooling", "labels_num", "bidirectional", "kernel_size", "block_size",
    "data_processor", "tokenizer", "seq_length"}
_DUAL_KEYS = {"stream_0", "stream_1", "projection", "feature_size"}
# Image and audio options: TencentPretrain has defaults for them, so they are valid keys; a text model
# does not read them.
_MEDIA_KEYS = {"image_height", "image_width", "patch_size", "channels_num", "image_preprocess", "image_tokenizer",
               "sampling_rate", "audio_preprocess", "max_audio_frames", "conv_layers_num", "audio_feature_size",
               "conv_channels", "conv_kernel_sizes", "specaugment", "vqgan_model_path", "vqgan_config_path"}
# The audio options an s2t import reads (the speech part and the asr task).
S2T_KEYS = {"sampling_rate", "audio_preprocess", "max_audio_frames", "conv_layers_num", "audio_feature_size",
            "conv_channels", "conv_kernel_sizes", "specaugment"}
# TencentPretrain options that describe training, preprocessing or the machine, not the model. They
# are accepted and not imported (pentad sets these under train.* and data.*); importing lists them.
_RUN_KEYS = {
    "learning_rate", "warmup", "lr_decay", "optimizer", "scheduler", "batch_size", "total_steps", "epochs_num",
    "accumulation_steps", "report_steps", "save_checkpoint_steps", "seed", "instances_buffer_size", "dup_factor",
    "dynamic_masking", "whole_word_masking", "span_masking", "span_geo_prob", "span_max_length", "full_sentences",
    "short_seq_prob", "docs_buffer_size", "sentence_selection_strategy", "json_format_corpus", "tgt_seq_length",
    "processes_num", "corpus_path", "dataset_path", "pretrained_model_path", "output_model_path", "config_path",
    "deep_init", "world_size", "gpu_ranks", "master_ip", "backend", "deepspeed", "deepspeed_config",
    "deepspeed_checkpoint_activations", "deepspeed_checkpoint_layers_num", "enable_zero3", "local_rank",
    "fp16", "fp16_opt_level", "log_path", "log_level", "log_file_level", "tensor_model_parallel_size",
    "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "use_lora", "lora_r", "lora_alpha",
    "lora_dropout", "lora_pretrained_model_path", "tgt_tokenizer", "tgt_vocab_path", "tgt_merges_path",
    "tgt_spm_model_path", "tgt_do_lower_case", "crf_target", "label2id_path"}
_VOCAB_KEYS = {"vocab_size", "vocab_path", "spm_model_path", "merges_path", "do_lower_case"}
KNOWN_KEYS = _MODEL_KEYS | _DUAL_KEYS | _MEDIA_KEYS | _RUN_KEYS | _VOCAB_KEYS

# Sizes TencentPretrain's argparse has no default for: a config that lacks one does not build there.
_REQUIRED = {"transformer": ("hidden_size", "heads_num", "layers_num", "feedforward_size", "hidden_act"),
             "recurrent": ("hidden_size", "layers_num"),
             "gatedcnn": ("hidden_size", "layers_num", "kernel_size", "block_size")}

# TencentPretrain's fixed epsilon of the embedding LayerNorm, the mlm head's LayerNorm and the
# decoder's final norm (whatever layernorm_eps says), and the default of layernorm_eps itself.
TP_EPS = 1e-6

# Text families whose configs import (the docs table lists each file).
TEXT_FAMILIES = ("albert", "bart", "bert", "bloom", "cnn", "gpt2", "llama", "llama2", "megatron", "pegasus", "rnn",
                 "t5", "t5-v1_1", "transformer", "xlm-roberta", "sbert", "rnn/siamese_lstm")


def is_tencentpretrain_config(raw: dict[str, Any]) -> bool:
    return bool(_MARKERS & set(raw)) or isinstance(raw.get("encoder"), str) or isinstance(raw.get("target"), list)


def import_config(raw: dict[str, Any], overrides: list[str], label: str,
                  notices: list[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Translate a flat TencentPretrain config into a pentad run-config dict.

    Bare vocabulary overrides (``vocab_size=N``, ``vocab_path=F`` ...) are consumed here; dotted
    pentad overrides are returned to apply after. Where the imported model behaves differently from
    what TencentPretrain trains with the same file (ALiBi, for one), a notice says so: appended to
    ``notices`` when a list is given, else printed on stderr; either way it is also recorded in the
    config's ``description``. Raises ``UserError`` naming every problem (unknown keys and names with
    the closest valid one, modules pentad lacks, non-text models).
    """
    flat, rest = _split_overrides(raw, overrides)
    _refuse_non_text(flat, label)
    imported = _Importer(flat, label)
    if _is_dual(flat):
        if not _dual_available():
            _refuse_dual(flat, label)
        out = imported.run_dual()
    else:
        out = imported.run()
    out["imported_from"] = "tencentpretrain"  # fine-tuning then takes TencentPretrain's defaults
    if notices is not None:
        notices.extend(imported.notices)
    else:
        for notice in imported.notices:
            print(f"pentad: notice: {label}: {notice}", file=sys.stderr, flush=True)
    return out, rest


# ------------------------------------------------------------------------------------- pieces
def _split_overrides(raw: dict[str, Any], overrides: list[str]) -> tuple[dict[str, Any], list[str]]:
    flat = dict(raw)
    rest = []
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        if "=" in text and "." not in key and key in _VOCAB_KEYS:
            value = text.split("=", 1)[1]
            flat[key] = int(value) if key == "vocab_size" and value.strip().isdigit() else value
        else:
            rest.append(text)
    return flat, rest


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _truthy(value: Any) -> bool:
    """TencentPretrain flags are JSON booleans; strings like "false" count as what they say."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def is_vit(flat: dict[str, Any]) -> bool:
    """A ViT: a patch embedding (with learned positions) and the vit data processor (or none), one stream."""
    parts = _as_list(flat.get("embedding", []))
    return ("patch" in parts and set(parts) <= {"patch", "pos"} and flat.get("data_processor", "vit") == "vit"
            and "stream_0" not in flat and "stream_1" not in flat and "tgt_embedding" not in flat)


def is_vilt(flat: dict[str, Any]) -> bool:
    """A ViLT: a word_patch embedding (caption then image, one stream) and the vilt data processor (or none)."""
    parts = _as_list(flat.get("embedding", []))
    return ("word_patch" in parts and set(parts) <= {"word_patch", "pos", "seg"}
            and flat.get("data_processor", "vilt") == "vilt" and "stream_0" not in flat and "stream_1" not in flat
            and "tgt_embedding" not in flat)


def is_clip(flat: dict[str, Any]) -> bool:
    """A CLIP: two streams, text (stream 0) and patches (stream 1), pre-trained with the clip processor."""
    streams = [flat.get(k) for k in ("stream_0", "stream_1")]
    if not all(isinstance(x, dict) for x in streams):
        return False
    text, image = (set(_as_list(x.get("embedding", []))) for x in streams)
    return flat.get("data_processor", "clip") == "clip" and "patch" not in text and "patch" in image \
        and image <= {"patch", "pos"}


def is_s2t(flat: dict[str, Any]) -> bool:
    """A speech-to-text model: speech features (with sinusoidal positions) into an encoder-decoder."""
    parts = _as_list(flat.get("embedding", []))
    return ("speech" in parts and set(parts) <= {"speech", "sinusoidalpos"} and flat.get("decoder") is not None
            and flat.get("data_processor", "s2t") == "s2t" and "stream_0" not in flat)


def is_beit(flat: dict[str, Any]) -> bool:
    """A BEiT: a masked_patch embedding (with learned positions) predicting image tokens with mlm."""
    parts = _as_list(flat.get("embedding", []))
    return ("masked_patch" in parts and set(parts) <= {"masked_patch", "pos"}
            and flat.get("data_processor", "beit") == "beit" and "stream_0" not in flat and "stream_1" not in flat
            and "tgt_embedding" not in flat)


# Tokenizers whose vocabulary is text ids followed by image_vocab_size image-token ids (DALL-E, talk2face).
_TEXT_IMAGE_TOKENIZERS = ("text_image", "multimodal")


def is_image_token_lm(flat: dict[str, Any]) -> bool:
    """A text-to-image-token language model (DALL-E, talk2face): text embeddings over a vocabulary of text
    and image tokens, so the model itself is a text model."""
    parts = set(_as_list(flat.get("embedding", [])))
    return (flat.get("tokenizer") in _TEXT_IMAGE_TOKENIZERS and parts <= {"word", "pos", "seg", "sinusoidalpos"}
            and flat.get("data_processor") in (None, "dalle") and "stream_0" not in flat)


def _refuse_non_text(flat: dict[str, Any], label: str) -> None:
    """Vision, vision-language and speech configs other than ViT: say which modality, and which stale keys."""
    evidence: list[str] = []
    vit, vilt, image_tokens, beit = is_vit(flat), is_vilt(flat), is_image_token_lm(flat), is_beit(flat)
    clip, s2t = is_clip(flat), is_s2t(flat)
    streams = [flat] + [s for s in (flat.get("stream_0"), flat.get("stream_1")) if isinstance(s, dict)]
    for stream in streams:
        for key in ("embedding", "tgt_embedding"):
            for name in _as_list(stream.get(key, [])):
                if key == "embedding" and clip and name == "patch" and stream is flat.get("stream_1"):
                    continue
                if key == "embedding" and s2t and name == "speech":
                    continue
                if key == "embedding" and ((vit and name == "patch") or (vilt and name == "word_patch")
                                           or (beit and name == "masked_patch")):
                    continue
                if name in _NON_TEXT_EMBEDDINGS:
                    evidence.append(f"{key} '{name}': {_NON_TEXT_EMBEDDINGS[name]}")
    processor = flat.get("data_processor")
    if processor in _NON_TEXT_PROCESSORS and not ((vit and processor == "vit") or (vilt and processor == "vilt")
                                                  or (image_tokens and processor == "dalle")
                                                  or (beit and processor == "beit") or (clip and processor == "clip")
                                                  or (s2t and processor == "s2t")):
        evidence.append(f"data_processor '{processor}': {_NON_TEXT_PROCESSORS[processor]}")
    tokenizer = flat.get("tokenizer")
    if tokenizer in _NON_TEXT_TOKENIZERS and not image_tokens and not (beit and tokenizer in ("image", "vqgan")):
        evidence.append(f"tokenizer '{tokenizer}': {_NON_TEXT_TOKENIZERS[tokenizer]}")
    if "image_tokenizer" in flat and not evidence and not image_tokens and not beit:
        evidence.append("image_tokenizer: a vocabulary of VQGAN image tokens")
    if not evidence:
        return
    stale: list[str] = []
    if tokenizer in _STALE_TOKENIZERS:
        stale.append(f"its tokenizer '{tokenizer}' is not registered in TencentPretrain (pretrain.py stops with a "
                     f"KeyError before building the model; the registered equivalent is "
                     f"'{_STALE_TOKENIZERS[tokenizer]}')")
    mask = flat.get("mask")
    if isinstance(mask, str) and mask not in ("fully_visible", "causal", "causal_with_prefix"):
        stale.append(f"its mask '{mask}' is not one of TencentPretrain's mask names (fully_visible, causal, "
                     "causal_with_prefix); TencentPretrain's encoder silently treats it as causal_with_prefix")
    message = (f"cannot import TencentPretrain config {label}: it is not a text model ({'; '.join(evidence)}). "
               "Image and speech modalities other than ViT, ViLT and image-token language models (dall-e, "
               f"talk2face) are not in pentad yet; text configs ({', '.join(TEXT_FAMILIES)}) and those import.")
    if stale:
        message += (" Note also that TencentPretrain's own file is stale: " + "; ".join(stale)
                    + ", so it does not train as shipped there either.")
    raise UserError(message)


def _dual_available() -> bool:
    """Whether pentad's pair heads (for model.streams) are registered."""
    import pentad.components  # noqa: F401  (registers every component)
    from pentad.registry import TARGETS as TARGET_REGISTRY

    return "pair_cls" in TARGET_REGISTRY and "clr" in TARGET_REGISTRY


def _is_dual(flat: dict[str, Any]) -> bool:
    return (flat.get("encoder") == "dual" or "dual" in _as_list(flat.get("embedding", []))
            or "stream_0" in flat or "stream_1" in flat)


def _refuse_dual(flat: dict[str, Any], label: str) -> None:
    """Dual-stream text models (SBERT, siamese LSTM) need pentad's ``dual`` encoder."""
    dual = [f"'{key}'" for key in ("stream_0", "stream_1") if key in flat]
    if flat.get("encoder") == "dual":
        dual.insert(0, "encoder 'dual'")
    if "dual" in _as_list(flat.get("embedding", [])):
        dual.insert(0, "embedding 'dual'")
    raise UserError(f"cannot import TencentPretrain config {label}: {', '.join(dual)} describe a dual-stream "
                    "(siamese) model, and pentad's dual encoder is not available yet, so SBERT and siamese "
                    "LSTM configs do not import yet. Single-stream text configs do.")


class _Importer:
    """One translation: collects every problem before raising, and the notices to tell the user.

    ``flat`` is the config as one stream sees it (a dual model's streams each get an importer over
    the top-level keys updated by ``stream_i``, as TencentPretrain's DualEmbedding/DualEncoder do);
    the problem and notice lists are shared between them.
    """

    def __init__(self, flat: dict[str, Any], label: str, problems: list[str] | None = None,
                 notices: list[str] | None = None, where: str = ""):
        self.flat = flat
        self.label = label
        self.problems: list[str] = [] if problems is None else problems
        self.notices: list[str] = [] if notices is None else notices
        self.where = where  # "stream_0." inside a stream, for messages

    def stream(self, key: str) -> _Importer:
        """The importer of ``stream_0`` / ``stream_1``: top-level keys updated by the stream's."""
        own = self.flat.get(key) or {}
        if not isinstance(own, dict):
            self.problems.append(f"'{key}': expected a mapping of keys, found {type(own).__name__}")
            own = {}
        ignored = sorted(k for k in own if k in _VOCAB_KEYS)
        if ignored:
            # TencentPretrain takes the vocabulary from the tokenizer, never from a stream's keys.
            self.notices.append(f"{', '.join(ignored)} inside '{key}' ignored (as in TencentPretrain: the vocabulary "
                                "comes from the tokenizer or vocab_size=N)")
        for k in own:
            if k in ("stream_0", "stream_1"):
                self.problems.append(f"'{key}.{k}': a stream cannot hold streams")
            elif k not in KNOWN_KEYS:
                hint = closest(k, sorted(KNOWN_KEYS))
                self.problems.append(f"'{key}.{k}': unknown TencentPretrain config key"
                                     + (f"; did you mean '{hint}'?" if hint else ""))
        merged = {k: v for k, v in self.flat.items() if k not in ("stream_0", "stream_1")}
        merged.update({k: v for k, v in own.items() if k not in _VOCAB_KEYS and k not in ("stream_0", "stream_1")})
        return _Importer(merged, self.label, self.problems, self.notices, f"{key}.")

    # ---------------------------------------------------------------------------- helpers
    def name(self, key: str, table: dict[str, str], value: Any, what: str) -> str | None:
        """The pentad name of a TencentPretrain name, or a problem with the closest valid one."""
        if isinstance(value, str) and value in table:
            return table[value]
        hint = closest(str(value), table)
        self.problems.append(f"'{self.where}{key}': {what} {shown(value)} is not available in pentad"
                             + (f"; did you mean '{hint}'?" if hint else "")
                             + f" (available: {', '.join(table)})")
        return None

    def flag(self, key: str) -> bool:
        return _truthy(self.flat.get(key, False))

    def require(self, keys: tuple[str, ...], why: str) -> None:
        for key in keys:
            if key not in self.flat:
                self.problems.append(f"'{self.where}{key}' is missing; TencentPretrain has no default for it ({why} "
                                     "needs it)")

    def unknown_keys(self) -> None:
        for key in self.flat:
            if key not in KNOWN_KEYS:
                hint = closest(key, sorted(KNOWN_KEYS))
                self.problems.append(f"'{key}': unknown TencentPretrain config key"
                                     + (f"; did you mean '{hint}'?" if hint else ""))
        if "tokenizer" in self.flat and not is_image_token_lm(self.flat) and not is_beit(self.flat):
            self.name("tokenizer", TEXT_TOKENIZERS, self.flat["tokenizer"], "tokenizer")

    def finish(self, model: dict[str, Any], objective: str | None,
               task: dict[str, Any] | None = None) -> dict[str, Any]:
        """The run-config dict around ``model`` (and ``task``); raises when any problem was found."""
        self.run_key_notices()
        self.notices[:] = list(dict.fromkeys(self.notices))  # tied streams repeat theirs
        if self.problems:
            raise UserError(f"cannot import TencentPretrain config {self.label}: " + "; ".join(self.problems) + ".")
        out: dict[str, Any] = {"model": model}
        description = f"imported from TencentPretrain config {self.label}"
        if self.notices:
            description += ". Notes: " + " ".join(n if n.endswith(".") else n + "." for n in self.notices)
        out["description"] = description
        tokenizer = _tokenizer(self.flat)
        if tokenizer is not None:
            out["tokenizer"] = tokenizer
        if objective is not None:
            seq = int(self.flat.get("seq_length", model["max_seq_length"]))
            out["data"] = {"objective": {"type": objective, "seq_length": seq}}
        if task is not None:
            out["task"] = task
        return out

    # --------------------------------------------------------------------- embedding + encoder
    def body(self) -> dict[str, Any]:
        """Sizes, embedding slot and encoder of one stream (a single-stream model has one):
        ``{"sizes": {...}, "embedding": {...}, "encoder": {...}, "kind", "activation", "dropout",
        "scale_words", "norm"}``."""
        flat = self.flat
        encoder_name = self.name("encoder", ENCODERS, flat.get("encoder", "transformer"), "encoder")
        kind = ("recurrent" if encoder_name in RECURRENT else encoder_name) or "transformer"
        self.require(_REQUIRED.get(kind, ()), f"the {encoder_name or 'transformer'} encoder")
        hidden = int(flat.get("hidden_size", 768))
        emb = int(flat.get("emb_size", hidden))
        sizes: dict[str, Any] = {"hidden_size": hidden, "max_seq_length": int(flat.get("max_seq_length", 512))}
        if emb != hidden:
            if kind == "transformer" and not self.flag("factorized_embedding_parameterization"):
                self.problems.append(f"'{self.where}emb_size' {emb} differs from hidden_size {hidden} without "
                                     "factorized_embedding_parameterization: TencentPretrain's transformer would "
                                     "receive emb_size-wide inputs and fail at the first step")
            sizes["embedding_size"] = emb
        dropout = float(flat.get("dropout", 0.1))
        activation = self.name("hidden_act", ACTIVATIONS, flat.get("hidden_act", "gelu"), "activation")
        source_parts = _as_list(flat.get("embedding", ["word"]))
        # TencentPretrain's word embedding scales by sqrt(emb_size) when the *source* embedding list
        # has sinusoidalpos, on both sides (WordEmbedding reads args.embedding, not tgt_embedding).
        scale_words = "sinusoidalpos" in source_parts
        norm = not self.flag("remove_embedding_layernorm")
        embedding = self.embedding_slot("embedding", source_parts, scale_words, norm, dropout)
        encoder: dict[str, Any] = {}
        if kind == "transformer":
            encoder = self.transformer(hidden, activation, dropout, decoder=False)
        elif kind == "recurrent":
            encoder = {"type": encoder_name, "num_layers": int(flat.get("layers_num", 2)), "dropout": dropout}
            if encoder_name in ("rnn", "lstm", "gru"):
                encoder["bidirectional"] = self.flag("bidirectional")
        elif kind == "gatedcnn":
            # TencentPretrain's gated CNN has no dropout of its own (the embedding's dropout applies).
            encoder = {"type": "gatedcnn", "num_layers": int(flat.get("layers_num", 9)),
                       "kernel_size": int(flat.get("kernel_size", 4)), "block_size": int(flat.get("block_size", 2)),
                       "dropout": 0.0}
        return {"sizes": sizes, "embedding": embedding, "encoder": encoder, "kind": kind, "activation": activation,
                "dropout": dropout, "scale_words": scale_words, "norm": norm}

    # ------------------------------------------------------------------------------- main
    def run(self) -> dict[str, Any]:
        """A single-stream model: embedding -> encoder -> (tgt_embedding -> decoder) -> targets."""
        flat = self.flat
        self.unknown_keys()
        body = self.body()
        model: dict[str, Any] = dict(body["sizes"])
        if "vocab_size" in flat:
            model["vocab_size"] = flat["vocab_size"]
        model["embedding"] = body["embedding"]
        model["encoder"] = body["encoder"]
        decoder = flat.get("decoder")
        has_decoder = decoder is not None
        if has_decoder:
            self.name("decoder", DECODERS, decoder, "decoder")
            if body["kind"] != "transformer":
                self.problems.append(f"'decoder': a transformer decoder after the '{flat.get('encoder')}' encoder is "
                                     "not available in pentad (only after a transformer encoder)")
            self.require(("decoder_layers_num",), "the decoder")
            target_parts = _as_list(flat.get("tgt_embedding", ["word"]))
            model["target_embedding"] = self.embedding_slot("tgt_embedding", target_parts, body["scale_words"],
                                                            body["norm"], body["dropout"])
            model["decoder"] = self.transformer(model["hidden_size"], body["activation"], body["dropout"],
                                                decoder=True)
            model["share_embedding"] = self.flag("share_embedding")
        else:
            stray = [k for k in ("tgt_embedding", "decoder_layers_num") if k in flat]
            stray += ["share_embedding"] if self.flag("share_embedding") else []
            if stray:
                self.notices.append(f"{', '.join(stray)} set without a decoder: no effect on the model (as in "
                                    "TencentPretrain)")
        target_names = [self.name("target", TARGETS, t, "target") for t in _as_list(flat.get("target", ["mlm"]))]
        model["targets"] = [self.target(t, body["activation"]) for t in target_names if t is not None]
        model["tie_word_embeddings"] = self.tying([t for t in target_names if t], has_decoder)
        if is_vit(flat):
            return self.vit_finish(model, target_names)
        if is_vilt(flat):
            return self.vilt_finish(model, target_names)
        if is_image_token_lm(flat):
            return self.image_token_finish(model)
        if is_beit(flat):
            return self.beit_finish(model, target_names)
        if is_s2t(flat):
            return self.finish(model, None, self.s2t_task())
        return self.finish(model, self.objective())

    def vilt_finish(self, model: dict[str, Any], target_names: list[str | None]) -> dict[str, Any]:
        """A ViLT: the image_text_match task (matching over the first position with sp, masked LM over the
        caption) instead of a data objective; TencentPretrain's vilt processor is its caption + image loader."""
        if sorted(t for t in target_names if t) != ["mlm", "sp"]:
            self.problems.append(f"'target' {shown(self.flat.get('target'))}: a ViLT trains the mlm and sp targets")
        if model["embedding"]["parts"][0].get("type") != "word_patch":
            self.problems.append(f"'embedding' {shown(self.flat.get('embedding'))}: word_patch comes first (it defines "
                                 "the sequence: the caption, then the image)")
        self.notices.append("data_processor vilt: the run's task is image_text_match (caption<TAB>path files, seeded "
                            "negative images); to pre-train from preprocessed shards use data.objective.type=vilt")
        return self.finish(model, None, {"type": "image_text_match", "normalise": "clip"})

    def beit_finish(self, model: dict[str, Any], target_names: list[str | None]) -> dict[str, Any]:
        """A BEiT: masked patches, an mlm head over image_tokenizer.image_vocab_size visual tokens."""
        if target_names != ["mlm"]:
            self.problems.append(f"'target' {shown(self.flat.get('target'))}: a BEiT predicts its masked patches' "
                                 "visual tokens with the mlm target alone")
        image = self.flat.get("image_tokenizer", {})
        size = image.get("image_vocab_size") if isinstance(image, dict) else None
        if "vocab_size" not in self.flat and isinstance(size, int):
            model["vocab_size"] = size
        tokenizer = self.flat.get("tokenizer")
        if tokenizer in _STALE_TOKENIZERS:
            self.notices.append(f"tokenizer '{tokenizer}' is not registered in TencentPretrain (pretrain.py stops "
                                f"with a KeyError); its equivalent '{_STALE_TOKENIZERS[tokenizer]}' is meant: the "
                                "vocabulary is the image tokenizer's codes")
        self.notices.append(f"the mlm head predicts {model.get('vocab_size', size)} visual tokens (vocab_size): "
                            "pentad's beit objective takes them from an image tokenizer it fits itself (pentad "
                            "image-tokenizer fit; give data.objective.image_tokenizer=FILE), as TencentPretrain's "
                            "VQGAN weights are not available")
        out = self.finish(model, "beit")
        patch = model["embedding"]["parts"][0]
        out["data"]["objective"].update(image_size=list(patch["image_size"]), channels=patch["channels"])
        return out

    def image_token_finish(self, model: dict[str, Any]) -> dict[str, Any]:
        """DALL-E / talk2face: a (prefix) language model over text and image-token ids."""
        image = self.flat.get("image_tokenizer", {})
        size = image.get("image_vocab_size") if isinstance(image, dict) else None
        tokenizer = self.flat.get("tokenizer")
        if tokenizer in _STALE_TOKENIZERS:
            self.notices.append(f"tokenizer '{tokenizer}' is not registered in TencentPretrain (pretrain.py stops "
                                f"with a KeyError); imported as its equivalent '{_STALE_TOKENIZERS[tokenizer]}'")
        self.notices.append("the model's vocabulary is the text vocabulary followed by "
                            f"{size or 'image_vocab_size'} image-token ids (give vocab_size=N for the sum); pentad "
                            "has no VQGAN image tokenizer: prepare its data with data.objective.type=dalle and an "
                            "image tokenizer pentad fits (pentad image-tokenizer fit)")
        return self.finish(model, None)

    def vit_finish(self, model: dict[str, Any], target_names: list[str | None]) -> dict[str, Any]:
        """A ViT: image_classification instead of a data objective (data_processor vit is TencentPretrain's
        label + image loader); its cls target keeps TencentPretrain's pooler (linear_1 + tanh)."""
        if target_names != ["cls"]:
            self.problems.append(f"'target' {shown(self.flat.get('target'))}: a ViT classifies with the cls target "
                                 "alone")
        if model["embedding"]["parts"][0].get("type") != "patch" or \
                [p.get("type") for p in model["embedding"]["parts"]] not in (["patch", "pos"], ["patch"]):
            self.problems.append(f"'embedding' {shown(self.flat.get('embedding'))}: a ViT's embedding is "
                                 "['patch', 'pos'] (patch first: it defines the sequence)")
        model.pop("vocab_size", None)  # no word table: the vocabulary does not matter
        model["tie_word_embeddings"] = False
        task = self.vit_task()
        if self.problems:
            return self.finish(model, None, task)
        patch = model["embedding"]["parts"][0]
        rows, cols = patch["image_size"][0] // patch["patch_size"], patch["image_size"][1] // patch["patch_size"]
        if rows * cols + 1 > model["max_seq_length"]:
            self.problems.append(f"'max_seq_length' {model['max_seq_length']} is less than the {rows * cols + 1} "
                                 f"positions of {patch['image_size'][0]}x{patch['image_size'][1]} images in "
                                 f"{patch['patch_size']}-pixel patches (CLS included); TencentPretrain's position "
                                 "table would be too short")
        return self.finish(model, None, task)

    def run_dual(self) -> dict[str, Any]:
        """A two-stream model (SBERT, siamese LSTM) as ``finetune/run_classifier_siamese.py`` builds it:
        each stream's embedding and encoder, pooled with the top-level ``pooling``, and a pair
        classifier over (u, v, |u-v|, u*v)."""
        flat = self.flat
        self.unknown_keys()
        for key in ("embedding", "encoder"):
            if key in flat and _as_list(flat[key]) != ["dual"]:
                self.problems.append(f"'{key}': a dual-stream config has {key} 'dual' (the streams name their own), "
                                     f"found {shown(flat[key])}")
        for key in ("stream_0", "stream_1"):
            if key not in flat:
                self.problems.append(f"'{key}' is missing: a dual-stream config describes both streams")
        if flat.get("decoder") is not None:
            self.problems.append("'decoder': a dual-stream model has no decoder")
        streams = [self.stream("stream_0"), self.stream("stream_1")]
        bodies = [s.body() for s in streams]
        tie = self.flag("tie_weights")
        model: dict[str, Any] = dict(bodies[0]["sizes"])
        if "vocab_size" in flat:
            model["vocab_size"] = flat["vocab_size"]
        model["embedding"] = bodies[0]["embedding"]
        model["tie_word_embeddings"] = False
        pretraining = "target" in flat
        # pretrain.py's clr target pools each stream by its own 'pooling'; run_classifier_siamese.py
        # pools both by the top-level one.
        poolings = [s.name("pooling", POOLINGS, (s.flat if pretraining else flat).get("pooling", "first"), "pooling")
                    for s in streams]
        names = default_names(bodies[1]["embedding"])
        second: dict[str, Any] = {"pooling": poolings[1]}
        if tie:
            second["share"] = names[0]
            if (bodies[0]["sizes"], bodies[0]["embedding"], bodies[0]["encoder"]) != \
                    (bodies[1]["sizes"], bodies[1]["embedding"], bodies[1]["encoder"]):
                self.problems.append("'tie_weights' with streams that differ: TencentPretrain then takes stream 1's "
                                     "embedding but stream 0's encoder for both; make the streams equal or set "
                                     "tie_weights false")
        else:
            # Untied streams (CLIP) keep DualEmbedding's second LayerNorm (stream_i_layer_norm, LN after LN)
            # on each stream that has an embedding LayerNorm, as TencentPretrain builds them; tied streams
            # share one slot, which cannot hold a norm of each stream's own.
            for body in bodies:
                if body["norm"]:
                    body["embedding"]["second_norm"] = True
            second.update(bodies[1]["sizes"], embedding=bodies[1]["embedding"], encoder=bodies[1]["encoder"])
        model["encoder"] = bodies[0]["encoder"]
        model["streams"] = {names[0]: {"pooling": poolings[0]}, names[1]: second}
        if pretraining:
            targets = _as_list(flat["target"])
            if targets != ["clr"]:
                self.problems.append(f"'target' {shown(flat['target'])}: a dual-stream model pre-trains with the clr "
                                     "target alone")
            clr: dict[str, Any] = {"type": "clr", "projection": self.flag("projection")}
            if self.flag("projection") and "feature_size" in flat:
                clr["feature_size"] = int(flat["feature_size"])
            model["targets"] = [clr]
        else:
            labels = flat.get("labels_num")
            if not labels:
                self.notices.append("the siamese classifier's labels_num comes from the training data in "
                                    "TencentPretrain; 2 labels here (override model.targets.0.num_labels=N)")
            # run_classifier_siamese.py: Linear(4H, labels) over (u, v, |u-v|, u*v), no dropout.
            model["targets"] = [{"type": "pair_cls", "num_labels": int(labels or 2),
                                 "features": ["u", "v", "abs_diff", "product"], "dropout": 0.0}]
        if tie and any(b["norm"] for b in bodies):
            self.notices.append("TencentPretrain's DualEmbedding applies a second LayerNorm (stream_i_layer_norm) "
                                "and a second dropout on top of each stream's embedding LayerNorm; pentad applies "
                                "one, so it has 2 x emb_size fewer parameters per such stream")
        if is_clip(flat):
            self.notices.append("data_processor clip: the run's task is image_text (caption<TAB>path files); to "
                                "pre-train from preprocessed shards use data.objective.type=clip")
            return self.finish(model, None, {"type": "image_text", "normalise": "clip"})
        return self.finish(model, self.objective())

    def objective(self) -> str | None:
        processor = self.flat.get("data_processor")
        return self.name("data_processor", OBJECTIVES, processor, "data processor") if processor else None

    # ------------------------------------------------------------------------- embeddings
    def embedding_slot(self, key: str, names: list[Any], scale_words: bool, norm: bool,
                       dropout: float) -> dict[str, Any]:
        """An embedding slot. TencentPretrain's embedding LayerNorm is always its own "normal" one
        with eps 1e-6 (``Embedding`` builds it directly, not from ``layernorm``)."""
        parts: list[dict[str, Any]] = []
        for name in names:
            kind = self.name(key, EMBEDDINGS, name, "embedding")
            if kind == "word":
                parts.append({"type": "word", "scale": scale_words})
            elif kind == "seg":
                # TencentPretrain's table has a padding row 0 besides segments A and B.
                parts.append({"type": "seg", "num_segments": 3})
            elif kind == "sinusoidal":
                speech = "speech" in _as_list(self.flat.get("embedding", []))
                layout = "sin and cos halves" if speech else "interleaved"
                notice = ("sinusoidalpos: imported with TencentPretrain's table layout (angle p / 10000^(i/(E/2-1)), "
                          f"{layout}, read from position 2); TencentPretrain also zeroes the table row whose index "
                          "equals the [PAD] id (it mixes a vocabulary id with a position), which pentad does not "
                          "reproduce, so activations at that one position differ")
                if notice not in self.notices:
                    self.notices.append(notice)
                sinusoidal = {"type": "sinusoidal", "interleave": True, "spacing": "tensor2tensor", "offset": 2}
                if speech:
                    # TencentPretrain: with a speech embedding (on either side), sin and cos halves, not
                    # interleaved, over max(max_seq_length, max_audio_frames) positions
                    sinusoidal["interleave"] = False
                    frames = int(self.flat.get("max_audio_frames", 6000))
                    sinusoidal["max_positions"] = max(int(self.flat.get("max_seq_length", 512)), frames) + 2
                parts.append(sinusoidal)
            elif kind == "patch":
                parts.append(self.patch_part())
            elif kind == "speech":
                parts.append(self.speech_part())
            elif kind == "masked_patch":
                parts.append({**self.patch_part(), "type": "masked_patch"})
            elif kind == "word_patch":
                patch = self.patch_part()
                patch.pop("type")
                parts.append({"type": "word_patch", "patch": patch})
            elif kind is not None:
                parts.append({"type": kind})
        return {"parts": parts, "norm": norm, "norm_kind": TP_LAYERNORM, "layer_norm_eps": TP_EPS, "dropout": dropout}

    def speech_part(self) -> dict[str, Any]:
        """TencentPretrain's SpeechEmbedding: stride-2 Conv1d layers with a GLU each (data_processor s2t; a GELU
        otherwise), scaled by sqrt(emb_size) when sinusoidal positions are added."""
        flat = self.flat
        channels = _as_list(flat.get("conv_channels", [1024, 1024]))
        kernels = _as_list(flat.get("conv_kernel_sizes", [5, 5]))
        return {"type": "speech", "feature_size": int(flat.get("audio_feature_size", 80)),
                "conv_channels": [int(c) for c in channels], "kernel_sizes": [int(k) for k in kernels],
                "activation": "glu" if flat.get("data_processor", "s2t") == "s2t" else "gelu",
                "scale": "sinusoidalpos" in _as_list(flat.get("embedding", []))}

    def patch_part(self) -> dict[str, Any]:
        """TencentPretrain's PatchEmbedding: a Conv2d without bias over channels_num channels, a CLS vector."""
        values = {}
        for key, default in VIT_DEFAULTS.items():
            if key == "image_preprocess":
                continue
            value = self.flat.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                self.problems.append(f"'{self.where}{key}': expected a positive integer, found {shown(value)}")
                value = default
            values[key] = value
        absent = [k for k in ("image_height", "image_width", "patch_size", "channels_num") if k not in self.flat]
        if absent:
            self.notices.append(f"{', '.join(absent)} not in the config: TencentPretrain's defaults ("
                                + ", ".join(f"{k} {VIT_DEFAULTS[k]}" for k in absent) + ")")
        return {"type": "patch", "image_size": [values["image_height"], values["image_width"]],
                "patch_size": values["patch_size"], "channels": values["channels_num"], "bias": False}

    def s2t_task(self) -> dict[str, Any]:
        """The asr task from TencentPretrain's audio options (sampling_rate, audio_feature_size,
        max_audio_frames, audio_preprocess, specaugment)."""
        flat = self.flat
        steps = _as_list(flat.get("audio_preprocess", []))
        audio: dict[str, Any] = {"sample_rate": int(flat.get("sampling_rate", 16000)),
                                 "feature_size": int(flat.get("audio_feature_size", 80)),
                                 "max_frames": int(flat.get("max_audio_frames", 6000)),
                                 "cmvn": "ceptral_normalize" in steps, "specaugment": None}
        if audio["cmvn"] and not {"normalize_means", "normalize_vars"} <= set(steps):
            self.notices.append("audio_preprocess: ceptral_normalize without both normalize_means and "
                                "normalize_vars; pentad's CMVN always normalises both")
        spec = flat.get("specaugment")
        if isinstance(spec, dict):
            audio["specaugment"] = {"freq_masks": int(spec.get("freq_mask_N", 0)),
                                    "freq_width": max(int(spec.get("freq_mask_F", 1)), 1),
                                    "time_masks": int(spec.get("time_mask_N", 0)),
                                    "time_width": max(int(spec.get("time_mask_T", 1)), 1),
                                    "time_ratio": float(spec.get("time_mask_p", 1.0))}
            if "mask_value" in spec:
                audio["specaugment"]["value"] = float(spec["mask_value"])
            if int(spec.get("time_warp_W", 0)) > 0:
                self.notices.append("specaugment time_warp_W: pentad does not warp time (frequency and time "
                                    "masks only)")
        return {"type": "asr", "audio": audio}

    def vit_task(self) -> dict[str, Any]:
        """The image_classification task from TencentPretrain's image_preprocess (default crop, normalize)."""
        steps = _as_list(self.flat.get("image_preprocess", VIT_DEFAULTS["image_preprocess"]))
        task: dict[str, Any] = {"type": "image_classification", "pooler": True, "head_dropout": 0.0,
                                "normalise": "clip"}
        if "normalize" not in steps:
            self.notices.append("image_preprocess without normalize: TencentPretrain then feeds pixels in [0, 1]; "
                                "pentad always normalises (task.normalise: clip, the mean/std TencentPretrain's "
                                "normalize uses)")
        crop = "crop" in steps or "corp" in steps
        if "crop" in steps:
            self.notices.append("image_preprocess 'crop': TencentPretrain tests for the misspelling 'corp' and so "
                                "never crops; pentad does the random resized crop the config asks for "
                                "(task.augment.crop_scale: null to train without it, as TencentPretrain does)")
        task["augment"] = {"crop_scale": [0.08, 1.0] if crop else None, "flip": "horizontal_flip" in steps}
        return task

    # ---------------------------------------------------------------------------- stacks
    def transformer(self, hidden: int, activation: str | None, dropout: float, decoder: bool) -> dict[str, Any]:
        """Encoder or decoder transformer stack. TencentPretrain's decoder layers read the same keys
        as its encoder layers, but its decoder has no rotary, ALiBi, sharing or residual attention."""
        flat = self.flat
        heads = int(flat.get("heads_num", 12))
        norm_position = self.name("layernorm_positioning", POSITIONING, flat.get("layernorm_positioning", "post"),
                                  "layernorm positioning")
        norm = self.name("layernorm", NORMS, flat.get("layernorm", "normal"), "layernorm")
        stack: dict[str, Any] = {
            "type": "transformer",
            "num_layers": int(flat.get("decoder_layers_num" if decoder else "layers_num", 12)),
            "num_heads": heads,
            "ffn_size": int(flat.get("feedforward_size", 4 * hidden)),
            "ffn": self.name("feed_forward", FEED_FORWARDS, flat.get("feed_forward", "dense"), "feed-forward"),
            "activation": activation,
            "norm": norm,
            "norm_position": norm_position,
            # TencentPretrain builds the final norm exactly for pre-norm stacks.
            "final_norm": norm_position == "pre",
            "dropout": dropout,
            "bias": not self.flag("remove_transformer_bias"),
            "layer_norm_eps": float(flat.get("layernorm_eps", TP_EPS)),
            "attention_scale": not self.flag("remove_attention_scale"),
        }
        if "local_kv_heads_num" in flat:
            stack["num_kv_heads"] = int(flat["local_kv_heads_num"])
        if "attention_head_size" in flat:
            stack["head_size"] = int(flat["attention_head_size"])
        positions = self.positions(decoder)
        stack["positions"] = positions
        if positions == "relative":
            stack["relative_buckets"] = int(flat.get("relative_attention_buckets_num", 32))
            stack["relative_max_distance"] = 128  # fixed in TencentPretrain's RelativePositionEmbedding
        if decoder:
            if norm_position == "pre":
                # TransformerDecoder builds its final norm itself: T5LayerNorm for "t5", else its
                # normal LayerNorm, with the default eps 1e-6 either way (layernorm_eps is not read).
                stack["final_norm_kind"] = "t5" if norm == "t5" else TP_LAYERNORM
                stack["final_norm_eps"] = TP_EPS
        else:
            stack["mask"] = self.name("mask", MASKS, flat.get("mask", "fully_visible"), "mask")
            if flat.get("mask") == "prefix":
                self.notices.append("mask 'prefix' is not one of TencentPretrain's mask names; TencentPretrain "
                                    "treats it as causal_with_prefix, and so does this import (pentad mask 'prefix')")
            stack["share_layers"] = self.flag("parameter_sharing")
            stack["residual_attention"] = self.flag("has_residual_attention")
        return stack

    def positions(self, decoder: bool) -> str:
        flat = self.flat
        chosen = [k for k in ("relative_position_embedding", "rotary_position_embedding", "alibi_position_embedding")
                  if self.flag(k)]
        if len(chosen) > 1:
            self.problems.append(f"{' and '.join(repr(k) for k in chosen)} are all set; TencentPretrain applies at "
                                 "most one of them and pentad takes one position scheme per stack")
            return "none"
        if not chosen:
            return "none"
        if chosen[0] == "relative_position_embedding":
            return "relative"
        if decoder:
            return "none"  # TencentPretrain's decoder layers never apply rotary or ALiBi
        if chosen[0] == "rotary_position_embedding":
            hidden, heads = int(flat.get("hidden_size", 768)), int(flat.get("heads_num", 12))
            if int(flat.get("attention_head_size", hidden // heads)) * heads != hidden:
                self.notices.append("rotary with attention_head_size x heads_num != hidden_size: TencentPretrain "
                                    "sizes its rotary table from hidden_size / heads_num and would fail; pentad "
                                    "rotates the whole attention head")
            return "rotary"
        self.notices.append(
            "alibi_position_embedding: pentad applies ALiBi attention biases, but TencentPretrain accepts this flag "
            "and never applies it (its utils/alibi.py is never called), so TencentPretrain trains this config with "
            "no position information at all. A checkpoint trained by TencentPretrain will therefore behave "
            "differently in pentad; to reproduce TencentPretrain exactly, override model.encoder.positions=none")
        return "alibi"

    # --------------------------------------------------------------------------- targets
    def target(self, name: str, activation: str | None) -> dict[str, Any]:
        flat = self.flat
        out: dict[str, Any] = {"type": name}
        if name == "mlm":
            # TencentPretrain's mlm head LayerNorm is its normal one with eps 1e-6, whatever
            # layernorm and layernorm_eps say.
            out.update(activation=activation, norm=TP_LAYERNORM, layer_norm_eps=TP_EPS)
        elif name == "sp" and flat.get("data_processor") == "albert":
            # Same head (pooler + 2-way classifier); pentad's albert objective labels it "sop".
            out["type"] = "sop"
        elif name in ("lm", "bilm"):
            out["bias"] = self.flag("has_lmtarget_bias")
            if "label_smoothing" in flat:
                # TencentPretrain's smoothed loss (lm_target.py, as fairseq's) puts eps/(V-1) on each
                # wrong token, torch's eps/V on every token.
                out.update(label_smoothing=float(flat["label_smoothing"]), label_smoothing_spread="others")
        elif name == "cls":
            out["pooling"] = self.name("pooling", POOLINGS, flat.get("pooling", "first"), "pooling")
            out["dropout"] = 0.0  # TencentPretrain's cls head has no dropout
            if flat.get("labels_num"):
                out["num_labels"] = int(flat["labels_num"])
            elif is_vit(flat):
                out["num_labels"] = VIT_LABELS
                self.notices.append(f"labels_num is not in the config (TencentPretrain's pretrain.py requires "
                                    f"--labels_num for a cls target): {VIT_LABELS} labels (ImageNet's) so that the "
                                    "model builds; fine-tuning sets the task's own (or override "
                                    "model.targets.0.num_labels=N)")
        return out

    def tying(self, targets: list[str], has_decoder: bool) -> bool:
        """pentad's ``tie_word_embeddings`` for TencentPretrain's tie_weights (``Model.__init__``):
        the mlm head ties to the source word table; otherwise the lm head ties to the decoder's word
        table (or the source's without a decoder), but with ``share_embedding`` that decoder table is
        replaced afterwards, which leaves the lm head an independent matrix."""
        if not self.flag("tie_weights"):
            return False
        if "mlm" in targets:
            if "lm" in targets:
                self.problems.append("'tie_weights' with both mlm and lm targets: TencentPretrain ties only the mlm "
                                     "head, pentad's tie_word_embeddings ties every head; set tie_weights false or "
                                     "drop one target")
            if has_decoder and not self.flag("share_embedding"):
                self.problems.append("'tie_weights' with an mlm target and a decoder that has its own word table: "
                                     "TencentPretrain ties the head to the encoder's table, pentad to the decoder's")
            return True
        if "lm" in targets:
            if has_decoder and self.flag("share_embedding"):
                self.notices.append(
                    "tie_weights with share_embedding: TencentPretrain ties the LM head to the decoder's word table "
                    "and then replaces that table by the encoder's, so its LM head is an independent matrix; "
                    "imported as tie_word_embeddings false, which is the same model")
                return False
            return True
        return False  # TencentPretrain ties only mlm and lm heads

    # ------------------------------------------------------------------------ run keys
    def run_key_notices(self) -> None:
        flat = self.flat
        if self.flag("layer_number_scale"):
            self.notices.append("layer_number_scale is inert in TencentPretrain (never passed to its layers) and "
                                "would not change the maths anyway (Megatron's 1/layer query scaling is undone in "
                                "the softmax); ignored")
        if flat.get("data_processor") == "llm_sft" and not self.flag("prefix_lm_loss"):
            self.notices.append("without prefix_lm_loss TencentPretrain's llm_sft also scores the prompt tokens; "
                                "pentad's llm_sft objective scores the response only")
        imported = VIT_KEYS if is_vit(flat) else S2T_KEYS if is_s2t(flat) else set()
        ignored = sorted(k for k in flat if (k in _RUN_KEYS or k in _MEDIA_KEYS) and k not in imported)
        if ignored:
            self.notices.append(f"not imported (training, preprocessing or media options, set under pentad's train.* "
                                f"and data.* instead): {', '.join(ignored)}")


# TencentPretrain's bert, bpe, char and space tokenizers have no special-token matching: a literal
# "[CLS]" in the text is tokenized like any other text ('[', 'cls', ']'), hence "split".
SPECIAL_TOKENS_IN_TEXT = "split"


def _tokenizer(flat: dict[str, Any]) -> dict[str, Any] | None:
    lower = str(flat.get("do_lower_case", "true")).lower() in ("true", "1", "yes")
    split = {"special_tokens_in_text": SPECIAL_TOKENS_IN_TEXT}
    if flat.get("spm_model_path"):
        return {"type": "sentencepiece", "model": flat["spm_model_path"]}
    if flat.get("vocab_path") and flat.get("merges_path"):
        return {"type": "bpe", "vocab": flat["vocab_path"], "merges": flat["merges_path"], **split}
    if flat.get("vocab_path"):
        kind = flat.get("tokenizer", "bert")
        if kind in ("char", "space"):
            return {"type": kind, "vocab": flat["vocab_path"], **split}
        return {"type": "wordpiece", "vocab": flat["vocab_path"], "lowercase": lower, **split}
    return None
