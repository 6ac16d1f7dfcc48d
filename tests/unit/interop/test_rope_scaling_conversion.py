"""LLaMA's RoPE scaling through config.json, both ways, without model weights: each kind's keys in
transformers 5's ``rope_parameters`` and in the older ``rope_theta`` + ``rope_scaling`` spelling (kind
under ``type`` or ``rope_type``) come back as they were; a shorter tokenizer limit writes the
defaults that depend on the length out; unknown kinds and keys, factors of the wrong length and
partial rotary are refused by name; families and formats without RoPE scaling refuse a scaled model;
the config section is checked against the stack (numbers against transformers: tests/parity)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from pydantic import TypeAdapter

from pentad.builder import build_model
from pentad.components.positions.rope_scaling import RopeScaling
from pentad.errors import ConfigError, UserError
from pentad.interop.hf.llama import FAMILY
from pentad.interop.hf.mixtral import FAMILY as MIXTRAL_FAMILY
from pentad.layers.positions import Rotary, rotary_cos_sin
from pentad.run_config import validate_raw
from pentad.tencentpretrain.checkpoint import export_config

from .helpers import LLAMA, MIXTRAL, variant

KEYS = {"model.embed_tokens.weight": (60, 32), "lm_head.weight": (60, 32)}
BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 60, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "hidden_act": "silu", "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}


def imported(config: dict[str, Any], max_length: int | None = None):
    plan = FAMILY.plan_import(config, KEYS, "test", max_length)
    return validate_raw({"model": plan.model}, {}, "test").model


def exported(model, base: dict[str, Any]) -> dict[str, Any]:
    return FAMILY.plan_export(model, label="test", model_type=None, base_config=base, omittable=set(), pad_id=None,
                              eos_id=None, labels=None).config


@pytest.mark.parametrize("rope", [
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}},
    {"rope_parameters": {"rope_type": "dynamic", "factor": 3.0, "rope_theta": 10000.0}},
    {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8.0,
                         "beta_slow": 0.5, "mscale": 0.9, "mscale_all_dim": 0.4, "truncate": False,
                         "attention_factor": 1.1, "rope_theta": 10000.0}},
    {"rope_parameters": {**LLAMA3, "rope_theta": 500000.0}},
    {"rope_parameters": {"rope_type": "longrope", "long_factor": [2.0] * 4, "short_factor": [1.0] * 4,
                         "original_max_position_embeddings": 16, "rope_theta": 10000.0}},
    {"rope_theta": 500000.0, "rope_scaling": dict(LLAMA3)},  # Llama 3.1's own config.json
    {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 4.0}},
    {"rope_theta": 10000.0, "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 2.0,
                                             "original_max_position_embeddings": 32}},
    {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 1.0, "rope_theta": 10000.0}},
], ids=["linear", "dynamic", "yarn", "llama3", "longrope", "llama3-legacy", "linear-type", "yarn-both-tags",
        "dynamic-no-theta", "whole-heads"])
def test_rope_fields_round_trip(rope):
    config = {**BASE, **copy.deepcopy(rope)}
    model = imported(config)
    section = rope.get("rope_parameters") or rope["rope_scaling"]
    assert model.encoder.rope_scaling.type == section.get("rope_type", section.get("type"))
    back = exported(model, config)
    for key in ("rope_parameters", "rope_theta", "rope_scaling", "max_position_embeddings"):
        assert back.get(key) == config.get(key), key
    assert set(back) - {"bos_token_id", "eos_token_id"} <= set(config) | {"head_dim", "initializer_range",
                                                                           "attention_bias", "mlp_bias",
                                                                           "attention_dropout"}


def test_shorter_limit_writes_the_length_dependent_defaults():
    """A tokenizer limit below max_position_embeddings shortens model.max_seq_length; the original length
    and YaRN's factor, which default to it, are written out with transformers' values."""
    yarn = imported({**BASE, "rope_parameters": {"rope_type": "yarn", "factor": None, "rope_theta": 10000.0}},
                    max_length=24)
    assert (yarn.max_seq_length, yarn.encoder.rope_scaling.original_max_position_embeddings,
            yarn.encoder.rope_scaling.factor) == (24, 64, 1.0)
    dynamic = imported({**BASE, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, max_length=24)
    assert dynamic.encoder.rope_scaling.original_max_position_embeddings == 64
    assert exported(dynamic, {})["max_position_embeddings"] == 64  # dynamic NTK's reference length
    same = imported({**BASE, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})
    assert same.encoder.rope_scaling.original_max_position_embeddings is None


@pytest.mark.parametrize("rope, message", [
    ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 10000.0}},
     "rope_type 'proportional' in the RoPE parameters .*linear, dynamic, yarn, llama3, longrope"),
    ({"rope_scaling": {"type": "su", "factor": 2.0}}, "rope_type 'su'"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "mrope_section": [2, 2]}},
     "RoPE parameters mrope_section for rope_type 'linear' \\(pentad converts factor\\)"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "rope_type 'llama3' \\(low_freq_factor: Field "
                                                                  "required; high_freq_factor: Field required\\)"),
    ({"rope_parameters": {"rope_type": "longrope", "long_factor": [1.0] * 3, "short_factor": [1.0] * 4}},
     "long_factor 3 factors; longrope needs one per rotated dimension pair, 4"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor 0.5 \\(LLaMA rotates whole heads\\)"),
], ids=["unknown-kind", "unknown-legacy-kind", "unknown-key", "missing-keys", "longrope-length", "partial"])
def test_rope_parameters_pentad_cannot_hold(rope, message):
    with pytest.raises(UserError, match="cannot convert test \\(llama\\): .*" + message):
        imported({**BASE, **rope})


def test_families_and_formats_without_rope_scaling_refuse_it():
    scaled = {"rope_scaling": {"type": "linear", "factor": 2.0}}
    with pytest.raises(UserError, match="RoPE scaling 'linear' \\(pentad converts RoPE scaling for llama only\\)"):
        MIXTRAL_FAMILY.plan_import({**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                                    "num_local_experts": 4, "num_experts_per_tok": 2, **scaled}, KEYS, "test", None)
    model = validate_raw({"model": variant(MIXTRAL, encoder={**MIXTRAL["encoder"], **scaled})}, {}, "test").model
    with pytest.raises(UserError, match="rope_scaling \\(linear\\): pentad converts RoPE scaling to llama only"):
        MIXTRAL_FAMILY.plan_export(model, label="test", model_type=None, base_config=None, omittable=set(),
                                   pad_id=None, eos_id=None, labels=None)
    llama = validate_raw({"model": variant(LLAMA, encoder={**LLAMA["encoder"], **scaled})}, {}, "test").model
    with pytest.raises(UserError, match="rope_scaling linear: TencentPretrain's rotary positions are unscaled"):
        export_config(llama, label="test")


@pytest.mark.parametrize("encoder, message", [
    ({"positions": "alibi", "rope_scaling": {"type": "linear", "factor": 2.0}},
     "rope_scaling: set but positions is 'alibi', not 'rotary'"),
    ({"rope_scaling": {"type": "longrope", "long_factor": [1.0] * 4, "short_factor": [1.0] * 8}},
     "rope_scaling.short_factor: 8 factors; longrope needs one per rotated dimension pair, 4 \\(rotary_dim 8 / 2\\)"),
    ({"rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}},
     "rope_scaling.high_freq_factor: 1.0 is not above low_freq_factor 4.0"),
    ({"rotary_dim": 2, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "dynamic needs more than 2 rotated dimensions"),
    ({"rope_scaling": {"type": "cubic", "factor": 2.0}}, "rope_scaling"),
], ids=["not-rotary", "longrope-length", "llama3-bands", "dynamic-dim", "unknown"])
def test_rope_scaling_section_is_checked(encoder, message):
    with pytest.raises(ConfigError, match=message):  # the config's fields, then the stack's checks
        build_model(validate_raw({"model": variant(LLAMA, encoder={**LLAMA["encoder"], **encoder})}, {}, "test").model,
                    device="meta")


def test_scaled_tables_follow_the_sequence_length_seen():
    """Dynamic NTK and LongRoPE change with the length seen (the cache's positions included, with or
    without explicit positions); up to the original length and for linear scaling they do not."""
    dynamic = TypeAdapter(RopeScaling).validate_python({"type": "dynamic", "factor": 2.0}).resolved(16)
    rotary = Rotary(8, 10000.0, dynamic)
    cpu = torch.device("cpu")
    short, _ = rotary.rotary(None, 1, 9, cpu, torch.float32)  # position 9 of 10
    long, _ = rotary.rotary(None, 1, 39, cpu, torch.float32)  # position 39 of 40
    explicit, _ = rotary.rotary(torch.tensor([[0, 39]]), 2, 0, cpu, torch.float32)
    plain, _ = rotary_cos_sin(torch.tensor([[9, 39]]), 8)
    torch.testing.assert_close(short[0, 0, 0], plain[0, 0, 0], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(long[0, 0, 0], plain[0, 0, 1], atol=1e-3)
    torch.testing.assert_close(explicit[0, 0, 1], long[0, 0, 0])
    unscaled = Rotary(8, 10000.0)
    assert torch.equal(unscaled.rotary(None, 5, 3, cpu, torch.float32)[0],
                       rotary_cos_sin(torch.arange(3, 8)[None], 8)[0])
