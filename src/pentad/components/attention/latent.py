"""``latent``: multi-head latent attention (MLA; DeepSeek-V2, DeepSeek-AI 2024, section 2.1; DeepSeek-V3), the
``latent_attention`` section of a transformer stack.

Keys and values of every head are expanded from one shared low-rank latent per position, and the rotary
position signal travels in a separate part of each query and key head ("decoupled RoPE"):

* queries: ``q`` [A (P + R), H] (``q_lora_rank`` unset), or through a bottleneck of ``q_lora_rank`` r_q,
  ``q_up(q_norm(q_down x))`` with ``q_down`` [r_q, H], an RMSNorm and ``q_up`` [A (P + R), r_q]; each head's
  rows are its P = ``qk_nope_head_dim`` position-free dimensions, then its R = ``qk_rope_head_dim`` rotary ones;
* keys and values: ``kv_down`` [r + R, H] gives the latent c (r = ``kv_lora_rank``, then an RMSNorm
  ``kv_norm``) and one rotary key of R dimensions shared by all heads; ``kv_up`` [A P + A V, r] expands c into
  the heads' position-free keys (rows 0 .. A P, head by head) and their values (V = ``v_head_dim``, the rows
  after);
* scores ``(q_nope . k_nope + q_rope . k_rope) * scale`` with scale 1/sqrt(P + R), times
  ``(0.1 * mscale_all_dim * ln(factor) + 1)^2`` under YaRN RoPE scaling with ``mscale_all_dim`` (DeepSeek's
  attention-temperature adjustment; the cos/sin factor of YaRN itself is the rotary scheme's); ``out``
  [H, A V].

A key/value cache keeps the latent and the rotary key per position, r + R numbers (576 in DeepSeek-V3,
against 2 x 128 heads x 128-192 for full keys and values), and a forward with a cache uses the absorbed
projections (section 2.1.2): the key expansion folded into the queries (``q_nope W_k`` scores against c
directly) and the value expansion applied after attention (``(probs c) W_v``), one latent "head" shared by
all query heads. Without a cache (training, scoring) keys and values are expanded and attended as usual;
the two give the same outputs up to float rounding (tests/unit/components/test_latent_attention.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.attention import attention_sizes
from pentad.config.base import StrictModel
from pentad.layers.attention import Attention, AttentionInputs, attend
from pentad.layers.block import InitScheme
from pentad.layers.cache import LayerCache
from pentad.layers.norms import RMSNorm
from pentad.layers.positions import apply_rotary
from pentad.layers.transformer import BlockFactory
from pentad.registry import ATTENTION_BLOCKS


class LatentAttentionConfig(StrictModel):
    """``model.encoder.latent_attention`` / ``model.decoder.latent_attention``: multi-head latent attention
    (``components/attention/latent.py``) with the stack's ``num_heads`` heads and its ``bias`` on ``q_down``,
    ``kv_down`` and ``out``."""

    kv_lora_rank: int = Field(ge=1, description="width r of the shared key/value latent (DeepSeek-V3: 512)")
    q_lora_rank: int | None = Field(None, ge=1, description="width of the query bottleneck (DeepSeek-V3: 1536); "
                                    "unset: one plain query projection")
    qk_nope_head_dim: int = Field(ge=1, description="position-free query/key dimensions per head (128)")
    qk_rope_head_dim: int = Field(ge=2, description="rotary query/key dimensions per head, the rotary key shared "
                                  "by every head (64); the rotary scheme rotates this many")
    v_head_dim: int = Field(ge=1, description="value dimensions per head (128)")
    norm_eps: float = Field(1e-6, gt=0.0, description="eps of the two bottleneck RMSNorms (q_norm, kv_norm)")

    def problems(self, stack: Any) -> list[tuple[str, str]]:
        """What does not fit the stack ``stack`` (a ``TransformerStackConfig``)."""
        problems = []
        if self.qk_rope_head_dim % 2:
            problems.append(("latent_attention.qk_rope_head_dim", f"{self.qk_rope_head_dim} is odd; rotary "
                                                                  "dimensions rotate in pairs"))
        if stack.positions != "rotary":
            problems.append(("latent_attention", f"set with positions '{stack.positions}': latent attention carries "
                                                 "its positions in rotary key dimensions; set positions: rotary"))
        if stack.rotary_dim not in (None, self.qk_rope_head_dim):
            problems.append(("rotary_dim", f"{stack.rotary_dim} with latent_attention: the rotated dimensions are "
                                           f"qk_rope_head_dim ({self.qk_rope_head_dim}); leave rotary_dim unset"))
        for key in ("num_kv_heads", "head_size"):
            if getattr(stack, key) is not None:
                problems.append((key, f"{getattr(stack, key)} with latent_attention, whose heads are sized by its own "
                                      "section (every head reads the one latent); leave it unset"))
        clashes = [name for name in ("residual_attention", "share_layers") if getattr(stack, name)]
        if stack.attention_reuse is not None:
            clashes.append("attention_reuse")
        if clashes:
            problems.append(("latent_attention", f"set with {', '.join(clashes)}: one attention variant per stack; "
                                                 "unset one of them"))
        return problems


def softmax_scale(head_dim: int, rope_scaling: Any) -> float:
    """1/sqrt(head_dim), times DeepSeek's YaRN adjustment ``(0.1 * mscale_all_dim * ln(factor) + 1)^2`` when
    ``rope_scaling`` (resolved) is YaRN with ``mscale_all_dim`` and a factor above one."""
    scale = head_dim ** -0.5
    all_dim = getattr(rope_scaling, "mscale_all_dim", None) if rope_scaling is not None else None
    factor = getattr(rope_scaling, "factor", None) or 1.0
    if all_dim and factor > 1:
        scale *= (0.1 * all_dim * math.log(factor) + 1.0) ** 2
    return scale


@dataclass(frozen=True)
class LatentSizes:
    """The widths of a :class:`LatentAttention` (the fields of :class:`LatentAttentionConfig`)."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    norm_eps: float = 1e-6


