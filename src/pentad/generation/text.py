"""Text in, text out: a model with its tokenizer, the prompt framing it was trained with, stop strings.

The framing follows the objectives (``data/objectives``), so a prompt looks like the training data:

* causal LM (``lm``): ``[BOS] text`` (the BOS only when the tokenizer has one distinct from its end
  token, as GPT-2's ``<|endoftext|>`` is not); stops at the end token (EOS, else SEP);
* prefix-LM (``prefixlm``): ``[CLS] text [SEP]`` is the prefix; stops at ``[SEP]``;
* encoder-decoder (``mt``, ``t5``, ``bart``, ``gsg``): the source is ``[BOS] text [EOS]`` (again the
  BOS only when distinct); the decoder starts with the objective's ``decoder_start`` (for runs
  converted from Hugging Face: the ``decoder_start_token_id`` of their config.json); stops at the
  target tokenizer's EOS (else SEP).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pentad.errors import UserError
from pentad.generation.config import GenerationConfig
from pentad.generation.search import GenerationOutput, generate, resolve_config
from pentad.model import Model


@dataclass
class Completion:
    """One generated sequence: its text (stop token and stop string removed), new token ids (stop
    token included), score (see ``GenerationOutput``) and why it ended: ``stop`` (a stop token),
    ``stop_string`` or ``length`` (max_new_tokens)."""

    text: str
    token_ids: list[int]
    score: float
    finish_reason: str


def load_model(run_dir: Path, device: str | torch.device | None = None) -> tuple[Model, Any, Any]:
    """(model in eval mode with the run's weights, run config, tokenizer or None) of a run directory
    (a training run: its best or latest checkpoint; a converted run: its model.safetensors)."""
    from pentad.builder import build_model, check_memory
    from pentad.runs import load_run
    from pentad.training.checkpoint import find_weights, load_weights, read_weights

    run_dir = Path(run_dir)
    cfg, tokenizer = load_run(run_dir)
    weights = find_weights(run_dir)
    check_memory(cfg.model, "generating", device)
    model = build_model(cfg.model, training=False)
    load_weights(model, read_weights(weights), str(weights))
    if device is not None:
        model = model.to(device)
    return model.eval(), cfg, tokenizer


# Batch fields a text prompt gives the model: its tokens (and, for models with segment embeddings, their
# segments); a model whose embedding reads anything else (audio, pixels) does not continue text prompts.
TEXT_INPUTS = frozenset({"tokens", "segments"})


def _check_text_input(model: Model, label: str) -> None:
    """A UserError when ``model``'s embedding reads something other than token ids (speech features, image
    pixels): text generation has nothing to give it."""
    reads = {field: name for name in model.embedding.part_names
             for field in getattr(model.embedding, name).requires}
    other = sorted(set(reads) - TEXT_INPUTS)
    if other or "tokens" not in reads:
        parts = ", ".join(f"{reads[f]} (Batch.{f})" for f in other) or "no token ids"
        raise UserError(f"{label} does not read text: its embedding takes {parts}, so there are no text prompts to "
                        "continue. pentad generate is for text models (language models, encoder-decoders on text); "
                        "run a speech or image model's task with pentad infer RUN data.test=FILE (an asr "
                        "run transcribes the audio files the TSV lists).")


def _end_id(tokenizer: Any) -> int | None:
    return tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id


def _interop_config(run_dir: Path) -> dict[str, Any]:
    """The Hugging Face config.json a converted run came from ({} for other runs)."""
    from pentad.layout import INTEROP

    path = run_dir / INTEROP
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); it is written by `pentad convert`, convert again") from None
    hf = data.get("hf_config") if isinstance(data, dict) else None
    return hf if isinstance(hf, dict) else {}


class IncrementalText:
    """Turns tokens arriving one at a time into text pieces that never need to be taken back.

    Decodes everything so far and emits what is new, holding back a trailing U+FFFD (a byte-level
    token that is only part of a character) and the last ``len(longest stop string) - 1``
    characters (they may begin a stop string). ``feed`` returns (new text, stop string found).
    """

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str] = ()):
        self.tokenizer, self.stop_strings = tokenizer, [s for s in stop_strings if s]
        self.hold = max((len(s) for s in self.stop_strings), default=1) - 1
        self.ids: list[int] = []
        self.emitted = ""
        self.text = ""

    def feed(self, token: int) -> tuple[str, bool]:
        self.ids.append(token)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = first_stop(self.text, self.stop_strings)
        if cut is not None:
            self.text = self.text[:cut]
            return self._emit(len(self.text)), True
        safe = len(self.text) - self.hold
        while safe > 0 and self.text[safe - 1] == "\ufffd":
            safe -= 1
        return self._emit(safe), False

    def finish(self) -> str:
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        if end <= len(self.emitted) or not self.text.startswith(self.emitted):
            return ""  # nothing new, or an earlier piece changed on re-decoding: keep it as emitted
        piece = self.text[len(self.emitted):end]
        self.emitted += piece
        return piece


def first_stop(text: str, stop_strings: Sequence[str]) -> int | None:
    """Index of the earliest stop string in ``text``, or None."""
    found = [i for i in (text.find(s) for s in stop_strings if s) if i >= 0]
    return min(found) if found else None


class StopStrings:
    """A ``stop_check`` for ``generate``: a row stops once the text of its new tokens contains a
    stop string. Only the last tokens are decoded each step (enough to hold the longest string
    even at four byte-level tokens per character)."""

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str]):
        self.tokenizer, self.stop_strings = tokenizer, [s for s in stop_strings if s]
        self.window = 4 * max((len(s) for s in self.stop_strings), default=1) + 4

    def __call__(self, tokens: Tensor, finished: Tensor) -> Tensor:
        tails = tokens[:, -self.window:].tolist()
        done = finished.tolist()
        hits = [not d and first_stop(self.tokenizer.decode(ids, skip_special_tokens=True), self.stop_strings)
                is not None for ids, d in zip(tails, done)]
        return torch.tensor(hits, dtype=torch.bool, device=tokens.device)


@dataclass
class TextGenerator:
    """A model, its tokenizer(s) and the token ids that frame prompts and end outputs.

    prefix_ids / suffix_ids: put around every encoded prompt; stop_token_ids: end a sequence;
    decoder_start_token_id: encoder-decoder models only; output_tokenizer: decodes the outputs
    (a translation model's target tokenizer; default ``tokenizer``).
    """

    model: Model
    tokenizer: Any
    prefix_ids: list[int] = field(default_factory=list)
    suffix_ids: list[int] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None
    decoder_start_token_id: int | None = None
    output_tokenizer: Any = None

    @classmethod
    def from_run(cls, run_dir: Path | str, device: str | torch.device | None = None,
                 decoder_start: str | None = None) -> TextGenerator:
        """Load a run directory. ``decoder_start`` overrides the decoder's first token: a role
        (``bos``, ``cls``, ``pad``, ``eos``) or a token string."""
        run_dir = Path(run_dir)
        model, cfg, tokenizer = load_model(run_dir, device)
        if tokenizer is None:
            raise UserError(f"run directory {run_dir} has no tokenizer (tokenizer/tokenizer.json), so text "
                            "prompts cannot be encoded; use pentad.generation.generate with token ids")
        return cls.for_model(model, tokenizer, objective=cfg.data.objective, hf_config=_interop_config(run_dir),
                             decoder_start=decoder_start, label=str(run_dir))

    @classmethod
    def for_model(cls, model: Model, tokenizer: Any, objective: Any = None, hf_config: dict[str, Any] | None = None,
                  decoder_start: str | None = None, label: str = "the model") -> TextGenerator:
        """Framing for ``model`` from its tokenizer, training objective config (or None) and, for
        converted runs, the Hugging Face config (``decoder_start_token_id``)."""
        from pentad.data.objectives.mt import resolve_decoder_start

        hf_config = hf_config or {}
        _check_text_input(model, label)
        bos = tokenizer.bos_id
        if model.decoder is not None:
            output = tokenizer
            target_cfg = getattr(objective, "target_tokenizer", None)
            if target_cfg is not None:
                from pentad.data.tokenizers import load_tokenizer

                output = load_tokenizer(target_cfg)
            end, target_end = _end_id(tokenizer), _end_id(output)
            if target_end is None:
                raise UserError(f"{label}: the target tokenizer has neither an EOS nor a SEP token to end outputs")
            prefix = [bos] if bos is not None and bos != end else []
            suffix = [end] if end is not None else []
            choice = decoder_start if decoder_start is not None else getattr(objective, "decoder_start", None)
            hf_start = hf_config.get("decoder_start_token_id")
            if choice is None and isinstance(hf_start, int):
                start = hf_start
            else:
                start = resolve_decoder_start(output, choice, getattr(objective, "type", "generate"))
            pad = output.pad_id
            return cls(model, tokenizer, prefix, suffix, [target_end], pad, start, output)
        if decoder_start is not None:
            raise UserError(f"{label} is not an encoder-decoder model: it has no decoder start token to set")
        if model.encoder.mask_kind == "prefix":
            cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
            if sep_id is None:
                raise UserError(f"{label}: a prefix-LM prompt ends with [SEP], which the tokenizer does not have")
            return cls(model, tokenizer, [cls_id] if cls_id is not None else [], [sep_id], [sep_id],
                       tokenizer.pad_id)
        end = _end_id(tokenizer)
        prefix = [bos] if bos is not None and bos != end else []
        return cls(model, tokenizer, prefix, [], [end] if end is not None else [], tokenizer.pad_id)

    @property
    def decoder(self) -> Any:
        return self.output_tokenizer if self.output_tokenizer is not None else self.tokenizer

    def config(self, config: GenerationConfig | None = None, **overrides: Any) -> GenerationConfig:
        """``config`` (and overrides) with this model's stop, pad and decoder start ids filled in
        where it leaves them unset."""
        cfg = resolve_config(config, overrides)
        fields: dict[str, Any] = {}
        if not cfg.stop_token_ids and "stop_token_ids" not in overrides:
            fields["stop_token_ids"] = list(self.stop_token_ids)
        if cfg.pad_token_id is None and self.pad_token_id is not None:
            fields["pad_token_id"] = self.pad_token_id
        if cfg.decoder_start_token_id is None and self.decoder_start_token_id is not None:
            fields["decoder_start_token_id"] = self.decoder_start_token_id
        return cfg.model_copy(update=fields) if fields else cfg

    def encode(self, text: str) -> list[int]:
        """The framed token ids of one prompt."""
        return [*self.prefix_ids, *self.tokenizer.encode(text), *self.suffix_ids]

    def _completions(self, output: GenerationOutput, stop_strings: Sequence[str], stop_ids: Sequence[int]
                     ) -> list[Completion]:
        stops = set(stop_ids)
        results = []
        for ids, score, stopped in zip(output.sequences(), output.scores.tolist(), output.stopped.tolist()):
            body = ids[:-1] if stopped and ids and ids[-1] in stops else ids
            text = self.decoder.decode(body, skip_special_tokens=True)
            reason = "stop" if stopped else "length"
            cut = first_stop(text, stop_strings)
            if cut is not None:
                text, reason = text[:cut], "stop_string"
            results.append(Completion(text, ids, float(score), reason))
        return results

    def generate(self, texts: Sequence[str], config: GenerationConfig | None = None, *,
                 stop_strings: Sequence[str] = (), batch_size: int = 8, generator: torch.Generator | None = None,
                 **overrides: Any) -> list[list[Completion]]:
        """Completions of each text (``num_return_sequences`` each, best first for beams), in
        batches of ``batch_size`` prompts. Stop strings end a row early with greedy and sampling;
        with beam search they only cut the returned text."""
        return self.generate_ids([self.encode(t) for t in texts], config, stop_strings=stop_strings,
                                 batch_size=batch_size, generator=generator, **overrides)

    def generate_ids(self, prompts: Sequence[Sequence[int]], config: GenerationConfig | None = None, *,
                     stop_strings: Sequence[str] = (), batch_size: int = 8, generator: torch.Generator | None = None,
                     **overrides: Any) -> list[list[Completion]]:
        """:meth:`generate` for prompts given as token ids, used as they are (no framing added: a chat
        template's ids)."""
        cfg = self.config(config, **overrides)
        if cfg.do_sample and generator is None and cfg.seed is not None:
            # One generator across batches: the samples depend on the seed, not on batch_size splits
            # being re-seeded.
            generator = torch.Generator(device=next(self.model.parameters()).device).manual_seed(cfg.seed)
        check = StopStrings(self.decoder, stop_strings) if stop_strings and cfg.strategy != "beam" else None
        results: list[list[Completion]] = []
        for begin in range(0, len(prompts), batch_size):
            chunk = [list(p) for p in prompts[begin:begin + batch_size]]
            output = generate(self.model, chunk, cfg, generator=generator, stop_check=check)
            flat = self._completions(output, stop_strings, cfg.stop_token_ids)
            n = output.num_return_sequences
            results += [flat[i:i + n] for i in range(0, len(flat), n)]
        return results

    def generate_streaming(self, text: str, on_text: Callable[[str], None], config: GenerationConfig | None = None,
                           *, stop_strings: Sequence[str] = (), generator: torch.Generator | None = None,
                           **overrides: Any) -> Completion:
        """Generate for one prompt, calling ``on_text`` with each new piece of text as it is
        produced; returns the whole completion (as ``generate`` would)."""
        return self.stream_ids(self.encode(text), on_text, config, stop_strings=stop_strings, generator=generator,
                               **overrides)

    def stream_ids(self, prompt: Sequence[int], on_text: Callable[[str], None], config: GenerationConfig | None = None,
                   *, stop_strings: Sequence[str] = (), generator: torch.Generator | None = None,
                   **overrides: Any) -> Completion:
        """:meth:`generate_streaming` for a prompt given as token ids, used as they are."""
        cfg = self.config(config, **overrides)
        if cfg.strategy == "beam" or cfg.num_return_sequences != 1:
            raise UserError("streaming shows one sequence as it grows: use greedy or sampling with one "
                            "return sequence (not beam search)")
        pieces = IncrementalText(self.decoder, stop_strings)
        stops = set(cfg.stop_token_ids)
        ended = [False]

        def on_step(tokens: Tensor) -> None:
            token = int(tokens[0])
            if ended[0] or token in stops:
                return
            piece, hit = pieces.feed(token)
            ended[0] = hit
            if piece:
                on_text(piece)

        check = StopStrings(self.decoder, stop_strings) if stop_strings else None
        output = generate(self.model, [list(prompt)], cfg, generator=generator, on_step=on_step,
                          stop_check=check)
        rest = pieces.finish()
        if rest:
            on_text(rest)
        return self._completions(output, stop_strings, cfg.stop_token_ids)[0]

    def stream(self, text: str, config: GenerationConfig | None = None, *, stop_strings: Sequence[str] = (),
               generator: torch.Generator | None = None, **overrides: Any) -> Iterator[str]:
        """Yield the text of one prompt's continuation piece by piece as tokens are produced."""
        from pentad.generation.search import stream as stream_ids

        cfg = self.config(config, **overrides)
        pieces = IncrementalText(self.decoder, stop_strings)
        stops = set(cfg.stop_token_ids)
        tokens = stream_ids(self.model, self.encode(text), cfg, generator=generator)
        try:
            for token in tokens:
                if token in stops:
                    break
                piece, hit = pieces.feed(token)
                if piece:
                    yield piece
                if hit:
                    return
            rest = pieces.finish()
            if rest:
                yield rest
        finally:
            tokens.close()  # stop decoding (and restore the model's mode) when the caller stops early
