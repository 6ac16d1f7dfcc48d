"""CTranslate2 Whisper models -> Hugging Face / pentad: a tiny random ``WhisperForConditionalGeneration``
written in CTranslate2's ``model.bin`` layout (fused projections, ``gamma``/``beta``, float16, the
projection as an alias of the word table) reads back as the same model, and the pentad run it
converts to decodes as the HF model does. Bad files are named with the reason."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from tests.parity.test_whisper_conversion import features, save_whisper
from tests.unit.interop.helpers import load_pentad_run, relative

from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.interop import convert
from pentad.interop.ctranslate2 import read_model_bin

transformers = pytest.importorskip("transformers")
CODES = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.float16: 4}


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def write_model_bin(path, variables: dict[str, torch.Tensor], aliases: dict[str, str], spec: str = "WhisperSpec"):
    out = [struct.pack("<I", 6), _string(spec), struct.pack("<I", 3), struct.pack("<I", len(variables))]
    for name, tensor in variables.items():
        data = tensor.contiguous().numpy().tobytes()
        out += [_string(name), struct.pack("<B", tensor.dim()), struct.pack(f"<{tensor.dim()}I", *tensor.shape),
                struct.pack("<BI", CODES[tensor.dtype], len(data)), data]
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_string(alias), _string(target)]
    path.write_bytes(b"".join(out))


def ct2_variables(hf, dtype=torch.float16) -> dict[str, torch.Tensor]:
    """The model in CTranslate2's WhisperSpec names (what its converter writes)."""
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    out: dict[str, torch.Tensor] = {"decoder/activation": torch.tensor(3, dtype=torch.int8),
                                    "decoder/num_heads": torch.tensor(4, dtype=torch.int16),
                                    "encoder/num_heads": torch.tensor(4, dtype=torch.int16),
                                    "decoder/pre_norm": torch.tensor(1, dtype=torch.int8)}

    def put(name, tensor):
        out[name] = tensor.to(dtype)

    def norm(theirs, ours):
        put(f"{theirs}/gamma", sd[f"{ours}.weight"])
        put(f"{theirs}/beta", sd[f"{ours}.bias"])

    def linear(theirs, ours):
        put(f"{theirs}/weight", sd[f"{ours}.weight"])
        put(f"{theirs}/bias", sd[f"{ours}.bias"])

    for i in (1, 2):
        linear(f"encoder/conv{i}", f"model.encoder.conv{i}")
    put("encoder/position_encodings/encodings", sd["model.encoder.embed_positions.weight"])
    put("decoder/position_encodings/encodings", sd["model.decoder.embed_positions.weight"])
    put("decoder/embeddings/weight", sd["model.decoder.embed_tokens.weight"])
    norm("encoder/layer_norm", "model.encoder.layer_norm")
    norm("decoder/layer_norm", "model.decoder.layer_norm")
    for stack in ("encoder", "decoder"):
        for layer in range(2):
            o, t = f"model.{stack}.layers.{layer}", f"{stack}/layer_{layer}"
            a = f"{o}.self_attn"
            put(f"{t}/self_attention/linear_0/weight", torch.cat([sd[f"{a}.{p}_proj.weight"] for p in "qkv"]))
            put(f"{t}/self_attention/linear_0/bias", torch.cat(
                [sd[f"{a}.q_proj.bias"], torch.zeros_like(sd[f"{a}.q_proj.bias"]), sd[f"{a}.v_proj.bias"]]))
            linear(f"{t}/self_attention/linear_1", f"{a}.out_proj")
            norm(f"{t}/self_attention/layer_norm", f"{o}.self_attn_layer_norm")
            if stack == "decoder":
                c = f"{o}.encoder_attn"
                linear(f"{t}/attention/linear_0", f"{c}.q_proj")
                put(f"{t}/attention/linear_1/weight", torch.cat([sd[f"{c}.k_proj.weight"], sd[f"{c}.v_proj.weight"]]))
                put(f"{t}/attention/linear_1/bias",
                    torch.cat([torch.zeros_like(sd[f"{c}.v_proj.bias"]), sd[f"{c}.v_proj.bias"]]))
                linear(f"{t}/attention/linear_2", f"{c}.out_proj")
                norm(f"{t}/attention/layer_norm", f"{o}.encoder_attn_layer_norm")
            linear(f"{t}/ffn/linear_0", f"{o}.fc1")
            linear(f"{t}/ffn/linear_1", f"{o}.fc2")
            norm(f"{t}/ffn/layer_norm", f"{o}.final_layer_norm")
    return out


