"""Whisper conversion parity: Hugging Face ``WhisperForConditionalGeneration`` / ``WhisperModel``
built from tiny configs with random weights (no download) convert to pentad and back.

* HF -> pentad: every encoder and decoder hidden state and the logits equal HF's within 1e-5
  relative in fp32 (the ``--verify`` report, and a direct comparison on its own features), the run
  gets an asr task set up as Whisper decodes, and greedy decoding gives HF ``generate``'s tokens.
* HF -> pentad -> HF: bitwise-identical state dicts and the same config.
* pentad -> HF: the ``whisper/tiny`` recipe shrunk, trained key biases included, exports to a model
  transformers loads with the same logits (the key biases dropped: they change no output).
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.unit.interop.helpers import load_pentad_run, make_run, relative, save_perturbed

from pentad.components.base import Batch
from pentad.config.loader import read_config_file, resolve_config_path
from pentad.generation import generate
from pentad.interop import convert

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 1e-5
SOURCE_POSITIONS = 12  # 24 feature frames


def whisper_config(**over):
    return transformers.WhisperConfig(**{
        "vocab_size": 97, "num_mel_bins": 16, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 48, "decoder_ffn_dim": 48,
        "max_source_positions": SOURCE_POSITIONS, "max_target_positions": 20, "pad_token_id": 90,
        "bos_token_id": 90, "eos_token_id": 90, "decoder_start_token_id": 91, "suppress_tokens": [5, 6],
        "begin_suppress_tokens": [7, 90], **over})


def save_whisper(directory, class_name="WhisperForConditionalGeneration", scale=0.05, **over):
    torch.manual_seed(0)
    model = save_perturbed(getattr(transformers, class_name)(whisper_config(**over)), directory, scale)
    # generate() reads Whisper's decoding settings from generation_config.json
    gen = transformers.GenerationConfig(decoder_start_token_id=91, eos_token_id=90, pad_token_id=90,
                                        no_timestamps_token_id=92, forced_decoder_ids=[[1, 92]],
                                        suppress_tokens=[5, 6], begin_suppress_tokens=[7, 90], is_multilingual=False,
                                        max_length=20)
    gen.save_pretrained(directory)
    model.generation_config = gen
    return model


def features(batch=3, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2 * SOURCE_POSITIONS, 16, generator=g)


@pytest.mark.parametrize("class_name", ["WhisperForConditionalGeneration", "WhisperModel"])
def test_hf_to_pentad_outputs_match(tmp_path, class_name):
    hf = save_whisper(tmp_path / "hf", class_name)
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert report.architecture == class_name
    names = [c.name for c in report.verification]
    assert "encoder layer 2 + final norm" in names and "decoder layer 2 + final norm" in names
    assert ("lm logits" in names) == (class_name == "WhisperForConditionalGeneration")
    cfg, ours = load_pentad_run(tmp_path / "pentad")
    audio = features()
    tokens = torch.randint(0, 97, (3, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = hf(input_features=audio.transpose(1, 2), decoder_input_ids=tokens)
        memory, padding = ours.encode(Batch(audio=audio))
        assert padding is None
        hidden = ours.decode(Batch(decoder_tokens=tokens), memory, padding)
    assert relative(memory, reference.encoder_last_hidden_state) < TOL
    if class_name == "WhisperForConditionalGeneration":
        assert relative(ours.targets["lm"](hidden, Batch()).logits, reference.logits) < TOL
    task = cfg.task
    assert (task.type, task.decoder_start, task.decoder_prompt) == ("asr", 91, [92])
    assert (task.suppress_tokens, task.begin_suppress_tokens) == ([5, 6], [7, 90])
    assert (task.audio.features, task.audio.cmvn, task.audio.feature_size) == ("whisper", False, 16)


@pytest.mark.parametrize("beams", [1, 3])
def test_decoding_equals_hugging_face_generate(tmp_path, beams):
    """Greedy and beam search from the converted run's task settings (start token, prompt,
    suppressed tokens) give the tokens of HF ``generate`` with the checkpoint's generation config."""
    hf = save_whisper(tmp_path / "hf", scale=0.5)  # spread logits: decoding wanders over many tokens
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    cfg, ours = load_pentad_run(tmp_path / "pentad")
    audio = features(seed=4)
    with torch.no_grad():
        theirs = hf.generate(input_features=audio.transpose(1, 2), max_new_tokens=12, num_beams=beams,
                             return_dict_in_generate=True).sequences
    task = cfg.task
    out = generate(ours, Batch(audio=audio), max_new_tokens=12, num_beams=beams,
                   decoder_start_token_id=task.decoder_start, decoder_prompt_ids=task.decoder_prompt,
                   suppress_tokens=task.suppress_tokens, begin_suppress_tokens=task.begin_suppress_tokens,
                   stop_token_ids=[90], pad_token_id=90)
    assert theirs[:, :2].tolist() == [[91, 92]] * 3  # HF returns the start token and the prompt first
    for row, mine in zip(theirs[:, 2:].tolist(), out.sequences()):
        assert row[:len(mine)] == mine and set(row[len(mine):]) <= {90}
    new = [t for row in out.sequences() for t in row]
    assert len(set(new)) > 4, f"degenerate test model: {out.sequences()}"
    assert not set(new) & {5, 6} and not {row[0] for row in out.sequences()} & {7, 90}


