"""Text generation with a key/value cache: greedy, sampling (temperature, top-k, top-p), repetition
penalty and beam search, for decoder-only (causal and prefix-LM) and encoder-decoder models.

* :func:`generate` / :func:`stream` work on token ids (``search.py``), with a
  :class:`GenerationConfig` (``config.py``).
* :class:`TextGenerator` (``text.py``) adds the tokenizer, the prompt framing the model was trained
  with, stop strings, and loading from a run directory; ``pentad generate`` is built on it.

See ``docs/generation.md``.
"""

from pentad.generation.config import GenerationConfig
from pentad.generation.processors import repetition_penalty, sampling_scores, top_k_filter, top_p_filter
from pentad.generation.search import GenerationOutput, beam_search, generate, stream
from pentad.generation.text import Completion, TextGenerator, load_model

__all__ = ["Completion", "GenerationConfig", "GenerationOutput", "TextGenerator", "beam_search", "generate",
           "load_model", "repetition_penalty", "sampling_scores", "stream", "top_k_filter", "top_p_filter"]
