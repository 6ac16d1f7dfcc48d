"""Every TencentPretrain config in ../shared/data/tencentpretrain/configs imports as the model
TencentPretrain's own builder makes of it, checked against the parameter counts measured with that
builder (tests/data/tencentpretrain_param_counts.json, read its ``_source`` entry) and against the
shrunk builds of tests/data/tencentpretrain_state_keys.json. Text and ViT configs match exactly,
except for parameters that exist only because of a TencentPretrain defect, which pentad does not
reproduce: those are named below and the difference must be exactly their size. The other vision
and speech configs are refused with a message naming the modality (and, where TencentPretrain's
own file is stale, saying so). Everything is built on the meta device."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import pytest

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.cli.main import main
from pentad.components.model_config import model_config_class
from pentad.errors import UserError
from pentad.model import count_parameters
from pentad.registry import TARGETS
from pentad.tencentpretrain.config import import_config

DATA = Path(__file__).resolve().parents[2] / "data"

# Parameters TencentPretrain builds only because of a defect (see docs/tencentpretrain_import.md):
#  - T5: encoder.relative_pos_emb is a second relative-position table that forward never reads (the
#    live one is shared by the layers as encoder.transformer.N.relative_pos_emb);
#  - tied dual-stream models (SBERT, siamese LSTM): DualEmbedding's stream_i_layer_norm re-normalises
#    the output of each stream's embedding LayerNorm (LN after LN); pentad's one shared slot has one
#    norm. Untied streams (CLIP) import it as ``second_norm``: the same count as TencentPretrain's.
DEFECT_PARAMETERS = (
    "encoder.relative_pos_emb.relative_attention_bias.weight",
    "embedding.dual.stream_0_layer_norm.gamma", "embedding.dual.stream_0_layer_norm.beta",
    "embedding.dual.stream_1_layer_norm.gamma", "embedding.dual.stream_1_layer_norm.beta",
)
# Every shipped family imports (vit, beit, clip, vilt, dall-e, talk2face and s2t too); none is refused.
NON_TEXT: set[str] = set()
DUAL = {"sbert/base_config.json", "sbert/large_config.json", "rnn/siamese_lstm_config.json"}
UNTIED_DUAL = {"clip/base-16_config.json", "clip/base-32_config.json"}


@cache
def counts() -> dict:
    return json.loads((DATA / "tencentpretrain_param_counts.json").read_text(encoding="utf-8"))


@cache
def state_keys() -> dict:
    return json.loads((DATA / "tencentpretrain_state_keys.json").read_text(encoding="utf-8"))


DOC = Path(__file__).resolve().parents[3] / "docs" / "tencentpretrain_import.md"


@cache
def documented() -> dict[str, tuple[int, int]]:
    """{config: (pentad count, TencentPretrain count)} from the table in docs/tencentpretrain_import.md."""
    out = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[2].replace(",", "").isdigit():
            out[cells[0].strip("`")] = (int(cells[2].replace(",", "")), int(cells[3].replace(",", "")))
    return out


def dual_available() -> bool:
    import pentad.components  # noqa: F401

    return "pair_cls" in TARGETS and "clr" in TARGETS


def measured() -> list[tuple[str, int, int]]:
    """(config, vocabulary size, TencentPretrain's parameter count) for every measurement."""
    out = []
    for name, entry in counts().items():
        if name.startswith("_"):
            continue
        for key, value in entry.items():
            if key == "params":
                out.append((name, entry["vocab_size"], value))
            elif key.startswith("params_vocab_"):
                out.append((name, int(key.removeprefix("params_vocab_")), value))
    return out


def defect_size(shapes: dict[str, list[int]], config: str = "") -> int:
    """Parameters of the defect-only tensors among {name: shape} of ``config`` (none for untied streams,
    whose second LayerNorms pentad builds too)."""
    if config in UNTIED_DUAL:
        return 0
    return sum(math.prod(shapes[name]) for name in DEFECT_PARAMETERS if name in shapes)


def family(name: str) -> str:
    return name.split("/")[0]


def test_ground_truth_covers_every_shipped_config(shared_data):
    shipped = {str(p.relative_to(shared_data / "configs")) for p in (shared_data / "configs").glob("*/*.json")}
    assert shipped == {name for name in counts() if not name.startswith("_")}


# ----------------------------------------------------------------------- text and ViT configs
TEXT = [m for m in measured() if family(m[0]) not in NON_TEXT]


@pytest.mark.parametrize(("name", "vocab", "tp_params"), TEXT, ids=[f"{n}@{v}" for n, v, _ in TEXT])
def test_text_config_builds_tencentpretrains_model(shared_data, name, vocab, tp_params):
    if name in DUAL and not dual_available():
        with pytest.raises(UserError, match="dual encoder is not available yet"):
            load_config(shared_data / "configs" / name, [f"vocab_size={vocab}"])
        return
    cfg = load_config(shared_data / "configs" / name, [f"vocab_size={vocab}"])
    model = build_model(cfg.model, device="meta")
    ours = count_parameters(model)
    entry = counts()[name]
    expected = tp_params - defect_size(entry["non_layer_params"], name)
    head = 0
    if name in DUAL:
        # TencentPretrain's count leaves out run_classifier_siamese.py's classifier head (2 labels
        # measured separately); pentad's model holds it as its pair_cls target.
        head = sum(p.numel() for p in model.targets.parameters())
        assert head == entry["classifier_head_params_labels_2"]
    assert ours - head == expected, (f"{name}: pentad {ours - head:,} vs TencentPretrain {tp_params:,} "
                                     f"(defect-only {tp_params - expected:,})")
    if vocab == entry["vocab_size"]:
        # The docs table shows what `pentad validate` prints (the pair head included) beside
        # TencentPretrain's count of the same model (its head of 2 labels added).
        assert documented().get(name) == (ours, tp_params + head), \
            f"docs/tencentpretrain_import.md: the row of {name} should read {ours:,} | {tp_params + head:,}"


def test_docs_table_has_a_row_for_every_text_config():
    assert set(documented()) == {name for name, vocab, _ in TEXT if vocab == counts()[name]["vocab_size"]}


def test_docs_counts_are_what_validate_prints(shared_data, capsys):
    for name in ("sbert/base_config.json", "bert/base_config.json"):
        assert main(["validate", str(shared_data / "configs" / name), "vocab_size=1000"]) == 0
        assert f"parameters: {documented()[name][0]:,}" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(UNTIED_DUAL))
