"""TencentPretrain CLIP checkpoints <-> pentad. The checkpoint holds the tensor names TencentPretrain's
CLIP model has (DualEmbedding's ``embedding.dual.embedding_i`` streams and the text stream's second
LayerNorm ``stream_0_layer_norm``, DualEncoder's ``encoder.encoder_i`` transformers, ClrTarget's
``logit_scale`` and projections) for its shipped models/clip/base-32_config.json shrunk, filled with
seeded random values."""

import json
from pathlib import Path

import pytest
import torch
from tests.unit.interop.helpers import write_tencentpretrain_dir

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.interop import convert
from pentad.runs import load_run
from pentad.training.checkpoint import find_weights, read_weights

H0, H1, FFN, VOCAB, FEATURES, IMAGE, PATCH = 32, 24, 48, 30, 16, 64, 32
SHRINK_0 = {"emb_size": H0, "hidden_size": H0, "feedforward_size": FFN, "heads_num": 4, "layers_num": 2,
            "max_seq_length": 16}
SHRINK_1 = {"emb_size": H1, "hidden_size": H1, "feedforward_size": FFN, "heads_num": 4, "layers_num": 1,
            "max_seq_length": (IMAGE // PATCH) ** 2 + 1}


def clip_state(g: torch.Generator) -> dict[str, torch.Tensor]:
    """A TencentPretrain CLIP state dict of the shrunk config, as its save_model writes it."""
    def t(*shape):
        return 0.1 * torch.randn(*shape, generator=g)

    state: dict[str, torch.Tensor] = {}

    def norm(prefix, width):
        state[f"{prefix}.gamma"], state[f"{prefix}.beta"] = 1 + t(width), t(width)

    def transformer(prefix, width, layers, final):
        for i in range(layers):
            layer = f"{prefix}.transformer.{i}"
            for j in range(3):
                state[f"{layer}.self_attn.linear_layers.{j}.weight"] = t(width, width)
                state[f"{layer}.self_attn.linear_layers.{j}.bias"] = t(width)
            state[f"{layer}.self_attn.final_linear.weight"] = t(width, width)
            state[f"{layer}.self_attn.final_linear.bias"] = t(width)
            norm(f"{layer}.layer_norm_1", width)
            state[f"{layer}.feed_forward.linear_1.weight"] = t(FFN, width)
            state[f"{layer}.feed_forward.linear_1.bias"] = t(FFN)
            state[f"{layer}.feed_forward.linear_2.weight"] = t(width, FFN)
            state[f"{layer}.feed_forward.linear_2.bias"] = t(width)
            norm(f"{layer}.layer_norm_2", width)
        if final:
            norm(f"{prefix}.layer_norm", width)

    state["embedding.dual.embedding_0.word.embedding.weight"] = t(VOCAB, H0)
    state["embedding.dual.embedding_0.pos.embedding.weight"] = t(SHRINK_0["max_seq_length"], H0)
    norm("embedding.dual.embedding_0.layer_norm", H0)
    state["embedding.dual.embedding_1.patch.cls_emb"] = t(1, 1, H1)
    state["embedding.dual.embedding_1.patch.projection.weight"] = t(H1, 3, PATCH, PATCH)
    state["embedding.dual.embedding_1.pos.embedding.weight"] = t(SHRINK_1["max_seq_length"], H1)
    norm("embedding.dual.stream_0_layer_norm", H0)  # stream 1 removes its embedding LayerNorm: no second one
    transformer("encoder.encoder_0", H0, SHRINK_0["layers_num"], final=False)  # post-LN text tower
    transformer("encoder.encoder_1", H1, SHRINK_1["layers_num"], final=True)  # pre-LN image tower
    state["target.clr.logit_scale"] = torch.tensor(2.6592600345611572)  # log(1 / 0.07), TencentPretrain's start
    state["target.clr.encoder_0_projection"] = torch.randn(H0, FEATURES, generator=g)
    state["target.clr.encoder_1_projection"] = torch.randn(H1, FEATURES, generator=g)
    return state


def tp_clip(directory: Path, shared_data: Path, state: dict[str, torch.Tensor] | None = None
            ) -> dict[str, torch.Tensor]:
    raw = json.loads((shared_data / "configs" / "clip" / "base-32_config.json").read_text(encoding="utf-8"))
    raw["stream_0"].update(SHRINK_0)
    raw["stream_1"].update(SHRINK_1)
    raw.update(image_height=IMAGE, image_width=IMAGE, feature_size=FEATURES)
    state = state if state is not None else clip_state(torch.Generator().manual_seed(0))
    write_tencentpretrain_dir(directory, state, raw)
    return state


def test_tencentpretrain_clip_converts_and_back_bitwise(shared_data, tmp_path):
    state = tp_clip(tmp_path / "tp", shared_data)
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run", verify=True)
    assert report.ok, report.render()
    assert any("stream_0_layer_norm" in n for n in report.notes)
    assert any("images" in (c.detail or "") for c in report.verification)  # both towers ran
    cfg, _ = load_run(tmp_path / "run")
    assert list(cfg.model.streams) == ["text", "image"] and cfg.model.streams["image"].share is None
    assert cfg.task.type == "image_text"
    assert cfg.model.embedding.second_norm and cfg.model.vocab_size == VOCAB
    assert not cfg.model.streams["image"].embedding.norm
    weights = read_weights(find_weights(tmp_path / "run"))
    assert torch.equal(weights["embedding.second_norm.weight"], state["embedding.dual.stream_0_layer_norm.gamma"])
    assert torch.equal(weights["streams.image.embedding.patch.cls"],
                       state["embedding.dual.embedding_1.patch.cls_emb"][0, 0])
    assert torch.equal(weights["targets.clr.projection_1.weight"], state["target.clr.encoder_1_projection"].T)
    assert torch.equal(weights["streams.image.encoder.final_norm.bias"], state["encoder.encoder_1.layer_norm.beta"])
    back = convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "back", verify=True)
    assert back.ok, back.render()
    written = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert sorted(written) == sorted(state)
    for key, tensor in state.items():
        assert torch.equal(written[key], tensor), key
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (config["embedding"], config["encoder"], config["target"], config["data_processor"]) == \
        (["dual"], "dual", ["clr"], "clip")
    assert (config["image_height"], config["patch_size"], config["feature_size"], config["tie_weights"]) == \
        (IMAGE, PATCH, FEATURES, False)
    assert config["stream_0"]["embedding"] == ["word", "pos"] and config["stream_1"]["embedding"] == ["patch", "pos"]
    assert (config["stream_0"]["remove_embedding_layernorm"], config["stream_1"]["remove_embedding_layernorm"]) == \
        (False, True)
    assert (config["stream_0"]["layernorm_positioning"], config["stream_1"]["hidden_act"]) == ("post", "gelu_fast")


def _layer_norm(x, gamma, beta, eps=1e-6):
    """TencentPretrain's LayerNorm: gamma * (x - mean) / (unbiased std + eps) + beta."""
    return gamma * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + eps) + beta