class LatentAttention(Attention):
    """Multi-head latent attention, [B,q,H] -> [B,q,H] (see the module docstring for the projections).

    The :class:`~pentad.layers.attention.Attention` base holds ``out`` [H, A V] (its head size is the value
    width V); ``scale`` is the softmax scale itself. Roles: ``q`` the query rows (of ``q_up``, or ``q``),
    ``k`` and ``v`` the two halves of ``kv_up``, ``o`` the output."""

    def __init__(self, hidden_size: int, num_heads: int, sizes: LatentSizes, scale: float, dropout: float = 0.0,
                 bias: bool = False):
        # read by _input_projections, which the base's constructor calls
        self.kv_lora_rank, self.q_lora_rank, self.norm_eps = sizes.kv_lora_rank, sizes.q_lora_rank, sizes.norm_eps
        self.nope_dim, self.rope_dim, self.v_dim = sizes.qk_nope_head_dim, sizes.qk_rope_head_dim, sizes.v_head_dim
        super().__init__(hidden_size, num_heads, head_size=sizes.v_head_dim, dropout=dropout, bias=bias)
        self.scale = scale

    def _input_projections(self, hidden_size: int, bias: bool) -> None:
        heads, qk = self.num_heads, self.nope_dim + self.rope_dim
        if self.q_lora_rank is None:
            self.q = nn.Linear(hidden_size, heads * qk, bias=False)
        else:
            self.q_down = nn.Linear(hidden_size, self.q_lora_rank, bias=bias)
            self.q_norm = RMSNorm(self.q_lora_rank, self.norm_eps)
            self.q_up = nn.Linear(self.q_lora_rank, heads * qk, bias=False)
        self.kv_down = nn.Linear(hidden_size, self.kv_lora_rank + self.rope_dim, bias=bias)
        self.kv_norm = RMSNorm(self.kv_lora_rank, self.norm_eps)
        self.kv_up = nn.Linear(self.kv_lora_rank, heads * (self.nope_dim + self.v_dim), bias=False)

    def input_projections(self) -> tuple[nn.Module, ...]:
        queries = (self.q,) if self.q_lora_rank is None else (self.q_down, self.q_up)
        return (*queries, self.kv_down, self.kv_up)

    def _init_t5_inputs(self, q_std: float, kv_std: float) -> None:
        for linear in self.input_projections():  # fan-in scaled, like every other T5-initialised projection
            weight = cast(Tensor, linear.weight)
            nn.init.normal_(weight, std=weight.shape[1] ** -0.5)

    def reset_parameters(self, std: float = 0.02, scheme: InitScheme = "normal") -> None:
        super().reset_parameters(std, scheme)
        for norm in (getattr(self, "q_norm", None), self.kv_norm):
            if norm is not None:
                norm.reset_parameters()

    def _input_roles(self) -> dict[str, dict[str, tuple[int, int]]]:
        keys = self.num_heads * self.nope_dim
        query = "q" if self.q_lora_rank is None else "q_up"
        return {query: {"q": (0, self.num_heads * (self.nope_dim + self.rope_dim))},
                "kv_up": {"k": (0, keys), "v": (keys, keys + self.num_heads * self.v_dim)}}

    def resize_heads(self, num_heads: int) -> None:
        raise ValueError("latent attention's heads are not pruned: every head reads the one shared latent "
                         "(prune its feed-forward units instead)")

    def _queries(self, x: Tensor) -> Tensor:
        q = self.q(x) if self.q_lora_rank is None else self.q_up(self.q_norm(self.q_down(x)))
        b, s, _ = x.shape
        return q.view(b, s, self.num_heads, self.nope_dim + self.rope_dim).transpose(1, 2)

    def forward(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None = None,
                carried: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        b, s, _ = x.shape
        q_nope, q_rope = self._queries(x).split((self.nope_dim, self.rope_dim), dim=-1)
        latent, k_rope = self.kv_down(x).split((self.kv_lora_rank, self.rope_dim), dim=-1)
        latent, k_rope = self.kv_norm(latent), k_rope[:, None]  # [B,S,r], [B,1,S,R]: one rotary key for all heads
        if inputs.rotary is not None:
            cos, sin = inputs.rotary
            q_rope, k_rope = apply_rotary(q_rope, cos, sin), apply_rotary(k_rope, cos, sin)
        if cache is not None:
            return self._absorbed(q_nope, q_rope, torch.cat((latent[:, None], k_rope), dim=-1), inputs, cache), None
        heads = self.num_heads
        k_nope, v = self.kv_up(latent).split((heads * self.nope_dim, heads * self.v_dim), dim=-1)
        k_nope = k_nope.view(b, s, heads, self.nope_dim).transpose(1, 2)
        k = torch.cat((k_nope, k_rope.expand(-1, heads, -1, -1)), dim=-1)
        q = torch.cat((q_nope, q_rope), dim=-1)
        context, _, probs = attend(q, k, v.view(b, s, heads, self.v_dim).transpose(1, 2), inputs, self.scale,
                                   self._dropout_p())
        return self._output(context), probs

    def _absorbed(self, q_nope: Tensor, q_rope: Tensor, rows: Tensor, inputs: AttentionInputs,
                  cache: LayerCache) -> Tensor:
        """Attention over the cached latent rows ([B,1,T,r+R]: c, then the rotary key) with the key expansion
        folded into the queries and the value expansion applied to the attended latent."""
        rows = cache.append_latent(rows)
        w_k, w_v = self._expansion()
        query = torch.cat((torch.matmul(q_nope, w_k), q_rope), dim=-1)  # [B,A,q,r+R]
        context, _, _ = attend(query, rows, rows[..., :self.kv_lora_rank], inputs, self.scale, self._dropout_p())
        return self._output(torch.matmul(context, w_v.transpose(1, 2)))  # [B,A,q,r] -> [B,A,q,V]

    def _expansion(self) -> tuple[Tensor, Tensor]:
        """The key and value expansions of ``kv_up`` per head, [A, P, r] and [A, V, r]. A projection replaced
        from outside (LoRA, int8) is read as the linear map it computes (applied to the identity)."""
        up, r = self.kv_up, self.kv_lora_rank
        if type(up) is nn.Linear:
            weight = up.weight
        else:
            weight = up(torch.eye(r, device=self.kv_norm.weight.device, dtype=self.kv_norm.weight.dtype)).t()
        heads = self.num_heads
        w_k, w_v = weight.split((heads * self.nope_dim, heads * self.v_dim), dim=0)
        return w_k.view(heads, self.nope_dim, r), w_v.view(heads, self.v_dim, r)


@ATTENTION_BLOCKS.register("latent")
class LatentAttentionBlock:
    @staticmethod
    def applies(cfg: Any) -> bool:
        return cfg.latent_attention is not None

    @staticmethod
    def factory(cfg: Any, model: Any) -> BlockFactory:
        sizes = attention_sizes(cfg, model)
        latent: LatentAttentionConfig = cfg.latent_attention
        scaling = cfg.rope_scaling.resolved(model.max_seq_length) if cfg.rope_scaling is not None else None
        scale = softmax_scale(latent.qk_nope_head_dim + latent.qk_rope_head_dim, scaling)
        widths = LatentSizes(**latent.model_dump())
        return lambda index: LatentAttention(sizes["hidden_size"], sizes["num_heads"], widths, scale,
                                             sizes["dropout"], sizes["bias"])