def test_clip_imports_the_stream_layernorms_tencentpretrain_builds(shared_data, name):
    """pretrain.py's DualEmbedding applies stream_0_layer_norm after the text stream's embedding
    LayerNorm: the imported text slot has it too (second_norm), so the count is TencentPretrain's own,
    with no defect subtracted; the image stream has no embedding LayerNorm at all."""
    entry = counts()[name]
    cfg = load_config(shared_data / "configs" / name, [f"vocab_size={entry['vocab_size']}"])
    model = build_model(cfg.model, device="meta")
    assert count_parameters(model) == entry["params"]
    assert model.embedding.second_norm is not None and model.embedding.second_norm.weight.shape == (512,)
    assert not cfg.model.streams["image"].embedding.norm and not cfg.model.streams["image"].embedding.second_norm


@pytest.mark.parametrize(("name", "difference"), [
    ("t5/small_config.json", 32 * 8),        # relative_attention_buckets_num x heads_num
    ("t5/11b_config.json", 32 * 128),
    ("t5-v1_1/small_config.json", 32 * 6),
    ("sbert/base_config.json", 2 * 2 * 768),  # two stream LayerNorms (gamma + beta) over emb_size
    ("rnn/siamese_lstm_config.json", 2 * 2 * 512),
])
def test_defect_differences_are_exactly_the_documented_tensors(name, difference):
    assert defect_size(counts()[name]["non_layer_params"]) == difference


