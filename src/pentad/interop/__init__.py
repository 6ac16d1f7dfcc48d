"""Weight and config conversion between pentad and other toolkits.

* :mod:`pentad.interop.keymap`: the mechanism. A key map is data (rules of pentad and foreign key
  templates with ``{layer}`` placeholders) plus a few named tensor transforms; the inverse
  direction is computed from the same rules.
* :mod:`pentad.interop.hf`: Hugging Face Transformers families (``bert``, ``roberta`` /
  ``xlm-roberta``, ``gpt2``, ``albert``, ``t5``, ``bart``, ``pegasus``, ``llama``, ``bloom``), one
  module each, both directions, with tokenizer files and sentence-transformers directories.
* :mod:`pentad.tencentpretrain` (a package of its own): TencentPretrain / UER-py configs and ``.bin``
  checkpoints, both ways.
* :mod:`pentad.interop.spm`: SentencePiece models re-numbered the way XLM-R and T5 tokenizers count.
* :mod:`pentad.interop.convert`: ``convert(direction, in_dir, out_dir, ...)`` behind
  ``pentad convert``, with ``verify`` comparing the two models layer by layer (encoder and decoder).

See ``docs/conversion.md``.
"""

from pentad.interop.convert import DIRECTIONS, ConversionReport, convert

__all__ = ["DIRECTIONS", "ConversionReport", "convert"]
