"""Search strategies over a session: greedy, sampling (temperature, top-k, top-p) and beam search.

Everything runs under ``torch.inference_mode`` on whole batches; the only host synchronisation per
step is the check whether every row (every prompt, for beams) has finished, which stopping needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from pentad import memory
from pentad.components.base import BATCH_INPUT_FIELDS, Batch
from pentad.generation.config import GenerationConfig, GenerationInputError
from pentad.generation.processors import NEG_INF, forbid, mark_seen, repetition_penalty, sampling_scores
from pentad.generation.session import (
    DecoderOnlySession,
    EncoderDecoderSession,
    Session,
    pack,
    position_limit,
    repad,
)
from pentad.layers.attention import Attention
from pentad.model import Model

Prompts = Sequence[Sequence[int]] | Tensor | Batch
# (tokens generated so far [rows, t], rows already finished [rows]) -> rows that must stop now [rows]
StopCheck = Callable[[Tensor, Tensor], Tensor]


@dataclass
class GenerationOutput:
    """What ``generate`` returns; rows are prompt-major (prompt i's sequences are rows
    ``i * num_return_sequences ...``), beams best first.

    tokens [N, T] long: new tokens only, ``fill_token_id`` after a row's end; lengths [N]: new tokens
    of each row (its stop token included); scores [N] float: beam search: the length-penalised beam
    score; otherwise the sum of the model's log-probabilities of the chosen tokens (before any
    filtering); stopped [N] bool: the row ended with a stop token (else max_new_tokens or a stop check).
    """

    tokens: Tensor
    lengths: Tensor
    scores: Tensor
    stopped: Tensor
    num_return_sequences: int = 1

    def owned(self) -> GenerationOutput:
        """A copy whose tensors are ordinary ones: tensors made under ``torch.inference_mode``
        cannot be modified in place outside it (cloning outside it lifts that)."""
        return GenerationOutput(self.tokens.clone(), self.lengths.clone(), self.scores.clone(),
                                self.stopped.clone(), self.num_return_sequences)

    def sequences(self) -> list[list[int]]:
        """The new tokens of each row without the filler (stop tokens kept)."""
        lengths = self.lengths.tolist()
        return [row[:n] for row, n in zip(self.tokens.tolist(), lengths)]


def resolve_config(config: GenerationConfig | None, overrides: dict[str, Any]) -> GenerationConfig:
    """``config`` with keyword ``overrides`` (validated again)."""
    base = config.model_dump() if config is not None else {}
    return GenerationConfig.model_validate({**base, **overrides})


@contextmanager
def eval_mode(model: Model) -> Iterator[None]:
    """Dropout off while decoding; the caller's train/eval state is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _device(model: Model) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _prompt_shape(prompts: Prompts) -> tuple[int, int]:
    """(prompts, longest prompt or source) of ``prompts``; (0, 0) where they are malformed (the
    session says what is wrong with them)."""
    if isinstance(prompts, Batch):
        first = next((getattr(prompts, f) for f in BATCH_INPUT_FIELDS if getattr(prompts, f) is not None), None)
        return (first.shape[0], first.shape[1]) if first is not None and first.dim() >= 2 else (0, 0)
    if isinstance(prompts, Tensor):
        return (prompts.shape[0], prompts.shape[1]) if prompts.dim() == 2 else (0, 0)
    try:
        return len(prompts), max((len(p) for p in prompts), default=0)
    except TypeError:
        return 0, 0


