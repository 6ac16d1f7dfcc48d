"""The speech embedding part: subsampled lengths for any number of convolutions, its padding mask,
padding frames that cannot leak into real ones, and the width check."""

from __future__ import annotations

import pytest
import torch

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.embeddings.speech import SpeechEmbedding, subsampled_lengths
from pentad.components.model_config import model_config_class
from pentad.errors import ConfigError


def model_config(channels, kernels, hidden=16, activation="glu"):
    return model_config_class().model_validate({
        "hidden_size": hidden, "vocab_size": 11, "max_seq_length": 64,
        "embedding": {"parts": [{"type": "speech", "feature_size": 8, "conv_channels": channels,
                                 "kernel_sizes": kernels, "activation": activation}, "sinusoidal"], "norm": False},
        "encoder": {"type": "transformer", "num_layers": 1, "num_heads": 2, "ffn_size": 32, "norm_position": "pre",
                    "final_norm": True},
        "target_embedding": {"parts": ["word", "sinusoidal"], "norm": False},
        "decoder": {"type": "transformer", "num_layers": 1, "num_heads": 2, "ffn_size": 32, "norm_position": "pre",
                    "final_norm": True},
        "targets": [{"type": "lm"}]})


@pytest.mark.parametrize("kernels", [[5], [5, 5], [3, 5, 7]])
def test_lengths_match_the_convolutions_for_any_depth(kernels):
    torch.manual_seed(0)
    part = SpeechEmbedding(8, [32] * len(kernels), kernels, 16)
    for frames in (1, 2, 7, 16, 33):
        out = part(Batch(audio=torch.randn(1, frames, 8)))
        assert out.shape[1] == int(subsampled_lengths(torch.tensor([frames]), kernels)[0])


def test_padding_mask_and_padding_frames_do_not_change_real_outputs():
    torch.manual_seed(0)
    model = build_model(model_config([32, 32], [5, 5]))
    part = model.embedding.speech
    audio = torch.randn(2, 20, 8)
    mask = torch.zeros(2, 20, dtype=torch.bool)
    mask[1, 9:] = True
    embedded = model.embedding(Batch(audio=audio, audio_padding_mask=mask))
    assert embedded.hidden.shape == (2, 5, 16)
    assert embedded.padding_mask.tolist() == [[False] * 5, [False, False, False, True, True]]
    noisy = audio.clone()
    noisy[1, 9:] = 1e3  # whatever the padding frames hold
    again = part(Batch(audio=noisy, audio_padding_mask=mask))
    torch.testing.assert_close(again, part(Batch(audio=audio, audio_padding_mask=mask)))
    # the encoder-decoder runs on it
    batch = Batch(audio=audio, audio_padding_mask=mask, decoder_tokens=torch.randint(0, 11, (2, 4)),
                  labels={"lm": torch.randint(0, 11, (2, 4))})
    assert torch.isfinite(model(batch)["lm"].loss)


def test_the_last_convolution_must_give_the_embedding_width():
    with pytest.raises(ConfigError, match=r"model.embedding.parts.0.conv_channels.*gives 8 channels after its GLU"):
        build_model(model_config([32, 16], [5, 5]), device="meta")
    build_model(model_config([32, 16], [5, 5], activation="gelu"), device="meta")