def test_tencentpretrain_clip_embeddings_follow_its_modules(shared_data, tmp_path):
    """The converted model's stream embeddings are TencentPretrain's, recomputed from its tensors:
    the text stream normalised twice (LN after LN), the image stream's CLS and patches plus positions;
    the clr logits are the scaled cosine similarities of the projected first positions."""
    state = tp_clip(tmp_path / "tp", shared_data)
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run")
    cfg, _ = load_run(tmp_path / "run")
    model = build_model(cfg.model)
    model.load_state_dict(read_weights(find_weights(tmp_path / "run")))
    model.eval()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, 7), generator=g)
    pixels = torch.randn(2, 3, IMAGE, IMAGE, generator=g)
    batch = Batch(tokens=tokens, padding_mask=torch.zeros(2, 7, dtype=torch.bool), pair=Batch(pixels=pixels))
    with torch.no_grad():
        text = model.embedding(batch).hidden
        image = model.stream_slots(1)[0](batch.pair).hidden
        output = model(batch)
    d = "embedding.dual."
    words = state[f"{d}embedding_0.word.embedding.weight"][tokens] + state[f"{d}embedding_0.pos.embedding.weight"][:7]
    once = _layer_norm(words, state[f"{d}embedding_0.layer_norm.gamma"], state[f"{d}embedding_0.layer_norm.beta"])
    twice = _layer_norm(once, state[f"{d}stream_0_layer_norm.gamma"], state[f"{d}stream_0_layer_norm.beta"])
    torch.testing.assert_close(text, twice, rtol=1e-5, atol=1e-6)
    patches = torch.nn.functional.conv2d(pixels, state[f"{d}embedding_1.patch.projection.weight"], stride=PATCH)
    patches = patches.flatten(2).transpose(1, 2)
    cls = state[f"{d}embedding_1.patch.cls_emb"].expand(2, -1, -1)
    expected = torch.cat([cls, patches], 1) + state[f"{d}embedding_1.pos.embedding.weight"]
    torch.testing.assert_close(image, expected, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(output["clr"].loss)


def _tp_tower(hidden, state, prefix, layers, post, act):
    """TencentPretrain's transformer (no padding): post-LN, or pre-LN with a final LayerNorm."""
    def lin(x, name):
        return x @ state[f"{name}.weight"].T + state[f"{name}.bias"]

    def ln(x, name):
        return _layer_norm(x, state[f"{name}.gamma"], state[f"{name}.beta"])

    def attention(x, layer):
        b, s, width = x.shape
        q, k, v = (lin(x, f"{layer}.self_attn.linear_layers.{j}").view(b, s, 4, -1).transpose(1, 2) for j in range(3))
        probs = torch.softmax(q @ k.transpose(-1, -2) / (width // 4) ** 0.5, dim=-1)
        return lin((probs @ v).transpose(1, 2).reshape(b, s, width), f"{layer}.self_attn.final_linear")

    def ffn(x, layer):
        return lin(act(lin(x, f"{layer}.feed_forward.linear_1")), f"{layer}.feed_forward.linear_2")

    for i in range(layers):
        layer = f"{prefix}.transformer.{i}"
        if post:
            inter = ln(attention(hidden, layer) + hidden, f"{layer}.layer_norm_1")
            hidden = ln(ffn(inter, layer) + inter, f"{layer}.layer_norm_2")
        else:
            inter = attention(ln(hidden, f"{layer}.layer_norm_1"), layer) + hidden
            hidden = ffn(ln(inter, f"{layer}.layer_norm_2"), layer) + inter
    return hidden if post else ln(hidden, f"{prefix}.layer_norm")


def test_tencentpretrain_clip_logits_follow_its_modules(shared_data, tmp_path):
    """The converted model's clr logits are TencentPretrain's, recomputed from its tensors: the post-LN
    text tower (exact GELU) and the pre-LN image tower (tanh GELU) pooled at the first position,
    projected by the [H, F] matrices, normalised, scaled by exp(logit_scale)."""
    state = tp_clip(tmp_path / "tp", shared_data)
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run")
    cfg, _ = load_run(tmp_path / "run")
    model = build_model(cfg.model)
    model.load_state_dict(read_weights(find_weights(tmp_path / "run")))
    model.eval()
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, VOCAB, (3, 9), generator=g)
    pixels = torch.randn(3, 3, IMAGE, IMAGE, generator=g)
    batch = Batch(tokens=tokens, padding_mask=torch.zeros(3, 9, dtype=torch.bool), pair=Batch(pixels=pixels))
    with torch.no_grad():
        logits = model(batch)["clr"].logits
        text = model.embedding(batch).hidden
        image = model.stream_slots(1)[0](batch.pair).hidden
    gelu = torch.nn.functional.gelu
    text = _tp_tower(text, state, "encoder.encoder_0", SHRINK_0["layers_num"], True, gelu)
    image = _tp_tower(image, state, "encoder.encoder_1", SHRINK_1["layers_num"], False,
                      lambda x: gelu(x, approximate="tanh"))
    f0 = text[:, 0] @ state["target.clr.encoder_0_projection"]
    f1 = image[:, 0] @ state["target.clr.encoder_1_projection"]
    f0, f1 = f0 / f0.norm(dim=-1, keepdim=True), f1 / f1.norm(dim=-1, keepdim=True)
    expected = state["target.clr.logit_scale"].exp() * f0 @ f1.T
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_clip_stream_with_one_embedding_norm_is_not_written_as_tencentpretrain(shared_data, tmp_path):
    """TencentPretrain's DualEmbedding always adds stream_0_layer_norm after a stream's embedding
    LayerNorm, so a pentad stream with one norm (second_norm: false) is refused."""
    state = clip_state(torch.Generator().manual_seed(0))
    tp_clip(tmp_path / "tp", shared_data, state)
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run")
    config_path = tmp_path / "run" / "config.yaml"
    text = config_path.read_text()
    assert "second_norm: true" in text
    config_path.write_text(text.replace("second_norm: true", "second_norm: false"))
    weights_path = find_weights(tmp_path / "run")
    weights = read_weights(weights_path)
    from safetensors.torch import save_file

    save_file({k: v for k, v in weights.items() if not k.startswith("embedding.second_norm.")}, str(weights_path))
    with pytest.raises(UserError, match=r"always applies a second one on top of it \(embedding.dual.stream_0"):
        convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "back")
    assert not (tmp_path / "back").exists()


def test_converted_clip_checkpoint_loads_strictly_into_the_imported_config(shared_data, tmp_path):
    """The config import builds the architecture the checkpoint conversion keeps: the same CLIP
    TencentPretrain config imported alone gives a model its converted weights load into strictly."""
    from pentad.components.model_config import model_config_class
    from pentad.tencentpretrain.config import import_config

    tp_clip(tmp_path / "tp", shared_data)
    raw = json.loads((tmp_path / "tp" / "config.json").read_text(encoding="utf-8"))
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run")
    out, _ = import_config(raw, [f"vocab_size={VOCAB}"], "clip", notices=[])
    model = build_model(model_config_class().model_validate(out["model"]), device="meta")
    weights = read_weights(find_weights(tmp_path / "run"))
    assert sorted(model.state_dict()) == sorted(weights)
    model.load_state_dict(weights, strict=True, assign=True)


def test_tied_dual_checkpoint_is_refused(shared_data, tmp_path):
    raw = json.loads((shared_data / "configs" / "sbert" / "base_config.json").read_text(encoding="utf-8"))
    directory = tmp_path / "tp"
    directory.mkdir()
    torch.save({"embedding.dual.embedding_0.word.embedding.weight": torch.zeros(30, 8)}, directory / "model.bin")
    (directory / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="tied streams or a siamese classifier"):
        convert("tencentpretrain-to-pentad", directory, tmp_path / "run")


def test_logit_scale_above_the_cap_raises_the_cap(shared_data, tmp_path):
    """TencentPretrain never caps exp(logit_scale); pentad's clr caps it at 100 unless the
    converted checkpoint's scale is larger, so the converted model scores as the checkpoint does."""
    state = clip_state(torch.Generator().manual_seed(0))
    state["target.clr.logit_scale"] = torch.tensor(5.0)  # a factor of 148.4
    tp_clip(tmp_path / "tp", shared_data, state)
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run")
    assert any("never caps it" in n for n in report.notes)
    cfg, _ = load_run(tmp_path / "run")
    model = build_model(cfg.model)
    model.load_state_dict(read_weights(find_weights(tmp_path / "run")))
    assert float(model.targets["clr"].scale().detach()) == pytest.approx(float(torch.tensor(5.0).exp()), rel=1e-6)
