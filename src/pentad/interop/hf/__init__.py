"""Hugging Face Transformers checkpoints <-> pentad: directories, weights, tokenizers, families.

A Hugging Face model directory holds ``config.json`` (its ``model_type`` picks the family),
weights (``model.safetensors``, sharded safetensors with ``model.safetensors.index.json``, or
``pytorch_model.bin`` read with ``weights_only=True``) and tokenizer files (``vocab.txt`` for
WordPiece, ``vocab.json`` + ``merges.txt`` for byte-level BPE, ``tokenizer_config.json``).

One module per family (registered by defining ``FAMILY``, see :mod:`.families`) declares how it
recognises a checkpoint and a pentad model, holds its key map (data, see :mod:`pentad.interop.keymap`)
and translates ``config.json`` <-> pentad's model config both ways; this module holds what they share.
Reading and writing HF files needs no ``transformers`` install; only ``--verify`` runs it.
SentencePiece tokenizers (``spiece.model``, ``tokenizer.model``, XLM-R's ``sentencepiece.bpe.model``)
are rewritten so that the model's own ids are the ones the HF tokenizer gives (:mod:`pentad.interop.spm`).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from pentad.errors import UserError
from pentad.files import atomic_path, write_json
from pentad.interop.keymap import Rule
from pentad.training.checkpoint import read_torch_state_dict

CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
PYTORCH_BIN_INDEX = "pytorch_model.bin.index.json"

# Hugging Face ``hidden_act`` / ``activation_function`` names -> pentad's. The three tanh GELU
# variants compute the same formula (Hendrycks & Gimpel 2016, eq. for the tanh approximation).
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu",
                  "tanh": "tanh", "linear": "linear", "quick_gelu": "quick_gelu"}
# pentad -> the name the exporter writes (GPT-2's original name for the tanh approximation).
PENTAD_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu",
                      "tanh": "tanh", "linear": "linear", "quick_gelu": "quick_gelu"}
ROLES = ("pad", "unk", "cls", "sep", "mask", "bos", "eos")


@dataclass(frozen=True)
class KeyLayout:
    """How a family's tensor names look: a checkpoint has this layout when one of its names contains
    one of ``contains``, starts with one of ``prefixes`` or ends with one of ``suffixes``, and for each
    of ``also`` some name contains it. Used to say that config.json and the weights disagree.

    ``rank`` orders the families tried (lower first): a family whose checkpoints also carry another
    family's marks (BART's carry PEGASUS's, Qwen2-MoE's dense layers LLaMA's) ranks before it."""

    contains: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    rank: int = 100

    def matches(self, keys: Iterable[str]) -> bool:
        names = list(keys)
        marked = any(any(m in k for m in self.contains) or k.startswith(self.prefixes) or k.endswith(self.suffixes)
                     for k in names)
        return marked and all(any(m in k for k in names) for m in self.also)


@dataclass
class ImportPlan:
    """What a family decided for one HF checkpoint: the pentad model config (a plain dict), the
    key map, the HF architecture it read, pentad keys filled with zeros (a head the HF model lacks)
    and notes for the user."""

    model: dict[str, Any]
    rules: list[Rule]
    architecture: str
    synthesized: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ExportPlan:
    """The HF ``config.json`` to write, the key map, pentad keys left out, and notes."""

    config: dict[str, Any]
    rules: list[Rule]
    architecture: str
    omit: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)


