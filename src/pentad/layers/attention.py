"""Multi-head attention: one class per variant, each with one forward path, and one attention kernel.

The variants (self-attention, cross-attention over an encoder memory, RealFormer residual scores,
attention-weight reuse) share the head layout, the output projection and the initialisation of the
:class:`Attention` base; each projects its own queries, keys and values and hands them to
:func:`attend`, the one place that chooses between ``scaled_dot_product_attention`` (fused kernels)
and :func:`explicit_attention` (the one explicit implementation: raw scores for residual attention,
probabilities for a layer whose probabilities the next one reuses, pentad's dropout on the CPU).
:class:`LeadingQueries` runs a self-attention for the first positions' queries alone. Masks follow
``layers/masks.py``: a bool tensor where True means "may attend", or a float tensor added to the scores
(it then also carries any position bias).

Projections are plain ``nn.Linear`` modules; LoRA, pruning and int8 quantisation replace or wrap them
from outside (``layers/lora.py``, ``layers/pruning.py``, ``layers/quantized.py``). Where only some rows
of a projection are needed, :func:`~pentad.layers.block.output_rows` asks the projection for them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pentad.layers.block import Block, InitScheme, init_linear, output_rows
from pentad.layers.cache import LayerCache
from pentad.layers.dropout import dropout as dropout_fn
from pentad.layers.positions import apply_rotary


@dataclass
class AttentionInputs:
    """What every layer of a stack shares for one forward: built once, read by each layer.

    mask: bool [B|1, 1, q, k] (True = attend) or float [B|1, heads|1, q, k] (added to the scores,
    -inf where not allowed; carries relative/ALiBi bias) or None; is_causal: let SDPA apply the
    causal mask itself (only when ``mask`` is None and there is no cache offset); rotary: (cos, sin)
    for the query positions, each [B|1, 1, q, rot_dim], applied to queries and new keys; memory
    [B,m,H]: what cross-attention attends to (None once a cache holds its keys and values);
    probabilities: return the attention probabilities (a later layer reuses them), which takes
    the explicit path; softcap: soft-cap the scores to (-c, c), c * tanh(scores / c), before the mask
    (Gemma 2), which takes the explicit path too.
    """

    mask: Tensor | None = None
    is_causal: bool = False
    rotary: tuple[Tensor, Tensor] | None = None
    memory: Tensor | None = None
    probabilities: bool = False
    softcap: float | None = None

    def mask_for(self, dtype: torch.dtype) -> Tensor | None:
        """The mask in a dtype SDPA accepts next to queries of ``dtype`` (float masks must match
        under autocast); converted once per forward, not once per layer."""
        mask = self.mask
        if mask is None or mask.dtype == torch.bool or mask.dtype == dtype:
            return mask
        converted = getattr(self, "_converted", None)
        if converted is None or converted.dtype != dtype:
            converted = mask.to(dtype)
            object.__setattr__(self, "_converted", converted)
        return converted

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Queries and keys [B, heads, S, D] rotated by the rotary tables (unchanged without them)."""
        if self.rotary is None:
            return q, k
        cos, sin = self.rotary
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def with_probabilities(self) -> AttentionInputs:
        """The same inputs, asking for the attention probabilities."""
        return replace(self, probabilities=True)


# ---- the kernel -------------------------------------------------------------------------------


def _repeat_heads(x: Tensor, heads: int) -> Tensor:
    """Key or value heads [B, kv_heads, S, D] repeated to ``heads`` (grouped-query attention)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def attention_scores(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None,
                     prev_scores: Tensor | None = None, softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """(raw scores, probabilities), each fp32 [B, heads, q, k]: ``q k^T * scale`` (default
    1/sqrt(head_size)), soft-capped to ``softcap * tanh(scores / softcap)`` when given, plus
    ``prev_scores`` (RealFormer), then masked and softmaxed. A causal mask over more keys than queries
    is aligned to the bottom right (the queries are the last positions)."""
    k = _repeat_heads(k, q.shape[1])
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if prev_scores is not None:
        scores = scores + prev_scores
    raw = scores
    if is_causal:
        q_len, k_len = scores.shape[-2:]
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
        scores = scores.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return raw, scores.softmax(dim=-1)


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                       scale: float | None, dropout: float, prev_scores: Tensor | None = None,
                       softcap: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Explicit attention: (context [B, heads, q, D], raw scores (RealFormer adds them to the next
    layer's), probabilities before dropout (attention-weight reuse hands them to the next layer))."""
    raw, probs = attention_scores(q, k, mask, is_causal, scale, prev_scores, softcap)
    v = _repeat_heads(v, q.shape[1])
    return torch.matmul(dropout_fn(probs, dropout).to(v.dtype), v), raw, probs


