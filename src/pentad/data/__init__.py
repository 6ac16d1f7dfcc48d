"""Data: tokenizers, vocabulary building, pre-training objectives and token-shard datasets."""
