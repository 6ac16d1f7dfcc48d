"""Conversion parity for the encoder-decoder and decoder-only families and ALBERT: Hugging Face
models built from tiny configs with random weights (no download) convert to pentad and back.

* HF -> pentad: encoder (and decoder) hidden states and logits equal HF's within 1e-5 (fp32) on a
  batch with padded rows (padded decoder rows too), and the ``--verify`` report agrees.
* HF -> pentad -> HF: bitwise-identical state dicts and equal configs.
* pentad -> HF: ``from_pretrained`` loads it and ``--verify`` passes (pentad -> HF -> pentad bitwise
  is in tests/unit/interop/test_hf_layout.py).
* TencentPretrain checkpoints laid out as TencentPretrain's own HF converters write them (LLaMA with
  its interleaved rotary rows, T5 v1.1) convert and match HF.
* SentencePiece tokenizers: XLM-R's fairseq ids and T5's sentinels, against HF's tokenizers.
* sentence-transformers directories: mean-pooled embeddings are verified and the files come back.
"""

from __future__ import annotations

import io
import json

import pytest
import torch
from tests.unit.interop.helpers import (
    ALBERT,
    BART,
    BLOOM,
    GEMMA3,
    LLAMA,
    MISTRAL,
    MIXTRAL,
    PEGASUS,
    QWEN2_MOE,
    SWITCH,
    T5,
    T5_V1_1,
    make_run,
    variant,
)

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.interop import convert
from pentad.runs import load_run
from pentad.training.checkpoint import find_weights, load_weights, read_weights

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB, HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 60, 32, 2, 4, 48, 24
LENGTHS, DECODER_LENGTHS = (12, 9, 5), (7, 5, 3)  # all but the first row padded


def perturb(module: torch.nn.Module, scale: float = 0.05) -> None:
    """Noise on every trainable parameter (a stored sinusoidal table is left as it is)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g))


def t5_config(**over):
    return transformers.T5Config(**{"vocab_size": VOCAB, "d_model": HIDDEN, "d_kv": HIDDEN // HEADS, "d_ff": FFN,
                                    "num_layers": LAYERS, "num_heads": HEADS, "relative_attention_num_buckets": 8,
                                    "relative_attention_max_distance": 16, **over})


def bart_config(cls=None, **over):
    cls = cls or transformers.BartConfig
    return cls(**{"vocab_size": VOCAB, "d_model": HIDDEN, "encoder_layers": LAYERS, "decoder_layers": LAYERS,
                  "encoder_attention_heads": HEADS, "decoder_attention_heads": HEADS, "encoder_ffn_dim": FFN,
                  "decoder_ffn_dim": FFN, "max_position_embeddings": POSITIONS, **over})


def llama_config(**over):
    return transformers.LlamaConfig(**{"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN,
                                       "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                                       "num_key_value_heads": 2, "max_position_embeddings": POSITIONS, **over})


def mistral_config(**over):
    """A window of 5 positions, shorter than the batch's rows (12)."""
    return transformers.MistralConfig(**{"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN,
                                         "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                                         "num_key_value_heads": 2, "max_position_embeddings": POSITIONS,
                                         "sliding_window": 5, **over})


def gemma3_config(**over):
    """Local, local, global layers (window 5, rows of 12), local rotary base 100, global linear RoPE scaling,
    scores by 1/sqrt(12) (not the head width 16), final logits soft-capped at 3."""
    return transformers.Gemma3TextConfig(**{
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": 3,
        "num_attention_heads": HEADS, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": POSITIONS,
        "sliding_window": 5, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 12, "final_logit_softcapping": 3.0,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
        **over})


def mixtral_config(**over):
    return transformers.MixtralConfig(**{"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN,
                                         "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                                         "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
                                         "max_position_embeddings": POSITIONS, **over})


def qwen2_moe_config(**over):
    """Three layers, the middle one dense (mlp_only_layers), a shared expert twice an expert's width."""
    return transformers.Qwen2MoeConfig(**{"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN,
                                          "num_hidden_layers": 3, "num_attention_heads": HEADS,
                                          "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
                                          "moe_intermediate_size": 16, "shared_expert_intermediate_size": 32,
                                          "mlp_only_layers": [1], "max_position_embeddings": POSITIONS, **over})


