"""CTranslate2 Whisper models -> Hugging Face Whisper directories (and so -> pentad runs).

CTranslate2 (the inference engine behind faster-whisper) stores a converted model as a directory
with ``model.bin``, ``config.json`` (decoding settings: ``suppress_ids``, ``suppress_ids_begin``,
``lang_ids``, ``alignment_heads``) and the tokenizer (``tokenizer.json``). ``model.bin`` is a small
binary format, read here without the ``ctranslate2`` package:

* little-endian ``uint32`` format version (5 or 6), then (version >= 2) the model spec's name as a
  ``uint16``-length string (NUL-terminated) and a ``uint32`` spec revision;
* ``uint32`` variable count; per variable: name (string), ``uint8`` rank, ``uint32`` dims, then
  (version >= 4) a ``uint8`` data type (0 float32, 1 int8, 2 int16, 3 int32, 4 float16,
  5 bfloat16) and a ``uint32`` byte count, and the raw data;
* (version >= 3) ``uint32`` alias count; per alias two strings (alias, variable).

Whisper's variables (``WhisperSpec``) map to ``WhisperForConditionalGeneration``'s: the fused
self-attention ``linear_0`` [3H, H] splits into ``q_proj``/``k_proj``/``v_proj`` (the key bias,
which Whisper does not have and CTranslate2 fills with zeros, is checked to be zero and dropped),
the cross-attention ``linear_1`` [2H, H] into ``k_proj``/``v_proj``; layer norms' ``gamma``/``beta``
are ``weight``/``bias``. Weights are widened to float32; an int8-quantised model is refused (its
scales would be needed). The encoder's position table is a fixed sinusoid that CTranslate2 stored at
the model's precision: it is checked against the sinusoid and written exactly, as transformers
computes it.
"""

from __future__ import annotations

import math
import shutil
import struct
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

from pentad.components.embeddings.sinusoidal import sinusoidal_table
from pentad.errors import UserError
from pentad.interop import hf as hfio

MODEL_BIN = "model.bin"
DTYPES = {0: torch.float32, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.float16, 5: torch.bfloat16}
ACTIVATIONS = {3: "gelu"}  # CTranslate2's ActivationType: 3 = exact (erf) GELU, Whisper's


def _read(handle: BinaryIO, fmt: str, where: str) -> tuple[Any, ...]:
    size = struct.calcsize(fmt)
    data = handle.read(size)
    if len(data) != size:
        raise UserError(f"{where} ends early (truncated CTranslate2 model.bin?)")
    return struct.unpack(fmt, data)


def _string(handle: BinaryIO, where: str) -> str:
    (length,) = _read(handle, "<H", where)
    raw = handle.read(length)
    if len(raw) != length:
        raise UserError(f"{where} ends early (truncated CTranslate2 model.bin?)")
    return raw.rstrip(b"\0").decode("utf-8")