class HFFamily:
    """A Hugging Face model family: one module of this package holds its subclass and the instance
    ``FAMILY`` (:mod:`.families` finds them). Subclasses fill the class attributes (the ``model_type``
    values of config.json it reads, its tensors' :class:`KeyLayout`, its tokenizer), :meth:`describes`
    (which pentad models it is the export family of) and the two planners."""

    name: str = ""
    model_types: tuple[str, ...] = ()
    layout: KeyLayout | None = None  # None: its tensor names tell it from no other family
    # "wordpiece", "bpe", "sentencepiece", "tokenizer_json" (the file as it is); None: not converted
    tokenizer_kind: str | None = "wordpiece"
    tokenizer_class: str = ""
    tokenizer_classes: dict[str, str] = {}  # model_type -> class, where it differs from tokenizer_class
    default_special_tokens: dict[str, str] = {}
    # families whose describes() this family's narrows: a model both accept is this family's (Qwen2 narrows
    # LLaMA), so a new family leaves the broader one's conditions as they are
    narrows: tuple[str, ...] = ()
    # SentencePiece tokenizers: the file names HF uses, and how HF numbers the model's pieces
    # ("plain": as they are; "fairseq": XLM-R's shifted ids; "t5": sentinels appended; "pegasus":
    # 103 special ids in front, see pentad.interop.spm).
    spm_files: tuple[str, ...] = ()
    spm_text_normalisation: bool = False  # ALBERT: lower-case, strip accents, quotes before SentencePiece
    spm_layout: str = "plain"
    tokenizer_note: str = ""  # why the tokenizer is not converted (tokenizer_kind None)
    token_types: bool = True  # the HF model takes token_type_ids (segments)
    logit_softcap: bool = False  # an lm head may soft-cap its logits (Gemma's final_logit_softcapping)
    needs_tokenizer: bool = True  # False: an image model (ViT), which has none to convert
    # HF's ``hidden_states`` end with the last layer's output before the final norm (ViT), not after it.
    states_before_final_norm: bool = False
    # The HF model feeds an image's patches in a random order (ViLT's visual_embed): only the text
    # positions of its states, and the heads over them, can be compared position by position.
    shuffles_image_positions: bool = False

    # --verify (pentad.interop.verify): the seeded batch both models run on, in the report's words, and
    # whether the HF model is two towers compared tower by tower with their pooled, projected features
    verify_batch: str = "one seeded batch with padded rows"
    two_towers: bool = False

    # speech models: whether the HF model takes padded audio with an attention mask (S2T) or always
    # the same number of frames (Whisper's 30 s)
    speech_padding: bool = True

    def speech_inputs(self, audio: Tensor, padding: Tensor | None) -> dict[str, Tensor]:
        """The HF keyword inputs of speech features ``audio`` [B, T, F] (``padding`` [B, T], True at
        padding frames)."""
        inputs = {"input_features": audio}
        if padding is not None:
            inputs["attention_mask"] = (~padding).long()
        return inputs

    def image_task(self, architecture: str) -> tuple[str, str] | None:
        """The task of an imported image-and-text run of ``architecture`` and its default pixel
        normalisation (``task.normalise`` when the checkpoint has no ``preprocessor_config.json``);
        None: none."""
        return None

    def task_config(self, config: dict[str, Any], in_dir: Path | None) -> tuple[dict[str, Any] | None, list[str]]:
        """The run's ``task`` section this family's checkpoints imply (None: decided elsewhere), and notes."""
        return None, []

    def describes(self, model: Any) -> bool:  # pragma: no cover - abstract
        """Whether a pentad ``ModelConfig`` is of this family, for ``pentad-to-hf`` without ``--family``
        and a run that was not imported from HF. Exactly one family describes any model once the
        families it ``narrows`` are set aside (the shared traits below keep the other conditions
        apart; :func:`~pentad.interop.hf.families.describing`)."""
        raise NotImplementedError

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:  # pragma: no cover - abstract
        """Decide the pentad config and key map. ``keys``: the checkpoint's tensor names and shapes
        (the heads present decide the architecture); ``max_length``: the tokenizer's model_max_length."""
        raise NotImplementedError

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:  # pragma: no cover - abstract
        """Decide config.json and the key map for a pentad ``ModelConfig``. ``base_config``: the
        config.json the model was imported from (its HF-only keys are kept); ``omittable``: pentad
        keys that were synthesized on import and are still zero (left out when the architecture
        allows); ``labels``: class names of a classification head."""
        raise NotImplementedError

    def outputs(self, architecture: str) -> dict[str, str]:
        """pentad target type -> the HF output field to compare it with, for ``--verify``."""
        raise NotImplementedError  # pragma: no cover

    def pad_token_id(self, config: dict[str, Any]) -> int:
        """The id HF treats as padding when it derives positions from tokens (RoBERTa)."""
        value = config.get("pad_token_id")
        return int(value) if isinstance(value, int) else 0

    def tokenizer_for(self, model_type: str | None) -> tuple[str | None, str]:
        """(tokenizer kind, SentencePiece layout) of a model type (XLM-R differs from RoBERTa)."""
        return self.tokenizer_kind, self.spm_layout

    def spm_import(self, pieces: list[str], in_dir: Path, tok_cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Family checks of an imported SentencePiece model's ``pieces`` (by id) against the directory's
        other tokenizer files: (pentad tokenizer options to set, notes). A UserError where the HF
        tokenizer would give other ids."""
        return {}, []

    def spm_export(self, pieces: list[str], out_dir: Path, saved: dict[str, Any],
                   tok_cfg: dict[str, Any]) -> tuple[set[str], list[str]]:
        """Family files written beside an exported SentencePiece model (``saved``: the pentad
        tokenizer's saved options; ``tok_cfg``: tokenizer_config.json to complete): (pentad options
        the family expressed, notes)."""
        return set(), []


# ------------------------------------------------------------------------- model traits (describes)
def part_types(model: Any) -> dict[str, Any]:
    """The parts of a pentad model config's embedding slot, by type."""
    return {p.type: p for p in model.embedding.parts}


def media(model: Any) -> str | None:
    """What a pentad model reads besides text: ``image`` (a ``patch`` part), ``image_text`` (ViLT's
    ``word_patch``), ``speech`` (a ``speech`` part), ``two_towers`` (two streams); None: text alone."""
    parts = part_types(model)
    for part, kind in (("patch", "image"), ("word_patch", "image_text"), ("speech", "speech")):
        if part in parts:
            return kind
    return "two_towers" if getattr(model, "streams", None) else None


def text_kind(model: Any) -> str | None:
    """A text model's shape: ``encoder_decoder``, ``causal`` (a causal mask or an lm head, no decoder)
    or ``encoder`` (bidirectional, no decoder); None for a model that reads more than text."""
    if media(model) is not None:
        return None
    if model.decoder is not None:
        return "encoder_decoder"
    if getattr(model.encoder, "mask", None) == "causal" or any(t.type == "lm" for t in model.targets):
        return "causal"
    return "encoder"


def positions(model: Any) -> str:
    """The encoder's position scheme in its attention (``none``: the embedding's, or none)."""
    return getattr(model.encoder, "positions", "none")


def mixture(model: Any) -> bool:
    """Whether the encoder's feed-forwards are a mixture of experts."""
    return getattr(model.encoder, "ffn", None) == "moe"


def windowed(model: Any) -> str:
    """Which layers of the encoder attend in a sliding window: ``none``, ``every`` or ``some`` (local and
    global layers alternating, ``window_pattern``)."""
    enc = model.encoder
    if getattr(enc, "sliding_window", None) is None:
        return "none"
    pattern = getattr(enc, "window_pattern", None)
    return "every" if pattern is None or set(pattern) == {"local"} else "some"


def window_problems(enc: Any, display: str) -> list[str]:
    """What a transformer stack's windows have that a family with one sliding window for every layer
    (Mistral, Mixtral) cannot express."""
    problems = []
    if enc.window_pattern is not None and set(enc.window_pattern) != {"local"}:
        problems.append(f"model.encoder.window_pattern {enc.window_pattern} (local and global layers; {display} "
                        "has one sliding window for every layer)")
    if enc.rotary_local_base is not None:
        problems.append(f"model.encoder.rotary_local_base {enc.rotary_local_base} ({display} rotates every layer "
                        "at one base)")
    return problems


def shared_expert_gate(model: Any) -> bool:
    """Whether the encoder's mixture of experts scales a shared expert by a gate (Qwen2-MoE)."""
    moe = getattr(model.encoder, "moe", None)
    return moe is not None and bool(moe.shared_gate)


def shared_or_factorised(model: Any) -> bool:
    """ALBERT's traits: layers shared across the stack, or an embedding narrower than the hidden size."""
    return bool(getattr(model.encoder, "share_layers", False)) or \
        model.embedding_size not in (None, model.hidden_size)


def one_segment_with_positions(model: Any) -> bool:
    """RoBERTa's trait beside BERT: one segment row and a position table of its own length."""
    parts = part_types(model)
    seg, pos = parts.get("seg"), parts.get("pos")
    return seg is not None and seg.num_segments == 1 and pos is not None and bool(pos.max_positions)


# ----------------------------------------------------------------------------- config field tables
@dataclass(frozen=True)
class Field:
    """One row of a family's config table: the config.json key ``hf`` and the pentad model config path
    ``path`` it translates to (dotted, below ``model``; a number indexes a list, ``embedding.parts.0.channels``;
    None: a key the family computes on import).

    Import (:func:`import_fields`): ``read`` of the config value (the family's defaults filled in) is
    set at ``path`` and at each path of ``also`` (one HF key for several pentad options, e.g. one dropout
    for the embedding and the layers). Export (:func:`export_fields`), first that applies: a value the
    family computed; with ``kept``, the value of the config.json the model was imported from (through
    ``read``), where it has the key (an option pentad does not hold); ``write(model)`` of the pentad
    ``ModelConfig``; the value at
    ``path``, through ``spelled(value, imported)`` when the HF spelling is not ``read``'s inverse (an
    activation, whose imported name is kept when it means the same function), else through ``read``. A
    table's rows are config.json's keys in the order they are written."""

    hf: str
    path: str | None = None
    read: Callable[[Any], Any] = lambda value: value
    write: Callable[[Any], Any] | None = None
    also: tuple[str, ...] = ()
    kept: bool = False
    spelled: Callable[[Any, Any], Any] | None = None


def activation_field(hf: str, path: str, *also: str) -> Field:
    """The row of an activation: HF's name -> pentad's on import (checked beforehand with
    :func:`activation`), and back with the imported config's own spelling where it means the same function."""
    return Field(hf, path, lambda name: HF_ACTIVATIONS[str(name)], also=also,
                 spelled=lambda value, imported: activation_name(imported, value))


def import_fields(table: list[Field], config: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """Set each row's pentad value from ``config`` into the (nested) pentad model dict ``model``; returns it."""
    for row in table:
        for path in ((row.path, *row.also) if row.path is not None else ()):
            *parents, leaf = path.split(".")
            node: Any = model
            for key in parents:
                node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
            node[leaf] = row.read(config[row.hf])
    return model


def export_fields(table: list[Field], model: Any, base: dict[str, Any] | None = None, **given: Any) -> dict[str, Any]:
    """config.json's values of the rows of ``table``, in its order, for a pentad ``ModelConfig``
    (``base``: the config.json it was imported from; ``given``: values the family computed, by
    config.json key, e.g. ``hidden_act``)."""
    base = base or {}
    values: dict[str, Any] = {}
    for row in table:
        if row.hf in given:
            values[row.hf] = given[row.hf]
        elif row.kept and row.hf in base:
            values[row.hf] = row.read(base[row.hf])
        elif row.write is not None:
            values[row.hf] = row.write(model)
        elif row.path is None:
            raise ValueError(f"config field {row.hf} has no path, no writer and no given value")
        else:
            value = model
            for key in row.path.split("."):
                value = value[int(key)] if key.isdigit() else getattr(value, key)
            values[row.hf] = row.spelled(value, base.get(row.hf)) if row.spelled is not None else row.read(value)
    return values


def with_rows(table: list[Field], *rows: Field) -> list[Field]:
    """``table`` with the rows of the same config.json keys replaced by ``rows`` (in place), the others appended."""
    given = {row.hf: row for row in rows}
    out = [given.pop(row.hf, row) for row in table]
    return out + list(given.values())


def owned_keys(table: list[Field], *more: str) -> tuple[str, ...]:
    """The config.json keys a family writes (``architectures``, ``model_type``, the table's, ``more``):
    the rest of an imported config.json is kept as it was (:func:`merge_config`)."""
    return ("architectures", "model_type", *(row.hf for row in table), *more)


def merge_config(base: dict[str, Any] | None, owned: tuple[str, ...], values: dict[str, Any]) -> dict[str, Any]:
    """config.json: ``architectures`` and ``model_type`` first, then the keys of the config the model
    was imported from that this family does not translate (kept as they were, except the stale
    ``transformers_version``), then the translated ``values``."""
    kept = {k: v for k, v in (base or {}).items() if k not in owned and k != "transformers_version"}
    head = {k: values[k] for k in ("architectures", "model_type") if k in values}
    return {**head, **kept, **{k: v for k, v in values.items() if k not in head}}


def stack_problems(stack: Any, path: str, family: str, hidden_size: int, *, grouped: bool = False,
                   head_size: bool = False, **expected: Any) -> list[str]:
    """Options of a pentad transformer stack config that the HF family cannot express.

    ``expected`` overrides the plain-transformer values (``norm="rmsnorm"``, ``positions="rotary"``,
    ...); ``grouped`` allows fewer key/value heads, ``head_size`` a head width other than H / heads.
    """
    want: dict[str, Any] = {"norm": "layernorm", "ffn": "dense", "attention_scale": True, "positions": "none",
                            "share_layers": False, "residual_attention": False, "attention_reuse": None,
                            "sliding_window": None, "window_pattern": None, "rotary_local_base": None,
                            "qk_norm": None, "attention_scale_size": None, "attention_softcap": None}
    want.update(expected)
    problems = []
    for key, value in want.items():
        found = getattr(stack, key, value)
        if found != value:
            problems.append(f"{path}.{key} is {found!r} where {family} has {value!r}")
    qkv_bias = getattr(stack, "qkv_bias", None)
    if "qkv_bias" not in expected and qkv_bias not in (None, getattr(stack, "bias", qkv_bias)):
        problems.append(f"{path}.qkv_bias {qkv_bias} with bias {stack.bias} (biases on the query/key/value "
                        f"projections alone; {family} has none)")
    heads = stack.num_heads
    if not grouped and stack.num_kv_heads not in (None, heads):
        problems.append(f"{path}.num_kv_heads {stack.num_kv_heads} (grouped-query attention; {family} has none)")
    size = stack.head_size or hidden_size // heads
    if not head_size and size * heads != hidden_size:
        problems.append(f"{path}.head_size {size} x {heads} heads differs from hidden_size {hidden_size}")
    if getattr(stack, "rotary_dim", None) not in (None, size):
        problems.append(f"{path}.rotary_dim {stack.rotary_dim} (partial rotary; {family} rotates whole heads)")
    return problems


def encoder_decoder_problems(enc: Any, dec: Any, family: str, hidden_size: int, *, pre_norm: bool,
                             layer_norm_eps: float) -> list[str]:
    """What the encoder and decoder stacks of a pentad encoder-decoder have that a HF family with one
    value of each option for both stacks, biases, and pre-norm with final norms (``pre_norm``) or
    post-norm without, cannot express."""
    problems = []
    for f in ("activation", "dropout", "attention_dropout", "layer_norm_eps", "bias", "norm_position"):
        if getattr(enc, f) != getattr(dec, f):
            problems.append(f"model.encoder.{f} ({getattr(enc, f)}) and model.decoder.{f} ({getattr(dec, f)}) "
                            f"differ; {family} has one value for both")
    position = "pre" if pre_norm else "post"
    for path, stack in (("model.encoder", enc), ("model.decoder", dec)):
        final = stack.final_norm if stack.final_norm is not None else stack.norm_position == "pre"
        if stack.norm_position != position or final != pre_norm or not stack.bias:
            problems.append(f"{path} must be {position}-norm with biases"
                            + (" and a final norm" if pre_norm else " without a final norm"))
        if float(stack.layer_norm_eps) != layer_norm_eps:
            problems.append(f"{path}.layer_norm_eps {stack.layer_norm_eps}; {family} uses {layer_norm_eps}")
        problems += stack_problems(stack, path, family, hidden_size)
    return problems


def seq_length(max_length: int | None, positions: int | None, default: int = 512) -> int:
    """pentad's max_seq_length: the tokenizer's limit when it fits the positions, else the positions."""
    if positions is None:
        return max_length if max_length is not None else default
    return max_length if max_length is not None and max_length <= positions else positions


def activation(name: Any, problems: list[str], key: str = "hidden_act") -> str:
    """pentad's name of a HF activation (a problem is recorded when there is none)."""
    act = HF_ACTIVATIONS.get(str(name))
    if act is None:
        problems.append(f"{key} '{name}' (supported: {', '.join(HF_ACTIVATIONS)})")
        return "gelu"
    return act


def activation_name(original: Any, activation: str) -> str | None:
    """The HF name to write for a pentad activation: the imported config's own spelling when it
    means the same function (``gelu_pytorch_tanh`` stays), else pentad's default HF name."""
    if HF_ACTIVATIONS.get(str(original)) == activation:
        return str(original)
    return PENTAD_ACTIVATIONS.get(activation)


def hinted_problems(config: dict[str, Any], supported: tuple[str, ...]) -> list[str]:
    """A problem for each ``architectures`` entry of config.json that the family cannot convert."""
    return [f"architecture {a} has a head pentad has no target for yet" for a in config.get("architectures") or []
            if isinstance(a, str) and a not in supported]


# ------------------------------------------------------------------------------------------ files
def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}, line {e.lineno} column {e.colno}: invalid JSON ({e.msg}).") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text.") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, found {type(data).__name__}.")
    return data