def switch_config(**over):
    return transformers.SwitchTransformersConfig(**{
        "vocab_size": VOCAB, "d_model": HIDDEN, "d_kv": HIDDEN // HEADS, "d_ff": FFN, "num_layers": 4,
        "num_sparse_encoder_layers": 2, "num_decoder_layers": 4, "num_sparse_decoder_layers": 2, "num_heads": HEADS,
        "num_experts": 4, "expert_capacity": 64, "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 16, **over})


def albert_config(**over):
    return transformers.AlbertConfig(**{"vocab_size": VOCAB, "embedding_size": 16, "hidden_size": HIDDEN,
                                        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                                        "intermediate_size": FFN, "max_position_embeddings": POSITIONS, **over})


def untie(model):
    """A T5 v1.1 output layer of its own (transformers 5 builds every T5 tied)."""
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(0.05 * torch.randn(VOCAB, HIDDEN))


# (id, HF class, config factory, pentad target type -> HF output field, post-construction edit)
CASES = [
    ("t5", "T5ForConditionalGeneration", t5_config, {"lm": "logits"}, None),
    ("t5-v1_1", "T5ForConditionalGeneration",
     lambda: t5_config(feed_forward_proj="gated-gelu", d_kv=16, tie_word_embeddings=False), {"lm": "logits"}, untie),
    ("t5-model", "T5Model", t5_config, {}, None),
    ("bart", "BartForConditionalGeneration", bart_config, {"lm": "logits"}, None),
    ("bart-model", "BartModel", bart_config, {}, None),
    ("pegasus", "PegasusForConditionalGeneration",
     lambda: bart_config(transformers.PegasusConfig, scale_embedding=True, activation_function="relu"),
     {"lm": "logits"}, None),
    ("llama-gqa", "LlamaForCausalLM", llama_config, {"lm": "logits"}, None),
    ("llama-tied", "LlamaForCausalLM", lambda: llama_config(num_key_value_heads=HEADS, tie_word_embeddings=True,
                                                           rope_theta=500.0), {"lm": "logits"}, None),
    ("llama-model", "LlamaModel", llama_config, {}, None),
    ("mixtral", "MixtralForCausalLM", mixtral_config, {"lm": "logits"}, None),
    ("switch", "SwitchTransformersForConditionalGeneration", switch_config, {"lm": "logits"}, None),
    ("switch-all-sparse", "SwitchTransformersForConditionalGeneration",
     lambda: switch_config(num_sparse_encoder_layers=4, num_sparse_decoder_layers=1, router_jitter_noise=0.0),
     {"lm": "logits"}, None),
    ("mixtral-top1-tied-window", "MixtralForCausalLM",
     lambda: mixtral_config(num_experts_per_tok=1, tie_word_embeddings=True, router_aux_loss_coef=0.02,
                            sliding_window=5), {"lm": "logits"}, None),
    ("mistral-window", "MistralForCausalLM", mistral_config, {"lm": "logits"}, None),
    ("gemma3", "Gemma3ForCausalLM", gemma3_config, {"lm": "logits"}, None),
    ("gemma3-untied-every-layer-global", "Gemma3ForCausalLM",
     lambda: gemma3_config(tie_word_embeddings=False, layer_types=None, sliding_window_pattern=1,
                           final_logit_softcapping=None, rope_parameters=None), {"lm": "logits"}, None),
    ("mistral-v0.3-tied-scaled", "MistralForCausalLM",
     lambda: mistral_config(sliding_window=None, tie_word_embeddings=True, head_dim=16,
                            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}),
     {"lm": "logits"}, None),
    ("qwen2_moe", "Qwen2MoeForCausalLM", qwen2_moe_config, {"lm": "logits"}, None),
    ("qwen2_moe-normalized-step2-tied", "Qwen2MoeForCausalLM",
     lambda: qwen2_moe_config(norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[], num_hidden_layers=4,
                              tie_word_embeddings=True, qkv_bias=False, num_experts_per_tok=3),
     {"lm": "logits"}, None),
    ("bloom", "BloomForCausalLM",
     lambda: transformers.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS),
     {"lm": "logits"}, None),
    ("albert-pretraining", "AlbertForPreTraining", albert_config, {"mlm": "prediction_logits", "sop": "sop_logits"},
     None),
    ("albert-mlm", "AlbertForMaskedLM", albert_config, {"mlm": "logits"}, None),
    ("albert-cls", "AlbertForSequenceClassification", lambda: albert_config(num_labels=3), {"cls": "logits"}, None),
    ("albert-token", "AlbertForTokenClassification", lambda: albert_config(num_labels=4), {"tagger": "logits"},
     None),
    ("albert-model", "AlbertModel", albert_config, {}, None),
    ("albert-qa", "AlbertForQuestionAnswering", albert_config, {}, None),  # start/end compared by --verify
]
IDS = [c[0] for c in CASES]


