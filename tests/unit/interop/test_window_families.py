"""Sliding windows and Gemma 3 in the Hugging Face families without ``transformers``: Mistral's and Mixtral's
``sliding_window`` both ways; what a family cannot express is refused by name (a bad window, local and
global layers to Mistral, any window to LLaMA, Gemma 3's options to TencentPretrain); Gemma 3's older
config.json spelling both ways and what it cannot express. Numerical parity is in
tests/parity/test_conversion_families.py and tests/parity/test_generation_hf.py."""

from __future__ import annotations

import pytest

from pentad.components.model_config import model_config_class
from pentad.errors import UserError
from pentad.interop.hf.families import families, guess_family

from .helpers import GEMMA3, LLAMA, MISTRAL, MIXTRAL, variant

MISTRAL_JSON = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 60, "hidden_size": 32,
                "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 64}


def export(family: str, model: dict) -> dict:
    cfg = model_config_class().model_validate(model)
    return families()[family].plan_export(cfg, label="run", model_type=family, base_config=None, omittable=set(),
                                          pad_id=0, eos_id=None, labels=None).config


def test_mistral_window_both_ways():
    plan = families()["mistral"].plan_import({**MISTRAL_JSON, "sliding_window": 7}, {}, "config.json", None)
    assert plan.model["encoder"]["sliding_window"] == 7
    default = families()["mistral"].plan_import(MISTRAL_JSON, {}, "config.json", None)  # MistralConfig: 4096
    assert default.model["encoder"]["sliding_window"] == 4096
    unwindowed = families()["mistral"].plan_import({**MISTRAL_JSON, "sliding_window": None}, {}, "config.json", None)
    assert "sliding_window" not in unwindowed.model["encoder"]
    assert export("mistral", MISTRAL)["sliding_window"] == 5
    windowed = variant(MIXTRAL, encoder={**MIXTRAL["encoder"], "sliding_window": 6})
    assert export("mixtral", windowed)["sliding_window"] == 6
    assert export("mixtral", MIXTRAL)["sliding_window"] is None
    assert guess_family(model_config_class().model_validate(MISTRAL)) == "mistral"
    assert guess_family(model_config_class().model_validate(LLAMA)) == "llama"


def test_what_a_family_cannot_express_is_refused_by_name():
    with pytest.raises(UserError, match="sliding_window 'x'"):
        families()["mistral"].plan_import({**MISTRAL_JSON, "sliding_window": "x"}, {}, "config.json", None)
    alternating = variant(MISTRAL, encoder={**MISTRAL["encoder"], "window_pattern": ["local", "global"]})
    with pytest.raises(UserError, match="window_pattern"):
        export("mistral", alternating)
    with pytest.raises(UserError, match="sliding_window is 5 where llama has None"):
        export("llama", MISTRAL)
    local_base = variant(MISTRAL, encoder={**MISTRAL["encoder"], "rotary_local_base": 100.0})
    with pytest.raises(UserError, match="rotary_local_base"):
        export("mistral", local_base)


GEMMA3_JSON = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 60, "hidden_size": 32,
               "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
               "head_dim": 16, "max_position_embeddings": 64, "sliding_window": 6, "sliding_window_pattern": 2,
               "rope_theta": 5e5, "rope_local_base_freq": 500.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0},
               "query_pre_attn_scalar": 16}


def test_gemma3_config_of_transformers_4_both_ways():
    """An older config.json (rope_theta, rope_local_base_freq, sliding_window_pattern) imports and exports in
    its own spelling."""
    gemma = families()["gemma3_text"]
    encoder = gemma.plan_import(GEMMA3_JSON, {}, "config.json", None).model["encoder"]
    assert encoder["window_pattern"] == ["local", "global"] and encoder["sliding_window"] == 6
    assert (encoder["rotary_base"], encoder["rotary_local_base"]) == (5e5, 500.0)
    assert encoder["rope_scaling"] == {"type": "linear", "factor": 4.0} and encoder["attention_scale_size"] == 16.0
    cfg = model_config_class().model_validate(gemma.plan_import(GEMMA3_JSON, {}, "config.json", None).model)
    assert guess_family(cfg) == "gemma3_text"
    config = gemma.plan_export(cfg, label="run", model_type="gemma3_text", base_config=GEMMA3_JSON, omittable=set(),
                               pad_id=0, eos_id=None, labels=None).config
    assert (config["rope_theta"], config["rope_local_base_freq"]) == (5e5, 500.0)
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 4.0} and "rope_parameters" not in config
    assert config["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert config["query_pre_attn_scalar"] == 16 and config["final_logit_softcapping"] is None


@pytest.mark.parametrize("change, message", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping 50.0 (transformers' Gemma 3 does not apply it"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"attention_bias": True}, "attention_bias True"),
    ({"layer_types": ["chunked_attention"] * 4}, "layer_types chunked_attention"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0},
                          "full_attention": {"rope_type": "default", "rope_theta": 1.0}}}, "sliding_attention layers"),
    ({"architectures": ["Gemma3ForSequenceClassification"]}, "Gemma3ForSequenceClassification"),
], ids=["attention-softcap", "bidirectional", "attention-bias", "layer-type", "scaled-local-rope", "head"])
def test_gemma3_refuses_what_it_cannot_express(change, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        families()["gemma3_text"].plan_import({**GEMMA3_JSON, **change}, {}, "config.json", None)


def test_tencentpretrain_export_refuses_the_window_and_gemma_options():
    from pentad.tencentpretrain.checkpoint import export_config

    with pytest.raises(UserError) as caught:
        export_config(model_config_class().model_validate(GEMMA3), label="run")
    for name in ("sliding_window 5", "attention_scale_size 12.0", "norm_position sandwich", "norm gemma_rmsnorm",
                 "lm soft-caps its logits"):
        assert name in str(caught.value), name