def read_config(in_dir: Path) -> dict[str, Any]:
    if not in_dir.is_dir():
        raise UserError(f"{in_dir} is not a directory (expected a Hugging Face model directory with {CONFIG}).")
    path = in_dir / CONFIG
    if not path.is_file():
        raise UserError(f"{in_dir} has no {CONFIG}: is it a Hugging Face model directory?")
    return read_json(path)


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{path} is truncated or corrupt and cannot be read ({e}).") from None


def read_weights(in_dir: Path) -> tuple[dict[str, Tensor], str]:
    """All tensors of a HF directory and the name of the file(s) they came from.

    Old checkpoints name LayerNorm parameters ``gamma``/``beta`` (from TensorFlow); they are read
    as ``weight``/``bias``, as ``transformers`` itself does.
    """
    state: dict[str, Tensor]
    if (in_dir / SAFETENSORS).is_file():
        state, name = _load_safetensors(in_dir / SAFETENSORS), SAFETENSORS
    elif (in_dir / SAFETENSORS_INDEX).is_file() or (in_dir / PYTORCH_BIN_INDEX).is_file():
        index = in_dir / (SAFETENSORS_INDEX if (in_dir / SAFETENSORS_INDEX).is_file() else PYTORCH_BIN_INDEX)
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise UserError(f"{index} has no 'weight_map' object.")
        state = {}
        for shard in sorted(set(weight_map.values())):
            path = in_dir / shard
            if not path.is_file():
                raise UserError(f"{index} names shard {shard}, which is not in {in_dir}.")
            state.update(_load_safetensors(path) if shard.endswith(".safetensors") else read_torch_state_dict(path))
        name = index.name
    elif (in_dir / PYTORCH_BIN).is_file():
        state, name = read_torch_state_dict(in_dir / PYTORCH_BIN), PYTORCH_BIN
    else:
        raise UserError(f"{in_dir} holds no weights: expected {SAFETENSORS}, {SAFETENSORS_INDEX}, "
                        f"{PYTORCH_BIN} or {PYTORCH_BIN_INDEX}.")
    renamed = {}
    for key, value in state.items():
        new = re.sub(r"(LayerNorm|layer_norm)\.gamma$", r"\1.weight", key)
        new = re.sub(r"(LayerNorm|layer_norm)\.beta$", r"\1.bias", new)
        renamed[new] = value
    return renamed, name