def save_hf(directory, class_name, make_config, edit=None):
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(make_config())
    if edit is not None:
        edit(model)
    perturb(model)
    model.save_pretrained(directory)
    return model.eval()


def rows(lengths, seq, pad, seed):
    """Right-padded token ids whose real tokens never equal the padding id."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (len(lengths), seq), generator=g)
    tokens = torch.where(tokens == pad, (tokens + 1) % VOCAB, tokens)
    padding = torch.arange(seq)[None, :] >= torch.tensor(lengths)[:, None]
    tokens[padding] = pad
    return tokens, padding


def pentad_model(run_dir):
    cfg, _ = load_run(run_dir)
    model = build_model(cfg.model)
    load_weights(model, read_weights(find_weights(run_dir)), str(run_dir))
    return cfg, model.eval()


def run_both(hf, ours, cfg, pad, albert: bool):
    """(HF output, pentad stack outputs {name: (hidden, keep)}, pentad target outputs)."""
    tokens, padding = rows(LENGTHS, 12, pad, 2)
    keep = ~padding
    hf_inputs = {"input_ids": tokens, "attention_mask": keep.long()}
    batch = Batch(tokens=tokens, padding_mask=padding)
    if albert:
        segments = ((torch.arange(12)[None, :] >= torch.tensor(LENGTHS)[:, None] // 2) & keep).long()
        hf_inputs["token_type_ids"] = batch.segments = segments
    if cfg.model.decoder is not None:
        decoder_tokens, decoder_padding = rows(DECODER_LENGTHS, 7, pad, 3)
        hf_inputs.update(decoder_input_ids=decoder_tokens, decoder_attention_mask=(~decoder_padding).long())
        batch.decoder_tokens, batch.decoder_padding_mask = decoder_tokens, decoder_padding
    with torch.no_grad():
        ref = hf(**hf_inputs, output_hidden_states=True)
        hidden, mask = ours.encode(batch)
        stacks = {"encoder": (hidden, keep)}
        if cfg.model.decoder is not None:
            hidden = ours.decode(batch, hidden, mask)
            stacks["decoder"] = (hidden, ~batch.decoder_padding_mask)
        outputs = {name: target(hidden, batch) for name, target in ours.targets.items()}
    return ref, stacks, outputs


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hf_to_pentad_outputs_match(tmp_path, case):
    _, class_name, make_config, fields, edit = case
    hf = save_hf(tmp_path / "hf", class_name, make_config, edit)
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert report.architecture == class_name
    cfg, ours = pentad_model(tmp_path / "pentad")
    pad = hf.config.pad_token_id if hf.config.pad_token_id is not None else 0
    ref, stacks, outputs = run_both(hf, ours, cfg, pad, albert=class_name.startswith("Albert"))
    if cfg.model.decoder is not None:
        theirs = {"encoder": ref.encoder_hidden_states[-1], "decoder": ref.decoder_hidden_states[-1]}
    else:
        theirs = {"encoder": ref.hidden_states[-1]}
    for name, (hidden, keep) in stacks.items():
        torch.testing.assert_close(hidden[keep], theirs[name][keep], atol=TOL, rtol=0, msg=name)
    head_keep = stacks["decoder" if "decoder" in stacks else "encoder"][1]
    compared = 0
    for target in cfg.model.targets:
        if target.type in fields:
            logits, reference = outputs[target.target_name].logits, getattr(ref, fields[target.type])
            if logits.dim() == 3:
                logits, reference = logits[head_keep], reference[head_keep]
            torch.testing.assert_close(logits, reference, atol=TOL, rtol=0, msg=target.type)
            compared += 1
    assert compared == len(fields)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hf_to_pentad_to_hf_is_bitwise(tmp_path, case):
    _, class_name, make_config, _, edit = case
    hf = save_hf(tmp_path / "hf", class_name, make_config, edit)
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    report = convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back", verify=True)
    assert report.ok, report.render()
    again = getattr(transformers, class_name).from_pretrained(tmp_path / "back", local_files_only=True)
    before, after = hf.state_dict(), again.state_dict()
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key
    ignore = {"transformers_version", "architectures", "_name_or_path"}
    original = {k: v for k, v in hf.config.to_dict().items() if k not in ignore}
    exported = {k: v for k, v in again.config.to_dict().items() if k not in ignore}
    assert exported == original


@pytest.mark.parametrize("family, model, auto", [
    ("t5", T5, "AutoModelForSeq2SeqLM"), ("t5", T5_V1_1, "AutoModelForSeq2SeqLM"),
    ("bart", BART, "AutoModelForSeq2SeqLM"), ("pegasus", PEGASUS, "AutoModelForSeq2SeqLM"),
    ("llama", LLAMA, "AutoModelForCausalLM"), ("bloom", BLOOM, "AutoModelForCausalLM"),
    ("mixtral", MIXTRAL, "AutoModelForCausalLM"), ("switch_transformers", SWITCH, "AutoModelForSeq2SeqLM"),
    ("mistral", MISTRAL, "AutoModelForCausalLM"), ("gemma3_text", GEMMA3, "AutoModelForCausalLM"),
    ("qwen2_moe", QWEN2_MOE, "AutoModelForCausalLM"),
    ("albert", ALBERT, "AutoModelForPreTraining"),
    ("albert", variant(ALBERT, targets=[{"type": "cls", "num_labels": 4}]), "AutoModelForSequenceClassification"),
    ("albert", variant(ALBERT, targets=[{"type": "tagger", "num_labels": 4}]), "AutoModelForTokenClassification"),
    ("albert", variant(ALBERT, targets=[{"type": "span"}]), "AutoModelForQuestionAnswering"),
], ids=["t5", "t5-v1_1", "bart", "pegasus", "llama", "bloom", "mixtral", "switch", "mistral", "gemma3", "qwen2_moe",
        "albert",
        "albert-cls", "albert-token", "albert-qa"])
def test_pentad_to_hf_loads_with_auto_classes(tmp_path, family, model, auto):
    make_run(tmp_path / "run", model)
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", verify=True)  # family guessed
    assert report.ok, report.render()
    assert report.family == family
    loaded = getattr(transformers, auto).from_pretrained(tmp_path / "hf", local_files_only=True)
    assert type(loaded).__name__ == report.architecture


# ------------------------------------------------------------------------------- TencentPretrain
def test_bloom_slow_but_exact_is_refused(tmp_path):
    """transformers' BLOOM with pretraining_tp > 1 and slow_but_exact leaves out the biases of
    self_attention.dense and mlp.dense_4h_to_h: it computes what the same weights compute with those
    biases zeroed, not the model they describe. pentad refuses it and says how to convert."""
    def config(**over):
        return transformers.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS, **over)

    hf = save_hf(tmp_path / "hf", "BloomForCausalLM", lambda: config(pretraining_tp=2, slow_but_exact=True))
    tokens = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    plain = transformers.BloomForCausalLM(config()).eval()
    plain.load_state_dict(hf.state_dict())
    no_bias = transformers.BloomForCausalLM(config()).eval()
    no_bias.load_state_dict(hf.state_dict())
    with torch.no_grad():
        for layer in no_bias.transformer.h:
            layer.self_attention.dense.bias.zero_()
            layer.mlp.dense_4h_to_h.bias.zero_()
        exact, full, dropped = (m(tokens).logits for m in (hf, plain, no_bias))
    # The fact the refusal rests on (if transformers changes it, this fails and the refusal is revisited).
    assert torch.allclose(exact, dropped, rtol=0, atol=1e-5 * float(dropped.abs().max()))
    assert float((exact - full).abs().max()) > 1e-2 * float(full.abs().max())
    with pytest.raises(UserError, match=r'"pretraining_tp": 2 with "slow_but_exact": true.*leaves out both '
                                        r'layers\' biases.*set "slow_but_exact": false in config.json'):
        convert("hf-to-pentad", tmp_path / "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # pretraining_tp alone changes nothing in transformers (without slow_but_exact it is ignored): converted.
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg["slow_but_exact"] = False
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "out", verify=True)
    assert report.ok, report.render()


def _tp_directory(directory, state, config):
    directory.mkdir()
    torch.save({k: v.clone() for k, v in state.items()}, directory / "model.bin")
    (directory / "config.json").write_text(json.dumps(config))


def test_tencentpretrain_llama_with_interleaved_rotary_matches_hf(tmp_path):
    """A LLaMA (grouped-query) laid out as scripts/convert_llama_from_huggingface_to_tencentpretrain.py
    writes it: q and k rows permuted to Meta's interleaved rotary pairs, layers as encoder.transformer.N."""
    hf = save_hf(tmp_path / "hf", "LlamaForCausalLM", llama_config)
    s = hf.state_dict()
    head = HIDDEN // HEADS

    def interleave(w, heads):  # the converter's unpermute: rotate-half rows -> interleaved pairs
        return w.reshape(heads, 2, head // 2, HIDDEN).transpose(1, 2).reshape(w.shape)

    tp = {"embedding.word.embedding.weight": s["model.embed_tokens.weight"],
          "encoder.layer_norm.weight": s["model.norm.weight"], "target.lm.output_layer.weight": s["lm_head.weight"]}
    for i in range(LAYERS):
        h, t = f"model.layers.{i}.", f"encoder.transformer.{i}."
        tp[f"{t}self_attn.linear_layers.0.weight"] = interleave(s[f"{h}self_attn.q_proj.weight"], HEADS)
        tp[f"{t}self_attn.linear_layers.1.weight"] = interleave(s[f"{h}self_attn.k_proj.weight"], 2)
        tp[f"{t}self_attn.linear_layers.2.weight"] = s[f"{h}self_attn.v_proj.weight"]
        tp[f"{t}self_attn.final_linear.weight"] = s[f"{h}self_attn.o_proj.weight"]
        tp[f"{t}layer_norm_1.weight"] = s[f"{h}input_layernorm.weight"]
        tp[f"{t}layer_norm_2.weight"] = s[f"{h}post_attention_layernorm.weight"]
        for ours, theirs in (("linear_gate", "gate_proj"), ("linear_1", "up_proj"), ("linear_2", "down_proj")):
            tp[f"{t}feed_forward.{ours}.weight"] = s[f"{h}mlp.{theirs}.weight"]
    _tp_directory(tmp_path / "tp", tp, {
        "emb_size": HIDDEN, "feedforward_size": FFN, "hidden_size": HIDDEN, "hidden_act": "silu", "heads_num": HEADS,
        "local_kv_heads_num": 2, "layers_num": LAYERS, "dropout": 0.0, "data_processor": "lm",
        "max_seq_length": POSITIONS, "embedding": ["word"], "remove_transformer_bias": True,
        "remove_embedding_layernorm": True, "rotary_position_embedding": True, "encoder": "transformer",
        "feed_forward": "gated", "mask": "causal", "layernorm_positioning": "pre", "layernorm": "rms",
        "target": ["lm"]})
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    cfg, ours = pentad_model(tmp_path / "pentad")
    ref, stacks, outputs = run_both(hf, ours, cfg, 0, albert=False)
    hidden, keep = stacks["encoder"]
    torch.testing.assert_close(hidden[keep], ref.hidden_states[-1][keep], atol=TOL, rtol=0)
    torch.testing.assert_close(outputs["lm"].logits[keep], ref.logits[keep], atol=TOL, rtol=0)
    convert("pentad-to-tencentpretrain", tmp_path / "pentad", tmp_path / "back", verify=True)
    back = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert back.keys() == tp.keys() and all(torch.equal(back[k], tp[k]) for k in tp)


def test_tencentpretrain_t5_v1_1_from_its_converter_matches_hf(tmp_path):
    """A T5 v1.1 laid out as scripts/convert_t5_from_huggingface_to_tencentpretrain.py writes it:
    the encoder's relative bias only in encoder.relative_pos_emb (TencentPretrain's layers read a
    per-layer copy the converter does not write; pentad reads this one and says so)."""
    # relative_attention_max_distance 128: fixed in TencentPretrain.
    hf = save_hf(tmp_path / "hf", "T5ForConditionalGeneration",
                 lambda: t5_config(feed_forward_proj="gated-gelu", d_kv=16, tie_word_embeddings=False,
                                   relative_attention_max_distance=128), untie)
    s = hf.state_dict()
    tp = {"embedding.word.embedding.weight": s["shared.weight"],
          "tgt_embedding.word.embedding.weight": s["shared.weight"],
          "target.lm.output_layer.weight": s["lm_head.weight"],
          "encoder.relative_pos_emb.relative_attention_bias.weight":
              s["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
          "decoder.self_pos_emb.relative_attention_bias.weight":
              s["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
          "encoder.layer_norm.weight": s["encoder.final_layer_norm.weight"],
          "decoder.layer_norm.weight": s["decoder.final_layer_norm.weight"]}
    for stack, block, tp_block, ffn in (("encoder", "encoder.block", "encoder.transformer", 1),
                                        ("decoder", "decoder.block", "decoder.transformer_decoder", 2)):
        for i in range(LAYERS):
            h, t = f"{block}.{i}.layer.", f"{tp_block}.{i}."
            for j, name in enumerate("qkv"):
                tp[f"{t}self_attn.linear_layers.{j}.weight"] = s[f"{h}0.SelfAttention.{name}.weight"]
            tp[f"{t}self_attn.final_linear.weight"] = s[f"{h}0.SelfAttention.o.weight"]
            tp[f"{t}layer_norm_1.weight"] = s[f"{h}0.layer_norm.weight"]
            if stack == "decoder":
                for j, name in enumerate("qkv"):
                    tp[f"{t}context_attn.linear_layers.{j}.weight"] = s[f"{h}1.EncDecAttention.{name}.weight"]
                tp[f"{t}context_attn.final_linear.weight"] = s[f"{h}1.EncDecAttention.o.weight"]
                tp[f"{t}layer_norm_2.weight"] = s[f"{h}1.layer_norm.weight"]
            for ours, theirs in (("linear_gate", "wi_0"), ("linear_1", "wi_1"), ("linear_2", "wo")):
                tp[f"{t}feed_forward.{ours}.weight"] = s[f"{h}{ffn}.DenseReluDense.{theirs}.weight"]
            tp[f"{t}layer_norm_{ffn + 1}.weight"] = s[f"{h}{ffn}.layer_norm.weight"]
    _tp_directory(tmp_path / "tp", tp, {
        "emb_size": HIDDEN, "feedforward_size": FFN, "hidden_size": HIDDEN, "hidden_act": "gelu_fast",
        "attention_head_size": 16, "heads_num": HEADS, "layers_num": LAYERS, "decoder_layers_num": LAYERS,
        "dropout": 0.0, "data_processor": "t5", "embedding": ["word"], "relative_position_embedding": True,
        "relative_attention_buckets_num": 8, "remove_embedding_layernorm": True, "tgt_embedding": ["word"],
        "share_embedding": True, "encoder": "transformer", "mask": "fully_visible", "layernorm_positioning": "pre",
        "feed_forward": "gated", "remove_attention_scale": True, "layernorm": "t5", "remove_transformer_bias": True,
        "decoder": "transformer", "target": ["lm"]})
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "pentad", verify=True)
    assert report.ok and any("encoder.relative_pos_emb" in n for n in report.notes)
    cfg, ours = pentad_model(tmp_path / "pentad")
    ref, stacks, outputs = run_both(hf, ours, cfg, 0, albert=False)
    for name, theirs in (("encoder", ref.encoder_hidden_states[-1]), ("decoder", ref.decoder_hidden_states[-1])):
        hidden, keep = stacks[name]
        torch.testing.assert_close(hidden[keep], theirs[keep], atol=TOL, rtol=0, msg=name)
    keep = stacks["decoder"][1]
    torch.testing.assert_close(outputs["lm"].logits[keep], ref.logits[keep], atol=TOL, rtol=0)
    convert("pentad-to-tencentpretrain", tmp_path / "pentad", tmp_path / "back")
    back = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert back.keys() == tp.keys() and all(torch.equal(back[k], tp[k]) for k in tp)


# -------------------------------------------------------------------------------------- tokenizers
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "A man is eating food.", "Hello world, a test.",
             "Sentence piece models split words into pieces.", "The girl is carrying a baby."] * 20
TEXTS = ["The quick brown fox, hello world!", "a lazy dog eats food", "Über naïve café"]


def train_sentencepiece(**options) -> bytes:
    spm = pytest.importorskip("sentencepiece")
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES), model_writer=buffer, vocab_size=60,
                                   hard_vocab_limit=False, character_coverage=1.0, minloglevel=2, **options)
    return buffer.getvalue()


