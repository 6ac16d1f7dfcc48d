"""TencentPretrain (and UER-py) checkpoints -> pentad.

A TencentPretrain model is a ``.bin`` state dict written by ``torch.save`` (read here with
``weights_only=True``) plus the flat JSON config it was trained with, which loads through
:func:`pentad.config.tencentpretrain.import_config`. Put both (and the vocabulary file the model
was trained with) in one directory and convert it.

The key scheme (TencentPretrain's ``model_builder`` and its HF conversion scripts) and how it maps:

=========================================================  ==========================================
TencentPretrain                                            pentad
=========================================================  ==========================================
``embedding.word.embedding.weight``                        ``embedding.word.weight``
``embedding.pos.embedding.weight``                         ``embedding.pos.weight``
``embedding.seg.embedding.weight`` (3 rows: pad, A, B)     ``embedding.seg.weight`` (2 rows: A, B)
``embedding.layer_norm.gamma`` / ``beta``                  ``embedding.norm.weight`` / ``bias``
``encoder.transformer.N.self_attn.linear_layers.0..2``     ``encoder.layers.N.attention.qkv`` (fused q;k;v)
``encoder.transformer.N.self_attn.final_linear``           ``encoder.layers.N.attention.out``
``encoder.transformer.N.layer_norm_1`` / ``layer_norm_2``  ``...attention_norm`` / ``...ffn_norm``
``encoder.transformer.N.feed_forward.linear_1`` / ``_2``   ``...ffn.up`` / ``...ffn.down``
``encoder.layer_norm`` (pre-norm models)                   ``encoder.final_norm``
``target.mlm.linear_1``, ``layer_norm``, ``linear_2``      ``targets.mlm.dense``, ``norm``, ``output``
``target.sp.linear_1`` / ``linear_2``                      ``targets.sp.pooler`` / ``classifier``
``target.lm.output_layer``                                 ``targets.lm.output``
``target.cls.linear_1`` / ``linear_2``                     ``targets.cls.pooler`` / ``classifier``
``output_layer_1`` / ``output_layer_2`` (a classifier      ``targets.cls.pooler`` / ``classifier``
fine-tuned with ``finetune/run_classifier.py``)
=========================================================  ==========================================

With ``tie_weights`` the output layer (``target.mlm.linear_2.weight`` or
``target.lm.output_layer.weight``) is saved under both names; the two must be equal. The padding
row of the segment table (row 0, which only padding positions read) is kept in
``interop_extra.safetensors``.

**Numerics.** TencentPretrain's ``normal`` LayerNorm divides by ``std + eps`` with the *unbiased*
standard deviation; pentad (like Hugging Face, whose weights TencentPretrain's own converters copy
unchanged) uses ``sqrt(var + eps)`` with the biased variance. The weights carry over exactly; the
activations differ from TencentPretrain's by a relative ~1/(2H) (about 6.5e-4 at H = 768).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from pentad.errors import UserError
from pentad.interop.keymap import WB, Rule, RuleSpec, expand, to_foreign

EMBEDDING_PARTS: dict[str, list[RuleSpec]] = {
    "word": [("embedding.word.weight", "embedding.word.embedding.weight")],
    "pos": [("embedding.pos.weight", "embedding.pos.embedding.weight")],
    "seg": [("embedding.seg.weight", "embedding.seg.embedding.weight", "seg_pad_row")],
}
EMBEDDING_NORM: list[RuleSpec] = [
    ("embedding.norm.weight", "embedding.layer_norm.gamma"),
    ("embedding.norm.bias", "embedding.layer_norm.beta"),
]
# {lwb}: weight and bias, or weight alone with remove_transformer_bias.
LAYER: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention.qkv.{lwb}",
     ("encoder.transformer.{layer}.self_attn.linear_layers.0.{lwb}",
      "encoder.transformer.{layer}.self_attn.linear_layers.1.{lwb}",
      "encoder.transformer.{layer}.self_attn.linear_layers.2.{lwb}"), "fuse_qkv"),
    ("encoder.layers.{layer}.attention.out.{lwb}", "encoder.transformer.{layer}.self_attn.final_linear.{lwb}"),
    ("encoder.layers.{layer}.attention_norm.weight", "encoder.transformer.{layer}.layer_norm_1.gamma"),
    ("encoder.layers.{layer}.attention_norm.bias", "encoder.transformer.{layer}.layer_norm_1.beta"),
    ("encoder.layers.{layer}.ffn.up.{lwb}", "encoder.transformer.{layer}.feed_forward.linear_1.{lwb}"),
    ("encoder.layers.{layer}.ffn.down.{lwb}", "encoder.transformer.{layer}.feed_forward.linear_2.{lwb}"),
    ("encoder.layers.{layer}.ffn_norm.weight", "encoder.transformer.{layer}.layer_norm_2.gamma"),
    ("encoder.layers.{layer}.ffn_norm.bias", "encoder.transformer.{layer}.layer_norm_2.beta"),
]
FINAL_NORM: list[RuleSpec] = [
    ("encoder.final_norm.weight", "encoder.layer_norm.gamma"),
    ("encoder.final_norm.bias", "encoder.layer_norm.beta"),
]
TARGETS: dict[str, list[RuleSpec]] = {
    "mlm": [("targets.{name}.dense.{wb}", "target.mlm.linear_1.{wb}"),
            ("targets.{name}.norm.weight", "target.mlm.layer_norm.gamma"),
            ("targets.{name}.norm.bias", "target.mlm.layer_norm.beta"),
            ("targets.{name}.output.bias", "target.mlm.linear_2.bias")],
    "sp": [("targets.{name}.pooler.{wb}", "target.sp.linear_1.{wb}"),
           ("targets.{name}.classifier.{wb}", "target.sp.linear_2.{wb}")],
    "lm": [],
    "cls": [("targets.{name}.pooler.{wb}", "target.cls.linear_1.{wb}"),
            ("targets.{name}.classifier.{wb}", "target.cls.linear_2.{wb}")],
}
# The vocabulary projection: tied to the word embedding (saved twice) or a tensor of its own.
OUTPUT_TIED: dict[str, list[RuleSpec]] = {
    "mlm": [("embedding.word.weight", "target.mlm.linear_2.weight", "tied")],
    "lm": [("embedding.word.weight", "target.lm.output_layer.weight", "tied")],
}
OUTPUT_UNTIED: dict[str, list[RuleSpec]] = {
    "mlm": [("targets.{name}.output.weight", "target.mlm.linear_2.weight")],
    "lm": [("targets.{name}.output.weight", "target.lm.output_layer.weight")],
}
LM_BIAS: list[RuleSpec] = [("targets.{name}.output.bias", "target.lm.output_layer.bias")]
# ``finetune/run_classifier.py`` saves its head at the top level of the state dict.
FINETUNED_CLASSIFIER: list[RuleSpec] = [
    ("targets.{name}.pooler.{wb}", "output_layer_1.{wb}"),
    ("targets.{name}.classifier.{wb}", "output_layer_2.{wb}"),
]
FINETUNED_MARKER = "output_layer_2.weight"

WEIGHT_SUFFIXES = (".bin", ".pt", ".pth")
# TencentPretrain tokenizer names -> pentad's (the vocabulary file decides the rest).
TOKENIZERS = {"bert": "wordpiece", "char": "char", "space": "space", "bpe": "bpe"}


def rules(model: Any, finetuned: bool = False) -> list[Rule]:
    """The key map of a pentad ``ModelConfig`` in TencentPretrain's layout.

    finetuned: the cls head is stored as ``output_layer_1/2`` (``run_classifier.py``)."""
    problems = []
    specs: list[RuleSpec] = []
    for part in model.embedding.parts:
        if part.type not in EMBEDDING_PARTS:
            problems.append(f"embedding part '{part.type}' has no TencentPretrain key map yet")
        specs += EMBEDDING_PARTS.get(part.type, [])
    if model.embedding.norm:
        specs += EMBEDDING_NORM
    enc = model.encoder
    if enc.type != "transformer":
        problems.append(f"encoder '{enc.type}' has no TencentPretrain key map yet")
    specs += LAYER
    final_norm = enc.final_norm if enc.final_norm is not None else enc.norm_position == "pre"
    if final_norm:
        specs += FINAL_NORM
    values: dict[str, Any] = {"layer": range(enc.num_layers), "wb": WB, "lwb": WB if enc.bias else ("weight",)}
    rule_list: list[Rule] = []
    tied_done = False
    for target in model.targets:
        head = list(FINETUNED_CLASSIFIER if finetuned and target.type == "cls" else TARGETS.get(target.type, []))
        if target.type not in TARGETS:
            problems.append(f"target '{target.type}' has no TencentPretrain key map yet")
        if target.type in OUTPUT_TIED:
            if model.tie_word_embeddings and not tied_done:
                head += OUTPUT_TIED[target.type]
                tied_done = True
            elif not model.tie_word_embeddings:
                head += OUTPUT_UNTIED[target.type]
        if target.type == "lm" and target.bias:
            head += LM_BIAS
        rule_list += expand(head, name=target.target_name, **values)
    if problems:
        raise UserError("cannot map this model to TencentPretrain's layout: " + "; ".join(problems) + ".")
    return expand(specs, **values) + rule_list


def to_tencentpretrain(model: Any, ours: dict[str, Tensor], extras: dict[str, Tensor] | None = None,
                       finetuned: bool = False, source: str = "pentad weights") -> dict[str, Tensor]:
    """A TencentPretrain state dict of pentad weights: the key map run backwards."""
    return to_foreign(ours, rules(model, finetuned), source=source, layout="TencentPretrain", extras=extras)


# ------------------------------------------------------------------------------------------ files
def read_state_dict(path: Path) -> dict[str, Tensor]:
    """A TencentPretrain ``.bin`` state dict (see ``training.checkpoint.read_torch_state_dict``)."""
    from pentad.training.checkpoint import read_torch_state_dict

    return read_torch_state_dict(path)


def find_files(in_dir: Path) -> tuple[Path, Path]:
    """(weights file, JSON config) of a TencentPretrain directory."""
    from pentad.config.tencentpretrain import is_tencentpretrain_config
    from pentad.interop.hf import read_json

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


def find_tokenizer(in_dir: Path, raw: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """The pentad tokenizer config of the vocabulary files next to the checkpoint (absolute paths).

    A merges file means GPT-2 BPE; a ``.model`` file SentencePiece; one ``*vocab*.txt`` file a
    WordPiece vocabulary (or ``char`` / ``space`` when the config's ``tokenizer`` says so).
    """
    merges = sorted(in_dir.glob("*merges*.txt"))
    vocabs = sorted(p for p in in_dir.glob("*vocab*") if p.suffix in (".txt", ".json"))
    models = sorted(in_dir.glob("*.model"))
    lower = str(raw.get("do_lower_case", "true")).lower() in ("true", "1", "yes")
    if merges:
        if len(merges) != 1 or len(vocabs) != 1:
            raise UserError(f"{in_dir}: a BPE tokenizer needs one *merges*.txt and one *vocab* file; found "
                            f"{[p.name for p in merges + vocabs]}.")
        return {"type": "bpe", "vocab": str(vocabs[0].resolve()), "merges": str(merges[0].resolve())}, []
    if models:
        if len(models) != 1:
            raise UserError(f"{in_dir}: several SentencePiece models {[p.name for p in models]}; keep one.")
        return {"type": "sentencepiece", "model": str(models[0].resolve())}, []
    texts = [p for p in vocabs if p.suffix == ".txt"]
    if len(texts) > 1:
        raise UserError(f"{in_dir}: several vocabulary files {[p.name for p in texts]}; keep the one the model "
                        "was trained with.")
    if texts:
        kind = TOKENIZERS.get(str(raw.get("tokenizer", "bert")), "wordpiece")
        cfg: dict[str, Any] = {"type": kind, "vocab": str(texts[0].resolve())}
        if kind == "wordpiece":
            cfg["lowercase"] = lower
        return cfg, []
    return None, [f"no vocabulary file in {in_dir}: the run has no tokenizer (set one in its config to fine-tune)"]


def plan(raw: dict[str, Any], state: dict[str, Tensor], label: str) -> tuple[dict[str, Any], bool, list[str]]:
    """(run-config dict, fine-tuned-classifier layout?, notes) of a TencentPretrain config + state dict."""
    from pentad.config.tencentpretrain import import_config

    word = state.get("embedding.word.embedding.weight")
    if word is None:
        raise UserError(f"{label}: no embedding.word.embedding.weight tensor, so this is not a TencentPretrain "
                        f"checkpoint with a word embedding (found e.g. {', '.join(sorted(state)[:4]) or 'nothing'}).")
    if any("sinusoidalpos" in str(e) for e in _as_list(raw.get("embedding", []))):
        raise UserError(f"{label}: the sinusoidalpos embedding has no TencentPretrain key map in pentad yet (its "
                        "table starts at position 2 and scales the word embedding, unlike pentad's).")
    out, _ = import_config(raw, [f"vocab_size={int(word.shape[0])}"], label)
    model = out["model"]
    notes: list[str] = []
    finetuned = FINETUNED_MARKER in state
    if finetuned:
        labels = int(state[FINETUNED_MARKER].shape[0])
        model["targets"] = [{"type": "cls", "num_labels": labels, "pooling": raw.get("pooling", "first")}]
        notes.append(f"output_layer_1/2 found: a classifier fine-tuned with run_classifier.py ({labels} labels); "
                     "it becomes pentad's cls target, replacing the config's pre-training targets")
    for target in model["targets"]:
        if target["type"] == "cls" and target.get("num_labels") is None and "target.cls.linear_2.weight" in state:
            target["num_labels"] = int(state["target.cls.linear_2.weight"].shape[0])
    notes.append("TencentPretrain's LayerNorm divides by (unbiased std + eps), pentad's by sqrt(biased var + eps): "
                 "the weights are exact, the activations differ from TencentPretrain's by a relative ~1/(2H)")
    return out, finetuned, notes


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]
