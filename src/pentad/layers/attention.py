"""Multi-head attention (self and cross), with grouped-query heads and a key/value cache.

Scores go through ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels) unless
residual attention needs the raw scores or a later layer reuses this layer's probabilities
(attention-weight reuse, :class:`AttentionReuse`). Masks follow ``layers/masks.py``: a bool tensor where True
means "may attend", or a float tensor added to the scores (it then also carries any position bias).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pentad.layers.block import Block, InitScheme, init_linear
from pentad.layers.cache import LayerCache
from pentad.layers.dropout import dropout as dropout_fn
from pentad.layers.positions import apply_rotary


@dataclass
class AttentionInputs:
    """What every layer of a stack shares for one forward: built once, read by each layer.

    mask: bool [B|1, 1, q, k] (True = attend) or float [B|1, heads|1, q, k] (added to the scores,
    -inf where not allowed; carries relative/ALiBi bias) or None; is_causal: let SDPA apply the
    causal mask itself (only when ``mask`` is None and there is no cache offset); rotary: (cos, sin)
    for the query positions, each [B|1, 1, q, rot_dim], applied to queries and new keys.
    """

    mask: Tensor | None = None
    is_causal: bool = False
    rotary: tuple[Tensor, Tensor] | None = None

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


class Attention(Block):
    """Multi-head attention, [B,q,H] -> [B,q,H].

    Self-attention keeps one fused projection ``qkv`` ([q_dim + 2 kv_dim, H], rows = queries, keys,
    values); cross-attention has ``q`` [q_dim, H] on the decoder side and ``kv`` [2 kv_dim, H] on the
    encoder memory. ``num_kv_heads`` < ``num_heads`` is grouped-query attention (1 = multi-query):
    each key/value head serves num_heads / num_kv_heads query heads. ``head_size`` may differ from
    H / num_heads (T5-3B/11B). ``scale=False`` drops the 1/sqrt(head_size) factor (T5, whose
    initialisation absorbs it). ``residual`` (RealFormer, He et al. 2021) adds the previous layer's
    raw scores to this layer's and returns its own, which needs the explicit (non-fused) path. ``bias`` switches
    every projection's bias; ``qkv_bias`` (when not None) overrides it for the query, key and value
    projections alone (Qwen2: biased ``qkv``, unbiased ``out``).

    ``reuse`` (attention-weight reuse, :class:`AttentionReuse`): the stack may hand this layer the
    previous layer's attention probabilities instead of letting it compute its own; it then applies
    only its value and output projections. With ``reuse_qk=False`` (pure reuse: the layer never
    recomputes) it has no query/key projections at all: ``v`` [kv_dim, H] replaces ``qkv``.
    """

    leading_queries = True

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_size: int | None = None, dropout: float = 0.0, bias: bool = True,
                 scale: bool = True, cross: bool = False, residual: bool = False, reuse: bool = False,
                 reuse_qk: bool = True, qkv_bias: bool | None = None):
        super().__init__()
        in_bias = bias if qkv_bias is None else qkv_bias  # query/key/value biases (Qwen: without an output bias)
        self.residual = residual
        self.reuse = reuse
        num_kv_heads = num_kv_heads or num_heads
        head_size = head_size or hidden_size // num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.q_dim, self.kv_dim = num_heads * head_size, num_kv_heads * head_size
        self.dropout = dropout
        self.scale = None if scale else 1.0  # None: SDPA's default 1/sqrt(head_size)
        self.cross = cross
        if cross and reuse:
            raise ValueError("cross-attention cannot reuse self-attention probabilities")
        self.v: nn.Linear | None = None  # the pure-reuse layer's value projection
        if cross:
            self.q = nn.Linear(hidden_size, self.q_dim, bias=in_bias)
            self.kv = nn.Linear(hidden_size, 2 * self.kv_dim, bias=in_bias)
        elif reuse and not reuse_qk:
            self.qkv: nn.Linear | None = None
            self.v = nn.Linear(hidden_size, self.kv_dim, bias=in_bias)
        else:
            self.qkv = nn.Linear(hidden_size, self.q_dim + 2 * self.kv_dim, bias=in_bias)
        self.out = nn.Linear(self.q_dim, hidden_size, bias=bias)

    def reset_parameters(self, std: float = 0.02, scheme: InitScheme = "normal") -> None:
        """``normal``: N(0, std) projections, zero biases. ``t5`` (Mesh TensorFlow): queries
        N(0, (H * head_size)^-1/2), keys and values N(0, H^-1/2), output N(0, q_dim^-1/2): T5 has no
        1/sqrt(head_size) in its scores, its initialisation absorbs it."""
        projections = (self.q, self.kv, self.out) if self.cross else (self.qkv, self.v, self.out)
        projections = tuple(linear for linear in projections if linear is not None)
        if scheme == "normal":
            for linear in projections:
                init_linear(linear, std)
            return
        hidden = self.out.weight.shape[0]
        q_std, kv_std = (hidden * self.head_size) ** -0.5, hidden ** -0.5
        if self.v is not None:
            nn.init.normal_(self.v.weight, std=kv_std)
        elif self.cross:
            nn.init.normal_(self.q.weight, std=q_std)
            nn.init.normal_(self.kv.weight, std=kv_std)
        else:
            nn.init.normal_(self.qkv.weight[:self.q_dim], std=q_std)
            nn.init.normal_(self.qkv.weight[self.q_dim:], std=kv_std)
        nn.init.normal_(self.out.weight, std=self.q_dim ** -0.5)
        for linear in projections:
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        b, s, _ = x.shape
        return x.view(b, s, heads, self.head_size).transpose(1, 2)  # [B, heads, S, D]

    def forward(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None = None,
                memory: Tensor | None = None, prev_scores: Tensor | None = None,
                prev_probs: Tensor | None = None, want_probs: bool = False, queries: int | None = None
                ) -> tuple[Tensor, Tensor | None]:
        """x [B,q,H]; memory [B,m,H] for cross-attention (ignored when the cache already holds its
        keys/values); prev_scores: the previous layer's raw scores for residual attention;
        prev_probs: the previous layer's attention probabilities [B,heads,q,k] (before dropout) to
        use instead of this layer's own (attention-weight reuse); want_probs: return the
        probabilities this layer used, for the next layer to reuse (the explicit path instead of SDPA).
        ``queries`` (self-attention without a cache, residual attention or reuse): only the first
        ``queries`` positions of ``x`` ask, all of them give keys and values; the output then covers
        those positions alone, [B,queries,H] (what a head reading only the first positions needs
        of a stack's last layer).

        Returns (output [B,q,H], raw scores [B,heads,q,k] when residual attention is on, the
        probabilities [B,heads,q,k] (float32) when want_probs, else None).
        """
        if queries is not None:
            if self.cross or cache is not None or self.residual or prev_probs is not None or want_probs:
                raise ValueError("queries at the first positions only is for self-attention without a cache, "
                                 "residual attention or attention-weight reuse")
            return self._leading(x, inputs, queries), None
        b, q_len, _ = x.shape
        if prev_probs is not None:
            return self._reuse(x, prev_probs, cache, want_probs)
        if not self.cross and self.qkv is None:
            raise ValueError("this attention layer has no query/key projections (attention_reuse with keep_qk "
                             "false): it can only reuse the previous layer's probabilities")
        if self.cross:
            q = self._heads(self.q(x), self.num_heads)
            if cache is not None and cache.cross_keys is not None:
                k, v = cache.cross_keys, cache.cross_values
            else:
                k, v = self.kv(memory).split(self.kv_dim, dim=-1)
                k, v = self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)
                if cache is not None:
                    cache.store_cross(k, v)
        else:
            q, k, v = self.qkv(x).split((self.q_dim, self.kv_dim, self.kv_dim), dim=-1)
            q, k, v = self._heads(q, self.num_heads), self._heads(k, self.num_kv_heads), self._heads(
                v, self.num_kv_heads)
            if inputs.rotary is not None:
                cos, sin = inputs.rotary
                q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            if cache is not None:
                k, v = cache.append(k, v)
        dropout = self.dropout if self.training else 0.0
        scores = None
        if self.residual:
            context, scores, _ = _attention_with_scores(q, k, v, inputs.mask, inputs.is_causal, self.scale,
                                                        prev_scores, dropout)
        elif want_probs:
            context, _, scores = _attention_with_scores(q, k, v, inputs.mask, inputs.is_causal, self.scale,
                                                        None, dropout)
        elif dropout and q.device.type == "cpu":
            # SDPA's CPU path draws attention dropout with bernoulli_ (slow): the explicit computation
            # uses pentad's dropout (layers/dropout.py)
            context = _attention_with_scores(q, k, v, inputs.mask, inputs.is_causal, self.scale, None, dropout)[0]
        else:
            gqa = self.num_kv_heads != self.num_heads
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=inputs.mask_for(q.dtype),
                                                     is_causal=inputs.is_causal,
                                                     dropout_p=dropout, scale=self.scale, enable_gqa=gqa)
        return self.out(context.transpose(1, 2).reshape(b, q_len, self.q_dim)), scores

    def _leading(self, x: Tensor, inputs: AttentionInputs, n: int) -> Tensor:
        """Self-attention of the first ``n`` positions of ``x`` [B,S,H] over all S: [B,n,H]. The query rows
        of ``qkv`` run on those positions alone (the whole projection runs and is sliced when ``qkv`` is
        wrapped, by LoRA say); the mask and rotary tables are cut to their query rows."""
        if self.qkv is None:
            raise ValueError("this attention layer has no query/key projections (attention_reuse with keep_qk "
                             "false): it can only reuse the previous layer's probabilities")
        b = x.shape[0]
        if type(self.qkv) is nn.Linear:
            weight, bias = self.qkv.weight, self.qkv.bias
            q = F.linear(x[:, :n], weight[:self.q_dim], bias[:self.q_dim] if bias is not None else None)
            k, v = F.linear(x, weight[self.q_dim:], bias[self.q_dim:] if bias is not None else None).split(
                self.kv_dim, dim=-1)
        else:
            q, k, v = self.qkv(x).split((self.q_dim, self.kv_dim, self.kv_dim), dim=-1)
            q = q[:, :n]
        q, k, v = self._heads(q, self.num_heads), self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)
        if inputs.rotary is not None:
            cos, sin = inputs.rotary
            q, k = apply_rotary(q, cos[..., :n, :], sin[..., :n, :]), apply_rotary(k, cos, sin)
        mask = inputs.mask_for(q.dtype)
        if mask is not None and mask.shape[-2] > 1:
            mask = mask[..., :n, :]
        # is_causal with fewer queries than keys is aligned to the top left (query i sees keys 0..i):
        # right for the first n positions
        dropout = self.dropout if self.training else 0.0
        # as in forward (not when causal: _attention_with_scores aligns a causal mask to the bottom right)
        if dropout and q.device.type == "cpu" and not inputs.is_causal:
            context = _attention_with_scores(q, k, v, mask, inputs.is_causal, self.scale, None, dropout)[0]
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=inputs.is_causal,
                                                     dropout_p=dropout, scale=self.scale,
                                                     enable_gqa=self.num_kv_heads != self.num_heads)
        return self.out(context.transpose(1, 2).reshape(b, n, self.q_dim))

    def _values(self, x: Tensor) -> Tensor:
        """The value heads [B, kv_heads, q, D] alone: the query/key rows of ``qkv`` are not computed
        (unless ``qkv`` is wrapped, by LoRA say: then the whole projection runs and V is sliced)."""
        if self.v is not None:
            v = self.v(x)
        elif type(self.qkv) is nn.Linear:
            start = self.q_dim + self.kv_dim
            bias = self.qkv.bias[start:] if self.qkv.bias is not None else None
            v = F.linear(x, self.qkv.weight[start:], bias)
        else:
            v = self.qkv(x)[..., self.q_dim + self.kv_dim:]
        return self._heads(v, self.num_kv_heads)

    def _reuse(self, x: Tensor, probs: Tensor, cache: LayerCache | None, want_probs: bool
               ) -> tuple[Tensor, Tensor | None]:
        """softmax(Q K^T) of the previous layer times this layer's values, then this layer's output
        projection (and its own attention dropout)."""
        b, q_len, _ = x.shape
        v = self._values(x)
        if cache is not None:
            v = cache.append_values(v)
        if probs.shape[1] != self.num_heads or probs.shape[2] != q_len or probs.shape[3] != v.shape[2]:
            raise ValueError(f"reused attention probabilities of shape {tuple(probs.shape)} do not fit this layer "
                             f"({self.num_heads} heads, {q_len} queries, {v.shape[2]} keys)")
        if self.num_kv_heads != self.num_heads:
            v = v.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        dropout = self.dropout if self.training else 0.0
        context = torch.matmul(dropout_fn(probs, dropout).to(v.dtype), v)
        return self.out(context.transpose(1, 2).reshape(b, q_len, self.q_dim)), probs if want_probs else None


def _attention_with_scores(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                           scale: float | None, prev_scores: Tensor | None, dropout: float
                           ) -> tuple[Tensor, Tensor, Tensor]:
    """Explicit attention: (context, raw scores (RealFormer adds them to the next layer's),
    probabilities before dropout (attention-weight reuse hands them to the next layer))."""
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if prev_scores is not None:
        scores = scores + prev_scores
    raw = scores
    if is_causal:
        q_len, k_len = scores.shape[-2:]
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
        scores = scores.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = scores.softmax(dim=-1)
    return torch.matmul(dropout_fn(probs, dropout).to(v.dtype), v), raw, probs


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
    if attention.cross:
        raise ValueError("attention_probabilities reads self-attention blocks")
    q, k, _ = attention.qkv(x).split((attention.q_dim, attention.kv_dim, attention.kv_dim), dim=-1)
    q, k = attention._heads(q, attention.num_heads), attention._heads(k, attention.num_kv_heads)
    if inputs.rotary is not None:
        cos, sin = inputs.rotary
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scale = attention.scale if attention.scale is not None else attention.head_size ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if inputs.is_causal:
        q_len, k_len = scores.shape[-2:]
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=x.device).tril(k_len - q_len)
        scores = scores.masked_fill(~allowed, float("-inf"))
    if inputs.mask is not None:
        mask = inputs.mask
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    return scores.softmax(dim=-1)
