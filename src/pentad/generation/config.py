"""Decoding options: one typed config shared by the Python API, the CLI and (later) run configs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pentad.config.base import StrictModel
from pentad.errors import UserError


class GenerationInputError(UserError, ValueError):
    """Prompts or options the model cannot generate from (an empty prompt, more positions than the
    model has, no decoder start token): a user mistake for the CLI (exit status 2), a ValueError
    for Python callers."""


class GenerationConfig(StrictModel):
    """How to pick the next tokens.

    The strategy follows from three fields: ``num_beams > 1`` is beam search, else ``do_sample``
    picks sampling (temperature, top-k, top-p) over greedy. Token ids (stop tokens, padding, the
    decoder start) are part of the config because they depend on the tokenizer, not the model;
    ``pentad.generation.text`` fills them from a run directory.
    """

    max_new_tokens: int = Field(32, ge=1, description="tokens to generate at most (stop token included)")
    min_new_tokens: int = Field(0, ge=0, description="stop tokens are forbidden before this many new tokens")
    do_sample: bool = Field(False, description="sample the next token instead of taking the most likely one")
    temperature: float = Field(1.0, gt=0.0, description="divide the logits by this before sampling")
    top_k: int | None = Field(None, ge=1, description="sample among the k most likely tokens only")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="nucleus sampling: sample among the most "
                                "likely tokens whose probabilities sum to at least top_p")
    repetition_penalty: float = Field(1.0, gt=0.0, description="divide positive (multiply negative) scores of "
                                      "tokens already in the prompt or output by this (Keskar et al. 2019)")
    num_beams: int = Field(1, ge=1, description="beam search with this many hypotheses per prompt when > 1")
    length_penalty: float = Field(1.0, description="beam score = sum of log-probs / length ** length_penalty")
    early_stopping: bool | Literal["never"] = Field(
        False, description="beam search: True stops a prompt once num_beams hypotheses have finished; "
        "False stops when the best running beam, at its current length, cannot beat them; 'never' only "
        "when no running beam could beat them at any length")
    num_return_sequences: int = Field(1, ge=1, description="outputs per prompt (at most num_beams with beam "
                                      "search; independent samples with sampling)")
    stop_token_ids: list[int] = Field(default_factory=list, description="a row stops after producing one of "
                                      "these (the EOS); empty: only max_new_tokens stops")
    pad_token_id: int | None = Field(None, ge=0, description="fills finished rows and input padding; default: "
                                     "the first stop token, else 0")
    decoder_start_token_id: int | None = Field(None, ge=0, description="first decoder input of encoder-"
                                               "decoder models (T5: pad, BART: eos)")
    decoder_prompt_ids: list[int] = Field(default_factory=list, description="encoder-decoder: tokens the decoder "
                                          "reads after the start token before it generates (Whisper's "
                                          "<|notimestamps|>); not part of the output")
    suppress_tokens: list[int] = Field(default_factory=list, description="token ids never generated (Whisper's "
                                       "suppress_tokens)")
    begin_suppress_tokens: list[int] = Field(default_factory=list, description="token ids not generated as the "
                                             "first new token (Whisper: a space, the end token)")
    use_cache: bool = Field(True, description="keep keys/values of past positions; False re-runs the whole "
                            "sequence at every step (slow; for tests and benchmarks)")
    cache: Literal["dynamic", "static"] = Field("dynamic", description="key/value cache: 'dynamic' grows its "
                                                "buffers as decoding goes; 'static' allocates buffers of the final "
                                                "length (prompt + max_new_tokens) once and writes each step in place "
                                                "at a position tensor, so a step can be compiled or captured as a "
                                                "CUDA graph")
    compile: bool = Field(False, description="compile the one-token decoding step with torch.compile (mode "
                          "'reduce-overhead', i.e. CUDA graphs, on CUDA; the default mode elsewhere); needs "
                          "cache='static'")
    seed: int | None = Field(None, description="seed of the sampling generator (reproducible samples)")

    @model_validator(mode="after")
    def _consistent(self) -> GenerationConfig:
        if self.num_beams > 1 and self.do_sample:
            raise ValueError("beam search with sampling is not supported: use num_beams=1 with do_sample, "
                             "or do_sample=false with num_beams > 1")
        if self.num_beams > 1 and self.num_return_sequences > self.num_beams:
            raise ValueError(f"num_return_sequences {self.num_return_sequences} exceeds num_beams "
                             f"{self.num_beams}: beam search returns at most num_beams hypotheses")
        if self.num_beams == 1 and not self.do_sample and self.num_return_sequences > 1:
            raise ValueError("greedy decoding returns one sequence per prompt: use do_sample or num_beams > 1 "
                             "for num_return_sequences > 1")
        if self.cache == "static" and not self.use_cache:
            raise ValueError("cache='static' needs use_cache=true: without a cache every step re-runs the whole "
                             "sequence and there is no key/value buffer to pre-allocate")
        if self.compile and self.cache != "static":
            raise ValueError(f"compile=true needs cache='static' (found cache={self.cache!r}): a compiled step "
                             "needs buffers of a fixed size written at a position tensor, or it recompiles as "
                             "the cache grows")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens {self.min_new_tokens} exceeds max_new_tokens {self.max_new_tokens}")
        return self

    @property
    def strategy(self) -> Literal["greedy", "sample", "beam"]:
        if self.num_beams > 1:
            return "beam"
        return "sample" if self.do_sample else "greedy"

    @property
    def fill_token_id(self) -> int:
        """The id written after a row has finished (and into input padding)."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        return self.stop_token_ids[0] if self.stop_token_ids else 0