def test_only_t5_and_dual_configs_carry_defect_parameters():
    carrying = {name for name, entry in counts().items()
                if not name.startswith("_") and defect_size(entry["non_layer_params"], name)}
    assert {family(n) for n in carrying} == {"t5", "t5-v1_1", "sbert", "rnn"}
    assert {n for n in carrying if family(n) == "rnn"} == {"rnn/siamese_lstm_config.json"}


SHRUNK = [k for k in state_keys() if not k.startswith("_")]


def _deep_update(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _deep_update(out[key], value) if nested else value
    return out


@pytest.mark.parametrize("key", SHRUNK)
def test_shrunk_builds_match_tencentpretrains_state_dicts(shared_data, key):
    """Small widths, where a size mistake (a head size, a bias, a norm) cannot hide in rounding."""
    entry = state_keys()[key]
    raw = json.loads((shared_data / "configs" / entry["config"]).read_text(encoding="utf-8"))
    raw = _deep_update(raw, entry["overrides"])
    if entry["config"] in DUAL and not dual_available():
        pytest.skip("pentad's dual encoder is not registered")
    out, _ = import_config(raw, [f"vocab_size={entry['vocab_size']}"], key, notices=[])
    model = build_model(model_config_class().model_validate(out["model"]), device="meta")
    shapes = {name: shape for name, shape in entry["keys"] if name not in entry["aliases"]}
    assert count_parameters(model) == entry["unique_params"] - defect_size(shapes)


# -------------------------------------------------------------------------- non-text configs
def test_stale_files_say_what_is_stale(shared_data, capsys):
    # BEiT and the image-token language models import, and their notices say what is stale
    for name, words in [("beit/base_config.json", "tokenizer 'vqgan' is not registered"),
                        ("dall-e/base_config.json", "tokenizer 'multimodal' is not registered"),
                        ("talk2face/base_config.json", "mask 'prefix' is not one of TencentPretrain's")]:
        cfg = load_config(shared_data / "configs" / name, ["vocab_size=1000"])
        assert words in capsys.readouterr().err and words in cfg.description


def test_image_token_and_vilt_imports_say_what_pentad_cannot_do_yet(shared_data, capsys):
    cfg = load_config(shared_data / "configs" / "dall-e/base_config.json", ["vocab_size=1000"])
    assert cfg.data.objective is None and "1024 image-token ids" in capsys.readouterr().err
    cfg = load_config(shared_data / "configs" / "clip/base-32_config.json", ["vocab_size=1000"])
    assert cfg.task.type == "image_text" and cfg.model.embedding.norm and cfg.model.embedding.second_norm
    assert list(cfg.model.streams) == ["text", "image"] and cfg.model.streams["image"].share is None
    assert not cfg.model.streams["image"].embedding.norm  # the image stream has no LayerNorm at all
    assert "second LayerNorm" not in cfg.description  # nothing left out to warn about
    cfg = load_config(shared_data / "configs" / "beit/base_config.json")
    assert cfg.model.vocab_size == 16384 and cfg.model.embedding.parts[0].type == "masked_patch"
    assert build_model(cfg.model, device="meta").embedding.masked_patch.mask.shape == (768,)
    cfg = load_config(shared_data / "configs" / "vilt/base_config.json", ["vocab_size=1000"])
    assert cfg.task.type == "image_text_match" and cfg.model.embedding.parts[0].type == "word_patch"
    assert cfg.model.embedding.parts[0].patch.image_size == [256, 256] and not cfg.model.embedding.parts[0].patch.bias


def test_cli_validate_exits_2_for_a_model_pentad_lacks(tmp_path, capsys):
    # speech features into an encoder alone (no decoder): not a model pentad builds
    path = tmp_path / "speech_encoder.json"
    path.write_text(json.dumps({"emb_size": 64, "hidden_size": 64, "feedforward_size": 128, "heads_num": 2,
                                "layers_num": 2, "hidden_act": "relu", "embedding": ["speech"],
                                "encoder": "transformer", "target": ["cls"], "data_processor": "s2t"}))
    assert main(["validate", str(path), "vocab_size=1000"]) == 2
    err = capsys.readouterr().err
    assert "speech features (S2T)" in err and "are not in pentad yet" in err


def test_s2t_configs_import_with_the_speech_subsampler(shared_data):
    cfg = load_config(shared_data / "configs" / "s2t/small_config.json", ["vocab_size=1000"])
    speech = cfg.model.embedding.parts[0]
    assert (speech.type, speech.conv_channels, speech.kernel_sizes, speech.activation) == \
        ("speech", [1024, 512], [5, 5], "glu") and speech.scale
    positions = cfg.model.embedding.parts[1]
    assert positions.type == "sinusoidal" and not positions.interleave and positions.max_positions == 6002
    assert not cfg.model.target_embedding.parts[1].interleave  # TencentPretrain: both sides when speech
    # the asr task from the audio options: CMVN, SpecAugment, feature size and longest utterance
    audio = cfg.task.audio
    assert cfg.task.type == "asr" and audio.cmvn and (audio.feature_size, audio.max_frames) == (80, 6000)
    spec = audio.specaugment
    assert (spec.freq_masks, spec.freq_width, spec.time_masks, spec.time_width, spec.time_ratio) == (2, 27, 2, 100, 1.0)
    assert "specaugment" not in cfg.description and "audio_feature_size" not in cfg.description


def test_cli_validate_reports_tencentpretrains_count(shared_data, capsys):
    assert main(["validate", str(shared_data / "configs/albert/base_config.json"), "vocab_size=21128"]) == 0
    assert "parameters: 13,373,834" in capsys.readouterr().out


# ------------------------------------------------------------------------- mapping decisions
def test_tie_weights_with_share_embedding_leaves_the_lm_head_untied(shared_data, capsys):
    for name in ("t5/small_config.json", "bart/base_config.json", "pegasus/base_config.json"):
        cfg = load_config(shared_data / "configs" / name, ["vocab_size=1000"])
        assert cfg.model.share_embedding and not cfg.model.tie_word_embeddings
        model = build_model(cfg.model, device="meta")
        assert model.target_embedding.word.weight is model.embedding.word.weight
        assert model.targets["lm"].output.weight is not model.embedding.word.weight
        assert "its LM head is an independent matrix" in capsys.readouterr().err
    # Without share_embedding the head ties to the decoder's own table (transformer/base) ...
    cfg = load_config(shared_data / "configs/transformer/base_config.json", ["vocab_size=1000"])
    model = build_model(cfg.model, device="meta")
    assert model.targets["lm"].output.weight is model.target_embedding.word.weight
    assert model.target_embedding.word.weight is not model.embedding.word.weight
    # ... and without a decoder to the word table (bert's mlm head, gpt2's lm head).
    for name, head in (("bert/base_config.json", "mlm"), ("gpt2/config.json", "lm")):
        model = build_model(load_config(shared_data / "configs" / name, ["vocab_size=1000"]).model, device="meta")
        assert model.targets[head].output.weight is model.embedding.word.weight


def test_alibi_notice(shared_data, capsys):
    cfg = load_config(shared_data / "configs/bloom/1b1_config.json", ["vocab_size=1000"])
    assert cfg.model.encoder.positions == "alibi" and cfg.model.embedding.norm is False
    err = capsys.readouterr().err
    assert "pentad: notice:" in err and "never applies it" in err and "behave differently" in err
    assert "model.encoder.positions=none" in err and "layer_number_scale is inert" in err
    assert "never applies it" in cfg.description  # recorded in the run directory's config.yaml
    # The override the notice suggests gives TencentPretrain's (position-free) model.
    cfg = load_config(shared_data / "configs/bloom/1b1_config.json",
                      ["vocab_size=1000", "model.encoder.positions=none"])
    assert cfg.model.encoder.positions == "none"


def test_notices_can_be_collected_instead_of_printed(shared_data, capsys):
    raw = json.loads((shared_data / "configs/bloom/7b1_config.json").read_text(encoding="utf-8"))
    notices: list[str] = []
    import_config(raw, ["vocab_size=10"], "bloom", notices=notices)
    assert any("alibi" in n for n in notices) and capsys.readouterr().err == ""


def test_albert_factorised_and_shared(shared_data):
    m = load_config(shared_data / "configs/albert/base_config.json", ["vocab_size=1000"]).model
    assert (m.hidden_size, m.embedding_size) == (768, 128) and m.encoder.share_layers
    assert [t.type for t in m.targets] == ["mlm", "sop"] and m.encoder.activation == "relu"
    assert m.embedding.parts[2].num_segments == 3  # TencentPretrain's padding row included


def test_t5_and_llama_options(shared_data):
    m = load_config(shared_data / "configs/t5-v1_1/small_config.json", ["vocab_size=1000"]).model
    e, d = m.encoder, m.decoder
    assert (e.positions, d.positions, e.norm, e.ffn, e.head_size, e.attention_scale, e.bias) == \
        ("relative", "relative", "t5", "gated", 64, False, False)
    assert e.final_norm and d.final_norm and d.num_layers == 8 and e.activation == "gelu_tanh"
    assert m.targets[0].scale_hidden is False  # TencentPretrain does not rescale before its LM head
    m = load_config(shared_data / "configs/llama2/70b_config.json", ["vocab_size=1000"]).model
    assert (m.encoder.positions, m.encoder.norm, m.encoder.num_kv_heads, m.encoder.mask) == \
        ("rotary", "rmsnorm", 8, "causal")


def test_sinusoidal_positions_scale_the_word_embedding(shared_data):
    m = load_config(shared_data / "configs/transformer/base_config.json", ["vocab_size=1000"]).model
    for slot in (m.embedding, m.target_embedding):
        assert [p.type for p in slot.parts] == ["word", "sinusoidal"] and slot.parts[0].scale
    assert m.targets[0].type == "lm" and not m.share_embedding


def test_data_processor_becomes_the_objective(shared_data):
    for name, objective in (("bert/base_config.json", "bert"), ("t5/small_config.json", "t5"),
                            ("pegasus/base_config.json", "gsg"), ("rnn/bilstm_config.json", "bilm"),
                            ("transformer/base_config.json", "mt")):
        assert load_config(shared_data / "configs" / name, ["vocab_size=1000"]).data.objective.type == objective


# ------------------------------------------------------------------------------- bad configs
def _write(tmp_path, **keys) -> Path:
    base = {"emb_size": 32, "hidden_size": 32, "feedforward_size": 64, "hidden_act": "gelu", "heads_num": 4,
            "layers_num": 2, "embedding": ["word", "pos"], "encoder": "transformer", "target": ["mlm"]}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**base, **keys}))
    return path


