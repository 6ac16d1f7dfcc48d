"""Parity of the Qwen2/2.5, Qwen3, Qwen3-MoE and HunYuan (dense, MoE) families with transformers: tiny
models with random weights (no download) of each family's own classes.

* HF -> pentad with ``--verify``: the embeddings, every layer's hidden states and the logits within 1e-5
  relative (fp32) on a batch with padded rows, and the test's own logits comparison on another batch.
* HF -> pentad -> HF with ``--verify``: bitwise-identical state dicts and equal configs.
* pentad -> HF: a pentad-built model is guessed to be of the family, exports, loads and verifies.
* ``generate``: greedy and beam-search tokens (and beam scores) equal transformers' from left-padded prompts.
* Options the family cannot hold are refused by name, and the query/key norms' order matters.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from tests.unit.interop.helpers import LLAMA, make_run

from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.generation import generate, load_model
from pentad.interop import convert

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB = 64
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)


def qwen2(**over: Any) -> Any:
    return transformers.Qwen2Config(**{**COMMON, **over})


def qwen3(**over: Any) -> Any:  # head_dim 16 where hidden / heads is 8
    return transformers.Qwen3Config(**{**COMMON, "head_dim": 16, **over})


def qwen3_moe(**over: Any) -> Any:
    """Three layers, the middle one dense (mlp_only_layers)."""
    return transformers.Qwen3MoeConfig(**{**COMMON, "num_hidden_layers": 3, "num_experts": 4, "num_experts_per_tok": 2,
                                          "moe_intermediate_size": 16, "mlp_only_layers": [1], **over})


def hunyuan_dense(**over: Any) -> Any:
    return transformers.HunYuanDenseV1Config(**{**COMMON, "head_dim": 8, **over})


def hunyuan_moe(**over: Any) -> Any:
    return transformers.HunYuanMoEV1Config(**{**COMMON, "head_dim": 8, "num_experts": 4, "moe_topk": 2,
                                              "intermediate_size": 24, **over})


ALPHA = {"rope_type": "dynamic", "alpha": 50.0, "factor": 1.0, "rope_theta": 10000.0}  # HunYuan's fixed NTK stretch


# (id, HF class, config factory)
CASES = [
    ("qwen2", "Qwen2ForCausalLM", qwen2),
    ("qwen2-tied-yarn", "Qwen2ForCausalLM",
     lambda: qwen2(tie_word_embeddings=True, num_key_value_heads=4, max_position_embeddings=32,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 2.0,
                                    "original_max_position_embeddings": 16})),
    ("qwen3", "Qwen3ForCausalLM", qwen3),
    ("qwen3-tied-linear", "Qwen3ForCausalLM",
     lambda: qwen3(tie_word_embeddings=True, head_dim=8, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                          "rope_theta": 500.0})),
    ("qwen3_moe", "Qwen3MoeForCausalLM", qwen3_moe),
    ("qwen3_moe-normalized-step2-tied", "Qwen3MoeForCausalLM",
     lambda: qwen3_moe(norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[], num_hidden_layers=4,
                       tie_word_embeddings=True, head_dim=16)),
    ("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", hunyuan_dense),
    ("hunyuan_v1_dense-alpha-tied", "HunYuanDenseV1ForCausalLM",
     lambda: hunyuan_dense(rope_parameters=ALPHA, tie_word_embeddings=True, head_dim=16)),
    ("hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM", hunyuan_moe),
    ("hunyuan_v1_moe-alpha-tied-top1", "HunYuanMoEV1ForCausalLM",
     lambda: hunyuan_moe(rope_parameters=ALPHA, tie_word_embeddings=True, moe_topk=1)),
]
IDS = [c[0] for c in CASES]
# what generation runs on: one config per family, with the ids generate needs
IDS_ = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
GENERATION = {"qwen2": ("Qwen2ForCausalLM", lambda: qwen2(**IDS_)),
              "qwen3": ("Qwen3ForCausalLM", lambda: qwen3(**IDS_)),
              "qwen3_moe": ("Qwen3MoeForCausalLM", lambda: qwen3_moe(**IDS_)),
              "hunyuan_v1_dense": ("HunYuanDenseV1ForCausalLM", lambda: hunyuan_dense(rope_parameters=ALPHA, **IDS_)),
              "hunyuan_v1_moe": ("HunYuanMoEV1ForCausalLM", lambda: hunyuan_moe(**IDS_))}
# a pentad model of each family, for the export of a model made in pentad
_ENC = LLAMA["encoder"]
PENTAD = {"qwen2": {**LLAMA, "encoder": {**_ENC, "qkv_bias": True}},
          "qwen3": {**LLAMA, "encoder": {**_ENC, "qk_norm": "before_rotary", "head_size": 16}},
          "qwen3_moe": {**LLAMA, "encoder": {**_ENC, "qk_norm": "before_rotary", "num_layers": 3, "ffn": "moe",
                                             "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_size": 16,
                                                     "every": 2, "first": 0, "normalize": False}}},
          "hunyuan_v1_dense": {**LLAMA, "encoder": {**_ENC, "qk_norm": "after_rotary"}},
          "hunyuan_v1_moe": {**LLAMA, "encoder": {**_ENC, "qk_norm": "after_rotary", "ffn": "moe",
                                                  "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_size": 16,
                                                          "shared_experts": 1}}}}


def perturb(model: torch.nn.Module, scale: float, seed: int = 1) -> None:
    """Noise on every parameter (unit norms and zero biases become distinct values); projections get
    the most where ``scale`` is large, so that generation does not repeat one token."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            factor = 0.1 if p.dim() != 2 or "embed" in name else 1.0
            p.add_(factor * scale * torch.randn(p.shape, generator=g))