def tokenizer_json(vocab: int) -> dict:
    pieces = {f"t{i}": i for i in range(vocab - 7)}
    special = ["<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>"]
    added = [{"id": 90 + i, "content": t, "special": True, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False} for i, t in enumerate(special)]
    return {"version": "1.0", "added_tokens": added, "pre_tokenizer": {"type": "Whitespace"},
            "model": {"type": "WordLevel", "vocab": pieces, "unk_token": "t0"}}


@pytest.fixture()
def ct2_dir(tmp_path):
    hf = save_whisper(tmp_path / "hf", scale=0.5)
    directory = tmp_path / "ct2"
    directory.mkdir()
    write_model_bin(directory / "model.bin", ct2_variables(hf),
                    {"decoder/projection/weight": "decoder/embeddings/weight"})
    (directory / "config.json").write_text(json.dumps({"suppress_ids": [5, 6], "suppress_ids_begin": [7, 90],
                                                       "lang_ids": []}))
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json(97)))
    return hf, directory


def test_reads_back_the_model_and_decodes_as_hugging_face(tmp_path, ct2_dir):
    hf, directory = ct2_dir
    spec, variables = read_model_bin(directory / "model.bin")
    assert spec == "WhisperSpec" and variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]
    report = convert("ctranslate2-to-hf", directory, tmp_path / "back", verify=True)
    assert report.ok, report.render()
    back = transformers.WhisperForConditionalGeneration.from_pretrained(str(tmp_path / "back")).eval()
    reference = {k: v.half().float() for k, v in hf.state_dict().items()}  # what float16 storage kept
    for key, value in back.state_dict().items():
        if key == "model.encoder.embed_positions.weight":  # the sinusoid, not as float16 stored it
            assert float((value - hf.state_dict()[key]).abs().max()) < 1e-5
        else:
            assert torch.equal(value, reference[key]), key
    gen = json.loads((tmp_path / "back" / "generation_config.json").read_text())
    assert (gen["decoder_start_token_id"], gen["no_timestamps_token_id"]) == (91, 92)
    assert gen["forced_decoder_ids"] == [[1, 92]]
    report = convert("ctranslate2-to-pentad", directory, tmp_path / "run", verify=True)
    assert report.ok and report.direction == "ctranslate2-to-pentad", report.render()
    cfg, ours = load_pentad_run(tmp_path / "run")
    assert (cfg.task.decoder_start, cfg.task.decoder_prompt, cfg.task.suppress_tokens) == (91, [92], [5, 6])
    audio = features(seed=4)
    with torch.no_grad():
        theirs = back.generate(input_features=audio.transpose(1, 2), max_new_tokens=10,
                               return_dict_in_generate=True).sequences[:, 2:]
        logits = back(input_features=audio.transpose(1, 2), decoder_input_ids=theirs).logits
        memory, padding = ours.encode(Batch(audio=audio))
        mine = ours.targets["lm"](ours.decode(Batch(decoder_tokens=theirs), memory, padding), Batch()).logits
    assert relative(mine, logits) < 1e-5


def test_bad_files_are_named(tmp_path, ct2_dir):
    hf, directory = ct2_dir
    data = (directory / "model.bin").read_bytes()
    (directory / "model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="model.bin: variable .* is cut short|ends early"):
        convert("ctranslate2-to-hf", directory, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    write_model_bin(directory / "model.bin", {"x": torch.zeros(2)}, {}, spec="TransformerSpec")
    with pytest.raises(UserError, match="holds a TransformerSpec model; pentad converts CTranslate2 Whisper"):
        convert("ctranslate2-to-hf", directory, tmp_path / "b")
    variables = ct2_variables(hf)
    variables["encoder/layer_0/self_attention/linear_0/weight"] = variables[
        "encoder/layer_0/self_attention/linear_0/weight"].float().to(torch.int8)
    write_model_bin(directory / "model.bin", variables, {})
    with pytest.raises(UserError, match="int8-quantised"):
        convert("ctranslate2-to-hf", directory, tmp_path / "c")
    with pytest.raises(UserError, match="--family applies"):
        convert("ctranslate2-to-pentad", directory, tmp_path / "d", family="whisper")