def decoding_memory(model: Model, prompts: int, length: int, config: GenerationConfig) -> tuple[int, str]:
    """(bytes, what they are) that decoding ``prompts`` prompts of up to ``length`` tokens as ``config``
    says allocates besides the model, at least: the key/value cache of every attention layer for each
    row (prompts x num_beams, or x num_return_sequences) over prompt + max_new_tokens positions (a
    cross-attention layer over the source), an encoder's memory, and the fp32 next-token scores of
    each row over the vocabulary (twice: scores and log-probabilities)."""
    copies = config.num_beams if config.strategy == "beam" else config.num_return_sequences
    rows = prompts * copies
    positions = length + config.max_new_tokens + (1 + len(config.decoder_prompt_ids) if model.decoder else 0)
    param = next(model.parameters(), None)
    size = param.element_size() if param is not None else 4
    cached = model.decoder if model.decoder is not None else model.encoder
    per_row = memory_width = 0
    for module in cached.modules():
        if isinstance(module, Attention):
            per_row += 2 * module.kv_dim * size * (length if module.cross else positions)
            if module.cross and getattr(module, "kv", None) is not None:
                memory_width = module.kv.in_features
    per_row += memory_width * length * size  # the encoder's output, copied per row
    head = lm_head_width(model)
    cache, scores = rows * per_row, rows * head * 4 * 2
    return cache + scores, (f"{rows:,} rows ({prompts:,} prompts x {copies:,}): key/value cache "
                            f"{memory.format_bytes(cache)} over {positions:,} positions, next-token scores "
                            f"{memory.format_bytes(scores)} over {head:,} tokens")


def lm_head_width(model: Model) -> int:
    """The vocabulary the next-token head scores (the widest output projection of the targets)."""
    widths = [m.out_features for m in model.targets.modules() if isinstance(m, nn.Linear)]
    return max(widths, default=0)


def check_memory(model: Model, prompts: Prompts, config: GenerationConfig) -> None:
    """Refuse (UserError) a decoding whose cache and scores cannot fit in what the model's device has
    available, before any of it is allocated (:func:`decoding_memory`; ``PENTAD_SKIP_MEMORY_CHECK=1``
    skips it)."""
    count, length = _prompt_shape(prompts)
    if not count:
        return
    need, shown = decoding_memory(model, count, length, config)
    memory.require(need, "generating", shown, _device(model),
                   "Use fewer beams (num_beams) or return sequences, fewer prompts per batch (--batch-size) or "
                   "fewer new tokens (max_new_tokens)")


def start_session(model: Model, prompts: Prompts, config: GenerationConfig,
                  padding_mask: Tensor | None = None) -> Session:
    """The session for ``prompts``: ragged token lists, or a tensor [B, L] with an optional
    ``padding_mask`` [B, L] (True = padding; any side, rows are re-padded as the model needs).
    A decoding that cannot fit in memory is refused first (:func:`check_memory`)."""
    check_memory(model, prompts, config)
    device = _device(model)
    encoder_decoder = model.decoder is not None
    side = "right" if encoder_decoder else "left"
    fill = config.fill_token_id
    if isinstance(prompts, Batch):  # an encoder-decoder's source inputs other than tokens (speech features)
        if not encoder_decoder:
            raise GenerationInputError("a source batch (e.g. audio features) needs an encoder-decoder model; "
                                       "give a decoder-only model token prompts")
        new = config.max_new_tokens
        _check_decoder_positions(model, config)
        if config.decoder_start_token_id is None:
            raise GenerationInputError("encoder-decoder generation needs decoder_start_token_id")
        use_cache = config.use_cache and model.decoder.supports_cache
        static = _static_cache(model, config, use_cache)
        return EncoderDecoderSession(model, None, None, config.decoder_start_token_id, new, use_cache,
                                     source_batch=prompts.to(device), prompt=config.decoder_prompt_ids,
                                     static=static, compile=config.compile)
    if isinstance(prompts, Tensor):
        if prompts.dim() != 2:
            raise GenerationInputError(f"prompts must be [batch, length] token ids, got shape {tuple(prompts.shape)}")
        tokens = prompts.to(device)
        padding = padding_mask.to(device) if padding_mask is not None else None
        if padding is not None:
            lengths = (~padding).sum(1)
            if bool((lengths == 0).any()):
                raise GenerationInputError("every prompt needs at least one token; a row is all padding")
            if bool(padding.any()):
                index = repad(tokens, padding, side)
                tokens, padding = tokens.gather(1, index), padding.gather(1, index)
                tokens = tokens.masked_fill(padding, fill)
            else:
                padding = None
        if tokens.shape[1] == 0:
            raise GenerationInputError("every prompt needs at least one token")
    else:
        prompts = [list(p) for p in prompts]
        if not prompts:
            raise GenerationInputError("no prompts given")
        empty = [i for i, p in enumerate(prompts) if not p]
        if empty:
            raise GenerationInputError(f"every prompt needs at least one token; prompt(s) {empty} are empty")
        tokens, padding = pack(prompts, fill, side, device)
    new = config.max_new_tokens
    # Recurrent and convolutional stacks keep no key/value cache: they re-run the sequence.
    use_cache = config.use_cache and (model.decoder if encoder_decoder else model.encoder).supports_cache
    static = _static_cache(model, config, use_cache)
    if encoder_decoder:
        limit, need = position_limit(model.embedding), tokens.shape[1]
        if limit is not None and need > limit:
            raise GenerationInputError(f"a source of {need} tokens exceeds the model's {limit} positions")
        _check_decoder_positions(model, config)
        if config.decoder_start_token_id is None:
            raise GenerationInputError("encoder-decoder generation needs decoder_start_token_id (T5: the pad id, "
                             "BART: the eos id)")
        return EncoderDecoderSession(model, tokens, padding, config.decoder_start_token_id, new, use_cache,
                                     prompt=config.decoder_prompt_ids, static=static, compile=config.compile)
    if config.decoder_prompt_ids:
        raise GenerationInputError("decoder_prompt_ids are read by an encoder-decoder's decoder; this model has "
                                   "none: put them in the prompt")
    limit, need = position_limit(model.embedding), tokens.shape[1] + new - 1
    if limit is not None and need > limit:
        raise GenerationInputError(f"a prompt of {tokens.shape[1]} tokens plus max_new_tokens {new} needs {need} "
                         f"positions; the model has {limit}")
    return DecoderOnlySession(model, tokens, padding, new, use_cache, fill, static=static, compile=config.compile)


