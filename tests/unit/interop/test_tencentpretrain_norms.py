"""TencentPretrain's LayerNorm through import and conversion: a "normal" config imports it where
TencentPretrain builds it, the round trip keeps it, torch's LayerNorm exports with a measured note,
and Hugging Face export refuses it unless asked, with the measured difference."""

import json

import pytest
import torch

from pentad.builder import build_model
from pentad.components.model_config import model_config_class
from pentad.components.norms import norm_kind_of
from pentad.errors import UserError
from pentad.interop import convert
from pentad.runs import load_run
from pentad.tencentpretrain.config import import_config

from .helpers import BERT as PENTAD_BERT
from .helpers import make_run
from .test_tencentpretrain import BERT, GPT2, tp_checkpoint

TRANSFORMER = {"emb_size": 32, "feedforward_size": 48, "hidden_size": 32, "hidden_act": "relu", "heads_num": 4,
               "layers_num": 2, "decoder_layers_num": 2, "max_seq_length": 24, "dropout": 0.1,
               "embedding": ["word", "sinusoidalpos"], "tgt_embedding": ["word", "sinusoidalpos"],
               "encoder": "transformer", "decoder": "transformer", "mask": "fully_visible", "target": ["lm"],
               "layernorm_positioning": "pre", "layernorm_eps": 1e-5}


def kinds(tp_config, vocab=60):
    out, _ = import_config(tp_config, [f"vocab_size={vocab}"], "test", [])
    model = build_model(model_config_class().model_validate(out["model"]), device="meta")
    return {name: (norm_kind_of(m), m.eps) for name, m in model.named_modules() if norm_kind_of(m)}


def test_normal_configs_import_tencentpretrains_layernorm_everywhere_it_builds_one():
    bert = kinds(BERT)
    assert set(k for k, _ in bert.values()) == {"layernorm_unbiased"}
    assert bert["embedding.norm"] == bert["targets.mlm.norm"] == ("layernorm_unbiased", 1e-6)
    assert bert["encoder.layers.1.ffn_norm"] == ("layernorm_unbiased", 1e-6)
    gpt2 = kinds(GPT2)
    assert gpt2["encoder.final_norm"][0] == "layernorm_unbiased" and "embedding.norm" not in gpt2
    # The decoder's final norm is TencentPretrain's LayerNorm with its default eps 1e-6 whatever
    # layernorm_eps says; the layers and the encoder's final norm read layernorm_eps.
    mt = kinds(TRANSFORMER)
    assert mt["decoder.final_norm"] == ("layernorm_unbiased", 1e-6)
    assert mt["decoder.layers.0.cross_attention_norm"] == mt["encoder.final_norm"] == ("layernorm_unbiased", 1e-5)


def test_rms_and_t5_layers_keep_tencentpretrains_layernorm_in_embedding_mlm_and_decoder_end():
    rms = kinds({**TRANSFORMER, "layernorm": "rms", "remove_embedding_layernorm": False})
    assert rms["encoder.layers.0.attention_norm"][0] == rms["encoder.final_norm"][0] == "rmsnorm"
    assert rms["embedding.norm"] == rms["target_embedding.norm"] == ("layernorm_unbiased", 1e-6)
    assert rms["decoder.final_norm"] == ("layernorm_unbiased", 1e-6)  # TencentPretrain's LayerNorm, with a bias
    t5 = kinds({**TRANSFORMER, "layernorm": "t5", "remove_embedding_layernorm": True})
    assert t5["decoder.final_norm"] == ("rmsnorm", 1e-6) and "embedding.norm" not in t5
    bert_rms = kinds({**BERT, "layernorm": "rms"})
    assert bert_rms["targets.mlm.norm"][0] == bert_rms["embedding.norm"][0] == "layernorm_unbiased"
    assert bert_rms["encoder.layers.0.ffn_norm"][0] == "rmsnorm"


def test_an_rms_decoder_converts_with_its_layernorm_end_both_ways(tmp_path):
    config = {**TRANSFORMER, "layernorm": "rms", "tie_weights": True, "share_embedding": True}
    _, ours, state = tp_checkpoint(tmp_path / "tp", config)
    assert "decoder.layer_norm.beta" in state and "decoder.transformer_decoder.0.layer_norm_1.weight" in state
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out", verify=True)
    assert report.ok
    convert("pentad-to-tencentpretrain", tmp_path / "out", tmp_path / "back")
    back = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("tp_config", [BERT, GPT2], ids=["bert", "gpt2"])
