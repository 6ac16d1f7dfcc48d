"""Registered slot implementations. Importing this package registers every component."""

from pentad.components import decoders, embeddings, encoders, targets  # noqa: F401