def test_round_trip_is_bitwise(tmp_path):
    save_whisper(tmp_path / "hf")
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    report = convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back")
    assert report.architecture == "WhisperForConditionalGeneration"
    original = safetensors_torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
    back = safetensors_torch.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(back) == set(original)
    for key in original:
        assert torch.equal(original[key], back[key]), key
    a = json.loads((tmp_path / "hf" / "config.json").read_text())
    b = json.loads((tmp_path / "back" / "config.json").read_text())
    for key in ("d_model", "encoder_layers", "decoder_ffn_dim", "max_source_positions", "num_mel_bins",
                "suppress_tokens", "begin_suppress_tokens", "decoder_start_token_id"):
        assert a[key] == b[key], key


def test_pentad_recipe_exports_to_hugging_face(tmp_path):
    raw = read_config_file(resolve_config_path("whisper/tiny"))["model"]
    raw.update(hidden_size=32, vocab_size=50, max_seq_length=16)
    raw["embedding"]["parts"][0].update(feature_size=16, conv_channels=[32, 32])
    raw["embedding"]["parts"][1]["max_positions"] = SOURCE_POSITIONS
    raw["target_embedding"]["parts"][1]["max_positions"] = 16
    for stack in ("encoder", "decoder"):
        raw[stack].update(num_layers=2, num_heads=4, ffn_size=48)
    _, net = make_run(tmp_path / "run", raw)
    assert float(net.encoder.layers[0].attention.qkv.bias[32:64].abs().max()) > 0  # trained key biases
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", verify=True)
    assert report.ok, report.render()
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(str(tmp_path / "hf")).eval()
    audio = features()
    tokens = torch.randint(0, 50, (3, 5), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = hf(input_features=audio.transpose(1, 2), decoder_input_ids=tokens).logits
        memory, padding = net.encode(Batch(audio=audio))
        mine = net.targets["lm"](net.decode(Batch(decoder_tokens=tokens), memory, padding), Batch()).logits
    assert relative(mine, theirs) < TOL


def test_a_changed_stem_is_refused(tmp_path):
    raw = read_config_file(resolve_config_path("whisper/tiny"))["model"]
    raw.update(hidden_size=32, vocab_size=50, max_seq_length=16)
    raw["embedding"]["parts"][0].update(feature_size=16, conv_channels=[32, 32], strides=[2, 2])
    raw["target_embedding"]["parts"][1]["max_positions"] = 16
    for stack in ("encoder", "decoder"):
        raw[stack].update(num_layers=1, num_heads=4, ffn_size=48)
    make_run(tmp_path / "run", raw)
    with pytest.raises(Exception, match="Whisper's stem"):
        convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family="whisper")