def save_hf(directory, class_name: str, make_config, scale: float = 0.05) -> Any:
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(make_config())
    perturb(model, scale)
    model.save_pretrained(directory)
    return model.eval()


def relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def assert_verified(report) -> None:
    assert report.ok, report.render()
    checks = report.checks()
    layers = [name for name in checks if name.startswith("layer ")]
    assert layers and "embeddings" in checks and "lm logits" in checks, list(checks)
    assert all(checks[name].relative <= TOL for name in checks if not checks[name].exact)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_converts_both_ways_with_parity_and_bitwise_round_trip(tmp_path, case):
    _, class_name, make_config = case
    hf = save_hf(tmp_path / "hf", class_name, make_config)
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert_verified(report)
    assert report.architecture == class_name
    ours, _, _ = load_model(tmp_path / "pentad")
    tokens = torch.randint(1, VOCAB, (2, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        reference = hf(tokens).logits
        hidden, _ = ours.encode(Batch(tokens=tokens))
        logits = ours.targets["lm"](hidden, Batch(tokens=tokens)).logits
    assert relative(logits, reference) <= TOL
    back = convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back", verify=True)
    assert_verified(back)
    again = getattr(transformers, class_name).from_pretrained(tmp_path / "back", local_files_only=True)
    before, after = hf.state_dict(), again.state_dict()
    assert before.keys() == after.keys()
    for key in before:
        assert before[key].dtype == after[key].dtype and torch.equal(before[key], after[key]), key
    ignore = {"transformers_version", "architectures", "_name_or_path"}
    assert {k: v for k, v in again.config.to_dict().items() if k not in ignore} == \
        {k: v for k, v in hf.config.to_dict().items() if k not in ignore}


@pytest.mark.parametrize("family", list(PENTAD))
def test_a_pentad_model_exports_as_its_family(tmp_path, family):
    make_run(tmp_path / "run", PENTAD[family])
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", verify=True)  # family guessed
    assert report.ok, report.render()
    assert report.family == family
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == family


PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 20, 31, 47]]
NEW = 10


@pytest.fixture(scope="module", params=list(GENERATION))
def pair(request, tmp_path_factory):
    class_name, make_config = GENERATION[request.param]
    root = tmp_path_factory.mktemp(request.param)
    hf = save_hf(root / "hf", class_name, make_config, scale=0.3)
    convert("hf-to-pentad", root / "hf", root / "pentad")
    ours, _, _ = load_model(root / "pentad")
    return hf, ours


def run_both(pair, stop: int, **options: Any) -> tuple[Any, torch.Tensor, Any]:
    hf, ours = pair
    pad = hf.config.pad_token_id
    mine = generate(ours, PROMPTS, max_new_tokens=NEW, stop_token_ids=[stop], pad_token_id=pad, **options)
    width = max(map(len, PROMPTS))
    ids, mask = torch.full((len(PROMPTS), width), pad), torch.zeros(len(PROMPTS), width, dtype=torch.long)
    for i, prompt in enumerate(PROMPTS):
        ids[i, width - len(prompt):], mask[i, width - len(prompt):] = torch.tensor(prompt), 1
    theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=stop, pad_token_id=pad,
                         output_scores=True, return_dict_in_generate=True, do_sample=False, **options)
    return mine, theirs.sequences[:, width:], theirs


def assert_same(mine: Any, new: torch.Tensor, stop: int, pad: int) -> None:
    assert new.shape[0] == len(mine.sequences())
    for i, row in enumerate(mine.sequences()):
        assert new[i, :len(row)].tolist() == row, f"row {i}: pentad {row}, HF {new[i].tolist()}"
        assert set(new[i, len(row):].tolist()) <= {pad, stop}, f"row {i} continues in HF"


