"""Model adapters for decoding: run a prompt, then one new token per row per step.

A session owns everything about the model side of one ``generate`` call: the prompt tensors, the
key/value cache, positions and masks. The search strategies (``search.py``) only see
``prefill() -> logits``, ``step(tokens) -> logits``, ``expand(n)`` and ``reorder(index)``; logits
are the next-token scores of the last position, [rows, V].

* :class:`DecoderOnlySession`: the encoder slot with a causal or prefix mask (GPT-2, LLaMA, BLOOM,
  prefix-LM). Prompts are **left**-padded so that every row's next token lands in the same column;
  positions are derived from the padding (position = number of real tokens before), so a padded
  row computes exactly what it would alone. A prefix-LM's prompt is its bidirectional prefix
  (segment 0); generated tokens are segment 1.
* :class:`EncoderDecoderSession`: the encoder runs once over right-padded sources; the decoder
  starts from ``decoder_start_token_id``. With a cache, cross-attention keys/values are computed
  from the encoder output on the first step and reused (``layers/cache.py``).

Without a cache (``use_cache=False``) every step re-runs the whole sequence so far, as
TencentPretrain's generation scripts do: the reference the cached path is tested against.

With ``static=True`` the cache is a :class:`~pentad.layers.cache.StaticKVCache` of the final length,
allocated on the prefill and written in place; a step's inputs are then tensors of fixed shapes and
addresses (the new tokens, their positions, the padding of the whole buffer, the cache's position
tensor), so ``compile=True`` can run the step through ``torch.compile`` (CUDA graphs on CUDA)
without recompiling as decoding advances. Prefill, ``expand`` and the search stay eager. The tensors
every step reads unchanged (cache buffers, cross-attention keys/values, the encoder memory and the
padding masks) are marked as static addresses, so CUDA graphs read them in place instead of copying
them on each replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from pentad.components.base import BATCH_INPUT_FIELDS, Batch, Target
from pentad.generation.config import GenerationInputError
from pentad.layers.cache import KVCache, StaticKVCache, mark_static_address
from pentad.model import EmbeddingSlot, Model


def lm_head(model: Model) -> Target:
    """The target whose ``logits(hidden [.., H]) -> [.., V]`` scores the next token (the ``lm`` target)."""
    heads = [t for t in model.targets.values() if callable(getattr(t, "logits", None))]
    if not heads:
        names = ", ".join(f"{n} ({t.registry_name})" for n, t in model.targets.items())
        raise GenerationInputError(f"the model has no next-token head to generate with (targets: {names}); "
                         "generation needs an 'lm' target")
    preferred = [t for t in heads if getattr(t, "registry_name", "") == "lm"]
    return (preferred or heads)[0]


def position_limit(slot: EmbeddingSlot | None) -> int | None:
    """How many positions the absolute position parts of ``slot`` have (None: unlimited)."""
    if slot is None:
        return None
    limits = [part.max_positions for part in slot.parts() if part.max_positions is not None]
    return min(limits) if limits else None


def make_cache(use_cache: bool, static: bool, capacity: int, device: torch.device) -> KVCache | None:
    """No cache, a growing one, or a static one of ``capacity`` positions."""
    if not use_cache:
        return None
    return StaticKVCache(capacity, device) if static else KVCache()


def compile_step(step: Callable[..., Tensor], device: torch.device) -> Callable[..., Tensor]:
    """``torch.compile`` of a one-token step: CUDA graphs (``reduce-overhead``) on CUDA, the default
    mode elsewhere. Shapes are static (``dynamic=False``): the step's inputs never change shape, and
    a shape that did would rather show as a recompilation than silently run a slower graph."""
    mode = "reduce-overhead" if device.type == "cuda" else None
    compiled = torch.compile(step, mode=mode, dynamic=False)
    if device.type != "cuda":
        return compiled

    def run(*args: Tensor) -> Tensor:
        # A CUDA graph's outputs are overwritten by its next replay: hand the search a copy.
        return compiled(*args).clone()
    return run


def mark_step_inputs(*tensors: Tensor | None) -> None:
    """Mark tensors that every compiled step of a static session reads unchanged (the encoder memory,
    padding masks) as static addresses, so CUDA graphs read them in place rather than copying them
    into the graph on each replay. Call again on the new tensors whenever they are replaced."""
    for tensor in tensors:
        if tensor is not None:
            mark_static_address(tensor)


def _reads(slot: EmbeddingSlot | None, field: str) -> bool:
    return slot is not None and any(field in part.requires for part in slot.parts())


def pack(prompts: Sequence[Sequence[int]], pad_id: int, side: str, device: torch.device
         ) -> tuple[Tensor, Tensor | None]:
    """Ragged token lists -> (tokens [B, L], padding_mask [B, L] or None when no row is padded),
    padded on the ``left`` or ``right``."""
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    padding = torch.ones((len(prompts), width), dtype=torch.bool)
    for i, ids in enumerate(prompts):
        n = len(ids)
        span = slice(width - n, width) if side == "left" else slice(0, n)
        tokens[i, span] = torch.as_tensor(list(ids), dtype=torch.long)
        padding[i, span] = False
    has_padding = min(lengths) != width
    return tokens.to(device), padding.to(device) if has_padding else None


def repad(tokens: Tensor, padding: Tensor, side: str) -> Tensor:
    """Index [B, L] that moves each row's real tokens to the ``side`` end, in order (a stable sort
    of the padding flags); gather tokens and padding with it."""
    key = (~padding).int() if side == "left" else padding.int()
    return torch.sort(key, dim=1, stable=True).indices


class DecoderOnlySession:
    """Decoding with the encoder slot (causal or prefix mask).

    tokens [B, L] left-padded prompts; padding [B, L] (True = padding) or None. Buffers hold
    prompt + ``max_new_tokens`` columns so steps write in place.
    """

    def __init__(self, model: Model, tokens: Tensor, padding: Tensor | None, max_new_tokens: int,
                 use_cache: bool = True, fill_id: int = 0, static: bool = False, compile: bool = False):
        self.model, self.head = model, lm_head(model)
        rows, prompt_len = tokens.shape
        total = prompt_len + max_new_tokens
        device = tokens.device
        self.tokens = torch.full((rows, total), fill_id, dtype=torch.long, device=device)
        self.tokens[:, :prompt_len] = tokens
        self.positions = torch.zeros((rows, total), dtype=torch.long, device=device)
        if padding is not None:
            real = (~padding).long()
            self.positions[:, :prompt_len] = (real.cumsum(1) - 1).clamp(min=0)
            self.next_position = real.sum(1)
            self.padding: Tensor | None = torch.zeros((rows, total), dtype=torch.bool, device=device)
            self.padding[:, :prompt_len] = padding
        else:
            self.positions[:, :prompt_len] = torch.arange(prompt_len, device=device)
            self.next_position = torch.full((rows,), prompt_len, dtype=torch.long, device=device)
            self.padding = None
        prefix = model.encoder.mask_kind == "prefix"
        self.segments: Tensor | None = None
        if prefix or _reads(model.embedding, "segments"):
            # The prompt is segment 0 (a prefix-LM's bidirectional prefix); generated tokens 1.
            self.segments = torch.zeros((rows, total), dtype=torch.long, device=device)
            self.segments[:, prompt_len:] = 1 if prefix else 0
        self.length = prompt_len
        self.static = static and use_cache
        self.cache = make_cache(use_cache, static, total, device)
        if self.static:
            mark_step_inputs(self.padding)  # the whole buffer, read by every step
        self.step_segment = 1 if prefix else 0
        self._step = compile_step(self._forward, device) if compile and self.static else self._forward

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    def history(self) -> tuple[Tensor, Tensor | None]:
        """(tokens [rows, length], padding [rows, length] or None) seen so far."""
        pad = self.padding[:, :self.length] if self.padding is not None else None
        return self.tokens[:, :self.length], pad

    def _forward(self, tokens: Tensor, positions: Tensor, padding: Tensor | None, segments: Tensor | None
                 ) -> Tensor:
        """Logits [rows, V] after the new positions tokens [rows, q] (positions, segments alike;
        padding: of the cached and new positions, or of the whole buffer with a static cache)."""
        hidden, _ = self.model.encode(Batch(tokens=tokens, positions=positions, padding_mask=padding,
                                            segments=segments), self.cache)
        return self.head.logits(hidden[:, -1])

    def _run(self, start: int, end: int) -> Tensor:
        padding = None
        if self.padding is not None:
            padding = self.padding if self.static else self.padding[:, :end]
        return self._forward(self.tokens[:, start:end], self.positions[:, start:end], padding,
                             self.segments[:, start:end] if self.segments is not None else None)

    def prefill(self) -> Tensor:
        """Run the prompts; logits [rows, V] of the first new token."""
        return self._run(0, self.length)

    def step(self, new: Tensor) -> Tensor:
        """Append ``new`` [rows] and return the logits of the token after it."""
        col = self.length
        self.tokens[:, col] = new
        self.positions[:, col] = self.next_position
        positions = self.next_position[:, None]
        self.next_position = self.next_position + 1
        self.length += 1
        if self.static:
            # Fresh [rows, 1] tensors rather than column views of the buffers, whose storage offsets
            # change every step (a compiled step would guard on them). The positions are copied too:
            # the first step's would otherwise be a view of the tensor made when the session was
            # (outside the search's inference mode) and the next ones inference tensors, a change of
            # dispatch keys that recompiles the step once.
            positions = positions.clone()
            segments = (torch.full_like(positions, self.step_segment) if self.segments is not None else None)
            return self._step(new[:, None].long(), positions, self.padding, segments)
        return self._run(col, col + 1) if self.cache is not None else self._run(0, col + 1)

    def reorder(self, index: Tensor) -> None:
        """Rows become ``rows[index]``, where ``index`` only permutes rows within their group of
        copies of one prompt (beam search): positions, padding and segments are the same in a
        group, so only the tokens and the cache move."""
        self.tokens = self.tokens.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)

    def expand(self, repeats: int) -> None:
        """Each row becomes ``repeats`` consecutive copies (beams, several samples per prompt)."""
        if repeats == 1:
            return
        index = torch.arange(self.rows, device=self.tokens.device).repeat_interleave(repeats)
        self.tokens = self.tokens.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        self.next_position = self.next_position.index_select(0, index)
        if self.padding is not None:
            self.padding = self.padding.index_select(0, index)
        if self.segments is not None:
            self.segments = self.segments.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)
        if self.static:
            mark_step_inputs(self.padding)


class EncoderDecoderSession:
    """Decoding with the decoder slot over an encoder memory.

    sources [B, S] right-padded encoder inputs; padding [B, S] or None. The decoder input starts
    with ``start_id``; its positions are 0, 1, ... (no decoder padding: all rows advance together).
    """

    def __init__(self, model: Model, sources: Tensor | None, padding: Tensor | None, start_id: int,
                 max_new_tokens: int, use_cache: bool = True, source_batch: Batch | None = None,
                 prompt: Sequence[int] = (), static: bool = False, compile: bool = False):
        if model.decoder is None:
            raise ValueError("EncoderDecoderSession needs a model with a decoder")
        if (sources is None) == (source_batch is None):
            raise ValueError("give the sources as token ids or as a source batch (audio features), not both")
        self.model, self.head = model, lm_head(model)
        self.sources, self.source_padding, self.source_batch = sources, padding, source_batch
        if source_batch is not None:  # the encoder reads other inputs (speech features): rows from its mask
            first = next(getattr(source_batch, f) for f in BATCH_INPUT_FIELDS if getattr(source_batch, f) is not None)
            device, rows = first.device, first.shape[0]
        else:
            device, rows = sources.device, sources.shape[0]
        width = 1 + len(prompt) + max_new_tokens
        self.tokens = torch.full((rows, width), start_id, dtype=torch.long, device=device)
        if prompt:  # the decoder prompt follows the start token in every row
            self.tokens[:, 1:1 + len(prompt)] = torch.tensor(list(prompt), dtype=torch.long, device=device)
        self.prompt_length = 1 + len(prompt)
        self.position_table = torch.arange(width, device=device)[None]
        self.source_segments = (torch.zeros_like(sources) if sources is not None
                                and _reads(model.embedding, "segments") else None)
        self.target_segments = _reads(model.target_embedding, "segments")
        self.memory: Tensor | None = None
        self.length = self.prompt_length
        self.static = static and use_cache
        self.cache = make_cache(use_cache, static, width, device)
        self._step = compile_step(self._forward, device) if compile and self.static else self._forward

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    def history(self) -> tuple[Tensor, Tensor | None]:
        return self.tokens[:, :self.length], None

    def _forward(self, tokens: Tensor, positions: Tensor, memory: Tensor | None, memory_padding: Tensor | None
                 ) -> Tensor:
        """Logits [rows, V] after the new decoder tokens [rows, q] at positions [1, q]."""
        batch = Batch(decoder_tokens=tokens, decoder_positions=positions,
                      decoder_segments=torch.zeros_like(tokens) if self.target_segments else None)
        hidden = self.model.decode(batch, memory, memory_padding, self.cache)
        return self.head.logits(hidden[:, -1])

    def _run(self, start: int, end: int) -> Tensor:
        return self._forward(self.tokens[:, start:end], self.position_table[:, start:end], self.memory,
                             self.source_padding)

    def prefill(self) -> Tensor:
        """Encode the sources once and run the start token (and the decoder prompt); logits [rows, V]."""
        if self.source_batch is not None:  # the memory's padding is the encoder's (subsampled audio)
            self.memory, self.source_padding = self.model.encode(self.source_batch)
            self.source_batch = None
        else:
            batch = Batch(tokens=self.sources, padding_mask=self.source_padding, segments=self.source_segments)
            self.memory, _ = self.model.encode(batch)
        if self.static:
            mark_step_inputs(self.memory, self.source_padding)
        return self._run(0, self.prompt_length)

    def step(self, new: Tensor) -> Tensor:
        col = self.length
        self.tokens[:, col] = new
        self.length += 1
        if self.static:
            # The new token's position is the cache's position tensor: no changing Python int (or
            # storage offset of a column view) reaches a compiled step.
            return self._step(new[:, None].long(), self.cache.offset.view(1, 1), self.memory, self.source_padding)
        return self._run(col, col + 1) if self.cache is not None else self._run(0, col + 1)

    def reorder(self, index: Tensor) -> None:
        """Rows become ``rows[index]`` within their groups of copies (the memory is the same in
        a group, so it stays)."""
        self.tokens = self.tokens.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)

    def expand(self, repeats: int) -> None:
        """Each row becomes ``repeats`` consecutive copies; call after ``prefill``."""
        if repeats == 1:
            return
        index = torch.arange(self.rows, device=self.tokens.device).repeat_interleave(repeats)
        self.tokens = self.tokens.index_select(0, index)
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
        if self.source_padding is not None:
            self.source_padding = self.source_padding.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)
        if self.static:
            mark_step_inputs(self.memory, self.source_padding)


Session = DecoderOnlySession | EncoderDecoderSession