def test_unknown_keys_and_names_suggest_the_closest(tmp_path):
    with pytest.raises(UserError) as info:
        load_config(_write(tmp_path, layers_nun=2, mask="casual", feed_forward="gatd"), ["vocab_size=10"])
    message = str(info.value)
    assert "'layers_nun': unknown TencentPretrain config key; did you mean 'layers_num'?" in message
    assert "did you mean 'causal'?" in message and "did you mean 'gated'?" in message


def test_mask_prefix_falls_through_to_causal_with_prefix(tmp_path, capsys):
    cfg = load_config(_write(tmp_path, mask="prefix", target=["lm"]), ["vocab_size=10"])
    assert cfg.model.encoder.mask == "prefix" and "treats it as causal_with_prefix" in capsys.readouterr().err


def test_missing_sizes_are_named(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"emb_size": 32, "hidden_size": 32, "layers_num": 2, "encoder": "transformer",
                                "target": ["lm"]}))
    with pytest.raises(UserError, match="'heads_num' is missing; TencentPretrain has no default"):
        load_config(path, ["vocab_size=10"])


def test_emb_size_without_factorisation_is_refused(tmp_path):
    with pytest.raises(UserError, match="without factorized_embedding_parameterization"):
        load_config(_write(tmp_path, emb_size=16), ["vocab_size=10"])


