"""Encoders: ``forward(hidden, padding_mask, prefix_lengths) -> hidden``."""

from pentad.components.encoders import cnn, rnn, transformer  # noqa: F401
