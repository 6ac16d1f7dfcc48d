"""The patch embedding (ViT): shapes, the sequence it defines for the position part, the checks of
its config, and equality with a hand-computed patchify."""

from __future__ import annotations

import pytest
import torch

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.errors import ConfigError

SMALL = ["model.embedding.parts.0.image_size=32", "model.embedding.parts.0.patch_size=8", "model.max_seq_length=17",
         "model.hidden_size=32", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
         "model.encoder.ffn_size=64", "model.targets.0.num_labels=3"]


def test_patches_match_a_hand_computed_patchify_and_positions_follow_the_sequence():
    torch.manual_seed(0)
    model = build_model(load_config("vit/tiny-16", SMALL).model)
    pixels = torch.randn(2, 3, 32, 32)
    embedded = model.embedding(Batch(pixels=pixels))
    assert embedded.hidden.shape == (2, 17, 32) and embedded.padding_mask is None
    patch, pos = model.embedding.patch, model.embedding.pos
    # patch (r, c) is pixels[:, :, 8r:8r+8, 8c:8c+8], flattened channel-major, times the kernel
    blocks = pixels.unfold(2, 8, 8).unfold(3, 8, 8)  # [B, C, 4, 4, 8, 8]
    blocks = blocks.permute(0, 2, 3, 1, 4, 5).reshape(2, 16, 3 * 64)
    expected = blocks @ patch.proj.weight.reshape(32, -1).T + patch.proj.bias
    expected = torch.cat([patch.cls.expand(2, 1, 32), expected], dim=1) + pos.weight[:17]
    torch.testing.assert_close(embedded.hidden, expected, rtol=1e-5, atol=1e-5)


def test_initialisation_is_vit_style():
    model = build_model(load_config("vit/tiny-16", SMALL).model)
    patch = model.embedding.patch
    assert torch.all(patch.cls == 0) and torch.all(patch.proj.bias == 0)
    assert 0.015 < float(patch.proj.weight.detach().std()) < 0.025


def test_config_problems_name_the_key():
    with pytest.raises(ConfigError) as error:
        build_model(load_config("vit/tiny-16", [*SMALL, "model.embedding.parts.0.image_size=30"]).model)
    assert "model.embedding.parts.0.image_size" in str(error.value) and "multiple of patch_size" in str(error.value)
    with pytest.raises(ConfigError) as error:
        build_model(load_config("vit/tiny-16", [*SMALL, "model.max_seq_length=10"]).model)
    assert "17 positions" in str(error.value) and "model.max_seq_length=17" in str(error.value)
    with pytest.raises(ConfigError) as error:
        build_model(load_config("bert/tiny", ["model.embedding.parts=[pos,seg]", "model.vocab_size=10"]).model)
    message = str(error.value)
    assert "model.embedding.parts" in message and "exactly one of masked_patch, patch, " in message
    assert "found 0 parts that make the sequence" in message


def test_wrong_image_shape_is_a_clear_error():
    model = build_model(load_config("vit/tiny-16", SMALL).model)
    with pytest.raises(ValueError, match=r"expects pixels \[batch, 3, 32, 32\], found shape \[2, 1, 32, 32\]"):
        model(Batch(pixels=torch.zeros(2, 1, 32, 32)))


def test_grayscale_and_no_cls():
    model = build_model(load_config("vit/tiny-16", [*SMALL, "model.embedding.parts.0.channels=1",
                                                    "model.embedding.parts.0.cls=false", "model.max_seq_length=16",
                                                    "model.targets.0.pooling=mean"]).model)
    out = model(Batch(pixels=torch.zeros(3, 1, 32, 32), labels={"cls": torch.tensor([0, 1, 2])}))
    assert out["cls"].logits.shape == (3, 3) and torch.isfinite(out["cls"].loss)


def test_masked_patches_take_the_mask_vector_and_nothing_else_changes():
    torch.manual_seed(0)
    cfg = load_config("vit/tiny-16", [*SMALL, "model.embedding.parts.0.type=masked_patch"]).model
    model = build_model(cfg)
    part = model.embedding.masked_patch
    assert part.mask.abs().sum() > 0  # initialised (truncated normal), not zeros
    pixels = torch.randn(2, 3, 32, 32)
    plain = part(Batch(pixels=pixels))
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[0, [0, 5]] = True
    mask[1, 15] = True
    masked = part(Batch(pixels=pixels, patch_mask=mask))
    changed = (masked != plain).any(-1)
    assert changed[:, 0].sum() == 0 and torch.equal(changed[:, 1:], mask)  # CLS never masked
    assert torch.equal(masked[0, 1], part.mask.detach()) and torch.equal(masked[1, 16], part.mask.detach())
    with pytest.raises(ValueError, match="patch_mask has shape"):
        part(Batch(pixels=pixels, patch_mask=mask[:, :8]))
