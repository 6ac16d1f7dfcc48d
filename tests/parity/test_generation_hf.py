"""Generation parity with Hugging Face ``generate``: the same random-init models, converted with
``pentad convert hf-to-pentad`` (the mixtures of experts of Mixtral, Qwen2-MoE, DeepSeek-V3 and Switch
Transformers included, and DeepSeek-V3's latent cache), give the same greedy
tokens, beam hypotheses (tokens and scores), samples (same seed) and repetition-penalised tokens.

Decoder-only prompts are a left-padded batch of different lengths (HF is given the attention mask;
both derive positions from it); encoder-decoder sources are right-padded. HF fills finished rows
with its pad id or, in beam search when the pad id is 0, with the EOS, so rows are compared up to
pentad's lengths and the rest must be filler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pentad.generation import generate, load_model
from pentad.interop import convert

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 20, 31, 47]]
NEW = 10


def _registered(model_type: str) -> None:
    from pentad.interop.hf.families import families

    if model_type not in families():
        pytest.skip(f"pentad.interop.hf has no '{model_type}' converter registered")


def _perturb(model: Any, scale: float, seed: int) -> None:
    """Noise on every parameter: zero biases and unit norms become distinct values. Projection
    matrices get the most, so that the layers (not the tied token table) decide the next token
    and greedy decoding does not just repeat one token."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            table = p.dim() != 2 or any(k in name for k in ("embed", "shared", "wte", "wpe"))
            p.add_((0.1 if table else 1.0) * scale * torch.randn(p.shape, generator=g))


def _hf_config(family: str) -> Any:
    t = transformers
    if family == "gpt2":
        return t.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                            eos_token_id=0, pad_token_id=0)
    if family == "llama":
        return t.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    if family == "mistral":  # a window of 8: longer than every prompt, shorter than prompt + new tokens
        return t.MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                               sliding_window=8, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "gemma3_text":  # local, local, global; a window of 8 as Mistral's
        return t.Gemma3TextConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                                  sliding_window=8, layer_types=["sliding_attention"] * 2 + ["full_attention"],
                                  query_pre_attn_scalar=12, final_logit_softcapping=5.0,
                                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                                   "full_attention": {"rope_type": "default", "rope_theta": 1e4}},
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "mixtral":
        return t.MixtralConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                               max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "qwen2_moe":  # layer 1 dense (mlp_only_layers), a gated shared expert
        return t.Qwen2MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=16, shared_expert_intermediate_size=32, mlp_only_layers=[1],
                                max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "deepseek_v3":  # latent attention (the latent cache, absorbed), layer 0 dense, grouped sigmoid routing
        return t.DeepseekV3Config(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                                  n_shared_experts=1, n_routed_experts=8, kv_lora_rank=16, q_lora_rank=12,
                                  qk_rope_head_dim=4, v_head_dim=8, qk_nope_head_dim=8, n_group=4, topk_group=2,
                                  num_experts_per_tok=3, first_k_dense_replace=1, max_position_embeddings=64,
                                  num_nextn_predict_layers=0, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "bloom":
        return t.BloomConfig(vocab_size=96, hidden_size=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2,
                             pad_token_id=0)
    if family == "t5":
        return t.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                          relative_attention_num_buckets=8, relative_attention_max_distance=20,
                          decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    if family == "switch_transformers":
        return t.SwitchTransformersConfig(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                          num_sparse_encoder_layers=1, num_decoder_layers=2,
                                          num_sparse_decoder_layers=1,
                                          num_heads=4, num_experts=4, relative_attention_num_buckets=8,
                                          relative_attention_max_distance=20, decoder_start_token_id=0, pad_token_id=0,
                                          eos_token_id=1)
    if family == "bart":
        return t.BartConfig(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                            max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                            decoder_start_token_id=2, forced_eos_token_id=None, forced_bos_token_id=None)
    raise AssertionError(family)


HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM",
              "mistral": "MistralForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
              "qwen2_moe": "Qwen2MoeForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
              "bloom": "BloomForCausalLM",
              "t5": "T5ForConditionalGeneration", "bart": "BartForConditionalGeneration",
              "switch_transformers": "SwitchTransformersForConditionalGeneration"}
SCALES = {"gpt2": 0.3, "llama": 0.3, "mistral": 0.3, "gemma3_text": 0.3, "mixtral": 0.3,  # picked by trying a few
          "bloom": 1.0, "t5": 1.0, "bart": 0.3,
          "switch_transformers": 1.0, "qwen2_moe": 0.3, "deepseek_v3": 0.3}


