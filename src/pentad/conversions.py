"""The directions ``pentad convert`` knows, in a module without torch: the command-line parser lists
them, and building the parser must not import torch (seconds of start-up for every command;
``pentad.interop.convert`` does the conversions and re-exports this tuple)."""

from __future__ import annotations

DIRECTIONS = ("hf-to-pentad", "pentad-to-hf", "tencentpretrain-to-pentad", "pentad-to-tencentpretrain",
              "ctranslate2-to-hf", "ctranslate2-to-pentad")
