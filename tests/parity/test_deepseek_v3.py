"""DeepSeek-V3 conversion parity (interop/hf/deepseek_v3.py): transformers' DeepseekV3ForCausalLM built from
tiny configs with random weights (no download), converted both ways.

* HF -> pentad with ``--verify``: every layer's hidden states and the logits within 1e-5 relative (fp32),
  on padded rows, also at positions beyond YaRN's original length, and the decoding with the latent cache
  (absorbed projections) equal to the full forward;
* HF -> pentad -> HF: bitwise state dicts and equal configs; pentad -> HF loads with the auto class;
* what pentad cannot hold (multi-token-prediction layers, attention biases, ...) is refused by name.
Greedy and beam generation against transformers' ``generate`` are in tests/parity/test_generation_hf.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.unit.interop.helpers import DEEPSEEK_V3, make_run

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.interop import convert
from pentad.layers.cache import KVCache
from pentad.runs import load_run
from pentad.training.checkpoint import find_weights, load_weights, read_weights

pytestmark = pytest.mark.usefixtures("one_thread")

transformers = pytest.importorskip("transformers")

VOCAB = 60
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 8.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}


def hf_config(**over):
    """Three layers, the first dense; 8 routed experts in 4 groups (2 per token), 3 per token, a shared one."""
    return transformers.DeepseekV3Config(**{
        "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
        "n_routed_experts": 8, "routed_scaling_factor": 2.5, "kv_lora_rank": 16, "q_lora_rank": 12,
        "qk_rope_head_dim": 4, "v_head_dim": 8, "qk_nope_head_dim": 8, "n_group": 4, "topk_group": 2,
        "num_experts_per_tok": 3, "first_k_dense_replace": 1, "max_position_embeddings": 32, "pad_token_id": 0,
        "num_nextn_predict_layers": 0, **over})


CASES = {
    "lora-queries-interleaved": {},
    "plain-queries-half-tied": {"q_lora_rank": None, "rope_interleave": False, "tie_word_embeddings": True,
                                "norm_topk_prob": False},
    "yarn-beyond-original": {"rope_parameters": YARN},
    "all-dense": {"first_k_dense_replace": 3},
}


def save_hf(directory, **over):
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(hf_config(**over))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))
    model.save_pretrained(directory)
    return model.eval()


def pentad_model(run_dir):
    cfg, _ = load_run(run_dir)
    model = build_model(cfg.model)
    load_weights(model, read_weights(find_weights(run_dir)), str(run_dir))
    return model.eval()


@pytest.mark.parametrize("over", CASES.values(), ids=CASES.keys())
def test_hf_to_pentad_matches_every_layer_and_the_logits(tmp_path, over):
    hf = save_hf(tmp_path / "hf", **over)
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok and report.max_relative() <= 1e-5, report.render()
    assert report.architecture == "DeepseekV3ForCausalLM"
    ours = pentad_model(tmp_path / "pentad")
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(1, VOCAB, (2, 20), generator=g)  # 20 positions: past YaRN's original 8
    keep = torch.ones(2, 20, dtype=torch.bool)
    keep[1, -6:] = False
    with torch.no_grad():
        ref = hf(input_ids=tokens, attention_mask=keep.long(), output_hidden_states=True)
        batch = Batch(tokens=tokens, padding_mask=~keep)
        hidden, _ = ours.encode(batch)
        logits = ours.targets["lm"](hidden, batch).logits
        scale = ref.logits[keep].abs().max()
        assert (logits[keep] - ref.logits[keep]).abs().max() <= 1e-5 * scale
        cache = KVCache()  # the latent cache and the absorbed projections, prompt then single steps
        steps = [ours.encode(Batch(tokens=tokens[:1, :12]), cache)[0]]
        steps += [ours.encode(Batch(tokens=tokens[:1, i:i + 1]), cache)[0] for i in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), hidden[:1], rtol=0, atol=2e-5 * float(hidden.abs().max()))


@pytest.mark.parametrize("over", CASES.values(), ids=CASES.keys())
def test_hf_to_pentad_to_hf_is_bitwise(tmp_path, over):
    hf = save_hf(tmp_path / "hf", **over)
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    report = convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back", verify=True)
    assert report.ok, report.render()
    again = transformers.DeepseekV3ForCausalLM.from_pretrained(tmp_path / "back", local_files_only=True)
    before, after = hf.state_dict(), again.state_dict()
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key
    ignore = {"transformers_version", "architectures", "_name_or_path"}
    assert {k: v for k, v in again.config.to_dict().items() if k not in ignore} == \
        {k: v for k, v in hf.config.to_dict().items() if k not in ignore}


def test_a_pentad_model_exports_and_loads_with_the_auto_class(tmp_path):
    make_run(tmp_path / "run", DEEPSEEK_V3)
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", verify=True)  # family guessed
    assert report.ok and report.family == "deepseek_v3", report.render()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert type(loaded).__name__ == "DeepseekV3ForCausalLM"
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["rope_interleave"] is True


def _edit(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("changes, message", [
    ({"attention_bias": True}, "attention_bias true"),
    ({"num_key_value_heads": 2}, "num_key_value_heads 2 with num_attention_heads 4"),
    ({"scoring_func": "softmax"}, "scoring_func 'softmax'"),
    ({"topk_method": "greedy"}, "topk_method 'greedy'"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config \\(fp8"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0}}, "RoPE parameters"),
], ids=["attention-bias", "kv-heads", "scoring", "topk-method", "fp8", "longrope-without-factors"])
def test_configs_pentad_cannot_hold_are_refused_by_name(tmp_path, changes, message):
    save_hf(tmp_path / "hf")
    _edit(tmp_path / "hf", **changes)
    with pytest.raises(UserError, match=f"cannot convert .*deepseek_v3.*{message}"):
        convert("hf-to-pentad", tmp_path / "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_multi_token_prediction_layers_are_refused_by_name(tmp_path):
    from safetensors.torch import load_file, save_file

    save_hf(tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    weights["model.layers.3.enorm.weight"] = torch.ones(32)  # DeepSeek's MTP module is layer num_hidden_layers
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    _edit(tmp_path / "hf", num_nextn_predict_layers=1)
    with pytest.raises(UserError, match=r"multi-token-prediction layer\(s\) model.layers.3 "
                                        r"\(num_nextn_predict_layers 1\): pentad has no multi-token-prediction"):
        convert("hf-to-pentad", tmp_path / "hf", tmp_path / "out")


def test_pentad_options_deepseek_v3_cannot_express_are_refused(tmp_path):
    moe = {**DEEPSEEK_V3["encoder"]["moe"], "scoring": "softmax"}
    make_run(tmp_path / "run", {**DEEPSEEK_V3, "encoder": {**DEEPSEEK_V3["encoder"], "moe": moe}})
    with pytest.raises(UserError, match="moe.scoring is 'softmax' where deepseek_v3 has 'sigmoid'"):
        convert("pentad-to-hf", tmp_path / "run", tmp_path / "out")
