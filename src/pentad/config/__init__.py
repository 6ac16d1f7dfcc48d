"""Typed configs, strict loading with overrides, and TencentPretrain config import."""
