"""Weight and config conversion between pentad and other toolkits.

* :mod:`pentad.interop.keymap`: the mechanism. A key map is data (rules of pentad and foreign key
  templates with ``{layer}`` placeholders) plus a few named tensor transforms; the inverse
  direction is computed from the same rules.
* :mod:`pentad.interop.hf`: Hugging Face Transformers families (``bert``, ``roberta`` /
  ``xlm-roberta``, ``gpt2``), one module each, both directions, with tokenizer files.
* :mod:`pentad.interop.tencentpretrain`: TencentPretrain / UER-py ``.bin`` checkpoints.
* :mod:`pentad.interop.convert`: ``convert(direction, in_dir, out_dir, ...)`` behind
  ``pentad convert``, with ``verify`` comparing the two models layer by layer.

See ``docs/conversion.md``.
"""

from pentad.interop.convert import DIRECTIONS, ConversionReport, convert

__all__ = ["DIRECTIONS", "ConversionReport", "convert"]