def test_dual_configs_say_not_yet_without_the_dual_encoder(shared_data, monkeypatch):
    from pentad.tencentpretrain import config as tencentpretrain

    monkeypatch.setattr(tencentpretrain, "_dual_available", lambda: False)
    with pytest.raises(UserError, match="encoder 'dual'.*dual encoder is not available yet"):
        load_config(shared_data / "configs/sbert/base_config.json", ["vocab_size=1000"])


# ------------------------------------------------------------------------------------------ ViT
def test_vit_imports_tencentpretrains_layout_and_an_image_task(shared_data, capsys):
    cfg = load_config(shared_data / "configs/vit/base-16-224_config.json", [])
    patch, pos = cfg.model.embedding.parts
    assert (patch.type, patch.image_size, patch.patch_size, patch.channels, patch.bias) == \
        ("patch", [224, 224], 16, 3, False)  # TencentPretrain's projection has no bias
    assert pos.type == "pos" and cfg.model.max_seq_length == 197 and not cfg.model.embedding.norm
    enc = cfg.model.encoder
    assert (enc.norm_position, enc.final_norm, enc.norm, enc.mask) == ("pre", True, "layernorm_unbiased",
                                                                      "bidirectional")
    (head,) = cfg.model.targets
    assert (head.type, head.pooler, head.pooling, head.num_labels, head.dropout) == ("cls", True, "first", 1000, 0.0)
    assert cfg.task.type == "image_classification" and cfg.task.pooler and cfg.task.normalise == "clip"
    assert cfg.data.objective is None
    err = capsys.readouterr().err
    assert "labels_num is not in the config" in err and "1000 labels" in err and "channels_num 3" in err
    assert "never crops" in err and "not imported" not in err  # the image keys are imported
    model = build_model(cfg.model, device="meta")
    assert model.embedding.patch.proj.bias is None and model.targets["cls"].pooler is not None