def _static_cache(model: Model, config: GenerationConfig, use_cache: bool) -> bool:
    """Whether to decode with a static cache; refuses (rather than falling back to a dynamic
    cache) a stack that cannot keep one."""
    if config.cache != "static":
        return False
    stack = model.decoder if model.decoder is not None else model.encoder
    slot = "decoder" if model.decoder is not None else "encoder"
    if not use_cache:
        raise GenerationInputError(f"cache='static' needs a key/value cache, but the model's {slot} "
                                   f"({stack.registry_name}) keeps none; use cache='dynamic' (and compile=false)")
    if not stack.supports_static_cache:
        raise GenerationInputError(f"cache='static' is not supported by the model's {slot} ({stack.registry_name}: "
                                   "attention-weight reuse caches values alone, and a static cache serves causal "
                                   "or prefix attention only); use cache='dynamic' (and compile=false)")
    return True


def _check_decoder_positions(model: Model, config: GenerationConfig) -> None:
    """The decoder reads the start token, the decoder prompt and all new tokens but the last."""
    limit = position_limit(model.target_embedding)
    new, prompt = config.max_new_tokens, len(config.decoder_prompt_ids)
    if limit is not None and new + prompt > limit:
        raise GenerationInputError(f"max_new_tokens {new}" + (f" after a decoder prompt of {prompt}" if prompt else "")
                                   + f" exceeds the decoder's {limit} positions")


def _suppressed(scores: Tensor, config: GenerationConfig, step: int, stop: Tensor) -> Tensor:
    """Scores with the tokens this step may not produce at -inf: stop tokens before min_new_tokens,
    suppress_tokens always, begin_suppress_tokens at the first step."""
    if step < config.min_new_tokens:
        scores = forbid(scores, stop)
    banned = config.suppress_tokens + (config.begin_suppress_tokens if step == 0 else [])
    if banned:
        scores = forbid(scores, torch.tensor(banned, dtype=torch.long, device=scores.device))
    return scores


