"""Transformer encoder: a stack of transformer layers with a configurable attention mask.

With ``mask: causal`` (or ``prefix``) this is also the body of decoder-only models (GPT-2, LLaMA,
BLOOM): "encoder" names the slot, not the direction. The same config fields (minus ``mask``)
configure the decoder slot's transformer (``components/decoders/transformer.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from torch import Tensor

from pentad.components import positions as _positions  # noqa: F401  (registers the position schemes)
from pentad.components.attention.latent import LatentAttentionConfig
from pentad.components.attention.qk_norm import QKNormOrder
from pentad.components.attention.reuse import AttentionReuseConfig
from pentad.components.base import Encoder
from pentad.components.blocks import FFN_BLOCKS, MoEConfig, stack_parts
from pentad.components.norms import norm_description, norm_kinds
from pentad.components.positions.rope_scaling import RopeScaling
from pentad.config.base import StrictModel
from pentad.layers.activations import ACTIVATION_NAMES
from pentad.layers.cache import KVCache
from pentad.layers.transformer import TransformerStack
from pentad.registry import ENCODERS, POSITION_SCHEMES

Activation = Literal[ACTIVATION_NAMES]  # type: ignore[valid-type]
Norm = Literal[norm_kinds()]  # type: ignore[valid-type]
FfnKind = Literal[tuple(FFN_BLOCKS.names())]  # type: ignore[valid-type]
PositionKind = Literal[tuple(POSITION_SCHEMES.names())]  # type: ignore[valid-type]


class TransformerStackConfig(StrictModel):
    """Fields shared by the transformer encoder and decoder."""

    num_layers: int = Field(12, ge=1)
    num_heads: int = Field(12, ge=1)
    num_kv_heads: int | None = Field(None, ge=1, description="key/value heads: fewer than num_heads is "
                                     "grouped-query attention, 1 is multi-query; default num_heads")
    head_size: int | None = Field(None, ge=1, description="per-head width; default hidden_size / num_heads")
    ffn_size: int | None = Field(None, ge=1, description="feed-forward width; default 4 * hidden_size")
    ffn: FfnKind = Field("dense", description="feed-forward block (components/blocks.py): dense down(act(up x)); "
                         "gated down(act(gate x) * up x), i.e. SwiGLU with silu, GeGLU with gelu")
    moe: MoEConfig | None = Field(None, description="the mixture of experts of ffn: moe (docs/moe.md); default "
                                  "8 experts, top-2, gated, dropless")
    activation: Activation = "gelu"
    norm: Norm = Field("layernorm", description=f"the layers' norms (components/norms): {norm_description()}")
    norm_position: Literal["post", "pre", "sandwich"] = Field(
        "post", description="post: x = norm(x + f(x)) (BERT); pre: x = x + f(norm(x)) (GPT-2, LLaMA); sandwich: "
        "x = x + norm(f(norm(x))), each sub-layer's output normalised too (Gemma 2/3)")
    final_norm: bool | None = Field(None, description="norm after the last layer; default: True for pre-norm and "
                                    "sandwich")
    final_norm_kind: Norm | None = Field(None, description="kind of the final norm; default: norm (TencentPretrain's "
                                         "decoder ends with a layernorm_unbiased whatever its layers use, t5 "
                                         "excepted)")
    final_norm_eps: float | None = Field(None, gt=0.0, description="eps of the final norm; default: layer_norm_eps")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    attention_dropout: float | None = Field(None, ge=0.0, lt=1.0, description="default: dropout")
    drop_path: float = Field(0.0, ge=0.0, lt=1.0, description="stochastic depth in training: each layer's "
                             "attention and feed-forward branches dropped per example, at a rate rising "
                             "linearly from 0 (first layer) to this (last layer), as DeiT and BEiT train "
                             "ViTs (with share_layers: this rate throughout); 0: off")
    bias: bool = Field(True, description="biases in the attention and feed-forward projections")
    qkv_bias: bool | None = Field(None, description="biases in the query/key/value projections alone; default: "
                                  "bias (Qwen2: true with bias false)")
    layer_norm_eps: float = Field(1e-12, gt=0.0)
    attention_scale: bool = Field(True, description="scale scores by 1/sqrt(head_size) (off for T5)")
    attention_scale_size: float | None = Field(
        None, gt=0.0, description="scale scores by 1/sqrt(attention_scale_size) instead of 1/sqrt(head_size) "
        "(Gemma 3's query_pre_attn_scalar); needs attention_scale")
    attention_softcap: float | None = Field(
        None, gt=0.0, description="soft-cap the attention scores to (-c, c): c * tanh(scores / c) before the mask "
        "and softmax (Gemma 2: 50); takes the explicit (non-fused) attention path; off when unset")
    qk_norm: QKNormOrder | None = Field(
        None, description="a norm of the stack's kind (norm, layer_norm_eps) on every query and key head, "
        "before_rotary (Qwen3, Gemma 3) or after_rotary (HunYuan); off when unset")
    positions: PositionKind = Field(
        "none", description="position signal inside attention (components/positions): rotary (RoPE), relative "
        "(T5 bucketed bias), alibi; learned/sinusoidal absolute positions are embedding parts instead")
    rotary_base: float = Field(10000.0, gt=0.0)
    rotary_dim: int | None = Field(None, ge=2, description="rotated dimensions per head; default all")
    rope_scaling: RopeScaling | None = Field(
        None, description="RoPE scaling of rotary positions (components/positions/rope_scaling.py), by type: linear, "
        "dynamic (NTK), yarn, llama3, longrope, with transformers' rope_parameters keys; unscaled when unset")
    sliding_window: int | None = Field(
        None, ge=1, description="sliding-window attention: a query sees itself and the sliding_window - 1 positions "
        "before it (bidirectional: the keys less than sliding_window away), in the layers window_pattern marks "
        "local (every layer when it is unset); the key/value cache of those layers keeps only that many "
        "positions (Mistral 7B v0.1: 4096; Gemma 3: 512 or 1024); unset: every layer global")
    window_pattern: list[Literal["local", "global"]] | None = Field(
        None, min_length=1, description="which layers are local (sliding_window) and which global, repeated over "
        "the stack: layer i is window_pattern[i % len] (Gemma 3: five local, one global); needs sliding_window")
    rotary_local_base: float | None = Field(
        None, gt=0.0, description="rotary base of the local (sliding-window) layers, which are then not "
        "rope-scaled (Gemma 3: 10000 locally, rotary_base 1e6 globally); default: the global layers' rotary")
    relative_buckets: int = Field(32, ge=2)
    relative_max_distance: int = Field(128, ge=2)
    share_layers: bool = Field(False, description="one layer applied num_layers times (ALBERT)")
    residual_attention: bool = Field(False, description="add the previous layer's raw scores (RealFormer)")
    attention_reuse: AttentionReuseConfig | None = Field(
        None, description="attention-weight reuse with stochastic recomputation: every k-th layer computes its "
        "attention probabilities, the layers between reuse them (docs/architecture.md); off when unset")
    latent_attention: LatentAttentionConfig | None = Field(
        None, description="multi-head latent attention (DeepSeek-V2/V3): low-rank queries and a shared key/value "
        "latent with decoupled rotary keys, the latent cached (docs/architecture.md); off when unset")

    def rotary_width(self, hidden_size: int) -> int:
        """Rotated dimensions per query/key head: rotary_dim, or latent attention's qk_rope_head_dim, or
        the whole head."""
        if self.rotary_dim is not None:
            return self.rotary_dim
        if self.latent_attention is not None:
            return self.latent_attention.qk_rope_head_dim
        return self.head_size or hidden_size // self.num_heads

    def check(self, model) -> list[tuple[str, str]]:
        """Problems that need the model-level sizes: (sub-path, message)."""
        problems = []
        if self.head_size is None and model.hidden_size % self.num_heads and self.latent_attention is None:
            problems.append(("num_heads", f"hidden_size {model.hidden_size} is not divisible by num_heads "
                                          f"{self.num_heads} (each head gets hidden_size / num_heads dimensions; "
                                          "or set head_size)"))
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            problems.append(("num_kv_heads", f"num_heads {self.num_heads} is not a multiple of num_kv_heads "
                                             f"{self.num_kv_heads} (each key/value head serves a whole group of "
                                             "query heads)"))
        head = self.head_size or model.hidden_size // self.num_heads
        rot = self.rotary_width(model.hidden_size)
        if self.latent_attention is not None:
            problems += self.latent_attention.problems(self)
        elif self.positions == "rotary" and (rot % 2 or rot > head):
            problems.append(("rotary_dim", f"rotary needs an even number of dimensions <= head size {head}; "
                                           f"got {rot}"))
        if self.rotary_dim is not None and self.positions != "rotary":
            problems.append(("rotary_dim", f"set but positions is '{self.positions}', not 'rotary'"))
        if self.rope_scaling is not None:
            if self.positions != "rotary":
                problems.append(("rope_scaling", f"set but positions is '{self.positions}', not 'rotary'; RoPE "
                                                 "scaling changes rotary frequencies"))
            else:
                problems += self.rope_scaling.problems(rot)
        problems += self._moe_problems()
        problems += self._reuse_problems()
        if self.qk_norm is not None and (self.residual_attention or self.attention_reuse is not None):
            other = "residual_attention" if self.residual_attention else "attention_reuse"
            problems.append(("qk_norm", f"set with {other}: the query/key norms are a self-attention variant of their "
                                        f"own, which {other} would replace; unset one of them"))
        problems += self._window_problems()
        if self.attention_scale_size is not None and not self.attention_scale:
            problems.append(("attention_scale_size", "set with attention_scale false, which leaves the scores "
                                                     "unscaled; drop one of them"))
        return problems

    def layer_window(self, index: int) -> int | None:
        """The sliding window of layer ``index`` (None: a global layer)."""
        if self.sliding_window is None:
            return None
        pattern = self.window_pattern or ["local"]
        return self.sliding_window if pattern[index % len(pattern)] == "local" else None

    def _window_problems(self) -> list[tuple[str, str]]:
        problems = []
        if self.window_pattern is not None and self.sliding_window is None:
            problems.append(("window_pattern", "set without sliding_window: there is no window for the local layers; "
                                               "set sliding_window or drop window_pattern"))
        if self.rotary_local_base is not None:
            if self.positions != "rotary":
                problems.append(("rotary_local_base", f"set but positions is '{self.positions}', not 'rotary'"))
            elif self.sliding_window is None:
                problems.append(("rotary_local_base", "set without sliding_window: no layer is local"))
        windows = {self.layer_window(i) for i in range(self.num_layers)}
        if len(windows) > 1:
            for key, what in (("share_layers", "one layer shared by every position of the stack"),
                              ("residual_attention", "raw scores handed from layer to layer"),
                              ("attention_reuse", "probabilities handed from layer to layer")):
                if getattr(self, key):
                    problems.append((key, f"{what} with local and global layers (window_pattern), which see "
                                          "different keys; use one window for every layer or unset it"))
        return problems

    def _reuse_problems(self) -> list[tuple[str, str]]:
        reuse = self.attention_reuse
        if reuse is None:
            return []
        problems = []
        if reuse.every > self.num_layers:
            problems.append(("attention_reuse.every", f"{reuse.every} with {self.num_layers} layers: no layer "
                                                      "would reuse (every is at most num_layers)"))
        if self.share_layers:
            problems.append(("attention_reuse", "set with share_layers: the one shared layer cannot both compute "
                                                "and reuse attention; unset one of them"))
        if self.residual_attention:
            problems.append(("attention_reuse", "set with residual_attention: a reusing layer has no scores of "
                                                "its own to add to the next layer's; unset one of them"))
        if reuse.keep_qk is False and (reuse.recompute_p > 0 or reuse.eval == "recompute"):
            why = f"recompute_p is {reuse.recompute_p}" if reuse.recompute_p > 0 else "eval is 'recompute'"
            problems.append(("attention_reuse.keep_qk", f"false, but {why}: recomputing needs the reusing layers' "
                                                        "query/key projections; leave keep_qk unset or true"))
        return problems

    def causal(self) -> bool:
        """Whether a position must not see later ones (a decoder always; an encoder by its mask)."""
        return True

    def _moe_problems(self) -> list[tuple[str, str]]:
        if self.ffn != "moe":
            return [("moe", f"set, but ffn is '{self.ffn}'; set ffn: moe to use it")] if self.moe is not None else []
        moe = self.moe_config
        problems = []
        if moe.top_k > moe.num_experts:
            problems.append(("moe.top_k", f"{moe.top_k} experts per token, but there are only {moe.num_experts}"))
        first = moe.every - 1 if moe.first is None else moe.first
        if first >= self.num_layers:
            problems.append(("moe.every" if moe.first is None else "moe.first",
                             f"the first MoE layer would be layer {first}, but there are {self.num_layers} layers: "
                             "no layer would have experts"))
        if first > 0 and self.share_layers:
            problems.append(("moe.every" if moe.first is None else "moe.first",
                             f"the first MoE layer is layer {first} with share_layers: the one shared layer is "
                             "layer 0, which would get no experts; use every: 1"))
        if moe.shared_gate and not moe.shared_experts:
            problems.append(("moe.shared_gate", "true, but shared_experts is 0: there is no shared expert to gate; "
                                                "set shared_experts or drop shared_gate"))
        problems += [(f"moe.{key}", message) for key, message in moe.routing_problems()]
        if moe.routing == "expert_choice" and self.causal():
            problems.append(("moe.routing", "expert_choice compares all tokens of a batch, so a position's output "
                                            "would depend on later positions; use top_k in a causal stack"))
        return problems

    @property
    def moe_config(self) -> MoEConfig:
        """The ``moe`` section, or its defaults when ``ffn: moe`` leaves it out."""
        return self.moe if self.moe is not None else MoEConfig()

    def stack_parts(self, model: Any, mask: str, cross_attention: bool = False) -> dict[str, Any]:
        """Keyword arguments of ``TransformerStack``: its layers, position scheme and final norm, built
        from the registered blocks (``components/blocks.py``)."""
        return stack_parts(self, model, mask, cross_attention)


class TransformerEncoderConfig(TransformerStackConfig):
    type: Literal["transformer"] = "transformer"
    mask: Literal["bidirectional", "causal", "prefix"] = "bidirectional"

    def causal(self) -> bool:
        return self.mask != "bidirectional"

    def check(self, model) -> list[tuple[str, str]]:
        problems = super().check(model)
        if self.sliding_window is not None and self.mask == "prefix":
            problems.append(("sliding_window", "set with mask 'prefix': a sliding window is defined for causal and "
                                               "bidirectional masks"))
        return problems


@ENCODERS.register("transformer")
class TransformerEncoder(TransformerStack, Encoder):
    """[B,S,H] -> [B,S,H]. Mask, position bias and rotary tables are built once per batch and shared
    by every layer. With a ``KVCache`` (decoder-only generation) only the new positions are run.
    ``output_positions`` n: [B,n,H], the last layer computing only those positions where it can
    (``TransformerStack.run``)."""

    Config = TransformerEncoderConfig
    trims_positions = True

    @property
    def requires(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("segments",) if self.mask_kind == "prefix" else ()

    @classmethod
    def from_config(cls, cfg: TransformerEncoderConfig, model) -> TransformerEncoder:
        return cls(**cfg.stack_parts(model, cfg.mask))

    def forward(self, hidden: Tensor, padding_mask: Tensor | None, prefix_lengths: Tensor | None = None,
                positions: Tensor | None = None, cache: KVCache | None = None,
                output_positions: int | None = None) -> Tensor:
        return self.run(hidden, padding_mask, prefix_lengths, positions, cache, output_positions=output_positions)
