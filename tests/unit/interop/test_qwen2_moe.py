"""Qwen2-MoE conversion (interop/hf/qwen2_moe.py) beyond the parity tests: where sparse layers go
both ways, and the options pentad cannot hold, each refused with a message naming it."""

from __future__ import annotations

import json

import pytest

from pentad.errors import UserError
from pentad.interop import convert
from pentad.interop.hf.qwen2_moe import pentad_layers, sparse_layers
from pentad.runs import load_run

from .helpers import LLAMA, MIXTRAL, QWEN2_MOE, make_run, variant
from .test_families import edit_config, exported


def test_layer_placement_matches_transformers():
    assert sparse_layers(4, 1, []) == pentad_layers(4, 1, None) == [0, 1, 2, 3]
    assert sparse_layers(4, 2, []) == pentad_layers(4, 2, None) == [1, 3]
    assert sparse_layers(3, 1, [1]) == pentad_layers(3, 2, 0) == [0, 2]
    assert sparse_layers(4, 1, [0]) == pentad_layers(4, 1, 1) == [1, 2, 3]


@pytest.mark.parametrize("every, first, step, mlp_only", [(2, None, 2, []), (2, 0, 1, [1, 3]), (1, 2, 1, [0, 1])],
                         ids=["every-2", "first-0", "first-2"])
def test_export_spells_the_sparse_layers_for_transformers(tmp_path, every, first, step, mlp_only):
    moe = {**QWEN2_MOE["encoder"]["moe"], "every": every, "first": first}
    make_run(tmp_path / "run", variant(QWEN2_MOE, encoder={**QWEN2_MOE["encoder"], "num_layers": 4, "moe": moe}))
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")  # family guessed from shared_gate
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "qwen2_moe"
    assert (config["decoder_sparse_step"], config["mlp_only_layers"]) == (step, mlp_only)
    assert (config["moe_intermediate_size"], config["shared_expert_intermediate_size"], config["qkv_bias"]) == \
        (16, 32, True)
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "back")
    back = load_run(tmp_path / "back")[0].model.encoder.moe
    assert pentad_layers(4, back.every, back.first) == pentad_layers(4, every, first)


@pytest.mark.parametrize("changes, message", [
    ({"mlp_only_layers": [1], "num_hidden_layers": 3, "decoder_sparse_step": 1, "use_sliding_window": True,
      "sliding_window": 8}, "use_sliding_window with sliding_window 8"),
    ({"mlp_only_layers": [2], "decoder_sparse_step": 1}, r"sparse layers \[0, 1\] .*cannot express"),
    ({"mlp_only_layers": [0, 1, 2]}, "no sparse layer"),
    ({"num_experts": 0}, "no sparse layer"),
    ({"shared_expert_intermediate_size": 24}, "shared_expert_intermediate_size 24 is not a positive multiple of "
                                              "moe_intermediate_size 16"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}}, "RoPE scaling 'yarn'"),
], ids=["sliding", "not-a-progression", "all-dense", "no-experts", "shared-width", "rope-scaling"])
def test_hf_options_pentad_cannot_hold(tmp_path, changes, message):
    directory = exported(tmp_path, QWEN2_MOE)
    edit_config(directory, **changes)
    with pytest.raises(UserError, match=f"cannot convert .*qwen2_moe.*{message}"):
        convert("hf-to-pentad", directory, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model, family, message", [
    (MIXTRAL, "qwen2_moe", "moe.shared_gate is False where qwen2_moe has True"),
    (variant(QWEN2_MOE, encoder={**QWEN2_MOE["encoder"], "moe": {**QWEN2_MOE["encoder"]["moe"], "shared_experts": 0,
                                                                "shared_gate": False}}),
     "qwen2_moe", "shared_experts is 0 where qwen2_moe has a shared expert"),
    (variant(QWEN2_MOE, encoder={**QWEN2_MOE["encoder"], "bias": True}), "qwen2_moe", "bias is True"),
    (QWEN2_MOE, "mixtral", "moe.shared_experts is 2 where mixtral has 0"),
    (variant(LLAMA, encoder={**LLAMA["encoder"], "qkv_bias": True}), "llama",
     "qkv_bias True with bias False .*llama has none"),
], ids=["no-gate", "no-shared", "all-biases", "qwen-as-mixtral", "qkv-bias-as-llama"])
def test_pentad_models_hf_cannot_express(tmp_path, model, family, message):
    make_run(tmp_path / "run", model)
    with pytest.raises(UserError, match=message):
        convert("pentad-to-hf", tmp_path / "run", tmp_path / "out", family=family)