def attend(q: Tensor, k: Tensor, v: Tensor, inputs: AttentionInputs, scale: float | None, dropout: float,
           prev_scores: Tensor | None = None, explicit: bool = False
           ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Attention of queries [B, heads, q, D] over keys and values [B, kv_heads, k, D]: (context
    [B, heads, q, D], raw scores, probabilities), the last two None on the fused path.

    The explicit path runs when asked (``explicit``, ``prev_scores``, ``inputs.probabilities`` or
    ``inputs.softcap``), and with dropout on the CPU, where SDPA draws its dropout with a slow
    ``bernoulli_`` (pentad's dropout, ``layers/dropout.py``, is faster), unless SDPA's causal mask must
    align to the top left (fewer queries than keys: :class:`LeadingQueries`). Otherwise
    ``scaled_dot_product_attention``."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    cpu_dropout = bool(dropout) and q.device.type == "cpu" and not (inputs.is_causal and q_len != k_len)
    if explicit or prev_scores is not None or inputs.probabilities or cpu_dropout or inputs.softcap is not None:
        return explicit_attention(q, k, v, inputs.mask, inputs.is_causal, scale, dropout, prev_scores,
                                  inputs.softcap)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=inputs.mask_for(q.dtype), is_causal=inputs.is_causal,
                                             dropout_p=dropout, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return context, None, None


# ---- the variants -----------------------------------------------------------------------------


class Attention(Block):
    """Base of the multi-head attention variants, [B,q,H] -> [B,q,H]: the head layout, the output
    projection ``out`` [H, q_dim], the initialisation; each subclass builds its input projections
    (:meth:`_input_projections`) and has one ``forward(x, inputs, cache=None, carried=None) ->
    (output [B,q,H], what it hands the next layer or None)``.

    ``num_kv_heads`` < ``num_heads`` is grouped-query attention (1 = multi-query): each key/value head
    serves num_heads / num_kv_heads query heads. ``head_size`` may differ from H / num_heads
    (T5-3B/11B). ``scale=False`` drops the 1/sqrt(head_size) factor (T5, whose initialisation absorbs
    it); a number is the factor itself (Gemma 3: 1/sqrt(query_pre_attn_scalar)). ``bias`` switches
    every projection's bias; ``qkv_bias`` (when not None) overrides it for the query, key and value
    projections alone (Qwen2: biased ``qkv``, unbiased ``out``).

    Declared: ``cross`` (attends to a memory), ``residual`` (hands its raw scores on), ``reuse``
    (may take the previous layer's probabilities), ``leading_queries`` (works with
    :class:`LeadingQueries`), ``window`` (the sliding window of a local layer's self-attention, None
    for a global one: set when the stack is assembled, read by the stack, which gives the layer that
    window's mask, rotary tables and rolling cache), ``softcap`` (the attention-score cap of
    :class:`AttentionInputs`, set and read alike).
    """

    cross: ClassVar[bool] = False
    residual: ClassVar[bool] = False
    reuse: ClassVar[bool] = False
    window: int | None = None
    softcap: float | None = None

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_size: int | None = None, dropout: float = 0.0, bias: bool = True, scale: bool | float = True,
                 qkv_bias: bool | None = None):
        super().__init__()
        num_kv_heads = num_kv_heads or num_heads
        head_size = head_size or hidden_size // num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.q_dim, self.kv_dim = num_heads * head_size, num_kv_heads * head_size
        self.dropout = dropout
        # None: SDPA's default 1/sqrt(head_size); False: unscaled; a number: that factor
        self.scale: float | None = (None if scale else 1.0) if isinstance(scale, bool) else float(scale)
        # query/key/value biases (Qwen: without an output bias)
        self._input_projections(hidden_size, bias if qkv_bias is None else qkv_bias)
        self.out = nn.Linear(self.q_dim, hidden_size, bias=bias)

    def _input_projections(self, hidden_size: int, bias: bool) -> None:  # pragma: no cover
        raise NotImplementedError

    def input_projections(self) -> tuple[nn.Module, ...]:
        """The query/key/value projections, in the order they are initialised."""
        raise NotImplementedError  # pragma: no cover

    def _init_t5_inputs(self, q_std: float, kv_std: float) -> None:  # pragma: no cover
        raise NotImplementedError

    def _input_roles(self) -> dict[str, dict[str, tuple[int, int]]]:  # pragma: no cover
        raise NotImplementedError

    def roles(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Projection name -> {role: (first row, end row)}: which output rows of each projection are the
        queries (``q``), keys (``k``), values (``v``) and the output (``o``). What adapts or cuts projections
        from outside (LoRA targets, ``training/lora.py``) reads the layout here."""
        return {**self._input_roles(), "out": {"o": (0, self.out.out_features)}}

    def resize_heads(self, num_heads: int) -> None:
        """Record that the projections, cut from outside (:func:`~pentad.layers.pruning.keep_heads`), now
        hold ``num_heads`` heads (of queries, and of keys and values: pruning needs as many of each)."""
        if self.num_kv_heads != self.num_heads:
            raise ValueError(f"cannot resize the heads of a block with {self.num_heads} query heads and "
                             f"{self.num_kv_heads} key/value heads (grouped-query attention)")
        self.num_heads = self.num_kv_heads = num_heads
        self.q_dim = self.kv_dim = num_heads * self.head_size

    def reset_parameters(self, std: float = 0.02, scheme: InitScheme = "normal") -> None:
        """``normal``: N(0, std) projections, zero biases. ``t5`` (Mesh TensorFlow): queries
        N(0, (H * head_size)^-1/2), keys and values N(0, H^-1/2), output N(0, q_dim^-1/2): T5 has no
        1/sqrt(head_size) in its scores, its initialisation absorbs it."""
        projections = (*self.input_projections(), self.out)
        if scheme == "normal":
            for linear in projections:
                init_linear(linear, std)
            return
        hidden = self.out.weight.shape[0]
        self._init_t5_inputs((hidden * self.head_size) ** -0.5, hidden ** -0.5)
        nn.init.normal_(self.out.weight, std=self.q_dim ** -0.5)
        for linear in projections:
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        b, s, _ = x.shape
        return x.view(b, s, heads, self.head_size).transpose(1, 2)  # [B, heads, S, D]

    def _output(self, context: Tensor) -> Tensor:
        """context [B, heads, q, D] -> the output projection's [B, q, H]."""
        b, _, q_len, _ = context.shape
        return self.out(context.transpose(1, 2).reshape(b, q_len, self.q_dim))

    def _dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    def _apply_probabilities(self, x: Tensor, probs: Tensor, v: Tensor, cache: LayerCache | None) -> Tensor:
        """Attention-weight reuse: the previous layer's probabilities [B, heads, q, k] (before dropout)
        times this layer's value heads ``v`` [B, kv_heads, q, D] (appended to the cache's), through this
        layer's own dropout and output projection."""
        q_len = x.shape[1]
        if cache is not None:
            v = cache.append_values(v)
        if probs.shape[1] != self.num_heads or probs.shape[2] != q_len or probs.shape[3] != v.shape[2]:
            raise ValueError(f"reused attention probabilities of shape {tuple(probs.shape)} do not fit this layer "
                             f"({self.num_heads} heads, {q_len} queries, {v.shape[2]} keys)")
        v = _repeat_heads(v, self.num_heads)
        return self._output(torch.matmul(dropout_fn(probs, self._dropout_p()).to(v.dtype), v))


class SelfAttention(Attention):
    """Self-attention with one fused projection ``qkv`` ([q_dim + 2 kv_dim, H], rows = queries, keys,
    values). ``forward`` returns the attention probabilities when ``inputs.probabilities`` (the next
    layer reuses them), else None; ``carried`` is not read."""

    leading_queries = True

    def _input_projections(self, hidden_size: int, bias: bool) -> None:
        self.qkv = nn.Linear(hidden_size, self.q_dim + 2 * self.kv_dim, bias=bias)

    def input_projections(self) -> tuple[nn.Module, ...]:
        return (self.qkv,)

    def _init_t5_inputs(self, q_std: float, kv_std: float) -> None:
        nn.init.normal_(self.qkv.weight[:self.q_dim], std=q_std)
        nn.init.normal_(self.qkv.weight[self.q_dim:], std=kv_std)

    def _input_roles(self) -> dict[str, dict[str, tuple[int, int]]]:
        q, kv = self.q_dim, self.kv_dim
        return {"qkv": {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}}

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B,S,H] -> query [B, heads, S, D], key and value [B, kv_heads, S, D] heads."""
        q, k, v = self.qkv(x).split((self.q_dim, self.kv_dim, self.kv_dim), dim=-1)
        return self._heads(q, self.num_heads), self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)

    def positioned(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None
                   ) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`project`, rotary positions applied and the cache's keys and values in front."""
        q, k, v = self.project(x)
        q, k = inputs.rotate(q, k)
        if cache is not None:
            k, v = cache.append(k, v)
        return q, k, v

    def forward(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None = None,
                carried: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        q, k, v = self.positioned(x, inputs, cache)
        context, _, probs = attend(q, k, v, inputs, self.scale, self._dropout_p())
        return self._output(context), probs


class ResidualAttention(SelfAttention):
    """RealFormer (He et al. 2021): the previous layer's raw scores (``carried``; None in the first
    layer) are added to this layer's, and this layer's raw scores are handed on, which needs the
    explicit path."""

    residual = True
    leading_queries = False

    def forward(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None = None,
                carried: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        q, k, v = self.positioned(x, inputs, cache)
        context, scores, _ = attend(q, k, v, inputs, self.scale, self._dropout_p(), prev_scores=carried,
                                    explicit=True)
        return self._output(context), scores


class CrossAttention(Attention):
    """Cross-attention (decoders): ``q`` [q_dim, H] projects the decoder side, ``kv`` [2 kv_dim, H] the
    encoder memory ``inputs.memory``; with a cache the memory's keys and values are computed on the
    first step and read from the cache afterwards."""

    cross = True

    def _input_projections(self, hidden_size: int, bias: bool) -> None:
        self.q = nn.Linear(hidden_size, self.q_dim, bias=bias)
        self.kv = nn.Linear(hidden_size, 2 * self.kv_dim, bias=bias)

    def input_projections(self) -> tuple[nn.Module, ...]:
        return (self.q, self.kv)

    def _init_t5_inputs(self, q_std: float, kv_std: float) -> None:
        nn.init.normal_(self.q.weight, std=q_std)
        nn.init.normal_(self.kv.weight, std=kv_std)

    def _input_roles(self) -> dict[str, dict[str, tuple[int, int]]]:
        kv = self.kv_dim
        return {"q": {"q": (0, self.q_dim)}, "kv": {"k": (0, kv), "v": (kv, 2 * kv)}}

    def _memory_heads(self, memory: Tensor, cache: LayerCache | None) -> tuple[Tensor, Tensor]:
        if cache is not None and cache.cross_keys is not None:
            return cache.cross_keys, cache.cross_values
        k, v = self.kv(memory).split(self.kv_dim, dim=-1)
        k, v = self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)
        if cache is not None:
            cache.store_cross(k, v)
        return k, v

    def forward(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None = None,
                carried: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        q = self._heads(self.q(x), self.num_heads)
        k, v = self._memory_heads(inputs.memory, cache)
        return self._output(attend(q, k, v, inputs, self.scale, self._dropout_p())[0]), None


class ReusingAttention(SelfAttention):
    """A layer of attention-weight reuse (:class:`AttentionReuse`) that keeps its query/key projections:
    handed the previous layer's attention probabilities (``carried``) it applies only its value rows of
    ``qkv`` and its output projection (and its own attention dropout); handed none (this forward's reuse
    plan has it recompute) it is the self-attention it extends. It passes the probabilities it used on
    when ``inputs.probabilities``."""

    reuse = True
    leading_queries = False

    def forward(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None = None,
                carried: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if carried is None:
            return super().forward(x, inputs, cache)
        start = self.q_dim + self.kv_dim
        v = self._heads(output_rows(self.qkv, x, start, start + self.kv_dim), self.num_kv_heads)
        return self._apply_probabilities(x, carried, v, cache), carried if inputs.probabilities else None


class ValueReuseAttention(Attention):
    """Pure attention-weight reuse (the layer never recomputes): no query/key projections at all, a value
    projection ``v`` [kv_dim, H] alone (``qkv`` is None). ``carried``: the previous layer's probabilities,
    required."""

    reuse = True
    qkv = None

    def _input_projections(self, hidden_size: int, bias: bool) -> None:
        self.v = nn.Linear(hidden_size, self.kv_dim, bias=bias)

    def input_projections(self) -> tuple[nn.Module, ...]:
        return (self.v,)

    def _init_t5_inputs(self, q_std: float, kv_std: float) -> None:
        nn.init.normal_(self.v.weight, std=kv_std)

    def _input_roles(self) -> dict[str, dict[str, tuple[int, int]]]:
        return {"v": {"v": (0, self.kv_dim)}}

    def forward(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None = None,
                carried: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if carried is None:
            raise ValueError("this attention layer has no query/key projections (attention_reuse with keep_qk "
                             "false): it can only reuse the previous layer's probabilities")
        v = self._heads(self.v(x), self.num_kv_heads)
        return self._apply_probabilities(x, carried, v, cache), carried if inputs.probabilities else None


class LeadingQueries:
    """Self-attention of the first ``n`` positions of ``x`` [B,S,H] over all S: [B,n,H] (the last layer
    of a stack whose heads read only those positions). A view of ``attention``'s projections, no
    parameters of its own: the query rows of ``qkv`` run on those positions alone
    (:func:`~pentad.layers.block.output_rows`); the mask and rotary tables are cut to their query rows."""

    def __init__(self, attention: SelfAttention, n: int):
        if not attention.leading_queries:
            raise ValueError(f"a {type(attention).__name__} does not run for leading queries alone")
        self.attention, self.n = attention, n

    def __call__(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        attention, n = self.attention, self.n
        q_dim, kv_dim = attention.q_dim, attention.kv_dim
        q = attention._heads(output_rows(attention.qkv, x[:, :n], 0, q_dim), attention.num_heads)
        k, v = output_rows(attention.qkv, x, q_dim, q_dim + 2 * kv_dim).split(kv_dim, dim=-1)
        k, v = attention._heads(k, attention.num_kv_heads), attention._heads(v, attention.num_kv_heads)
        if inputs.rotary is not None:
            cos, sin = inputs.rotary
            q, k = apply_rotary(q, cos[..., :n, :], sin[..., :n, :]), apply_rotary(k, cos, sin)
        mask = inputs.mask_for(q.dtype)
        if mask is not None and mask.shape[-2] > 1:
            mask = mask[..., :n, :]
        # is_causal with fewer queries than keys is aligned to the top left (query i sees keys 0..i):
        # right for the first n positions (attend keeps such a mask on SDPA); soft-capped scores take the
        # explicit path, which aligns it to the bottom right, so they get the mask itself
        is_causal = inputs.is_causal
        if is_causal and inputs.softcap is not None:
            mask, is_causal = torch.ones(n, x.shape[1], dtype=torch.bool, device=x.device).tril()[None, None], False
        leading = AttentionInputs(mask, is_causal, softcap=inputs.softcap)
        return attention._output(attend(q, k, v, leading, attention.scale, attention._dropout_p())[0])


@dataclass
class AttentionReuse:
    """Attention-weight reuse with stochastic recomputation: which reusing layers recompute.

    A layer whose attention block has ``reuse`` set takes the previous layer's attention
    probabilities instead of computing softmax(Q K^T) itself. While training, each reusing layer
    recomputes its own attention instead with probability ``recompute_p``, decided afresh at every
    training forward (micro-batch) by a generator of its own, seeded by ``seed`` and the count of
    training forwards so far (``draws``): the same decisions on every rank, whatever the ranks'
    global random states, and the same in an activation-checkpointing replay (the stack decides
    once per forward, outside the recomputed layers). In eval mode a reusing layer reuses
    (``eval_recompute=False``) or always recomputes (``True``).
    """

    recompute_p: float = 0.0
    eval_recompute: bool = False
    seed: int = 0
    draws: int = 0

    def plan(self, reusing: list[bool], training: bool) -> list[bool]:
        """Per layer: whether it computes its own attention (True for every non-reusing layer)."""
        if not training or self.recompute_p in (0.0, 1.0):
            recompute = self.eval_recompute if not training else self.recompute_p == 1.0
            return [not reuse or recompute for reuse in reusing]
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.draws)
        self.draws += 1
        draws = torch.rand(len(reusing), generator=generator).tolist()
        return [not reuse or draw < self.recompute_p for reuse, draw in zip(reusing, draws)]

    def stochastic(self, training: bool) -> bool:
        """Whether this forward's decisions are random (training with 0 < recompute_p < 1)."""
        return training and 0.0 < self.recompute_p < 1.0




def attention_probabilities(attention: Attention, x: Tensor, inputs: AttentionInputs) -> Tensor:
    """The attention distributions [B, heads, q, k] a self-attention block computes for its input ``x``
    [B,q,H] (no cache), recomputed from its ``qkv`` projection: what attention-transfer distillation reads
    (through a forward hook, so the block's own forward is untouched). Differentiable."""
    if not isinstance(attention, SelfAttention):
        raise ValueError("attention_probabilities reads self-attention blocks")
    q, k, _ = attention.positioned(x, inputs, None)
    return attention_scores(q, k, inputs.mask, inputs.is_causal, attention.scale, softcap=inputs.softcap)[1]
