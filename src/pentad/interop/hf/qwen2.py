"""Qwen2 and Qwen2.5 (``model_type: qwen2``: ``Qwen2ForCausalLM``), both ways.

A LLaMA body (:mod:`pentad.interop.hf.llama`: fused ``qkv`` from ``q_proj``/``k_proj``/``v_proj``,
RMSNorm, SwiGLU, rotary positions, grouped-query heads) whose query, key and value projections
carry biases and nothing else does: pentad ``qkv_bias: true`` with ``bias: false`` (``q_proj.bias``,
``k_proj.bias``, ``v_proj.bias`` fuse to ``qkv.bias``; ``o_proj`` and the feed-forward have none).
RoPE scaling converts as for LLaMA (``rope_parameters``, or ``rope_theta`` with ``rope_scaling``).

Sliding-window attention is refused: a layer whose type is ``sliding_attention`` (``layer_types``,
or ``use_sliding_window`` with the layers from ``max_window_layers`` on, as transformers derives
them) has no pentad counterpart here. Written back, ``use_sliding_window`` is false and every
layer ``full_attention``; ``sliding_window`` and ``max_window_layers`` of the imported config.json
are kept as they were (transformers ignores them then).

:class:`Qwen2Family` is also the base of the other LLaMA-bodied dense families (Qwen3, HunYuan
dense), which set its class attributes: the architecture, the config table, whether the query,
key and value biases come with the output's (``attention_bias``) and where a per-head query/key
norm goes (``qk_norm``) under which names.
"""

from __future__ import annotations

from typing import Any

from pentad.errors import UserError
from pentad.interop.hf import (
    ExportPlan,
    Field,
    ImportPlan,
    KeyLayout,
    activation,
    activation_name,
    export_fields,
    hinted_problems,
    merge_config,
    mixture,
    owned_keys,
    positions,
    seq_length,
    text_kind,
)
from pentad.interop.hf.llama import (
    ATTENTION_DROPOUT,
    BODY,
    BODY_FIELDS,
    HEADS,
    MLP,
    NORMS,
    OUT,
    QKV,
    ROPE_KEYS,
    LlamaFamily,
    body_model,
    body_problems,
    dynamic_positions,
    rope_export,
    rope_scaling,
    rope_theta,
)
from pentad.interop.keymap import Rule, RuleSpec, expand

DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 32768, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28, "layer_types": None,
    "attention_dropout": 0.0,
}
# config.json's keys in the order they are written (sliding_window and max_window_layers: the imported ones kept)
FIELDS: list[Field] = BODY_FIELDS + [
    Field("use_sliding_window", kept=True, write=lambda m: False),
    Field("layer_types", write=lambda m: ["full_attention"] * m.encoder.num_layers),
    ATTENTION_DROPOUT,
]


def qkv_bias_alone(model: Any) -> bool:
    """Qwen2's trait beside LLaMA: biases on the query/key/value projections and on nothing else."""
    enc = model.encoder
    return bool(getattr(enc, "qkv_bias", None)) and not getattr(enc, "bias", True)


def qk_norm(model: Any) -> str | None:
    """Where the encoder's per-head query/key norm goes (``before_rotary``, ``after_rotary``; None: none)."""
    return getattr(model.encoder, "qk_norm", None)


def windowed_layers(c: dict[str, Any]) -> list[int]:
    """The layers transformers gives a sliding window (``c``: config.json with the defaults filled in):
    those of type ``sliding_attention`` (``layer_types``, else from ``max_window_layers`` on), when
    ``use_sliding_window`` leaves a window."""
    if not c.get("use_sliding_window") or c.get("sliding_window") is None:
        return []
    layers = int(c["num_hidden_layers"])
    types = c.get("layer_types") or ["sliding_attention" if i >= int(c.get("max_window_layers") or 0)
                                     else "full_attention" for i in range(layers)]
    return [i for i, kind in enumerate(types) if kind == "sliding_attention"]