def test_vit_without_image_keys_takes_tencentpretrains_defaults(tmp_path, capsys):
    path = tmp_path / "vit.json"
    path.write_text(json.dumps({"emb_size": 32, "hidden_size": 32, "feedforward_size": 64, "hidden_act": "gelu",
                                "heads_num": 4, "layers_num": 1, "data_processor": "vit", "embedding": ["patch", "pos"],
                                "remove_embedding_layernorm": True, "encoder": "transformer",
                                "layernorm_positioning": "pre", "target": ["cls"], "labels_num": 5,
                                "image_preprocess": ["horizontal_flip"]}))
    cfg = load_config(path, [])
    patch = cfg.model.embedding.parts[0]
    assert (patch.image_size, patch.patch_size, patch.channels) == ([256, 256], 16, 3)
    assert cfg.model.max_seq_length == 512 and cfg.model.targets[0].num_labels == 5  # 512 >= 1 + 16 x 16
    assert cfg.task.augment.crop_scale is None and cfg.task.augment.flip
    err = capsys.readouterr().err
    assert "TencentPretrain's defaults (image_height 256, image_width 256, patch_size 16, channels_num 3)" in err
    assert "without normalize" in err and "labels_num is not" not in err


@pytest.mark.parametrize("change, message", [
    ({"max_seq_length": 100}, "less than the 197 positions of 224x224 images"),
    ({"target": ["cls", "mlm"]}, "a ViT classifies with the cls target alone"),
    ({"embedding": ["pos", "patch"]}, "patch first"),
    ({"patch_size": 0}, "'patch_size': expected a positive integer"),
])
def test_bad_vit_configs_are_refused(shared_data, tmp_path, change, message):
    raw = json.loads((shared_data / "configs/vit/base-16-224_config.json").read_text(encoding="utf-8"))
    path = tmp_path / "vit.json"
    path.write_text(json.dumps({**raw, **change}))
    with pytest.raises(UserError, match=message):
        load_config(path, [])


def test_vit_with_a_word_embedding_is_still_refused(tmp_path):
    path = tmp_path / "vilt.json"
    path.write_text(json.dumps({"hidden_size": 32, "heads_num": 4, "layers_num": 1, "feedforward_size": 64,
                                "hidden_act": "gelu", "data_processor": "vit", "embedding": ["word", "patch"],
                                "target": ["cls"]}))
    with pytest.raises(UserError, match="not a text model"):
        load_config(path, ["vocab_size=10"])
