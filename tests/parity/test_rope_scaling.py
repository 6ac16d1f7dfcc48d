"""RoPE scaling parity with Hugging Face: a tiny ``LlamaForCausalLM`` (random weights, no download)
of every scaled ``rope_type`` converts to pentad, whose logits equal transformers' within 1e-5
relative (fp32) at positions far beyond ``original_max_position_embeddings`` (16 of 48), in one
forward and, for the kinds that depend on the sequence length seen (dynamic NTK, LongRoPE), in
incremental decoding with a key/value cache; greedy generation from left-padded prompts past the
original length gives transformers' tokens; converted back, config.json's RoPE fields are the same.
Without its scaling the converted model differs, so each comparison can fail.
"""

from __future__ import annotations

import json

import pytest
import torch

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.generation import generate
from pentad.interop import convert
from pentad.layers.cache import KVCache
from pentad.runs import load_run
from pentad.training.checkpoint import find_weights, load_weights, read_weights

transformers = pytest.importorskip("transformers")

ORIGINAL, LONG, SEQ, PREFILL, VOCAB, HEAD = 16, 64, 48, 40, 100, 16
TOL = 1e-5
KINDS = {
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 3.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": ORIGINAL, "beta_fast": 4.0, "beta_slow": 0.5},
    "yarn-mscale": {"factor": 4.0, "original_max_position_embeddings": ORIGINAL, "mscale": 0.9,
                    "mscale_all_dim": 0.4, "truncate": False},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL},
    "longrope": {"long_factor": [1.0 + 0.7 * i for i in range(HEAD // 2)],
                 "short_factor": [1.0 + 0.05 * i for i in range(HEAD // 2)],
                 "original_max_position_embeddings": ORIGINAL},
}
LENGTH_DEPENDENT = ("dynamic", "longrope")


@pytest.fixture(scope="module", params=list(KINDS))
def converted(request, tmp_path_factory):
    """(kind, HF model, pentad model, directory holding hf/ and the pentad run pentad/) for one scaled kind."""
    name = request.param
    kind = name.split("-")[0]
    tmp = tmp_path_factory.mktemp(name)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=ORIGINAL if kind == "dynamic" else LONG,
        rope_parameters={"rope_type": kind, "rope_theta": 100.0, **KINDS[name]})
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(tmp / "hf")
    convert("hf-to-pentad", tmp / "hf", tmp / "pentad")
    cfg, _ = load_run(tmp / "pentad")
    ours = build_model(cfg.model)
    load_weights(ours, read_weights(find_weights(tmp / "pentad")), str(tmp / "pentad"))
    return kind, hf.eval(), ours.eval(), tmp


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(2))


def relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def pentad_logits(model, ids: torch.Tensor, cache: KVCache | None = None, seen: int = 0) -> torch.Tensor:
    batch = Batch(tokens=ids, padding_mask=torch.zeros(ids.shape[0], seen + ids.shape[1], dtype=torch.bool))
    hidden, _ = model.encode(batch, cache)
    return model.targets["lm"](hidden, batch).logits


def test_scaled_rope_matches_hf_beyond_the_original_length(converted):
    kind, hf, ours, _ = converted
    ids = tokens()
    with torch.no_grad():
        if kind in LENGTH_DEPENDENT:  # first, while transformers' cached frequencies only grow
            cache, step = KVCache(), []
            out = hf(ids[:, :PREFILL], use_cache=True)
            theirs = [out.logits]
            step.append(pentad_logits(ours, ids[:, :PREFILL], cache))
            for t in range(PREFILL, SEQ):
                out = hf(ids[:, t:t + 1], cache=out.past_key_values, use_cache=True)
                theirs.append(out.logits)
                step.append(pentad_logits(ours, ids[:, t:t + 1], cache, seen=t))
            assert relative(torch.cat(step, 1), torch.cat(theirs, 1)) <= TOL
        reference = hf(ids).logits
        logits = pentad_logits(ours, ids)
        assert relative(logits, reference) <= TOL
        rotary = ours.encoder.rotary
        scaling, rotary.scaling = rotary.scaling, None
        try:
            unscaled = pentad_logits(ours, ids)
        finally:
            rotary.scaling = scaling
    assert relative(unscaled[:, ORIGINAL:], reference[:, ORIGINAL:]) > 1e-3


def test_scaled_rope_config_round_trips(converted, tmp_path):
    kind, _, _, tmp = converted
    cfg, _ = load_run(tmp / "pentad")
    assert cfg.model.encoder.rope_scaling.type == kind
    convert("pentad-to-hf", tmp / "pentad", tmp_path / "back")
    before = json.loads((tmp / "hf" / "config.json").read_text())
    after = json.loads((tmp_path / "back" / "config.json").read_text())
    for key in ("rope_parameters", "max_position_embeddings"):
        assert after[key] == before[key], key
    assert "rope_scaling" not in after and "rope_theta" not in after


def test_scaled_rope_generates_hf_tokens_past_the_original_length(converted):
    """Left-padded prompts (explicit positions) and 24 new tokens: positions up to 29 of original 16."""
    _, _, ours, tmp = converted
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp / "hf", local_files_only=True).eval()  # fresh RoPE state
    prompts, new, stop = [[5, 6, 7, 8, 9, 10], [11, 12, 13]], 24, VOCAB - 1
    ids, mask = torch.zeros(2, 6, dtype=torch.long), torch.zeros(2, 6, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, 6 - len(prompt):], mask[i, 6 - len(prompt):] = torch.tensor(prompt), 1
    theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=stop,
                         pad_token_id=0, do_sample=False)[:, 6:]
    out = generate(ours, prompts, max_new_tokens=new, stop_token_ids=[stop], pad_token_id=0)
    assert int(out.lengths.max()) > 16 - 6  # some row runs past the original length
    for row, length in enumerate(out.lengths.tolist()):  # a stopped row's filler is each side's own
        assert torch.equal(out.tokens[row, :length], theirs[row, :length]), row