def hf_tokenizer(directory):
    pytest.importorskip("google.protobuf", reason="transformers reads SentencePiece files with protobuf")
    return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)


def test_xlm_roberta_sentencepiece_gets_fairseq_ids(tmp_path):
    """XLM-R's sentencepiece.bpe.model (<unk> <s> </s> first) as HF numbers it: <s> <pad> </s> <unk>,
    every other piece one up, <mask> last; and back to the original file on export."""
    data = train_sentencepiece(model_type="unigram")
    save_hf(tmp_path / "hf", "XLMRobertaForMaskedLM", lambda: transformers.XLMRobertaConfig(
        vocab_size=VOCAB + 2, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=HEADS,
        intermediate_size=FFN, max_position_embeddings=POSITIONS + 2, type_vocab_size=1, pad_token_id=1))
    (tmp_path / "hf" / "sentencepiece.bpe.model").write_bytes(data)
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
    theirs = hf_tokenizer(tmp_path / "hf")
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    _, ours = load_run(tmp_path / "pentad")
    assert ours.vocab_size == len(theirs)
    for text in TEXTS:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
    assert (ours.pad_id, ours.cls_id, ours.sep_id, ours.unk_id, ours.mask_id) == (
        theirs.pad_token_id, theirs.cls_token_id, theirs.sep_token_id, theirs.unk_token_id, theirs.mask_token_id)
    convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back")
    assert (tmp_path / "back" / "sentencepiece.bpe.model").read_bytes() == data
    again = hf_tokenizer(tmp_path / "back")
    assert [again(t)["input_ids"] for t in TEXTS] == [theirs(t)["input_ids"] for t in TEXTS]