class Qwen2Family(LlamaFamily):
    name = "qwen2"
    model_types = ("qwen2",)
    narrows = ("llama",)
    # LLaMA's names with biased query projections (tried before LLaMA)
    layout = KeyLayout(contains=(".self_attn.q_proj.bias",), also=(".mlp.gate_proj.",), rank=90)
    tokenizer_kind = "tokenizer_json"  # byte-level BPE with Qwen's own pre-tokenizer: the file as it is
    tokenizer_class = "Qwen2Tokenizer"
    spm_files = ()
    default_special_tokens = {"eos": "<|endoftext|>", "pad": "<|endoftext|>"}

    architecture = "Qwen2ForCausalLM"
    display = "Qwen2"
    defaults = DEFAULTS
    fields = FIELDS
    owned = owned_keys(FIELDS, *ROPE_KEYS)
    # attention_bias: config.json's switch for biases on q, k, v and o (None: Qwen2's fixed q/k/v biases)
    attention_bias_key: str | None = None
    qk_norm: str | None = None  # where the family's per-head query/key norms go (pentad's qk_norm)
    qk_norm_names = ("q_norm", "k_norm")  # their HF names under self_attn

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" and not mixture(model) \
            and qk_norm(model) is None and qkv_bias_alone(model)

    def attention_rules(self) -> list[RuleSpec]:
        """The per-head query/key norm rules of a layer (none for Qwen2)."""
        if self.qk_norm is None:
            return []
        q, k = self.qk_norm_names
        return [("encoder.layers.{layer}.attention.q_norm.weight", f"{{p}}layers.{{layer}}.self_attn.{q}.weight"),
                ("encoder.layers.{layer}.attention.k_norm.weight", f"{{p}}layers.{{layer}}.self_attn.{k}.weight")]

    def rules(self, *, prefix: str, num_layers: int, heads: int, kv_heads: int,  # type: ignore[override]
              qkv_bias: bool, out_bias: bool, head: str, lm: str) -> list[Rule]:
        common = dict(p=prefix, heads=heads, kv_heads=kv_heads, lm=lm, layer=range(num_layers))
        return (expand(BODY + HEADS[head], **common)
                + expand(QKV, awb=("weight", "bias") if qkv_bias else ("weight",), **common)
                + expand(OUT, awb=("weight", "bias") if out_bias else ("weight",), **common)
                + expand(self.attention_rules() + NORMS + MLP, mwb=("weight",), **common))

    def biases(self, c: dict[str, Any], problems: list[str]) -> bool:
        """Whether the query/key/value projections have biases (config.json ``c``, defaults filled in)."""
        if self.attention_bias_key is None:
            return True
        if c[self.attention_bias_key]:
            problems.append(f"{self.attention_bias_key} true (biases on the query, key, value and output projections "
                            "but not the feed-forward, which pentad's one bias switch cannot hold)")
        return False

    def family_problems(self, config: dict[str, Any], c: dict[str, Any]) -> list[str]:
        """What else of config.json this family cannot convert."""
        windowed = windowed_layers(c)
        if windowed:
            return [f"use_sliding_window with sliding_window {c['sliding_window']} on layers {windowed} (pentad's "
                    "attention is not windowed)"]
        return []

    def family_options(self, config: dict[str, Any], c: dict[str, Any], head_dim: int) -> dict[str, Any]:
        """Options of the pentad stack this family adds (the query/key norms' order)."""
        return {"qk_norm": self.qk_norm} if self.qk_norm is not None else {}

    def rotary(self, config: dict[str, Any], c: dict[str, Any], head_dim: int, max_length: int | None,
               problems: list[str]) -> tuple[float, dict[str, Any] | None]:
        """(rotary base, pentad's rope_scaling section or None) of config.json."""
        max_positions = int(c["max_position_embeddings"])
        scaling = rope_scaling(config, max_positions, seq_length(max_length, max_positions), head_dim, problems)
        return rope_theta(config), scaling

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**self.defaults, **config}
        problems = hinted_problems(config, (self.architecture,))
        act = activation(c["hidden_act"], problems)
        qkv_bias = self.biases(c, problems)
        problems += self.family_problems(config, c)
        heads = int(c["num_attention_heads"])
        kv_heads = int(c["num_key_value_heads"] or heads)
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        base, scaling = self.rotary(config, c, head_dim, max_length, problems)
        if problems:
            raise UserError(f"cannot convert {label} ({self.name}): " + "; ".join(problems) + ".")
        tied = bool(c["tie_word_embeddings"])
        options = {"qkv_bias": True} if qkv_bias else {}
        model = body_model(c, act, base, max_length, tied, ffn="gated", bias=False, **options,
                           **self.family_options(config, c, head_dim))
        if scaling is not None:
            model["encoder"]["rope_scaling"] = scaling
        rules = self.rules(prefix="model.", num_layers=int(c["num_hidden_layers"]), heads=heads, kv_heads=kv_heads,
                           qkv_bias=qkv_bias, out_bias=False, head="tied" if tied else "untied", lm="lm")
        return ImportPlan(model, rules, self.architecture, [], [])

    def export_problems(self, model: Any) -> list[str]:
        """What a pentad model has that this family cannot hold."""
        expected: dict[str, Any] = {"ffn": "gated", "bias": False, "qk_norm": self.qk_norm}
        if self.attention_bias_key is None:
            expected["qkv_bias"] = True  # else stack_problems refuses biases on q, k, v alone
        return body_problems(model, self.name, self.display, scaling=True, **expected)

    def export_config(self, model: Any, base: dict[str, Any], act: str) -> dict[str, Any]:
        """config.json's translated keys (before the imported config.json's other keys are merged in)."""
        config: dict[str, Any] = {"architectures": [self.architecture], "model_type": self.model_types[0],
                                  **export_fields(self.fields, model, hidden_act=act),
                                  **rope_export(model.encoder, base)}
        if "head_dim" not in base and config["head_dim"] * model.encoder.num_heads == model.hidden_size \
                and self.defaults["head_dim"] is None:
            del config["head_dim"]  # the config class derives it
        return config

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        enc = model.encoder
        problems = self.export_problems(model)
        base = dict(base_config or {})
        act = activation_name(base.get("hidden_act"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as {self.name}: " + "; ".join(problems) + ".")
        config = self.export_config(model, base, act)
        if "max_position_embeddings" in base and int(base["max_position_embeddings"]) >= model.max_seq_length:
            config["max_position_embeddings"] = base["max_position_embeddings"]
        if dynamic_positions(enc, model.max_seq_length) is not None:  # dynamic NTK's reference length
            config["max_position_embeddings"] = dynamic_positions(enc, model.max_seq_length)
        if "eos_token_id" not in base and eos_id is not None:
            config["eos_token_id"] = eos_id
        config = merge_config(base, self.owned, config)
        heads = enc.num_heads
        rules = self.rules(prefix="model.", num_layers=enc.num_layers, heads=heads, kv_heads=enc.num_kv_heads or heads,
                           qkv_bias=bool(enc.qkv_bias), out_bias=False,
                           head="tied" if model.tie_word_embeddings else "untied", lm=model.targets[0].target_name)
        return ExportPlan(config, rules, self.architecture, set(), [])


FAMILY = Qwen2Family()
