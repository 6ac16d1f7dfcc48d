"""The registered blocks of a transformer layer, and the assembly of a stack from them.

The transformer encoder and decoder configs name a block kind per role (``ffn: dense | gated | moe``,
the mixture of experts configured by the ``moe`` section); attention has one registered variant per
kind of layer (``components/attention``: ``self``, ``residual``, ``reuse``, ``cross``), chosen by the
stack config. Each registered class turns the stack config into a ``BlockFactory`` (layer index ->
module). :func:`stack_parts` builds every layer from those factories (with its norms, registered in
``components/norms``, dropout and stochastic depth), the position scheme (``components/positions``) and
the final norm, and hands them to ``TransformerStack`` built; the stack and its layers read no config.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from torch import nn

from pentad.components.attention import self_attention_kind
from pentad.components.norms import make_norm, norm_factory
from pentad.config.base import StrictModel
from pentad.layers.feed_forward import FeedForward
from pentad.layers.moe import MoE, RouterInput, Routing, Scoring
from pentad.layers.transformer import BlockFactory, TransformerLayer, drop_path_rate
from pentad.registry import ATTENTION_BLOCKS, FFN_BLOCKS, POSITION_SCHEMES


def stack_parts(cfg: Any, model: Any, mask: str, cross_attention: bool = False) -> dict[str, Any]:
    """The built parts of a ``TransformerStack`` (its keyword arguments) from the stack config ``cfg``:
    every layer assembled from the registered blocks (self-attention, cross-attention when asked,
    feed-forward; built in that order, the order their construction draws random numbers in, which
    fixes the weights of a seeded build), then the position scheme, then the final norm."""
    attention = ATTENTION_BLOCKS.get(self_attention_kind(cfg)).factory(cfg, model)
    cross = ATTENTION_BLOCKS.get("cross").factory(cfg, model) if cross_attention else None
    ffn = FFN_BLOCKS.get(cfg.ffn).factory(cfg, model)
    hidden = model.hidden_size
    norm = norm_factory(cfg.norm, hidden, cfg.layer_norm_eps)  # each sub-layer's own norm, from ``NORMS``

    def layer(index: int) -> TransformerLayer:
        self_attention = attention(index)
        self_attention.window = cfg.layer_window(index)  # declared on the block; the stack reads it
        self_attention.softcap = cfg.attention_softcap
        cross_block = cross(index) if cross is not None else None
        return TransformerLayer(self_attention, ffn(index), norm, norm_position=cfg.norm_position, dropout=cfg.dropout,
                                cross_attention=cross_block,
                                drop_path=drop_path_rate(cfg.drop_path, index, cfg.num_layers, cfg.share_layers))

    layers = [layer(i) for i in range(1 if cfg.share_layers else cfg.num_layers)]
    positions = POSITION_SCHEMES.get(cfg.positions).build(cfg, model, mask)
    final = cfg.final_norm if cfg.final_norm is not None else cfg.norm_position in ("pre", "sandwich")
    final_norm = (make_norm(cfg.final_norm_kind or cfg.norm, hidden,
                            cfg.layer_norm_eps if cfg.final_norm_eps is None else cfg.final_norm_eps)
                  if final else None)
    reuse = cfg.attention_reuse.runtime() if cfg.attention_reuse is not None else None
    return dict(layers=layers, num_layers=cfg.num_layers, mask=mask, positions=positions, final_norm=final_norm,
                attention_reuse=reuse)


@FFN_BLOCKS.register("dense")
class DenseBlock:
    """``down(act(up x))`` of width ``ffn_size`` (BERT, GPT-2, T5 v1.0)."""

    gated = False

    @classmethod
    def factory(cls, cfg: Any, model: Any) -> BlockFactory:
        size = cfg.ffn_size or 4 * model.hidden_size
        return lambda index: FeedForward(model.hidden_size, size, cfg.activation, cfg.bias, cls.gated)


@FFN_BLOCKS.register("gated")
class GatedBlock(DenseBlock):
    """``down(act(gate x) * up x)``: SwiGLU with silu (LLaMA), GeGLU with gelu (T5 v1.1)."""

    gated = True


class MoEConfig(StrictModel):
    """``model.encoder.moe`` / ``model.decoder.moe`` (with ``ffn: moe``): see ``layers/moe.py``."""

    num_experts: int = Field(8, ge=2)
    top_k: int = Field(2, ge=1, description="experts per token (token choice); expert choice: the mean number "
                       "of experts per token when capacity_factor is unset")
    expert: Literal["dense", "gated"] = Field("gated", description="each expert's feed-forward kind")
    expert_ffn_size: int | None = Field(None, ge=1, description="width of each expert; default the stack's "
                                        "ffn_size")
    routing: Routing = Field("top_k", description="top_k: each token picks its experts (Switch k=1, Mixtral k=2); "
                             "expert_choice: each expert picks its tokens (Zhou et al. 2022; not for causal stacks)")
    capacity_factor: float | None = Field(None, gt=0.0, description="assignments per expert = ceil(factor * "
                                          "tokens * top_k / num_experts), the rest dropped (they pass through "
                                          "the residual); unset: dropless")
    normalize: bool = Field(True, description="renormalise the top-k gates to sum to one (Mixtral); false: the "
                            "router probabilities themselves (Switch)")
    router_input: RouterInput = Field("hidden", description="hidden: the router reads the layer's hidden "
                                      "states; word: the stack's input, i.e. the token embeddings (word-vector "
                                      "routing)")
    every: int = Field(1, ge=1, description="MoE in every k-th layer (layers k-1, 2k-1, ... unless first says "
                       "otherwise); the others get one feed-forward of the expert kind and the stack's ffn_size")
    first: int | None = Field(None, ge=0, description="index of the first MoE layer, then every every-th; "
                              "default every - 1 (Hugging Face's Switch Transformers: 1 when every > 1)")
    shared_experts: int = Field(0, ge=0, description="always-on experts added to the routed output, as one "
                                "feed-forward of shared_experts * expert_ffn_size (DeepSeek-MoE, Qwen-MoE)")
    shared_gate: bool = Field(False, description="scale the shared experts' output per token by "
                              "sigmoid(shared_gate x), a Linear(hidden_size, 1) without bias (Qwen-MoE); needs "
                              "shared_experts")
    balance_loss_weight: float = Field(0.01, ge=0.0, description="weight of the load-balancing loss moe_balance")
    z_loss_weight: float = Field(0.0, ge=0.0, description="weight of the router z-loss moe_z (ST-MoE: 0.001)")
    scoring: Scoring = Field("softmax", description="router scores: softmax over the experts; sigmoid, each "
                             "expert's own (DeepSeek-V3)")
    choice_bias: bool = Field(False, description="a per-expert bias (buffer expert_bias, checkpointed) added to the "
                              "scores for choosing experts only, not to the gates (DeepSeek-V3's "
                              "e_score_correction_bias)")
    bias_update_rate: float = Field(0.0, ge=0.0, description="auxiliary-loss-free balancing: after every optimizer "
                                    "step each choice bias moves by this much towards balance, from the "
                                    "assignments counted since (DeepSeek-V3: 0.001); 0: the bias stays as loaded")
    groups: int = Field(1, ge=1, description="group-limited routing: the experts in this many equal groups "
                        "(DeepSeek-V3's n_group: 8)")
    group_top_k: int | None = Field(None, ge=1, description="groups a token may choose its experts from, those "
                                    "whose two best scores sum highest (topk_group: 4); default all")
    routed_scaling: float = Field(1.0, gt=0.0, description="factor on the routed experts' gates "
                                  "(routed_scaling_factor: 2.5 in DeepSeek-V3)")

    def routing_problems(self) -> list[tuple[str, str]]:
        """What does not fit together in the DeepSeek-V3 routing options: (sub-path below moe, message)."""
        problems = []
        if self.bias_update_rate and not self.choice_bias:
            problems.append(("bias_update_rate", f"{self.bias_update_rate} without choice_bias: there is no bias to "
                                                 "update; set choice_bias: true"))
        if self.num_experts % self.groups or (self.groups > 1 and self.num_experts // self.groups < 2):
            problems.append(("groups", f"{self.groups} groups of {self.num_experts} experts: groups must be equal and "
                                       "hold 2 experts or more (a group scores its two best)"))
        elif self.group_top_k is not None and self.group_top_k > self.groups:
            problems.append(("group_top_k", f"{self.group_top_k} of {self.groups} groups"))
        elif self.top_k > (self.group_top_k or self.groups) * (self.num_experts // self.groups):
            problems.append(("top_k", f"{self.top_k} experts per token from {self.group_top_k} groups of "
                                      f"{self.num_experts // self.groups}"))
        if self.routing == "expert_choice":
            chosen = [k for k, on in (("scoring", self.scoring != "softmax"), ("choice_bias", self.choice_bias),
                                      ("groups", self.groups > 1)) if on]
            if chosen:
                problems.append((chosen[0], "chooses experts per token: it needs routing top_k, not expert_choice"))
        return problems


@FFN_BLOCKS.register("moe")
class MoEBlock:
    """A mixture of experts (``moe`` section) in every ``moe.every``-th layer, the expert kind's dense or
    gated feed-forward in the others."""

    @staticmethod
    def factory(cfg: Any, model: Any) -> BlockFactory:
        moe: MoEConfig = cfg.moe_config
        size = cfg.ffn_size or 4 * model.hidden_size
        expert_size = moe.expert_ffn_size or size
        gated = moe.expert == "gated"

        def make(index: int) -> nn.Module:
            first = moe.every - 1 if moe.first is None else moe.first
            if index < first or (index - first) % moe.every:
                return FeedForward(model.hidden_size, size, cfg.activation, cfg.bias, gated)
            return MoE(model.hidden_size, expert_size, moe.num_experts, moe.top_k, activation=cfg.activation,
                       bias=cfg.bias, gated=gated, routing=moe.routing, capacity_factor=moe.capacity_factor,
                       normalize=moe.normalize, router_input=moe.router_input,
                       shared_ffn_size=moe.shared_experts * expert_size, shared_gate=moe.shared_gate,
                       balance_loss_weight=moe.balance_loss_weight, z_loss_weight=moe.z_loss_weight,
                       scoring=moe.scoring, choice_bias=moe.choice_bias, bias_update_rate=moe.bias_update_rate,
                       groups=moe.groups, group_top_k=moe.group_top_k, routed_scaling=moe.routed_scaling)

        return make