def _generator(config: GenerationConfig, generator: torch.Generator | None, device: torch.device
               ) -> torch.Generator | None:
    if generator is not None or config.seed is None:
        return generator
    return torch.Generator(device=device).manual_seed(config.seed)


def _seen(session: Session, vocab: int) -> Tensor:
    """[rows, V] bool: tokens of the prompt (not padding) and decoder input so far."""
    tokens, padding = session.history()
    seen = torch.zeros((tokens.shape[0], vocab), dtype=torch.bool, device=tokens.device)
    return mark_seen(seen, tokens, None if padding is None else ~padding)


class TokenSearch:
    """Greedy decoding or sampling, one token per row per step.

    Iterate ``steps()`` to receive each step's tokens [rows] (finished rows get the filler);
    ``output`` is set when it ends.
    """

    def __init__(self, session: Session, config: GenerationConfig, generator: torch.Generator | None = None,
                 stop_check: StopCheck | None = None):
        self.session, self.config, self.stop_check = session, config, stop_check
        self.generator = generator
        self.output: GenerationOutput | None = None

    @torch.inference_mode()
    def steps(self) -> Iterator[Tensor]:
        cfg, session = self.config, self.session
        logits = session.prefill()
        copies = cfg.num_return_sequences
        if copies > 1:
            session.expand(copies)
            logits = logits.repeat_interleave(copies, 0)
        rows, vocab = logits.shape
        device = logits.device
        stop = torch.tensor(cfg.stop_token_ids, dtype=torch.long, device=device)
        fill = cfg.fill_token_id
        seen = _seen(session, vocab) if cfg.repetition_penalty != 1.0 else None
        out = torch.full((rows, cfg.max_new_tokens), fill, dtype=torch.long, device=device)
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        stopped = torch.zeros(rows, dtype=torch.bool, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        logprob = torch.zeros(rows, dtype=torch.float32, device=device)
        for step in range(cfg.max_new_tokens):
            raw = scores = logits.float()
            # log p(chosen) = logit - logsumexp: one reduction instead of a [rows, V] log-softmax.
            log_norm = torch.logsumexp(raw, dim=-1)
            if seen is not None:
                scores = repetition_penalty(scores, seen, cfg.repetition_penalty)
            scores = _suppressed(scores, cfg, step, stop)
            if cfg.do_sample:
                scores = sampling_scores(scores, cfg.temperature, cfg.top_k, cfg.top_p)
                chosen = torch.multinomial(scores.softmax(dim=-1), 1, generator=self.generator).squeeze(1)
            else:
                chosen = scores.argmax(dim=-1)
            chosen = chosen.masked_fill(finished, fill)
            live = ~finished
            logprob += (raw.gather(1, chosen[:, None]).squeeze(1) - log_norm).masked_fill(finished, 0.0)
            lengths += live.long()
            out[:, step] = chosen
            hit = torch.isin(chosen, stop) & live
            stopped |= hit
            finished = finished | hit
            if self.stop_check is not None:
                finished = finished | self.stop_check(out[:, :step + 1], finished)
            yield chosen
            if step + 1 == cfg.max_new_tokens or bool(finished.all()):
                break
            if seen is not None:
                mark_seen(seen, chosen[:, None])
            logits = session.step(chosen)
        width = int(lengths.max())
        self.output = GenerationOutput(out[:, :width], lengths, logprob, stopped, copies)


@torch.inference_mode()
def beam_search(session: Session, config: GenerationConfig) -> GenerationOutput:
    """Beam search with ``num_beams`` hypotheses per prompt.

    Each step extends every running beam by every token, keeps the best ``K = (1 + stop tokens) *
    num_beams`` candidates per prompt by total log-probability (so that ``num_beams`` of them are
    still running after the ones ending in a stop token are set aside), moves the stop-token
    candidates among the first ``num_beams`` into the finished pool (score = total log-probability /
    new tokens ** length_penalty) and continues with the best ``num_beams`` running ones. At the last
    step the best ``num_beams`` candidates finish by length. A prompt is done per ``early_stopping``
    (see ``GenerationConfig``). This is the search Hugging Face's ``generate`` runs, so both return
    the same hypotheses for the same model.
    """
    cfg = config
    beams, new = cfg.num_beams, cfg.max_new_tokens
    logits = session.prefill()
    prompts, vocab = logits.shape
    device = logits.device
    session.expand(beams)
    logits = logits.repeat_interleave(beams, 0)
    stop = torch.tensor(cfg.stop_token_ids, dtype=torch.long, device=device)
    fill = cfg.fill_token_id
    keep = max(2, 1 + len(cfg.stop_token_ids)) * beams
    if keep > beams * vocab:
        raise GenerationInputError(f"beam search keeps {keep} candidates per prompt but only {beams * vocab} "
                                   "exist (vocabulary too small for num_beams)")
    seen = _seen(session, vocab) if cfg.repetition_penalty != 1.0 else None
    # Only the first beam of each prompt is live at the start (the others are copies of it): a large
    # negative score, not -inf, keeps arithmetic finite.
    running_scores = torch.zeros((prompts, beams), device=device)
    running_scores[:, 1:] = -1.0e9
    running = torch.full((prompts, beams, new), fill, dtype=torch.long, device=device)
    done_tokens = torch.full((prompts, beams, new), fill, dtype=torch.long, device=device)
    done_scores = torch.full((prompts, beams), NEG_INF, device=device)
    done_lengths = torch.zeros((prompts, beams), dtype=torch.long, device=device)
    done_stopped = torch.zeros((prompts, beams), dtype=torch.bool, device=device)
    done_real = torch.zeros((prompts, beams), dtype=torch.bool, device=device)
    can_improve = torch.ones(prompts, dtype=torch.bool, device=device)
    first_k = (torch.arange(keep, device=device) < beams)[None]
    group_offset = torch.arange(prompts, device=device)[:, None] * beams
    for step in range(new):
        log_probs = logits.float().log_softmax(dim=-1)
        if seen is not None:
            log_probs = repetition_penalty(log_probs, seen, cfg.repetition_penalty)
        log_probs = _suppressed(log_probs, cfg, step, stop)
        total = (log_probs.view(prompts, beams, vocab) + running_scores[..., None]).view(prompts, -1)
        cand_scores, cand_index = total.topk(keep, dim=-1)  # sorted, best first
        cand_beam, cand_token = cand_index // vocab, cand_index % vocab
        cand_seq = running.gather(1, cand_beam[..., None].expand(-1, -1, new)).clone()
        cand_seq[:, :, step] = cand_token
        is_stop = torch.isin(cand_token, stop)
        last = step + 1 == new
        ends = torch.ones_like(is_stop) if last else is_stop
        # Finished candidates: among the first num_beams, while the prompt can still improve.
        eligible = ends & first_k & can_improve[:, None]
        if cfg.early_stopping is True:
            eligible &= ~done_real.all(dim=1, keepdim=True)
        final = torch.where(eligible, cand_scores / float(step + 1) ** cfg.length_penalty,
                            torch.full_like(cand_scores, NEG_INF))
        merged = torch.cat((done_scores, final), dim=1).topk(beams, dim=1).indices
        done_scores = torch.cat((done_scores, final), dim=1).gather(1, merged)
        done_tokens = torch.cat((done_tokens, cand_seq), dim=1).gather(1, merged[..., None].expand(-1, -1, new))
        done_lengths = torch.cat((done_lengths, torch.full_like(cand_beam, step + 1)), dim=1).gather(1, merged)
        done_stopped = torch.cat((done_stopped, is_stop & eligible), dim=1).gather(1, merged)
        done_real = torch.cat((done_real, eligible), dim=1).gather(1, merged)
        if last:
            break
        # Running beams: the best candidates that did not end.
        open_scores = cand_scores.masked_fill(ends, NEG_INF)
        chosen = open_scores.topk(beams, dim=1).indices
        running_scores = open_scores.gather(1, chosen)
        source_beam = cand_beam.gather(1, chosen)
        next_tokens = cand_token.gather(1, chosen)
        running = cand_seq.gather(1, chosen[..., None].expand(-1, -1, new))
        # Can a running beam still beat the worst finished one? (Hugging Face's heuristic: judge
        # the best running beam at its current length, or at max length with early_stopping
        # 'never' and a positive length penalty.)
        length = new if (cfg.early_stopping == "never" and cfg.length_penalty > 0) else step + 1
        best_possible = running_scores[:, 0] / float(length) ** cfg.length_penalty
        full = done_real.all(dim=1)
        can_improve = can_improve & (~full | (best_possible > done_scores.min(dim=1).values))
        finished = ~can_improve
        if cfg.early_stopping is True:
            finished = finished | full
        if bool(finished.all()):
            break
        index = (group_offset + source_beam).view(-1)
        session.reorder(index)
        if seen is not None:
            seen = seen.index_select(0, index)
            mark_seen(seen, next_tokens.view(-1, 1))
        logits = session.step(next_tokens.view(-1))
    returned = cfg.num_return_sequences
    lengths = done_lengths[:, :returned].reshape(-1)
    tokens = done_tokens[:, :returned].reshape(prompts * returned, new)
    width = int(lengths.max())
    return GenerationOutput(tokens[:, :width], lengths, done_scores[:, :returned].reshape(-1),
                            done_stopped[:, :returned].reshape(-1), returned)


def generate(model: Model, prompts: Prompts, config: GenerationConfig | None = None, *,
             padding_mask: Tensor | None = None, generator: torch.Generator | None = None,
             on_step: Callable[[Tensor], None] | None = None, stop_check: StopCheck | None = None,
             **overrides: Any) -> GenerationOutput:
    """Generate continuations of ``prompts`` with ``model`` (a pentad ``Model`` with an ``lm`` target).

    prompts: token id lists of any lengths (decoder-only: the text to continue; encoder-decoder:
    the source), or a tensor [B, L] with ``padding_mask`` [B, L] (True = padding), or, for an
    encoder-decoder, a ``Batch`` of the encoder's inputs (speech: ``audio`` and ``audio_padding_mask``).
    config / overrides: a ``GenerationConfig`` and keyword fields replacing its values
    (``generate(model, ids, max_new_tokens=20, do_sample=True, seed=0)``).
    generator: the ``torch.Generator`` sampling draws from (default: one seeded with
    ``config.seed``, else torch's global generator).
    on_step: called with each step's tokens [rows] (greedy and sampling), e.g. to stream.
    stop_check: ``(tokens so far [rows, t], finished [rows]) -> [rows] bool`` rows to stop now
    (stop strings); greedy and sampling only.
    """
    config = resolve_config(config, overrides)
    with eval_mode(model):
        session = start_session(model, prompts, config, padding_mask)
        if config.strategy == "beam":
            if on_step is not None or stop_check is not None:
                raise GenerationInputError("on_step and stop_check are not available with beam search")
            return beam_search(session, config).owned()
        search = TokenSearch(session, config, _generator(config, generator, _device(model)), stop_check)
        for tokens in search.steps():
            if on_step is not None:
                on_step(tokens)
        assert search.output is not None
        return search.output.owned()


def stream(model: Model, prompt: Sequence[int], config: GenerationConfig | None = None, *,
           generator: torch.Generator | None = None, stop_check: StopCheck | None = None,
           **overrides: Any) -> Iterator[int]:
    """Yield the new tokens of one prompt as they are produced (the stop token included, last).

    Greedy or sampling; the model is in eval mode while the iterator runs.
    """
    config = resolve_config(config, overrides)
    if config.strategy == "beam" or config.num_return_sequences != 1:
        raise GenerationInputError("streaming produces one sequence: use greedy or sampling with "
                                   "num_return_sequences=1")
    with eval_mode(model):
        session = start_session(model, [list(prompt)], config)
        search = TokenSearch(session, config, _generator(config, generator, _device(model)), stop_check)
        # steps() ends after the step in which the row finished, so every token it yields is real.
        for tokens in search.steps():
            yield int(tokens[0])