def stops(pair) -> list[int]:
    """The EOS and a token greedy decoding produces mid-sequence (so that some rows stop)."""
    free, _, _ = run_both(pair, stop=pair[0].config.eos_token_id)
    first = free.sequences()[0]
    assert len({t for row in free.sequences() for t in row}) > 3, "degenerate model: raise its perturbation"
    return [pair[0].config.eos_token_id, first[min(NEW // 2, len(first) - 1)]]


def test_greedy_and_beam_generate_hf_tokens(pair):
    pad = pair[0].config.pad_token_id
    for stop in stops(pair):
        mine, new, _ = run_both(pair, stop)
        assert_same(mine, new, stop, pad)
        mine, new, theirs = run_both(pair, stop, num_beams=3, num_return_sequences=2, length_penalty=1.5)
        assert_same(mine, new, stop, pad)
        torch.testing.assert_close(mine.scores, theirs.sequences_scores, atol=1e-4, rtol=5e-5)


def edited(tmp_path, class_name: str, make_config, **changes: Any):
    save_hf(tmp_path / "hf", class_name, make_config)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.update(changes)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    return tmp_path / "hf"


@pytest.mark.parametrize("family, class_name, make_config, changes, message", [
    ("qwen2", "Qwen2ForCausalLM", qwen2, {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1,
                                          "layer_types": None},
     r"use_sliding_window with sliding_window 8 on layers \[1\]"),
    ("qwen2", "Qwen2ForCausalLM", qwen2, {"architectures": ["Qwen2ForSequenceClassification"]},
     "architecture Qwen2ForSequenceClassification"),
    ("qwen2", "Qwen2ForCausalLM", qwen2, {"rope_parameters": {"rope_type": "su", "rope_theta": 1.0}}, "rope_type 'su'"),
    ("qwen3", "Qwen3ForCausalLM", qwen3, {"attention_bias": True}, "attention_bias true"),
    ("qwen3", "Qwen3ForCausalLM", qwen3, {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0,
                                          "layer_types": None}, r"on layers \[0, 1\]"),
    ("qwen3_moe", "Qwen3MoeForCausalLM", qwen3_moe, {"use_sliding_window": True, "sliding_window": 8},
     "use_sliding_window with sliding_window 8"),
    ("qwen3_moe", "Qwen3MoeForCausalLM", qwen3_moe, {"mlp_only_layers": [0, 1, 2]}, "no sparse layer"),
    ("qwen3_moe", "Qwen3MoeForCausalLM", qwen3_moe, {"mlp_only_layers": [2], "decoder_sparse_step": 1},
     r"sparse layers \[0, 1\] .*cannot express"),
    ("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", hunyuan_dense, {"attention_bias": True}, "attention_bias true"),
    ("hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM", hunyuan_moe, {"moe_topk": [2, 1]}, r"moe_topk \[2, 1\]"),
    ("hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM", hunyuan_moe, {"head_dim": None}, "head_dim null"),
], ids=["qwen2-sliding", "qwen2-head", "qwen2-rope", "qwen3-bias", "qwen3-sliding", "qwen3_moe-sliding",
        "qwen3_moe-dense", "qwen3_moe-gap", "hunyuan-dense-bias", "hunyuan-moe-topk-list", "hunyuan-moe-head-dim"])
def test_options_the_family_cannot_hold_are_refused(tmp_path, family, class_name, make_config, changes, message):
    directory = edited(tmp_path, class_name, make_config, **changes)
    with pytest.raises(UserError, match=f"cannot convert .*\\({family}\\).*{message}"):
        convert("hf-to-pentad", directory, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_llama_without_biases_is_not_qwen2(tmp_path):
    """LLaMA's model is guessed as llama (qwen2 narrows it only where the query/key/value biases are);
    exported as qwen2 by name it is refused for the biases it lacks."""
    make_run(tmp_path / "run", copy.deepcopy(LLAMA))
    assert convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf").family == "llama"
    with pytest.raises(UserError, match=r"as qwen2: .*qkv_bias is None where qwen2 has True"):
        convert("pentad-to-hf", tmp_path / "run", tmp_path / "q", family="qwen2")


@pytest.mark.parametrize("class_name, make_config", [("Qwen3ForCausalLM", qwen3),
                                                     ("HunYuanDenseV1ForCausalLM", hunyuan_dense)])
def test_the_query_key_norm_order_matters(tmp_path, class_name, make_config):
    """Qwen3 normalises before the rotation, HunYuan after: the converted model with the other order differs."""
    hf = save_hf(tmp_path / "hf", class_name, make_config, scale=0.3)
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    ours, _, _ = load_model(tmp_path / "pentad")
    tokens = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        reference = hf(tokens).logits
        logits = ours.targets["lm"](ours.encode(Batch(tokens=tokens))[0], Batch(tokens=tokens)).logits
        assert relative(logits, reference) <= TOL
        for layer in ours.encoder.layers:
            layer.attention.after_rotary = not layer.attention.after_rotary
        flipped = ours.targets["lm"](ours.encode(Batch(tokens=tokens))[0], Batch(tokens=tokens)).logits
    assert relative(flipped, reference) > 1e-3


def test_a_query_key_norm_model_is_refused_by_families_without_them(tmp_path):
    make_run(tmp_path / "run", PENTAD["qwen3"])
    for family in ("llama", "qwen2", "hunyuan_v1_dense"):
        with pytest.raises(UserError, match=f"as {family}: .*qk_norm is 'before_rotary' where {family} has "):
            convert("pentad-to-hf", tmp_path / "run", tmp_path / family, family=family)
