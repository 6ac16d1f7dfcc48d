"""Decoders: ``forward(hidden, padding_mask, memory, memory_padding_mask, positions, cache) -> hidden``."""

from pentad.components.decoders import transformer  # noqa: F401
