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


# (id, HF class, config factory)
CASES = [
    ("qwen2", "Qwen2ForCausalLM", qwen2),
    ("qwen2-tied-yarn", "Qwen2ForCausalLM",
     lambda: qwen2(tie_word_embeddings=True, num_key_value_heads=4, max_position_embeddings=32,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 2.0,
                                    "original_max_position_embeddings": 16})),
]
IDS = [c[0] for c in CASES]
# what generation runs on: one config per family, with the ids generate needs
GENERATION = {"qwen2": ("Qwen2ForCausalLM", lambda: qwen2(bos_token_id=1, eos_token_id=2, pad_token_id=0))}
# a pentad model of each family, for the export of a model made in pentad
PENTAD = {"qwen2": {**LLAMA, "encoder": {**LLAMA["encoder"], "qkv_bias": True}}}


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
], ids=["qwen2-sliding", "qwen2-head", "qwen2-rope"])
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
