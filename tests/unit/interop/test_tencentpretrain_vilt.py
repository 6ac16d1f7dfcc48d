"""TencentPretrain ViLT checkpoints <-> pentad. The checkpoint holds the tensor names TencentPretrain's
ViLT model has (WordPatchEmbedding's ``language_embedding`` and ``vision_embedding``, pos and seg,
the embedding LayerNorm, the post-LN transformer, the untied mlm head and the sp head) for its shipped
models/vilt/base_config.json shrunk, filled with seeded random values."""

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

from .helpers import make_run

H, FFN, VOCAB, LAYERS, IMAGE, PATCH, SEQ = 32, 48, 30, 2, 64, 32, 24
SHRINK = {"emb_size": H, "hidden_size": H, "feedforward_size": FFN, "heads_num": 4, "layers_num": LAYERS,
          "max_seq_length": SEQ, "image_height": IMAGE, "image_width": IMAGE}


def vilt_state(g: torch.Generator) -> dict[str, torch.Tensor]:
    """A TencentPretrain ViLT state dict of the shrunk config, as its save_model writes it."""
    def t(*shape):
        return 0.1 * torch.randn(*shape, generator=g)

    state: dict[str, torch.Tensor] = {}

    def norm(prefix):
        state[f"{prefix}.gamma"], state[f"{prefix}.beta"] = 1 + t(H), t(H)

    state["embedding.word_patch.language_embedding.embedding.weight"] = t(VOCAB, H)
    state["embedding.word_patch.vision_embedding.cls_emb"] = t(1, 1, H)
    state["embedding.word_patch.vision_embedding.projection.weight"] = t(H, 3, PATCH, PATCH)
    state["embedding.pos.embedding.weight"] = t(SEQ, H)
    state["embedding.seg.embedding.weight"] = t(3, H)
    norm("embedding.layer_norm")
    for i in range(LAYERS):
        layer = f"encoder.transformer.{i}"
        for j in range(3):
            state[f"{layer}.self_attn.linear_layers.{j}.weight"] = t(H, H)
            state[f"{layer}.self_attn.linear_layers.{j}.bias"] = t(H)
        state[f"{layer}.self_attn.final_linear.weight"], state[f"{layer}.self_attn.final_linear.bias"] = t(H, H), t(H)
        norm(f"{layer}.layer_norm_1")
        state[f"{layer}.feed_forward.linear_1.weight"] = t(FFN, H)
        state[f"{layer}.feed_forward.linear_1.bias"] = t(FFN)
        state[f"{layer}.feed_forward.linear_2.weight"] = t(H, FFN)
        state[f"{layer}.feed_forward.linear_2.bias"] = t(H)
        norm(f"{layer}.layer_norm_2")
    state["target.mlm.linear_1.weight"], state["target.mlm.linear_1.bias"] = t(H, H), t(H)
    norm("target.mlm.layer_norm")
    state["target.mlm.linear_2.weight"], state["target.mlm.linear_2.bias"] = t(VOCAB, H), t(VOCAB)  # not tied
    state["target.sp.linear_1.weight"], state["target.sp.linear_1.bias"] = t(H, H), t(H)
    state["target.sp.linear_2.weight"], state["target.sp.linear_2.bias"] = t(2, H), t(2)
    return state


def tp_vilt(directory: Path, shared_data: Path, tie: bool = False) -> dict[str, torch.Tensor]:
    raw = json.loads((shared_data / "configs" / "vilt" / "base_config.json").read_text(encoding="utf-8"))
    raw.update(SHRINK)
    state = vilt_state(torch.Generator().manual_seed(0))
    if tie:  # tie_weights: the mlm output layer is the word table, saved under both names
        raw["tie_weights"] = True
        state["target.mlm.linear_2.weight"] = state["embedding.word_patch.language_embedding.embedding.weight"]
    write_tencentpretrain_dir(directory, state, raw)
    return state


def test_tencentpretrain_vilt_converts_and_back_bitwise(shared_data, tmp_path):
    state = tp_vilt(tmp_path / "tp", shared_data)
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run", verify=True)
    assert report.ok, report.render()
    assert any("followed by an image" in (c.detail or "") for c in report.verification)  # the forward ran
    cfg, _ = load_run(tmp_path / "run")
    assert [p.type for p in cfg.model.embedding.parts] == ["word_patch", "pos", "seg"]
    assert cfg.model.vocab_size == VOCAB and cfg.task.type == "image_text_match"
    assert [t.type for t in cfg.model.targets] == ["mlm", "sp"] and not cfg.model.tie_word_embeddings
    weights = read_weights(find_weights(tmp_path / "run"))
    assert torch.equal(weights["embedding.word_patch.word.weight"],
                       state["embedding.word_patch.language_embedding.embedding.weight"])
    assert torch.equal(weights["embedding.word_patch.patch.cls"],
                       state["embedding.word_patch.vision_embedding.cls_emb"][0, 0])
    back = convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "back", verify=True)
    assert back.ok, back.render()
    written = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert sorted(written) == sorted(state)
    for key, tensor in state.items():
        assert torch.equal(written[key], tensor), key
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (config["embedding"], config["data_processor"], config["target"]) == \
        (["word_patch", "pos", "seg"], "vilt", ["mlm", "sp"])
    assert (config["image_height"], config["image_width"], config["patch_size"]) == (IMAGE, IMAGE, PATCH)


