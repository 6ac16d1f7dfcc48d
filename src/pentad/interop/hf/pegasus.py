"""Pegasus (``model_type: pegasus``): BART's layout (:mod:`.bart`) with three differences.

* Positions are a fixed sinusoidal table, sines in the first half of the dimensions and cosines in
  the second (pentad ``sinusoidal`` with ``interleave: false``), counted from 0. transformers
  stores the table as ``embed_positions.weight``; the import checks it equals the table pentad
  computes and keeps it for the way back.
* Layers are pre-norm, each stack ends with a LayerNorm (``encoder.layer_norm``), and the
  embeddings have no LayerNorm.
* ``scale_embedding`` (true in the released checkpoints) multiplies the word embedding by
  sqrt(d_model) (pentad ``word.scale``).

The tokenizer (``spiece.model``) converts to pentad's ``sentencepiece`` tokenizer with the model
rewritten to the ids ``PegasusTokenizer`` gives: ``<pad>`` 0, ``</s>`` 1, ``<mask_1>`` 2, ``<mask_2>``
3, ``<unk_2>``..``<unk_102>`` 4..104, then every piece from ``<unk>`` on at its own id + 103
(``offset`` in tokenizer_config.json); the export writes the original file back (see
:mod:`pentad.interop.spm`).
"""

from __future__ import annotations

from typing import Any

from pentad.interop.hf import KeyLayout, part_types, positions, text_kind
from pentad.interop.hf.bart import DEFAULTS as BART_DEFAULTS
from pentad.interop.hf.bart import OWNED as BART_OWNED
from pentad.interop.hf.bart import BartLikeFamily
from pentad.interop.keymap import RuleSpec

DEFAULTS: dict[str, Any] = {**BART_DEFAULTS, "vocab_size": 50265, "max_position_embeddings": 1024,
                            "encoder_layers": 12, "encoder_ffn_dim": 4096, "encoder_attention_heads": 16,
                            "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
                            "activation_function": "gelu", "d_model": 1024, "scale_embedding": False,
                            "pad_token_id": 0}


class PegasusFamily(BartLikeFamily):
    name = "pegasus"
    model_types = ("pegasus",)
    layout = KeyLayout(contains=("encoder_attn.q_proj",))
    class_prefix = "Pegasus"
    defaults = DEFAULTS
    owned = BART_OWNED
    tokenizer_kind = "sentencepiece"
    tokenizer_class = "PegasusTokenizer"
    spm_files = ("spiece.model",)
    spm_layout = "pegasus"
    default_special_tokens = {"pad": "<pad>", "eos": "</s>", "unk": "<unk>", "mask": "<mask_2>"}
    pre_norm = True

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "encoder_decoder" and positions(model) != "relative" \
            and "sinusoidal" in part_types(model)

    def position_rules(self, positions: int, hidden: int) -> list[RuleSpec]:
        return [((), f"{{p}}{stack}.embed_positions.weight", f"sinusoidal:{positions}:{hidden}")
                for stack in ("encoder", "decoder")]

    def embedding_parts(self, c: dict[str, Any], positions: int) -> list[dict[str, Any]]:
        return [{"type": "word", "scale": bool(c["scale_embedding"])},
                {"type": "sinusoidal", "max_positions": positions, "interleave": False}]

    def position_notes(self, positions: int) -> list[str]:
        return []

    def embedding_problems(self, slot: Any, path: str) -> tuple[list[str], int | None, bool]:
        parts = slot.parts
        problems = []
        if [p.type for p in parts] != ["word", "sinusoidal"] or getattr(parts[-1], "interleave", True):
            problems.append(f"{path}.parts is {[p.type for p in parts]}; Pegasus has word and sinusoidal (interleave: "
                            "false)")
        if slot.norm:
            problems.append(f"{path}.norm is on; Pegasus does not normalise its embeddings")
        table = parts[-1] if parts and parts[-1].type == "sinusoidal" else None
        return problems, (table.max_positions if table is not None else None), bool(getattr(parts[0], "scale", False))


FAMILY = PegasusFamily()
