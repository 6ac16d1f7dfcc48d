"""Embedding parts, summed by the embedding slot (see ``pentad.model.EmbeddingSlot``)."""

from pentad.components.embeddings import masked_patch, patch, pos, seg, sinusoidal, speech, word, word_patch  # noqa: F401
