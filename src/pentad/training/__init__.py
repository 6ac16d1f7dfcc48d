"""Trainer, optimisers and schedules, checkpoints."""
