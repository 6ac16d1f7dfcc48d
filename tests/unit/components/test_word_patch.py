"""The word_patch part (ViLT): its Hugging Face layout options (the caption's own positions, token
type and norm, the image's own positions) compute what they say, are off by default, and bad
combinations are config errors that name the key."""

from __future__ import annotations

import pytest
import torch

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.errors import ConfigError

H = 32
PATCH = {"image_size": 16, "patch_size": 8, "channels": 3, "bias": True}
HF_PART = {"type": "word_patch", "patch": PATCH, "text_positions": 6, "text_segments": 2, "text_norm": True,
           "image_positions": True}


def model_config(part, *, parts=None, norm=False):
    raw = {"hidden_size": H, "vocab_size": 50, "max_seq_length": 11,
           "embedding": {"parts": parts or [part, {"type": "seg", "num_segments": 2}], "norm": norm,
                         "dropout": 0.0},
           "encoder": {"type": "transformer", "num_layers": 1, "num_heads": 2, "ffn_size": 48,
                       "norm_position": "pre", "final_norm": True, "dropout": 0.0},
           "targets": [{"type": "mlm"}, {"type": "sp"}]}
    return model_config_class().model_validate(raw)


def batch(text=4):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (2, text), generator=g)
    padding = torch.tensor([[False] * text, [False] * (text - 1) + [True]])
    segments = torch.cat([torch.zeros(2, text), torch.ones(2, 5)], 1).long()
    return Batch(tokens=tokens, padding_mask=padding, segments=segments,
                 pixels=torch.randn(2, 3, 16, 16, generator=g))


def test_defaults_are_tencentpretrains_layout():
    cfg = model_config({"type": "word_patch", "patch": PATCH}, parts=[{"type": "word_patch", "patch": PATCH}, "pos",
                                                                      {"type": "seg", "num_segments": 2}])
    part = cfg.embedding.parts[0]
    assert part.text_positions is None and part.text_segments is None and not part.text_norm
    assert not part.image_positions
    net = build_model(cfg)
    names = [n for n, _ in net.embedding.word_patch.named_parameters()]
    assert names == ["word.weight", "patch.cls", "patch.proj.weight", "patch.proj.bias"]


def test_hf_layout_computes_caption_and_image_parts():
    torch.manual_seed(0)
    net = build_model(model_config(HF_PART)).eval()
    part = net.embedding.word_patch
    b = batch()
    with torch.no_grad():
        out = net.embedding(b)
        words = part.word.weight[b.tokens] + part.text_seg.weight[0] + part.text_pos.weight[:4]
        text = torch.nn.functional.layer_norm(words, (H,), part.text_norm.weight, part.text_norm.bias, 1e-12)
        image = part.patch(b) + part.image_pos.weight
        expected = torch.cat([text, image], 1) + net.embedding.seg.weight[b.segments]
    assert out.hidden.shape == (2, 4 + 5, H)
    torch.testing.assert_close(out.hidden, expected, rtol=1e-6, atol=1e-6)
    assert out.padding_mask.tolist()[1] == [False, False, False, True] + [False] * 5
    assert part.image_pos.weight.shape == (5, H) and part.text_pos.weight.shape == (6, H)
    assert torch.equal(part.text_norm.weight, torch.ones(H))


def test_a_caption_longer_than_the_text_positions_is_refused():
    net = build_model(model_config(HF_PART))
    with pytest.raises(ValueError, match="exceeds the word_patch part's 6 text positions"):
        net.embedding(batch(text=7))


@pytest.mark.parametrize("part, parts, norm, key, message", [
    ({**HF_PART, "image_positions": False}, None, False, "parts.0.image_positions", "the image would have no"),
    ({**HF_PART, "text_positions": None}, None, False, "parts.0.text_positions", "the caption would have no"),
    (HF_PART, [HF_PART, "pos", {"type": "seg", "num_segments": 2}], False, "parts.0.text_positions",
     "also has a 'pos' part"),
    (HF_PART, None, True, "parts.0.text_norm", "normalised twice"),
])
def test_bad_combinations_are_config_errors_naming_the_key(part, parts, norm, key, message):
    with pytest.raises(ConfigError) as error:
        build_model(model_config(part, parts=parts, norm=norm))
    assert f"model.embedding.{key}" in str(error.value) and message in str(error.value)
