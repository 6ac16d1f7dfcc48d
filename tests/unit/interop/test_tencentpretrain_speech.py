"""TencentPretrain S2T checkpoints <-> pentad. The checkpoint holds the tensor names TencentPretrain's
S2T model has (SpeechEmbedding's ``conv.conv_layers.<i>.0`` convolutions, the transformer encoder and
decoder, final LayerNorms, the lm output layer tied to ``tgt_embedding.word``) for its shipped
models/s2t/small_config.json shrunk, filled with seeded random values."""

import json
from pathlib import Path

import pytest
import torch
from tests.unit.interop.helpers import write_tencentpretrain_dir

from pentad.errors import UserError
from pentad.interop import convert
from pentad.runs import load_run
from pentad.training.checkpoint import find_weights, read_weights

from .helpers import make_run

H, FFN, VOCAB, LAYERS, DECODER_LAYERS, CHANNELS = 32, 48, 30, 2, 1, [48, 64]
SHRINK = {"emb_size": H, "hidden_size": H, "feedforward_size": FFN, "heads_num": 4, "layers_num": LAYERS,
          "decoder_layers_num": DECODER_LAYERS, "conv_channels": CHANNELS, "max_seq_length": 16,
          "max_audio_frames": 64}


def s2t_state(g: torch.Generator) -> dict[str, torch.Tensor]:
    """A TencentPretrain S2T state dict of the shrunk config, as its save_model writes it."""
    def t(*shape):
        return 0.1 * torch.randn(*shape, generator=g)

    state: dict[str, torch.Tensor] = {}
    ins = [80, CHANNELS[0] // 2]
    for i, (c_in, c_out) in enumerate(zip(ins, CHANNELS)):
        state[f"embedding.speech.conv.conv_layers.{i}.0.weight"] = t(c_out, c_in, 5)
        state[f"embedding.speech.conv.conv_layers.{i}.0.bias"] = t(c_out)

    def attention(prefix):
        for j in range(3):
            state[f"{prefix}.linear_layers.{j}.weight"], state[f"{prefix}.linear_layers.{j}.bias"] = t(H, H), t(H)
        state[f"{prefix}.final_linear.weight"], state[f"{prefix}.final_linear.bias"] = t(H, H), t(H)

    def norm(prefix):
        state[f"{prefix}.gamma"], state[f"{prefix}.beta"] = 1 + t(H), t(H)

    def feed_forward(prefix):
        state[f"{prefix}.linear_1.weight"], state[f"{prefix}.linear_1.bias"] = t(FFN, H), t(FFN)
        state[f"{prefix}.linear_2.weight"], state[f"{prefix}.linear_2.bias"] = t(H, FFN), t(H)

    for i in range(LAYERS):
        layer = f"encoder.transformer.{i}"
        attention(f"{layer}.self_attn")
        norm(f"{layer}.layer_norm_1")
        feed_forward(f"{layer}.feed_forward")
        norm(f"{layer}.layer_norm_2")
    norm("encoder.layer_norm")
    state["tgt_embedding.word.embedding.weight"] = t(VOCAB, H)
    for i in range(DECODER_LAYERS):
        layer = f"decoder.transformer_decoder.{i}"
        attention(f"{layer}.self_attn")
        norm(f"{layer}.layer_norm_1")
        attention(f"{layer}.context_attn")
        norm(f"{layer}.layer_norm_2")
        feed_forward(f"{layer}.feed_forward")
        norm(f"{layer}.layer_norm_3")
    norm("decoder.layer_norm")
    state["target.lm.output_layer.weight"] = state["tgt_embedding.word.embedding.weight"]  # tie_weights
    return state


def tp_s2t(directory: Path, shared_data: Path) -> dict[str, torch.Tensor]:
    raw = json.loads((shared_data / "configs" / "s2t" / "small_config.json").read_text(encoding="utf-8"))
    raw.update(SHRINK)
    state = s2t_state(torch.Generator().manual_seed(0))
    write_tencentpretrain_dir(directory, state, raw)
    return state


def test_tencentpretrain_s2t_converts_and_back_bitwise(shared_data, tmp_path):
    state = tp_s2t(tmp_path / "tp", shared_data)
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run", verify=True)
    assert report.ok, report.render()
    assert any("utterances" in (c.detail or "") for c in report.verification)  # the forward pass ran on audio
    cfg, _ = load_run(tmp_path / "run")
    speech = cfg.model.embedding.parts[0]
    assert (speech.type, speech.conv_channels, speech.activation, speech.scale) == ("speech", CHANNELS, "glu", True)
    assert cfg.model.vocab_size == VOCAB and cfg.task.type == "asr"
    weights = read_weights(find_weights(tmp_path / "run"))
    for i in range(2):
        assert torch.equal(weights[f"embedding.speech.convs.{i}.weight"],
                           state[f"embedding.speech.conv.conv_layers.{i}.0.weight"])
    assert torch.equal(weights["target_embedding.word.weight"], state["tgt_embedding.word.embedding.weight"])
    back = convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "back", verify=True)
    assert back.ok, back.render()
    written = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert sorted(written) == sorted(state)
    for key, tensor in state.items():
        assert torch.equal(written[key], tensor), key
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (config["embedding"], config["data_processor"], config["conv_channels"], config["audio_feature_size"]) \
        == (["speech", "sinusoidalpos"], "s2t", CHANNELS, 80)
    assert config["max_audio_frames"] == 64 and config["tgt_embedding"] == ["word", "sinusoidalpos"]


def test_speech_layout_tencentpretrain_cannot_hold_is_refused(tmp_path):
    """TencentPretrain feeds every convolution after the first conv_channels[0] / 2 channels."""
    table = {"type": "sinusoidal", "interleave": False, "spacing": "tensor2tensor", "offset": 2, "max_positions": 40}
    stack = {"type": "transformer", "num_layers": 1, "num_heads": 4, "ffn_size": 48, "activation": "relu",
             "norm_position": "pre", "final_norm": True}
    model = {
        "hidden_size": H, "vocab_size": VOCAB, "max_seq_length": 16,
        "embedding": {"parts": [{"type": "speech", "conv_channels": [48, 32, 2 * H], "kernel_sizes": [5, 5, 5]},
                                table], "norm": False},
        "target_embedding": {"parts": [{"type": "word", "scale": True}, table], "norm": False},
        "encoder": {**stack, "mask": "bidirectional"}, "decoder": stack, "targets": [{"type": "lm"}],
    }
    make_run(tmp_path / "run", model)
    with pytest.raises(UserError, match=r"feeds every convolution after the first conv_channels\[0\] / 2 = 24 "
                                        r"channels, pentad's gives \[24, 16\]"):
        convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "tp")
    assert not (tmp_path / "tp").exists()