def test_t5_sentinels_get_hf_ids(tmp_path):
    data = train_sentencepiece(model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    make_run(tmp_path / "run", T5)
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    (tmp_path / "hf" / "spiece.model").write_bytes(data)
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer",
                                                                        "extra_ids": 100}))
    theirs = hf_tokenizer(tmp_path / "hf")
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    _, ours = load_run(tmp_path / "pentad")
    assert ours.vocab_size == len(theirs)
    for i in (0, 1, 99):
        assert ours.token_to_id(f"<extra_id_{i}>") == theirs.convert_tokens_to_ids(f"<extra_id_{i}>")
    for text in TEXTS:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
    convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back")
    assert (tmp_path / "back" / "spiece.model").read_bytes() == data
    assert json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())["extra_ids"] == 100


# --------------------------------------------------------------------------- sentence-transformers
def test_sentence_transformers_directory(tmp_path):
    save_hf(tmp_path / "st", "BertModel", lambda: transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=FFN, max_position_embeddings=POSITIONS))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (tmp_path / "st" / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "st" / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False}
    (tmp_path / "st" / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (tmp_path / "st" / "2_Normalize").mkdir()
    report = convert("hf-to-pentad", tmp_path / "st", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert ("sentence embedding (mean pooling, normalised)" in report.checks())
    back = convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back", verify=True)
    assert back.ok and any(name.startswith("sentence embedding") for name in back.checks())
    assert json.loads((tmp_path / "back" / "modules.json").read_text()) == modules
    assert json.loads((tmp_path / "back" / "1_Pooling" / "config.json").read_text()) == pooling
    assert (tmp_path / "back" / "2_Normalize").is_dir()