def test_round_trip_keeps_the_kind_and_says_nothing_about_norms(tmp_path, tp_config):
    tp_checkpoint(tmp_path / "tp", tp_config)
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    cfg, _ = load_run(tmp_path / "out")
    assert cfg.model.encoder.norm == "layernorm_unbiased"
    report = convert("pentad-to-tencentpretrain", tmp_path / "out", tmp_path / "back")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written.get("layernorm", "normal") == "normal"
    assert not any("LayerNorm" in n or "differently" in n for n in report.notes), report.notes


def test_torch_layernorm_exports_to_tencentpretrain_with_the_measured_difference(tmp_path):
    make_run(tmp_path / "run", PENTAD_BERT)
    report = convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "tp")
    (note,) = [n for n in report.notes if "cannot express" in n]
    assert "model.embedding.norm_kind" in note and "model.encoder.norm" in note and "model.targets.0.norm" in note
    (measured,) = [n for n in report.notes if "measured" in n]
    # e.g. "... .kind layernorm_unbiased instead of layernorm ... mlm logits 1.2e-02"
    assert "layernorm_unbiased instead of layernorm" in measured
    value = float(measured.split("mlm logits ")[1].split(",")[0].rstrip(")"))
    assert 1e-4 < value < 1e-1


def test_hf_export_refuses_tencentpretrains_layernorm_unless_allowed(tmp_path):
    tp_checkpoint(tmp_path / "tp", BERT)
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    with pytest.raises(UserError, match="--allow-norm-change") as error:
        convert("pentad-to-hf", tmp_path / "out", tmp_path / "hf", family="bert")
    message = str(error.value)
    assert "model.encoder.norm" in message and "model.embedding.norm_kind" in message and "logits" in message
    assert not (tmp_path / "hf").exists()
    pytest.importorskip("transformers")
    report = convert("pentad-to-hf", tmp_path / "out", tmp_path / "hf", family="bert", verify=True,
                     allow_norm_change=True)
    assert report.ok  # the exported model is pentad's with torch's LayerNorm, exactly
    assert any("--allow-norm-change" in n and "mlm logits" in n for n in report.notes)


def test_hf_export_refuses_a_final_norm_hf_cannot_express(tmp_path):
    # TencentPretrain's decoder ends with eps 1e-6 whatever layernorm_eps says (1e-5 here).
    tp_checkpoint(tmp_path / "tp", {**TRANSFORMER, "tie_weights": True, "share_embedding": True})
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    with pytest.raises(UserError, match=r"model.decoder.final_norm_eps 1e-06 differs from layer_norm_eps 1e-05"):
        convert("pentad-to-hf", tmp_path / "out", tmp_path / "hf", family="bart", allow_norm_change=True)


def test_large_models_are_not_run_twice_to_word_a_note():
    from pentad.components.base import Batch
    from pentad.interop.numerics import measured_difference, swap_norm_kinds

    out, _ = import_config(BERT, ["vocab_size=60"], "test", [])
    cfg = model_config_class().model_validate(out["model"])
    tensors = build_model(cfg).state_dict()
    batch = Batch(tokens=torch.ones(1, 4, dtype=torch.long), segments=torch.zeros(1, 4, dtype=torch.long))
    swapped = swap_norm_kinds(cfg, "layernorm_unbiased", "layernorm")
    assert "not measured" in measured_difference(cfg, tensors, swapped, tensors, batch, limit=1000)
    assert measured_difference(cfg, tensors, swapped, tensors, batch).startswith("by encoder output ")


def test_command_line_refuses_with_status_2_and_exports_with_the_flag(tmp_path, capsys):
    from .test_cli import exit_status

    tp_checkpoint(tmp_path / "tp", BERT)
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "out")
    argv = ["convert", "pentad-to-hf", str(tmp_path / "out"), str(tmp_path / "hf"), "--family", "bert"]
    assert exit_status(argv) == 2
    assert exit_status(argv + ["--allow-norm-change"]) == 0
    assert "--allow-norm-change" in capsys.readouterr().out