def test_tencentpretrain_vilt_embedding_follows_its_modules(shared_data, tmp_path):
    """The converted embedding is TencentPretrain's recomputed from its tensors: the words, then the
    image's CLS and patches, plus positions and segments (text A = row 1, image B = row 2), LayerNorm."""
    state = tp_vilt(tmp_path / "tp", shared_data)
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run")
    cfg, _ = load_run(tmp_path / "run")
    model = build_model(cfg.model)
    model.load_state_dict(read_weights(find_weights(tmp_path / "run")))
    model.eval()
    g = torch.Generator().manual_seed(1)
    text, patches = 6, (IMAGE // PATCH) ** 2
    tokens = torch.randint(0, VOCAB, (2, text), generator=g)
    pixels = torch.randn(2, 3, IMAGE, IMAGE, generator=g)
    segments = torch.cat([torch.zeros(2, text), torch.ones(2, 1 + patches)], 1).long()
    batch = Batch(tokens=tokens, pixels=pixels, segments=segments, padding_mask=torch.zeros(2, text, dtype=torch.bool))
    with torch.no_grad():
        hidden = model.embedding(batch).hidden
    e = "embedding.word_patch."
    words = state[f"{e}language_embedding.embedding.weight"][tokens]
    image = torch.nn.functional.conv2d(pixels, state[f"{e}vision_embedding.projection.weight"], stride=PATCH)
    image = torch.cat([state[f"{e}vision_embedding.cls_emb"].expand(2, -1, -1), image.flatten(2).transpose(1, 2)], 1)
    length = text + 1 + patches
    summed = torch.cat([words, image], 1) + state["embedding.pos.embedding.weight"][:length] \
        + state["embedding.seg.embedding.weight"][segments + 1]
    expected = state["embedding.layer_norm.gamma"] * (summed - summed.mean(-1, keepdim=True)) \
        / (summed.std(-1, keepdim=True) + 1e-6) + state["embedding.layer_norm.beta"]
    torch.testing.assert_close(hidden, expected, rtol=1e-5, atol=1e-6)


def test_word_patch_with_a_patch_bias_is_not_written_as_tencentpretrain(tmp_path):
    model = {
        "hidden_size": H, "vocab_size": VOCAB, "max_seq_length": SEQ,
        "embedding": {"parts": [{"type": "word_patch", "patch": {"image_size": IMAGE, "patch_size": PATCH,
                                                                  "bias": True}}, "pos"]},
        "encoder": {"type": "transformer", "num_layers": 1, "num_heads": 4, "ffn_size": FFN},
        "targets": [{"type": "mlm"}],
    }
    make_run(tmp_path / "run", model)
    with pytest.raises(UserError, match="word_patch has a bias in its projection"):
        convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "tp")
    assert not (tmp_path / "tp").exists()


def test_tencentpretrain_vilt_with_tied_mlm_head_round_trips(shared_data, tmp_path):
    """With tie_weights the mlm head is the word table inside word_patch, stored once."""
    state = tp_vilt(tmp_path / "tp", shared_data, tie=True)
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run", verify=True)
    assert report.ok, report.render()
    cfg, _ = load_run(tmp_path / "run")
    assert cfg.model.tie_word_embeddings
    back = convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "back", verify=True)
    assert back.ok, back.render()
    written = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert sorted(written) == sorted(state)
    assert written["target.mlm.linear_2.weight"].data_ptr() == \
        written["embedding.word_patch.language_embedding.embedding.weight"].data_ptr()
    assert all(torch.equal(written[k], v) for k, v in state.items())


def test_word_patch_in_hugging_faces_layout_is_not_written_as_tencentpretrain(tmp_path):
    part = {"type": "word_patch", "patch": {"image_size": IMAGE, "patch_size": PATCH, "bias": False},
            "text_positions": 8, "text_segments": 2, "text_norm": True, "image_positions": True}
    model = {
        "hidden_size": H, "vocab_size": VOCAB, "max_seq_length": 13,
        "embedding": {"parts": [part, {"type": "seg", "num_segments": 2}], "norm": False},
        "encoder": {"type": "transformer", "num_layers": 1, "num_heads": 4, "ffn_size": FFN},
        "targets": [{"type": "mlm"}],
    }
    make_run(tmp_path / "run", model)
    with pytest.raises(UserError, match="word_patch has Hugging Face ViLT's layout"):
        convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "tp")
    assert not (tmp_path / "tp").exists()
