"""Speech-to-text (``model_type: speech_to_text``): key map and config translation, both ways.

``Speech2TextForConditionalGeneration`` (and a bare ``Speech2TextModel``) becomes a pentad
encoder-decoder whose encoder embedding is a ``speech`` part plus sinusoidal positions and whose
decoder embedding is a word table plus sinusoidal positions; the layers are BART's (:mod:`.bart`)
with pre-norm and a final LayerNorm per stack, and the ``lm`` head has no bias and is tied to the
decoder's word table (``tie_word_embeddings: false`` gives it a table of its own). pentad's
``s2t/small|medium|large`` recipes are this layout.

* **Subsampler.** ``encoder.conv.conv_layers.<i>`` are pentad's ``embedding.speech.convs.<i>``:
  stride-2 ``Conv1d`` layers (padding k//2), each followed by a GLU. Hugging Face has one
  ``conv_channels`` for every layer but the last, whose output is ``2 * d_model``; pentad lists them
  (``conv_channels: [C, ..., C, 2 * d_model]``). ``input_feat_per_channel * input_channels`` is the
  speech part's ``feature_size``. Hugging Face derives the encoder's attention mask from the frame
  counts with (L - 1) // 2 + 1 per layer, which is the length its convolutions give only for odd
  kernels (pentad's ``subsampled_lengths`` is right for both), so even kernels are refused.
* **Positions.** ``Speech2TextSinusoidalPositionalEmbedding`` is tensor2tensor's table (sines in the
  first half of the dimensions, cosines in the second, frequencies 10000^(-i/(d/2-1))) whose row
  ``pad_token_id + 1 + p`` is position p, counted over the real frames or tokens (padding reads a zero
  row); pentad's ``sinusoidal`` part with ``spacing: tensor2tensor``, ``interleave: false`` and
  ``offset: pad_token_id + 1``, ``max_positions`` = ``max_source_positions`` / ``max_target_positions``.
  (The encoder finds its real frames by comparing a 0/1 padding mark with ``pad_token_id``: with
  ``pad_token_id`` 0 its real frames read the zero row, so such a checkpoint is refused.)
  The table is a non-persistent buffer, so checkpoints hold no weights for it; older ones that
  stored it (``embed_positions.weights``) are read and the table is ignored, as transformers does.
  transformers computes the table in float32 and pentad in float64: the two agree within 1e-6
  for the first hundred positions and drift apart by float32's rounding of the angle further on
  (about 1e-4 at position 1000).
* ``scale_embedding`` multiplies both the subsampler's output and the decoder's word embedding by
  sqrt(d_model) (pentad ``speech.scale`` and ``word.scale``: one value for both).

The tokenizer (``Speech2TextTokenizer``) is a SentencePiece model (``sentencepiece.bpe.model``) whose
pieces ``vocab.json`` numbers. fairseq's S2T recipes train the model with the dictionary's ids
(``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3), so the two agree and pentad's ``sentencepiece``
tokenizer gives the same ids; a checkpoint where they differ is refused, naming the first pieces
that differ. ``do_lower_case`` does not lower-case text in transformers 5 (it did in 4.x), so the
tokenizer keeps case; ``do_upper_case`` (upper-case decoded text) and multilingual ``lang_codes`` (a
language token before each transcript) have no pentad counterpart; each is noted. The export writes
``vocab.json`` from the model's pieces.
``activation_dropout`` and the layer-drop rates have no pentad counterpart; they only
matter in training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    encoder_decoder_problems,
    export_fields,
    hinted_problems,
    import_fields,
    media,
    merge_config,
    owned_keys,
    part_types,
    read_json,
    write_json,
)
from pentad.interop.hf.bart import CROSS_ATTENTION, FINAL_NORMS, LAYER_NORM_EPS, SELF_ATTENTION
from pentad.interop.keymap import WB, Rule, RuleSpec, expand

# {p}: "model." inside Speech2TextForConditionalGeneration, "" for a bare Speech2TextModel checkpoint.
EMBEDDINGS: list[RuleSpec] = [
    ("embedding.speech.convs.{conv}.{wb}", "{p}encoder.conv.conv_layers.{conv}.{wb}"),
    ("target_embedding.word.weight", "{p}decoder.embed_tokens.weight"),
    ((), ("{p}encoder.embed_positions.weights?", "{p}decoder.embed_positions.weights?"), "ignore"),
]
TIED_HEAD: list[RuleSpec] = [("target_embedding.word.weight", "lm_head.weight?", "tied")]
OWN_HEAD: list[RuleSpec] = [("targets.{lm}.output.weight", "lm_head.weight")]

# Speech2TextConfig's defaults.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 10000, "encoder_layers": 12, "encoder_ffn_dim": 2048, "encoder_attention_heads": 4,
    "decoder_layers": 6, "decoder_ffn_dim": 2048, "decoder_attention_heads": 4, "activation_function": "relu",
    "d_model": 256, "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0, "init_std": 0.02,
    "scale_embedding": True, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2,
    "max_source_positions": 6000, "max_target_positions": 1024, "num_conv_layers": 2, "conv_kernel_sizes": [5, 5],
    "conv_channels": 1024, "input_feat_per_channel": 80, "input_channels": 1, "tie_word_embeddings": True,
    "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
}
# config.json <-> pentad, in the order config.json is written: the encoder embedding is [speech,
# sinusoidal], the decoder's [word, sinusoidal]; one activation, dropout and scale_embedding for both.
# Computed by the planners: the position offset (pad_token_id + 1), the subsampler's channels and
# feature split, tying on import.
FIELDS: list[Field] = [
    Field("vocab_size", "vocab_size", int),
    Field("d_model", "hidden_size", int),
    Field("encoder_layers", "encoder.num_layers", int),
    Field("encoder_ffn_dim", "encoder.ffn_size", int, lambda m: m.encoder.ffn_size or 4 * m.hidden_size),
    Field("encoder_attention_heads", "encoder.num_heads", int),
    Field("decoder_layers", "decoder.num_layers", int),
    Field("decoder_ffn_dim", "decoder.ffn_size", int, lambda m: m.decoder.ffn_size or 4 * m.hidden_size),
    Field("decoder_attention_heads", "decoder.num_heads", int),
    activation_field("activation_function", "encoder.activation", "decoder.activation"),
    Field("dropout", "encoder.dropout", float,
          also=("decoder.dropout", "embedding.dropout", "target_embedding.dropout")),
    Field("attention_dropout", "encoder.attention_dropout", float,
          lambda m: float(m.encoder.attention_dropout if m.encoder.attention_dropout is not None
                          else m.encoder.dropout), also=("decoder.attention_dropout",)),
    Field("init_std", "init_std", float),
    Field("scale_embedding", "embedding.parts.0.scale", bool, also=("target_embedding.parts.0.scale",)),
    Field("pad_token_id", write=lambda m: m.embedding.parts[1].offset - 1),
    Field("max_source_positions", "embedding.parts.1.max_positions", int,
          lambda m: m.embedding.parts[1].max_positions or m.max_seq_length),
    Field("max_target_positions", "target_embedding.parts.1.max_positions", int,
          lambda m: m.target_embedding.parts[1].max_positions or m.max_seq_length),
    Field("num_conv_layers", write=lambda m: len(m.embedding.parts[0].kernel_sizes)),
    Field("conv_kernel_sizes", "embedding.parts.0.kernel_sizes", lambda sizes: [int(k) for k in sizes]),
    Field("conv_channels"),
    Field("input_feat_per_channel"),
    Field("input_channels"),
    Field("tie_word_embeddings", write=lambda m: bool(m.tie_word_embeddings)),
    Field("is_encoder_decoder", write=lambda m: True),
]
OWNED = owned_keys(FIELDS)
ARCHITECTURES = ("Speech2TextForConditionalGeneration", "Speech2TextModel")
VOCAB = "vocab.json"
# pentad's stacks besides the FIELDS: pre-norm with a final LayerNorm, biases everywhere.
STACK: dict[str, Any] = {"type": "transformer", "norm_position": "pre", "final_norm": True, "bias": True,
                         "layer_norm_eps": LAYER_NORM_EPS}


def _positive_int(c: dict[str, Any], key: str, problems: list[str], minimum: int = 1) -> int:
    value = c.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems.append(f"{key} is {value!r}; expected an integer >= {minimum}")
        return minimum
    return value


class Speech2TextFamily(HFFamily):
    name = "speech_to_text"
    model_types = ("speech_to_text",)
    # BART's cross-attention names and a convolutional stem: tried before BART and PEGASUS
    layout = KeyLayout(contains=("encoder.conv.conv_layers.",), rank=30)
    tokenizer_kind = "sentencepiece"
    verify_batch = ("one seeded batch of feature frames with rows padded by zero frames (and padded decoder "
                    "rows)")
    tokenizer_class = "Speech2TextTokenizer"
    spm_files = ("sentencepiece.bpe.model",)
    default_special_tokens = {"bos": "<s>", "eos": "</s>", "pad": "<pad>", "unk": "<unk>"}
    token_types = False

    def describes(self, model: Any) -> bool:
        if media(model) != "speech":
            return False
        strides = part_types(model)["speech"].strides
        return not (strides and strides[0] == 1)

    def spm_import(self, pieces: list[str], in_dir: Path, tok_cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        path = in_dir / VOCAB
        if not path.is_file():
            raise UserError(f"{in_dir} has {self.spm_files[0]} but no {VOCAB}: Speech2TextTokenizer numbers the "
                            "SentencePiece pieces through vocab.json, so the ids are unknown without it.")
        vocab = read_json(path)
        ids = {piece: i for i, piece in enumerate(pieces)}
        differ = [f"{piece!r} is {vocab.get(piece)} in {VOCAB} and {ids.get(piece)} in the model"
                  for piece in sorted(set(vocab) | set(ids), key=lambda p: ids.get(p, len(ids)))
                  if vocab.get(piece) != ids.get(piece)]
        if differ:
            raise UserError(f"{path} numbers the pieces of {self.spm_files[0]} differently from the model itself "
                            f"({len(differ)} differ: {'; '.join(differ[:4])}), which pentad's sentencepiece "
                            "tokenizer cannot follow; convert without the tokenizer files and set a tokenizer "
                            "whose ids are the checkpoint's.")
        notes = []
        if tok_cfg.get("do_lower_case"):
            notes.append("do_lower_case: transformers 5's Speech2TextTokenizer does not lower-case text with it (4.x "
                         "did), and neither does the converted tokenizer; set tokenizer.lowercase: true for 4.x's ids")
        if tok_cfg.get("do_upper_case"):
            notes.append("do_upper_case: Speech2TextTokenizer upper-cases decoded text, pentad's predictions keep the "
                         "model's case (score with task.lowercase: true)")
        if tok_cfg.get("lang_codes"):
            notes.append(f"lang_codes {tok_cfg['lang_codes']!r}: the multilingual tokenizer puts a language token "
                         "before each transcript, which pentad's asr task does not (add it to the transcripts)")
        return {}, notes

    def spm_export(self, pieces: list[str], out_dir: Path, saved: dict[str, Any],
                   tok_cfg: dict[str, Any]) -> tuple[set[str], list[str]]:
        write_json(out_dir / VOCAB, {piece: i for i, piece in enumerate(pieces)})
        tok_cfg["do_upper_case"] = False
        return set(), []

    def outputs(self, architecture: str) -> dict[str, str]:
        return {"lm": "logits"} if architecture.endswith("ForConditionalGeneration") else {}

    def pad_token_id(self, config: dict[str, Any]) -> int:
        value = {**DEFAULTS, **config}.get("pad_token_id")
        return int(value) if isinstance(value, int) else 1

    def task_config(self, config: dict[str, Any], in_dir: Path | None) -> tuple[dict[str, Any] | None, list[str]]:
        """An ``asr`` run: the decoder starts with ``decoder_start_token_id`` (the end token in the
        released models); ``task.audio`` takes the sample rate, filterbank bins and utterance CMVN of
        the feature extractor's ``preprocessor_config.json`` when there is one (Kaldi filterbanks, as
        Speech2TextFeatureExtractor computes them)."""
        start = {**DEFAULTS, **config}["decoder_start_token_id"]
        task: dict[str, Any] = {"type": "asr"}
        notes: list[str] = []
        if isinstance(start, int) and not isinstance(start, bool):
            task["decoder_start"] = start
        path = in_dir / "preprocessor_config.json" if in_dir is not None else None
        if path is None or not path.is_file():
            notes.append("no preprocessor_config.json: the asr task reads audio with pentad's defaults (16 kHz, 80 "
                         "Kaldi filterbank bins, utterance CMVN)")
            return task, notes
        processor = read_json(path)
        audio: dict[str, Any] = {"features": "kaldi"}
        for ours, theirs in (("sample_rate", "sampling_rate"), ("feature_size", "num_mel_bins")):
            if isinstance(processor.get(theirs), int):
                audio[ours] = processor[theirs]
        if isinstance(processor.get("do_ceptral_normalize"), bool):
            audio["cmvn"] = processor["do_ceptral_normalize"]
            if audio["cmvn"] and not (processor.get("normalize_means", True) and processor.get("normalize_vars", True)):
                notes.append(f"{path}: normalize_means / normalize_vars are not both on; pentad's CMVN normalises both")
        task["audio"] = audio
        return task, notes

    def rules(self, *, prefix: str, convs: int, encoder_layers: int, decoder_layers: int, lm: str,
              head: bool, tied: bool) -> list[Rule]:
        heads = (TIED_HEAD if tied else OWN_HEAD) if head else []
        rules = expand(EMBEDDINGS + FINAL_NORMS + heads, p=prefix, conv=range(convs), wb=WB, lm=lm)
        rules += expand(SELF_ATTENTION, p=prefix, s="encoder", layer=range(encoder_layers), wb=WB)
        rules += expand(SELF_ATTENTION + CROSS_ATTENTION, p=prefix, s="decoder", layer=range(decoder_layers), wb=WB)
        return rules

    # -- import -----------------------------------------------------------------------------------
    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, ARCHITECTURES)
        activation(c["activation_function"], problems, "activation_function")
        hidden = _positive_int(c, "d_model", problems)
        kernels = c["conv_kernel_sizes"]
        if not isinstance(kernels, (list, tuple)) or not kernels or \
                not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in kernels):
            problems.append(f"conv_kernel_sizes is {kernels!r}; expected a list of positive integers")
            kernels = [5]
        kernels = [int(k) for k in kernels]
        convs = _positive_int(c, "num_conv_layers", problems)
        if convs != len(kernels):
            problems.append(f"num_conv_layers {convs} with {len(kernels)} conv_kernel_sizes {kernels}; give one "
                            "kernel size per layer")
        even = [k for k in kernels if k % 2 == 0]
        if even:
            problems.append(f"conv_kernel_sizes {kernels} has even sizes: transformers computes the encoder's "
                            "attention mask with (L - 1) // 2 + 1 frames per layer, which is the length its "
                            "convolutions give only for odd kernels, so padded batches would differ from pentad's")
        channels = _positive_int(c, "conv_channels", problems)
        if convs > 1 and channels % 2:
            problems.append(f"conv_channels {channels} is odd; a GLU halves each layer's output")
        features = _positive_int(c, "input_feat_per_channel", problems) * _positive_int(c, "input_channels", problems)
        pad = c.get("pad_token_id")
        if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
            problems.append(f"pad_token_id is {pad!r}: the position tables start at row pad_token_id + 1, so it "
                            "must be a non-negative integer")
            pad = 1
        elif pad == 0:
            problems.append("pad_token_id 0: transformers' encoder marks real frames 0 and padding 1 and reads the "
                            "zero row of its position table wherever that mark equals pad_token_id, so with 0 its "
                            "real frames get no position at all, which pentad does not convert")
        _positive_int(c, "max_source_positions", problems)
        targets = _positive_int(c, "max_target_positions", problems)
        tied = c.get("tie_word_embeddings", True) is not False
        head = "lm_head.weight" in keys or (tied and any(k.startswith("model.") for k in keys))
        if problems:
            raise UserError(f"cannot convert {label} ({self.name}): " + "; ".join(problems) + ".")
        prefix = "model." if any(k.startswith("model.") for k in keys) else ""
        table = {"type": "sinusoidal", "interleave": False, "spacing": "tensor2tensor", "offset": pad + 1}
        model = import_fields(FIELDS, c, {
            "max_seq_length": targets, "tie_word_embeddings": tied,
            "embedding": {"parts": [{"type": "speech", "feature_size": features,
                                     "conv_channels": [channels] * (convs - 1) + [2 * hidden], "activation": "glu"},
                                    dict(table)], "norm": False},
            "target_embedding": {"parts": [{"type": "word"}, dict(table)], "norm": False},
            "encoder": {**STACK, "mask": "bidirectional"}, "decoder": dict(STACK),
            "targets": [{"type": "lm", "bias": False}],
        })
        notes = [f"positions: rows {pad + 1}.. of transformers' sinusoidal tables (offset pad_token_id + 1), computed "
                 "by pentad; the checkpoint holds no weights for them"]
        for key in ("activation_dropout", "encoder_layerdrop", "decoder_layerdrop"):
            if float(c.get(key) or 0.0):
                notes.append(f"{key} {c[key]} has no pentad counterpart (training only)")
        arch = ARCHITECTURES[0] if head else ARCHITECTURES[1]
        rules = self.rules(prefix=prefix, convs=convs, encoder_layers=int(c["encoder_layers"]),
                           decoder_layers=int(c["decoder_layers"]), lm="lm", head=head, tied=tied)
        synthesized: list[str] = []
        if not head and not tied:
            synthesized = ["targets.lm.output.weight"]
            notes.append("targets.lm.output.weight: no lm_head in the checkpoint; zeros")
        return ImportPlan(model, rules, arch, synthesized, notes)

    # -- export -----------------------------------------------------------------------------------
    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        problems: list[str] = []
        enc, dec = model.encoder, model.decoder
        if dec is None or model.target_embedding is None:
            raise UserError(f"cannot export {label} as {self.name}: it has no decoder (Speech2Text is an "
                            "encoder-decoder).")
        hidden = model.hidden_size
        src = list(model.embedding.parts)
        tgt = list(model.target_embedding.parts)
        speech = src[0] if src and src[0].type == "speech" else None
        word = tgt[0] if tgt and tgt[0].type == "word" else None
        if speech is None or [p.type for p in src] != ["speech", "sinusoidal"]:
            problems.append(f"model.embedding.parts is {[p.type for p in src]}; Speech2Text has speech and sinusoidal")
        if word is None or [p.type for p in tgt] != ["word", "sinusoidal"]:
            problems.append(f"model.target_embedding.parts is {[p.type for p in tgt]}; Speech2Text has word and "
                            "sinusoidal")
        offsets = set()
        sizes = []
        for path, parts in (("model.embedding", src), ("model.target_embedding", tgt)):
            table = parts[-1] if parts and parts[-1].type == "sinusoidal" else None
            sizes.append((table.max_positions or model.max_seq_length) if table is not None else None)
            if table is None:
                continue
            offsets.add(table.offset)
            if table.interleave or table.spacing != "tensor2tensor":
                problems.append(f"{path} sinusoidal positions must be interleave: false, spacing: tensor2tensor "
                                "(transformers' layout)")
        for path, slot in (("model.embedding", model.embedding), ("model.target_embedding", model.target_embedding)):
            if slot.norm:
                problems.append(f"{path}.norm is on; Speech2Text does not normalise its embeddings")
        offset = offsets.pop() if len(offsets) == 1 else None
        if offsets or offset is None:
            problems.append("the encoder and decoder positions must have one offset (transformers starts both at row "
                            "pad_token_id + 1)")
        elif offset < 2:
            problems.append(f"sinusoidal offset {offset}: transformers reads position p at row pad_token_id + 1 + p "
                            "and its encoder has positions only with pad_token_id >= 1, so the offset must be at "
                            "least 2")
        elif pad_id is not None and pad_id != offset - 1:
            problems.append(f"the positions start at row {offset}, which in transformers means pad_token_id "
                            f"{offset - 1}, but the tokenizer's padding id is {pad_id}")
        if speech is not None:
            channels, kernels = list(speech.conv_channels), list(speech.kernel_sizes)
            if speech.activation != "glu":
                problems.append(f"model.embedding speech activation is {speech.activation}; Speech2Text has a GLU")
            if channels[-1] != 2 * hidden:
                problems.append(f"the last convolution has {channels[-1]} channels; Speech2Text's gives 2 x d_model "
                                f"= {2 * hidden}")
            if len(set(channels[:-1])) > 1:
                problems.append(f"conv_channels {channels}: Speech2Text has one channel count for every layer but "
                                "the last")
            if any(k % 2 == 0 for k in kernels):
                problems.append(f"kernel_sizes {kernels} has even sizes, for which transformers' encoder attention "
                                "mask ((L - 1) // 2 + 1 frames per layer) differs from the convolutions' lengths")
            if word is not None and bool(speech.scale) != bool(word.scale):
                problems.append(f"speech.scale ({speech.scale}) and word.scale ({word.scale}) differ; Speech2Text "
                                "has one scale_embedding for both")
        if model.target_vocab_size not in (None, model.vocab_size):
            problems.append(f"model.target_vocab_size {model.target_vocab_size} differs from vocab_size "
                            f"{model.vocab_size}; Speech2Text has one vocabulary")
        if model.embedding_size not in (None, hidden):
            problems.append(f"model.embedding_size {model.embedding_size} (Speech2Text has no factorised embedding)")
        problems += encoder_decoder_problems(enc, dec, "Speech2Text", hidden, pre_norm=True,
                                             layer_norm_eps=LAYER_NORM_EPS)
        if getattr(enc, "mask", "bidirectional") != "bidirectional":
            problems.append(f"model.encoder.mask is {enc.mask}; the Speech2Text encoder is bidirectional")
        targets = list(model.targets)
        if len(targets) != 1 or targets[0].type != "lm" or targets[0].bias or targets[0].scale_hidden:
            problems.append(f"targets {[t.type for t in targets]}: Speech2Text has one lm head without a bias or "
                            "rescaling")
        base = dict(base_config or {})
        act = activation_name(base.get("activation_function"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as {self.name}: " + "; ".join(problems) + ".")
        assert speech is not None and word is not None and offset is not None
        channels = list(speech.conv_channels)
        input_channels = base.get("input_channels", 1)
        if not isinstance(input_channels, int) or input_channels < 1 or speech.feature_size % input_channels:
            input_channels = 1
        config = {"architectures": [ARCHITECTURES[0]], "model_type": self.model_types[0], **export_fields(
            FIELDS, model, base, input_feat_per_channel=speech.feature_size // input_channels,
            input_channels=input_channels, conv_channels=channels[0] if len(channels) > 1
            else base.get("conv_channels", DEFAULTS["conv_channels"]))}
        if "eos_token_id" not in base and eos_id is not None:
            config["eos_token_id"] = eos_id
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="model.", convs=len(speech.kernel_sizes), encoder_layers=enc.num_layers,
                           decoder_layers=dec.num_layers, lm=targets[0].target_name, head=True,
                           tied=bool(model.tie_word_embeddings))
        return ExportPlan(config, rules, ARCHITECTURES[0], set(), [])


FAMILY = Speech2TextFamily()
