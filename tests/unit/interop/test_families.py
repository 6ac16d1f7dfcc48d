"""The ALBERT, T5, BART, Pegasus, LLaMA and BLOOM key maps without ``transformers``: HF names,
the layouts that need a transform, HF config options pentad cannot hold, and the errors (each a
UserError, exit status 2 on the command line). Numerical parity is in
tests/parity/test_conversion_families.py; pentad -> HF -> pentad is bitwise in test_hf_layout.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pentad.errors import UserError
from pentad.interop import convert, spm
from pentad.training.checkpoint import read_weights

from .helpers import ALBERT, BART, BLOOM, LLAMA, PEGASUS, T5, T5_V1_1, make_run, variant
from .test_cli import exit_status


def exported(tmp_path: Path, model: dict, name: str = "hf") -> Path:
    make_run(tmp_path / f"{name}-run", model)
    convert("pentad-to-hf", tmp_path / f"{name}-run", tmp_path / name)
    return tmp_path / name


def edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def test_hugging_face_names(tmp_path):
    ours = read_weights(make_run(tmp_path / "run", BLOOM) and tmp_path / "run" / "model.safetensors")
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "bloom")
    state = load_file(str(tmp_path / "bloom" / "model.safetensors"))
    fused = state["transformer.h.0.self_attention.query_key_value.weight"]  # [q0; k0; v0; q1; ...] per head
    qkv = ours["encoder.layers.0.attention.qkv.weight"]
    head = 32 // 4
    assert torch.equal(fused[:head], qkv[:head]) and torch.equal(fused[head:2 * head], qkv[32:32 + head])
    assert "lm_head.weight" not in state  # tied
    t5 = load_file(str(exported(tmp_path, T5_V1_1, "t5") / "model.safetensors"))
    assert t5["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].shape == (8, 4)
    assert "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" not in t5
    assert "decoder.block.1.layer.1.EncDecAttention.k.weight" in t5 and "lm_head.weight" in t5
    assert "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" in t5
    config = json.loads((tmp_path / "t5" / "config.json").read_text())
    assert (config["feed_forward_proj"], config["d_kv"], config["tie_word_embeddings"]) == ("gated-gelu", 16, False)
    bart = load_file(str(exported(tmp_path, BART, "bart") / "model.safetensors"))
    assert bart["model.encoder.embed_positions.weight"].shape == (24 + 2, 32)
    assert bart["final_logits_bias"].shape == (1, 60)
    pegasus = load_file(str(exported(tmp_path, PEGASUS, "pegasus") / "model.safetensors"))
    from pentad.components.embeddings.sinusoidal import sinusoidal_table

    assert torch.equal(pegasus["model.decoder.embed_positions.weight"], sinusoidal_table(24, 32, interleave=False))
    albert = load_file(str(exported(tmp_path, ALBERT, "albert") / "model.safetensors"))
    assert albert["albert.encoder.embedding_hidden_mapping_in.weight"].shape == (32, 16)
    assert "albert.encoder.albert_layer_groups.0.albert_layers.0.ffn.weight" in albert
    assert json.loads((tmp_path / "albert" / "config.json").read_text())["num_hidden_groups"] == 1
    llama = json.loads((exported(tmp_path, LLAMA, "llama") / "config.json").read_text())
    assert (llama["num_key_value_heads"], llama["rope_parameters"]["rope_theta"]) == (2, 10000.0)


@pytest.mark.parametrize("model, family, changes, message", [
    (T5, "t5", {"feed_forward_proj": "gated-relu-x"}, "feed_forward_proj 'gated-relu-x'"),
    (T5, "t5", {"architectures": ["T5ForQuestionAnswering"]}, "T5ForQuestionAnswering has a head pentad"),
    (ALBERT, "albert", {"num_hidden_groups": 2}, "num_hidden_groups 2"),
    (BART, "bart", {"tie_word_embeddings": False}, "tie_word_embeddings false"),
    (LLAMA, "llama", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 10000.0, "factor": 2.0}},
     "rope_type 'proportional' in the RoPE parameters"),
    (LLAMA, "llama", {"attention_bias": True}, "attention_bias True with mlp_bias False"),
    (BLOOM, "bloom", {"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
], ids=["t5-ffn", "t5-head", "albert-groups", "bart-untied", "llama-rope-kind", "llama-bias", "bloom-residual"])
def test_hf_options_pentad_cannot_hold(tmp_path, model, family, changes, message):
    directory = exported(tmp_path, model)
    edit_config(directory, **changes)
    with pytest.raises(UserError, match=message):
        convert("hf-to-pentad", directory, tmp_path / "out")
    assert exit_status(["convert", "hf-to-pentad", str(directory), str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_checkpoint_of_another_family(tmp_path):
    bart = exported(tmp_path, BART, "bart")
    llama = exported(tmp_path, LLAMA, "llama")
    (bart / "model.safetensors").write_bytes((llama / "model.safetensors").read_bytes())
    with pytest.raises(UserError, match="does not look like a Hugging Face bart checkpoint.*look like a llama "
                                        "checkpoint"):
        convert("hf-to-pentad", bart, tmp_path / "out")
    assert exit_status(["convert", "hf-to-pentad", str(bart), str(tmp_path / "out")]) == 2


def test_missing_tensor_and_wrong_shape(tmp_path):
    directory = exported(tmp_path, T5)
    state = load_file(str(directory / "model.safetensors"))
    del state["decoder.block.1.layer.1.EncDecAttention.v.weight"]
    state["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = torch.zeros(9, 4)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"1 tensor\(s\) missing: decoder.block.1.layer.1.EncDecAttention.v.weight.*"
                                        r"relative_attention_bias.weight \(9, 4\)"):
        convert("hf-to-pentad", directory, tmp_path / "out")
    assert exit_status(["convert", "hf-to-pentad", str(directory), str(tmp_path / "out")]) == 2


def test_unknown_model_type_suggests_a_family(tmp_path):
    directory = exported(tmp_path, T5)
    edit_config(directory, model_type="mt5")
    with pytest.raises(UserError, match="model_type 'mt5' is not a model family pentad converts.*did you mean 't5'"):
        convert("hf-to-pentad", directory, tmp_path / "out")
    assert exit_status(["convert", "hf-to-pentad", str(directory), str(tmp_path / "out")]) == 2


@pytest.mark.parametrize("model, family, message", [
    (variant(LLAMA, encoder={**LLAMA["encoder"], "positions": "alibi"}), "llama", "positions is 'alibi'"),
    (variant(T5, decoder={**T5["decoder"], "num_heads": 2}), "t5", "model.decoder.num_heads"),
    (BART, "t5", "model.embedding must be an unscaled word table"),
    (variant(ALBERT, encoder={**ALBERT["encoder"], "share_layers": False}), "albert", "share_layers is False"),
    (BLOOM, "gpt2", "GPT-2 has word and pos"),
    (variant(PEGASUS, tie_word_embeddings=False), "pegasus", "tie_word_embeddings: true"),
], ids=["llama-alibi", "t5-decoder-heads", "bart-as-t5", "albert-unshared", "bloom-as-gpt2", "pegasus-untied"])
def test_pentad_models_hf_cannot_express(tmp_path, model, family, message):
    make_run(tmp_path / "run", model)
    with pytest.raises(UserError, match=message):
        convert("pentad-to-hf", tmp_path / "run", tmp_path / "out", family=family)
    assert exit_status(["convert", "pentad-to-hf", str(tmp_path / "run"), str(tmp_path / "out"), "--family",
                        family]) == 2


def test_sinusoidal_table_that_pentad_cannot_compute(tmp_path):
    directory = exported(tmp_path, PEGASUS)
    state = load_file(str(directory / "model.safetensors"))
    state["model.encoder.embed_positions.weight"] += 0.5
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="embed_positions.weight: differs from the sinusoidal table"):
        convert("hf-to-pentad", directory, tmp_path / "out")


# ----------------------------------------------------------------------------------- SentencePiece
def tiny_model(**options) -> bytes:
    sentencepiece = pytest.importorskip("sentencepiece")
    buffer = io.BytesIO()
    text = ["the quick brown fox jumps over the lazy dog", "a man is eating food", "hello world"] * 20
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=buffer, vocab_size=40,
                                             hard_vocab_limit=False, minloglevel=2, **options)
    return buffer.getvalue()


def test_sentencepiece_layouts_round_trip():
    import sentencepiece

    data = tiny_model()
    assert spm.SentencePieceModel.parse(data, "m").serialize() == data  # every field kept
    fairseq = spm.to_fairseq(data, "m")
    assert spm.is_fairseq(fairseq) and not spm.is_fairseq(data)
    original = sentencepiece.SentencePieceProcessor(model_proto=data)
    shifted = sentencepiece.SentencePieceProcessor(model_proto=fairseq)
    assert [shifted.id_to_piece(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert (shifted.bos_id(), shifted.pad_id(), shifted.eos_id(), shifted.unk_id()) == (0, 1, 2, 3)
    text = "the lazy fox eats hello"
    assert shifted.encode(text) == [i + 1 if i else 3 for i in original.encode(text)]
    assert shifted.id_to_piece(shifted.get_piece_size() - 1) == "<mask>"
    assert spm.from_fairseq(fairseq, "m") == data
    t5 = spm.to_t5(data, "m", extra_ids=3)
    processor = sentencepiece.SentencePieceProcessor(model_proto=t5)
    size = original.get_piece_size()
    assert [processor.piece_to_id(f"<extra_id_{i}>") for i in range(3)] == [size + 2, size + 1, size]
    assert spm.from_t5(t5, "m") == (data, 3)


def test_a_model_already_in_fairseq_order_is_refused():
    """tencentpretrain/models/sentencepiece.bpe.model is not XLM-R's model: its ids already start
    <s> <pad> </s> <unk> (10,000 pieces, XLM-R's has 250,000 and starts <unk> <s> </s>), so
    XLM-R's HF tokenizer, which shifts every id by one, would misnumber it; the import says so."""
    path = Path(__file__).parents[4] / "shared" / "data" / "tencentpretrain" / "models" / "sentencepiece.bpe.model"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    with pytest.raises(UserError, match=r"to start with \['<unk>', '<s>', '</s>'\] \(found \['<s>', '<pad>', "
                                        r"'</s>'\]\)"):
        spm.to_fairseq(path.read_bytes(), str(path))


def test_not_a_sentencepiece_model():
    with pytest.raises(UserError, match="is not a SentencePiece model file"):
        spm.SentencePieceModel.parse(b"\xff\xff\xff", "junk.model")