def write_safetensors(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """Atomic write; ``format: pt`` is the metadata ``transformers`` requires."""
    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata={"format": "pt", **(metadata or {})})


# ------------------------------------------------------------------------------------- tokenizers
def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _special_tokens(in_dir: Path, tokenizer_config: dict[str, Any], defaults: dict[str, str],
                    vocab: dict[str, int]) -> dict[str, str]:
    """Role -> token from tokenizer_config.json / special_tokens_map.json, else the family's
    defaults; only tokens the vocabulary has (pentad rejects the others)."""
    sources = [tokenizer_config]
    if (in_dir / SPECIAL_TOKENS_MAP).is_file():
        sources.append(read_json(in_dir / SPECIAL_TOKENS_MAP))
    chosen: dict[str, str] = {}
    for role in ROLES:
        for source in sources:
            token = _token_text(source.get(f"{role}_token"))
            if token is not None:
                break
        else:
            token = defaults.get(role)
        if token is not None and token in vocab:
            chosen[role] = token
    return chosen


CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
CHAT_TEMPLATE_RECORD = "chat_template.json"  # the run's copy, in pentad.data.chat's JSON form


def import_chat_template(in_dir: Path, tok_dir: Path) -> str | None:
    """The chat template(s) of a HF directory written to ``tok_dir`` as ``chat_template.json``; its name,
    or None when the directory has none. As ``transformers`` reads them: ``chat_template.jinja`` and
    ``additional_chat_templates/NAME.jinja`` when present, else ``tokenizer_config.json``'s
    ``chat_template`` (a string or a list of named templates); the record keeps the special tokens
    those files name, which is what the template sees as ``bos_token``, ``eos_token``, ..."""
    tok_cfg = read_json(in_dir / TOKENIZER_CONFIG) if (in_dir / TOKENIZER_CONFIG).is_file() else {}
    templates: dict[str, str] = {}
    if (in_dir / CHAT_TEMPLATE_FILE).is_file():
        templates["default"] = (in_dir / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    if (in_dir / CHAT_TEMPLATE_DIR).is_dir():
        for path in sorted((in_dir / CHAT_TEMPLATE_DIR).glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    value: Any = (templates["default"] if list(templates) == ["default"]
                  else [{"name": k, "template": v} for k, v in templates.items()]) if templates else None
    if value is None:
        value = tok_cfg.get("chat_template")
    if not value:
        return None
    sources = [tok_cfg]
    if (in_dir / SPECIAL_TOKENS_MAP).is_file():
        sources.append(read_json(in_dir / SPECIAL_TOKENS_MAP))
    record: dict[str, Any] = {"chat_template": value}
    for role in ROLES:
        token = next((t for t in (_token_text(source.get(f"{role}_token")) for source in sources) if t is not None),
                     None)
        if token is not None:
            record[f"{role}_token"] = token
    tok_dir.mkdir(parents=True, exist_ok=True)
    write_json(tok_dir / CHAT_TEMPLATE_RECORD, record)
    return CHAT_TEMPLATE_RECORD


def import_tokenizer(in_dir: Path, tok_dir: Path, family: HFFamily,
                     model_type: str | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    """Write the pentad tokenizer files of a HF directory into ``tok_dir``.

    Returns (pentad tokenizer config with paths relative to ``tok_dir``, or None; notes).
    ``vocab.txt`` / ``vocab.json`` + ``merges.txt`` are copied byte for byte; when only a fast
    ``tokenizer.json`` exists its vocabulary (and merges) are written out in those formats.
    SentencePiece models are rewritten to the ids the HF tokenizer gives (:mod:`pentad.interop.spm`).
    A chat template becomes the config's ``chat_template`` (:func:`import_chat_template`).
    """
    cfg, notes = _import_tokenizer_files(in_dir, tok_dir, family, model_type)
    if cfg is not None:
        template = import_chat_template(in_dir, tok_dir)
        if template is not None:
            cfg["chat_template"] = template
    return cfg, notes


def _import_tokenizer_files(in_dir: Path, tok_dir: Path, family: HFFamily,
                            model_type: str | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    kind, layout = family.tokenizer_for(model_type)
    if not family.needs_tokenizer:
        return None, []
    if kind is None:
        return None, [f"tokenizer not converted: {family.tokenizer_note}; set a tokenizer in the run config"]
    tok_cfg = read_json(in_dir / TOKENIZER_CONFIG) if (in_dir / TOKENIZER_CONFIG).is_file() else {}
    fast = read_json(in_dir / "tokenizer.json") if (in_dir / "tokenizer.json").is_file() else None
    fast_model = fast.get("model", {}) if fast else {}
    tok_dir.mkdir(parents=True, exist_ok=True)
    if kind == "sentencepiece":
        return _import_sentencepiece(in_dir, tok_dir, family, layout, tok_cfg)
    if kind == "tokenizer_json":
        if fast is None:
            return None, [f"no tokenizer: {in_dir} has no tokenizer.json"]
        # Not named tokenizer.json: a run directory's tokenizer/tokenizer.json is pentad's own config.
        (tok_dir / "hf_tokenizer.json").write_bytes((in_dir / "tokenizer.json").read_bytes())
        vocab = {t["content"]: t["id"] for t in fast.get("added_tokens", []) if isinstance(t, dict)}
        vocab.update(fast_model.get("vocab") or {} if isinstance(fast_model.get("vocab"), dict) else {})
        cfg = {"type": "tokenizer_json", "file": "hf_tokenizer.json", **_split_special(tok_cfg)}
        special = _special_tokens(in_dir, tok_cfg, family.default_special_tokens, vocab)
        if special:
            cfg["special_tokens"] = special
        return cfg, []
    if kind == "wordpiece":
        if (in_dir / "vocab.txt").is_file():
            data = (in_dir / "vocab.txt").read_bytes()
        elif fast_model.get("type") == "WordPiece" and isinstance(fast_model.get("vocab"), dict):
            ordered = sorted(fast_model["vocab"].items(), key=lambda kv: kv[1])
            if [i for _, i in ordered] != list(range(len(ordered))):
                raise UserError(f"{in_dir / 'tokenizer.json'}: the WordPiece ids are not 0..n-1 without gaps.")
            data = ("\n".join(t for t, _ in ordered) + "\n").encode("utf-8")
        else:
            return None, [f"no tokenizer: {in_dir} has neither vocab.txt nor a WordPiece tokenizer.json"]
        (tok_dir / "vocab.txt").write_bytes(data)
        vocab = {t: i for i, t in enumerate(data.decode("utf-8-sig").split("\n")) if t}
        normalizer = (fast or {}).get("normalizer") or {}
        lower = tok_cfg.get("do_lower_case", normalizer.get("lowercase", True))
        cfg: dict[str, Any] = {"type": "wordpiece", "vocab": "vocab.txt", "lowercase": bool(lower),
                               "split_cjk": bool(tok_cfg.get("tokenize_chinese_chars",
                                                             normalizer.get("handle_chinese_chars", True))),
                               "strip_accents": tok_cfg.get("strip_accents", normalizer.get("strip_accents"))}
    else:
        if (in_dir / "vocab.json").is_file() and (in_dir / "merges.txt").is_file():
            (tok_dir / "vocab.json").write_bytes((in_dir / "vocab.json").read_bytes())
            (tok_dir / "merges.txt").write_bytes((in_dir / "merges.txt").read_bytes())
        elif fast_model.get("type") == "BPE" and isinstance(fast_model.get("vocab"), dict):
            merges = [m if isinstance(m, str) else " ".join(m) for m in fast_model.get("merges", [])]
            write_json(tok_dir / "vocab.json", fast_model["vocab"])
            (tok_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges),
                                                encoding="utf-8")
        else:
            return None, [f"no tokenizer: {in_dir} has neither vocab.json + merges.txt nor a BPE tokenizer.json"]
        vocab = read_json(tok_dir / "vocab.json")
        cfg = {"type": "bpe", "vocab": "vocab.json", "merges": "merges.txt",
               "add_prefix_space": bool(tok_cfg.get("add_prefix_space", False))}
    cfg.update(_split_special(tok_cfg))
    special = _special_tokens(in_dir, tok_cfg, family.default_special_tokens, vocab)
    if special:
        cfg["special_tokens"] = special
    return cfg, []


def _split_special(tok_cfg: dict[str, Any]) -> dict[str, str]:
    """HF's ``split_special_tokens: true`` (literal special tokens in text are ordinary text) is
    pentad's ``special_tokens_in_text: split``; HF's default is pentad's ``parse``."""
    return {"special_tokens_in_text": "split"} if tok_cfg.get("split_special_tokens") is True else {}


def _import_sentencepiece(in_dir: Path, tok_dir: Path, family: HFFamily, layout: str,
                          tok_cfg: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """The family's SentencePiece model, laid out with the ids the HF tokenizer gives."""
    from pentad.interop import spm

    found = [in_dir / name for name in family.spm_files if (in_dir / name).is_file()]
    if not found:
        return None, [f"no tokenizer: {in_dir} has no {' or '.join(family.spm_files)} (a lone tokenizer.json is not "
                      "converted to a SentencePiece model); set a tokenizer in the run config"]
    path = found[0]
    data = path.read_bytes()
    notes: list[str] = []
    if layout == "fairseq":
        data = spm.to_fairseq(data, str(path))
        notes.append(f"{path.name}: ids laid out as fairseq's dictionary (<s> <pad> </s> <unk> first, every other "
                     "piece one up, <mask> last), as the HF tokenizer numbers them")
    elif layout == "t5":
        extra = tok_cfg.get("extra_ids", spm.T5_EXTRA_IDS)
        data = spm.to_t5(data, str(path), int(extra) if isinstance(extra, int) else spm.T5_EXTRA_IDS)
    elif layout == "pegasus":
        offset = tok_cfg.get("offset", spm.PEGASUS_OFFSET)
        offset = int(offset) if isinstance(offset, int) else spm.PEGASUS_OFFSET
        data = spm.to_pegasus(data, str(path), offset)
        notes.append(f"{path.name}: <mask_1>, <mask_2> and <unk_2>..<unk_{offset - 1}> inserted after </s>, so that "
                     f"every other piece has the id PegasusTokenizer gives it (its own + {offset})")
    model = spm.SentencePieceModel.parse(data, path)
    vocab = {piece.text: i for i, piece in enumerate(model.pieces)}
    options, family_notes = family.spm_import([piece.text for piece in model.pieces], in_dir, tok_cfg)
    notes += family_notes
    (tok_dir / path.name).write_bytes(data)
    cfg: dict[str, Any] = {"type": "sentencepiece", "model": path.name, **options}
    special = _special_tokens(in_dir, tok_cfg, family.default_special_tokens, vocab)
    if special:
        cfg["special_tokens"] = special
    if family.spm_text_normalisation:
        # AlbertTokenizer's defaults: lower-case, accents stripped, `` and '' read as ".
        cfg["lowercase"] = bool(tok_cfg.get("do_lower_case", True))
        cfg["strip_accents"] = not bool(tok_cfg.get("keep_accents", False))
        cfg["replace_quotes"] = True
    return cfg, notes


def _export_sentencepiece(tokenizer: Any, out_dir: Path, family: HFFamily, layout: str,
                          tok_cfg: dict[str, Any]) -> list[str]:
    """Write a pentad SentencePiece tokenizer as the family's HF file (the inverse of the import layout)."""
    from pentad.interop import spm

    with tempfile.TemporaryDirectory() as tmp:
        saved = tokenizer.save(Path(tmp))
        data = (Path(tmp) / saved["model"]).read_bytes()
    if layout == "fairseq":
        data = spm.from_fairseq(data, f"the run's SentencePiece model ({saved['model']})")
    elif layout == "t5":
        data, extra = spm.from_t5(data, saved["model"])
        tok_cfg["extra_ids"] = extra
    elif layout == "pegasus":
        data, offset = spm.from_pegasus(data, saved["model"])
        tok_cfg.update(offset=offset, mask_token_sent="<mask_1>")
    (out_dir / family.spm_files[0]).write_bytes(data)
    pieces = [piece.text for piece in spm.SentencePieceModel.parse(data, family.spm_files[0]).pieces]
    handled, notes = family.spm_export(pieces, out_dir, saved, tok_cfg)
    if family.spm_text_normalisation:
        tok_cfg.update(do_lower_case=bool(saved.get("lowercase")), keep_accents=not saved.get("strip_accents"))
        if not saved.get("replace_quotes"):
            notes.append(f"{family.tokenizer_class} always reads `` and '' as \"; the run's tokenizer does not")
    else:
        changed = [k for k in ("lowercase", "strip_accents", "replace_quotes") if saved.get(k) and k not in handled]
        if changed:
            notes.append(f"the tokenizer's {', '.join(changed)} option(s) have no {family.tokenizer_class} equivalent: "
                         "normalise inputs the same way yourself with the exported tokenizer")
    return notes


def model_max_length(in_dir: Path) -> int | None:
    """``model_max_length`` of tokenizer_config.json when it is a real limit (HF writes 1e30 for none)."""
    path = in_dir / TOKENIZER_CONFIG
    if not path.is_file():
        return None
    value = read_json(path).get("model_max_length")
    return int(value) if isinstance(value, int) and 0 < value < 10**9 else None


def export_tokenizer(tokenizer: Any, out_dir: Path, family: HFFamily, max_length: int,
                     model_type: str | None = None) -> list[str]:
    """Write a pentad tokenizer in the HF format of ``family``; returns notes (what was not written)."""
    kind = tokenizer.registry_name
    wanted, layout = family.tokenizer_for(model_type)
    if wanted is None:
        return [f"tokenizer not exported: {family.tokenizer_note}"]
    if kind != wanted:
        return [f"tokenizer not exported: pentad's '{kind}' tokenizer has no {family.name} equivalent "
                f"(a {family.name} model uses {wanted})"]
    notes: list[str] = []
    size = tokenizer.vocab_size
    try:
        tokens = [tokenizer.id_to_token(i) for i in range(size)]
    except IndexError:
        return ["tokenizer not exported: its vocabulary has gaps in the ids, which HF vocabulary files cannot hold"]
    options = tokenizer.config().model_dump(mode="json")
    special = {role: tok for role, tok in tokenizer.special_tokens.items() if tok is not None}
    tokenizer_class = family.tokenizer_classes.get(model_type or "", family.tokenizer_class)
    tok_cfg: dict[str, Any] = {"tokenizer_class": tokenizer_class, "model_max_length": max_length}
    if kind == "sentencepiece":
        notes += _export_sentencepiece(tokenizer, out_dir, family, layout, tok_cfg)
    elif kind == "tokenizer_json":
        with tempfile.TemporaryDirectory() as tmp:
            saved = tokenizer.save(Path(tmp))
            (out_dir / "tokenizer.json").write_bytes((Path(tmp) / saved["file"]).read_bytes())
    elif kind == "wordpiece":
        (out_dir / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
        tok_cfg.update(do_lower_case=options["lowercase"], tokenize_chinese_chars=options["split_cjk"],
                       strip_accents=options["strip_accents"])
        if options["max_input_chars_per_word"] != 100:
            notes.append("max_input_chars_per_word is not a HF BertTokenizer option: HF uses 100")
        special = {r: t for r, t in special.items() if r in ("pad", "unk", "cls", "sep", "mask")}
    else:
        write_json(out_dir / "vocab.json", {t: i for i, t in enumerate(tokens)})
        with tempfile.TemporaryDirectory() as tmp:
            saved = tokenizer.save(Path(tmp))
            lines = (Path(tmp) / saved["merges"]).read_text(encoding="utf-8-sig").split("\n")
        merges = [line for line in lines if line.strip() and not line.startswith("#version")]
        # HF's slow GPT-2 reader skips the first line, so the version header is always written.
        (out_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges), encoding="utf-8")
        tok_cfg["add_prefix_space"] = options["add_prefix_space"]
        if options["lowercase"]:
            notes.append("the tokenizer lower-cases text, which HF byte-level BPE tokenizers do not: "
                         "lower-case inputs yourself with the exported tokenizer")
    if options.get("special_tokens_in_text") == "split":
        tok_cfg["split_special_tokens"] = True
    for role, token in special.items():
        tok_cfg[f"{role}_token"] = token
    if tokenizer.chat_template is not None:  # the form transformers reads (a string or named templates)
        tok_cfg["chat_template"] = tokenizer.chat_template.to_json()["chat_template"]
    write_json(out_dir / TOKENIZER_CONFIG, tok_cfg)
    write_json(out_dir / SPECIAL_TOKENS_MAP, {f"{r}_token": t for r, t in special.items()})
    return notes