class Pair:
    """A HF model and the pentad model converted from it, with padded HF inputs for ``PROMPTS``."""

    def __init__(self, family: str, root: Path):
        _registered(family)
        torch.manual_seed(0)
        self.config = _hf_config(family)
        self.hf = getattr(transformers, HF_CLASSES[family])(self.config).eval()
        _perturb(self.hf, SCALES[family], 1)
        self.hf.save_pretrained(root / "hf")
        convert("hf-to-pentad", root / "hf", root / "pentad")
        self.ours, _, _ = load_model(root / "pentad")
        self.seq2seq = self.ours.decoder is not None
        self.pad = self.config.pad_token_id
        self.start = self.config.decoder_start_token_id if self.seq2seq else None

    def run(self, stop: int, prompts: list[list[int]] = PROMPTS, **options: Any) -> tuple[Any, torch.Tensor, Any]:
        """(pentad GenerationOutput, HF new tokens, HF output with sequences_scores), same options."""
        ours = generate(self.ours, prompts, max_new_tokens=NEW, stop_token_ids=[stop], pad_token_id=self.pad,
                        decoder_start_token_id=self.start, **options)
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), self.pad)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            span = slice(0, len(p)) if self.seq2seq else slice(width - len(p), width)
            ids[i, span], mask[i, span] = torch.tensor(p), 1
        hf_options = {k: v for k, v in options.items() if k != "seed"}
        if "seed" in options:
            torch.manual_seed(options["seed"])
        theirs = self.hf.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=stop,
                                  pad_token_id=self.pad, output_scores=True, return_dict_in_generate=True,
                                  **hf_options)
        new = theirs.sequences[:, 1:] if self.seq2seq else theirs.sequences[:, width:]
        return ours, new, theirs


@pytest.fixture(scope="module", params=["gpt2", "llama", "mistral", "gemma3_text", "mixtral", "qwen2_moe",
                                        "deepseek_v3", "t5",
                                        "switch_transformers", "bart", "bloom"])
def pair(request, tmp_path_factory) -> Pair:
    return Pair(request.param, tmp_path_factory.mktemp(request.param))


def assert_same(pair: Pair, ours: Any, hf_rows: torch.Tensor, stop: int) -> None:
    assert hf_rows.shape[0] == len(ours.sequences())
    for i, row in enumerate(ours.sequences()):
        assert hf_rows[i, :len(row)].tolist() == row, f"row {i}: pentad {row}, HF {hf_rows[i].tolist()}"
        assert set(hf_rows[i, len(row):].tolist()) <= {pair.pad, stop}, f"row {i} continues in HF"


def _stops(pair: Pair) -> list[int]:
    """The model's EOS and a token greedy decoding produces mid-sequence (so that rows do stop)."""
    free, _, _ = pair.run(stop=pair.config.eos_token_id)
    assert len({t for row in free.sequences() for t in row}) > 3, "degenerate model: raise its perturbation"
    common = free.sequences()[0][NEW // 2] if len(free.sequences()[0]) > NEW // 2 else free.sequences()[0][-1]
    return [pair.config.eos_token_id, common]


def test_greedy(pair: Pair) -> None:
    for stop in _stops(pair):
        ours, new, _ = pair.run(stop, do_sample=False)
        assert_same(pair, ours, new, stop)


@pytest.mark.parametrize("early_stopping,length_penalty", [(False, 1.0), (True, 2.0), ("never", 0.5)])
def test_beam_search(pair: Pair, early_stopping: Any, length_penalty: float) -> None:
    for stop in _stops(pair):
        ours, new, theirs = pair.run(stop, num_beams=3, num_return_sequences=2, early_stopping=early_stopping,
                                     length_penalty=length_penalty, do_sample=False)
        assert_same(pair, ours, new, stop)
        # a sequence score sums every new token's log-probability (each to fp32 rounding; with
        # length_penalty 0.5 it is only divided by sqrt(length)), so the tolerance grows with it:
        # switch_transformers was seen 1.2e-4 (1.7e-5 relative) apart
        torch.testing.assert_close(ours.scores, theirs.sequences_scores, atol=1e-4, rtol=5e-5)


def test_sampling_with_the_same_seed(pair: Pair) -> None:
    """Same filters, same order of draws from the same seed: the same samples."""
    stop = pair.config.eos_token_id
    ours, new, _ = pair.run(stop, do_sample=True, top_k=12, top_p=0.9, temperature=0.8, seed=3)
    assert_same(pair, ours, new, stop)


def test_repetition_penalty(pair: Pair) -> None:
    # Prompts of one length: HF also penalises the pad ids of left-padded prompts, pentad only real tokens.
    prompts = [p[:3] for p in PROMPTS]
    stop = pair.config.eos_token_id
    ours, new, _ = pair.run(stop, prompts, do_sample=False, repetition_penalty=1.8)
    assert_same(pair, ours, new, stop)
