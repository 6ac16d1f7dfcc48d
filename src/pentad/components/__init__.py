"""Registered slot implementations. Importing this package registers every component."""

from pentad.components import decoders, embeddings, encoders, norms, targets  # noqa: F401