def read_model_bin(path: Path) -> tuple[str, dict[str, Tensor]]:
    """(spec name, variables by name, aliases included) of a CTranslate2 ``model.bin``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist: a CTranslate2 model directory holds model.bin and config.json")
    variables: dict[str, Tensor] = {}
    with path.open("rb") as handle:
        where = str(path)
        (version,) = _read(handle, "<I", where)
        if not 1 <= version <= 6:
            raise UserError(f"{path}: format version {version}; pentad reads CTranslate2 model.bin versions 1-6")
        spec = ""
        if version >= 2:
            spec = _string(handle, where)
            _read(handle, "<I", where)  # spec revision
        (count,) = _read(handle, "<I", where)
        for _ in range(count):
            name = _string(handle, where)
            (rank,) = _read(handle, "<B", where)
            dims = _read(handle, f"<{rank}I", where) if rank else ()
            if version >= 4:
                code, nbytes = _read(handle, "<BI", where)
                if code not in DTYPES:
                    raise UserError(f"{path}: variable {name} has data type {code}, which pentad does not know")
                dtype = DTYPES[code]
            else:  # older files store the item size; float32 for 4-byte items
                item, count_items = _read(handle, "<BI", where)
                dtype, nbytes = {4: torch.float32, 2: torch.float16, 1: torch.int8}[item], item * count_items
            data = handle.read(nbytes)
            if len(data) != nbytes:
                raise UserError(f"{path}: variable {name} is cut short ({len(data)} of {nbytes} bytes)")
            tensor = torch.frombuffer(bytearray(data), dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
            variables[name] = tensor.reshape(dims).clone()
        if version >= 3:
            (aliases,) = _read(handle, "<I", where)
            for _ in range(aliases):
                alias, target = _string(handle, where), _string(handle, where)
                if target in variables:
                    variables[alias] = variables[target]
    return spec, variables


def _scalar(variables: dict[str, Tensor], name: str, default: int | None = None) -> int:
    value = variables.get(name)
    if value is None:
        if default is None:
            raise UserError(f"the CTranslate2 model has no '{name}'")
        return default
    return int(value.reshape(-1)[0])


def _layers(variables: dict[str, Tensor], stack: str) -> int:
    count = 0
    while f"{stack}/layer_{count}/ffn/linear_0/weight" in variables:
        count += 1
    return count


def whisper_state(variables: dict[str, Tensor], label: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """(HF WhisperForConditionalGeneration state dict in float32, shape facts) of ``WhisperSpec``
    variables."""
    problems: list[str] = []
    for name, tensor in variables.items():
        if tensor.dtype == torch.int8 and tensor.dim() >= 2:
            problems.append(f"{name} is int8-quantised; convert the model again with --quantization float16 "
                            "or float32")
            break
    for key in ("encoder/activation", "decoder/activation"):
        if key in variables and _scalar(variables, key) not in ACTIVATIONS:
            problems.append(f"{key} is {_scalar(variables, key)} (Whisper's exact GELU is 3)")
    if _scalar(variables, "decoder/scale_embeddings", 0) or not _scalar(variables, "decoder/pre_norm", 1):
        problems.append("a scaled or post-norm decoder is not Whisper's")
    if problems:
        raise UserError(f"cannot convert {label}: " + "; ".join(problems) + ".")
    state: dict[str, Tensor] = {}
    used: set[str] = set()

    def take(name: str) -> Tensor:
        if name not in variables:
            raise UserError(f"{label}: the CTranslate2 Whisper model has no variable '{name}'")
        used.add(name)
        return variables[name].float()

    def norm(ours: str, theirs: str) -> None:
        state[f"{ours}.weight"], state[f"{ours}.bias"] = take(f"{theirs}/gamma"), take(f"{theirs}/beta")

    def linear(ours: str, theirs: str) -> None:
        state[f"{ours}.weight"], state[f"{ours}.bias"] = take(f"{theirs}/weight"), take(f"{theirs}/bias")

    def split(theirs: str, names: list[str]) -> None:
        """A fused projection -> its parts; a part named '' (a key bias) must be zero and is dropped."""
        weights = take(f"{theirs}/weight").chunk(len(names))
        biases = take(f"{theirs}/bias").chunk(len(names))
        for name, weight, bias in zip(names, weights, biases):
            state[f"{name}.weight"] = weight.clone()
            if name.endswith("k_proj"):
                if float(bias.abs().max()) != 0.0:
                    raise UserError(f"{label}: {theirs}/bias has a non-zero key part; Whisper has no key bias")
            else:
                state[f"{name}.bias"] = bias.clone()

    for i in (1, 2):
        linear(f"model.encoder.conv{i}", f"encoder/conv{i}")
    hidden = int(state["model.encoder.conv1.weight"].shape[0])
    mels = int(state["model.encoder.conv1.weight"].shape[1])
    table = take("encoder/position_encodings/encodings")
    exact = sinusoidal_table(table.shape[0], table.shape[1], interleave=False, spacing="tensor2tensor")
    worst = float((table - exact).abs().max())
    if worst > 2e-3:  # float16 rounding of values in [-1, 1] is at most 4.9e-4
        raise UserError(f"{label}: encoder/position_encodings differ from Whisper's sinusoid by up to {worst:.2e}")
    state["model.encoder.embed_positions.weight"] = exact
    state["model.decoder.embed_positions.weight"] = take("decoder/position_encodings/encodings")
    state["model.decoder.embed_tokens.weight"] = take("decoder/embeddings/weight")
    used.add("decoder/projection/weight")  # CTranslate2's alias of the word table: the tied output
    norm("model.encoder.layer_norm", "encoder/layer_norm")
    norm("model.decoder.layer_norm", "decoder/layer_norm")
    facts: dict[str, Any] = {"d_model": hidden, "num_mel_bins": mels,
                             "encoder_layers": _layers(variables, "encoder"),
                             "decoder_layers": _layers(variables, "decoder"),
                             "encoder_attention_heads": _scalar(variables, "encoder/num_heads"),
                             "decoder_attention_heads": _scalar(variables, "decoder/num_heads"),
                             "max_source_positions": int(table.shape[0]),
                             "max_target_positions": int(state["model.decoder.embed_positions.weight"].shape[0]),
                             "vocab_size": int(state["model.decoder.embed_tokens.weight"].shape[0])}
    for stack in ("encoder", "decoder"):
        for layer in range(facts[f"{stack}_layers"]):
            ours, theirs = f"model.{stack}.layers.{layer}", f"{stack}/layer_{layer}"
            split(f"{theirs}/self_attention/linear_0", [f"{ours}.self_attn.{p}_proj" for p in "qkv"])
            linear(f"{ours}.self_attn.out_proj", f"{theirs}/self_attention/linear_1")
            norm(f"{ours}.self_attn_layer_norm", f"{theirs}/self_attention/layer_norm")
            if stack == "decoder":
                linear(f"{ours}.encoder_attn.q_proj", f"{theirs}/attention/linear_0")
                split(f"{theirs}/attention/linear_1", [f"{ours}.encoder_attn.{p}_proj" for p in "kv"])
                linear(f"{ours}.encoder_attn.out_proj", f"{theirs}/attention/linear_2")
                norm(f"{ours}.encoder_attn_layer_norm", f"{theirs}/attention/layer_norm")
            linear(f"{ours}.fc1", f"{theirs}/ffn/linear_0")
            linear(f"{ours}.fc2", f"{theirs}/ffn/linear_1")
            norm(f"{ours}.final_layer_norm", f"{theirs}/ffn/layer_norm")
    facts["encoder_ffn_dim"] = int(state["model.encoder.layers.0.fc1.weight"].shape[0])
    facts["decoder_ffn_dim"] = int(state["model.decoder.layers.0.fc1.weight"].shape[0])
    left = sorted(k for k, v in variables.items() if k not in used and v.dim() >= 1 and v.numel() > 1)
    if left:
        raise UserError(f"{label}: {len(left)} CTranslate2 variable(s) pentad does not know where to put: "
                        f"{', '.join(left[:5])}")
    return state, facts


def _token_ids(tokenizer: dict[str, Any]) -> dict[str, int]:
    ids = {t["content"]: int(t["id"]) for t in tokenizer.get("added_tokens", []) if isinstance(t, dict)}
    vocab = (tokenizer.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids.update({k: int(v) for k, v in vocab.items() if k not in ids})
    return ids


def whisper_to_hf(in_dir: Path, out_dir: Path) -> list[str]:
    """Write a Hugging Face Whisper directory (config.json, generation_config.json,
    model.safetensors, tokenizer files) for the CTranslate2 Whisper model in ``in_dir``; notes."""
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    label = str(in_dir / MODEL_BIN)
    spec, variables = read_model_bin(in_dir / MODEL_BIN)
    if spec != "WhisperSpec":
        raise UserError(f"{label} holds a {spec or 'pre-spec'} model; pentad converts CTranslate2 Whisper models "
                        "(WhisperSpec) only")
    ct2_config = hfio.read_json(in_dir / "config.json") if (in_dir / "config.json").is_file() else {}
    tokenizer = hfio.read_json(in_dir / "tokenizer.json") if (in_dir / "tokenizer.json").is_file() else None
    state, facts = whisper_state(variables, label)
    notes = [f"read {len(variables)} CTranslate2 variables ({spec}); weights widened to float32"]
    ids = _token_ids(tokenizer) if tokenizer is not None else {}
    end = ids.get("<|endoftext|>", 50256)
    start = ids.get("<|startoftranscript|>", 50257)
    no_timestamps = ids.get("<|notimestamps|>")
    multilingual = facts["vocab_size"] >= 51865
    config = {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", **facts,
              "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
              "is_encoder_decoder": True, "pad_token_id": end, "bos_token_id": end if multilingual else start,
              "eos_token_id": end, "decoder_start_token_id": start,
              "suppress_tokens": list(ct2_config.get("suppress_ids") or []),
              "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin") or [220, end])}
    generation = {"decoder_start_token_id": start, "eos_token_id": end, "pad_token_id": end,
                  "bos_token_id": config["bos_token_id"], "max_length": facts["max_target_positions"],
                  "suppress_tokens": config["suppress_tokens"],
                  "begin_suppress_tokens": config["begin_suppress_tokens"],
                  "is_multilingual": multilingual, "return_timestamps": False}
    if no_timestamps is not None:
        generation["no_timestamps_token_id"] = no_timestamps
        if not multilingual:
            generation["forced_decoder_ids"] = [[1, no_timestamps]]
    if ct2_config.get("alignment_heads"):
        generation["alignment_heads"] = ct2_config["alignment_heads"]
    out_dir.mkdir(parents=True, exist_ok=True)
    hfio.write_json(out_dir / hfio.CONFIG, config)
    hfio.write_json(out_dir / "generation_config.json", generation)
    hfio.write_safetensors(out_dir / hfio.SAFETENSORS, state, {"source": "ctranslate2"})
    if tokenizer is not None:
        shutil.copyfile(in_dir / "tokenizer.json", out_dir / "tokenizer.json")
        hfio.write_json(out_dir / hfio.TOKENIZER_CONFIG, {
            "tokenizer_class": "WhisperTokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "model_max_length": 1024})
    else:
        notes.append(f"no tokenizer: {in_dir} has no tokenizer.json")
    size = sum(t.numel() for t in state.values())
    notes.append(f"Whisper {facts['encoder_layers']}+{facts['decoder_layers']} layers, d_model {facts['d_model']}, "
                 f"vocabulary {facts['vocab_size']} ({'multilingual' if multilingual else 'English-only'}), "
                 f"{size:,} parameters ({math.ceil(size * 4 / 2**20)} MiB in float32)")
    return notes
