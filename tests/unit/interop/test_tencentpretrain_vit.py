"""TencentPretrain ViT checkpoints <-> pentad. The checkpoints hold exactly the tensor names and shapes
TencentPretrain's own builder makes of its shrunk vit configs (tests/data/tencentpretrain_state_keys.json),
filled with seeded random values."""

import json
from pathlib import Path

import pytest
import torch

from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.interop import convert
from pentad.runs import load_run

from .helpers import make_run

DATA = Path(__file__).resolve().parents[2] / "data"
ENTRIES = ("vit", "vit-rectangular-gray")


def entry(name: str) -> dict:
    return json.loads((DATA / "tencentpretrain_state_keys.json").read_text(encoding="utf-8"))[name]


def tp_vit(directory: Path, name: str, shared_data: Path, **over) -> dict[str, torch.Tensor]:
    """model.bin + config.json of a TencentPretrain ViT laid out as its builder lays it out."""
    e = entry(name)
    raw = json.loads((shared_data / "configs" / e["config"]).read_text(encoding="utf-8"))
    raw.update(e["overrides"], **over)
    g = torch.Generator().manual_seed(0)
    state = {key: 0.1 * torch.randn(shape, generator=g) for key, shape in e["keys"]}
    directory.mkdir(parents=True)
    torch.save(state, directory / "model.bin")
    (directory / "config.json").write_text(json.dumps(raw))
    return state


@pytest.mark.parametrize("name", ENTRIES)
def test_tencentpretrain_vit_converts_and_back_bitwise(shared_data, tmp_path, name):
    state = tp_vit(tmp_path / "tp", name, shared_data)
    report = convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run", verify=True)
    assert report.ok, report.render()
    cfg, _ = load_run(tmp_path / "run")
    patch = cfg.model.embedding.parts[0]
    assert patch.type == "patch" and not patch.bias and cfg.model.targets[0].pooler
    assert cfg.model.targets[0].num_labels == state["target.cls.linear_2.weight"].shape[0]  # from the checkpoint
    assert cfg.task.type == "image_classification" and cfg.task.normalise == "clip"
    assert not any("labels_num is not in the config" in note for note in report.notes)
    back = convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "back", verify=True)
    assert back.ok, back.render()
    written = torch.load(tmp_path / "back" / "model.bin", weights_only=True)
    assert sorted(written) == sorted(state)
    for key, tensor in state.items():
        assert torch.equal(written[key], tensor), key
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    e = entry(name)
    assert (config["image_height"], config["image_width"], config["channels_num"], config["patch_size"]) == \
        (e["overrides"].get("image_height", 224), e["overrides"].get("image_width", 224),
         e["overrides"].get("channels_num", 3), 16)
    assert config["data_processor"] == "vit" and config["embedding"] == ["patch", "pos"]


def test_tencentpretrain_vit_forward_follows_its_modules(shared_data, tmp_path):
    """The converted model computes TencentPretrain's ViT: patch conv (no bias) + CLS, positions,
    pre-LN layers with its LayerNorm, final norm, pooler (tanh) then classifier, on the CLS state."""
    state = tp_vit(tmp_path / "tp", "vit", shared_data)
    convert("tencentpretrain-to-pentad", tmp_path / "tp", tmp_path / "run")
    from pentad.builder import build_model
    from pentad.training.checkpoint import find_weights, load_weights, read_weights

    cfg, _ = load_run(tmp_path / "run")
    model = build_model(cfg.model)
    load_weights(model, read_weights(find_weights(tmp_path / "run")), "run")
    model.eval()
    pixels = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        batch = Batch(pixels=pixels)
        logits = model.targets["cls"](model.encode(batch)[0], batch).logits
        # The embedding by hand, from TencentPretrain's tensors.
        patches = torch.nn.functional.conv2d(pixels, state["embedding.patch.projection.weight"], stride=16)
        patches = patches.flatten(2).transpose(1, 2)
        embedded = torch.cat([state["embedding.patch.cls_emb"].expand(2, 1, -1), patches], 1) \
            + state["embedding.pos.embedding.weight"][None, :197]
        captured = []
        hook = model.embedding.register_forward_hook(lambda m, i, o: captured.append(o.hidden))
        model.encode(batch)
        hook.remove()
    torch.testing.assert_close(captured[0], embedded, atol=1e-5, rtol=0)
    assert logits.shape == (2, 1000)


def test_hugging_face_layout_vit_is_not_written_as_tencentpretrain(tmp_path):
    model = {
        "hidden_size": 32, "max_seq_length": 17,
        "embedding": {"parts": [{"type": "patch", "image_size": 16, "patch_size": 4}, "pos"], "norm": False},
        "encoder": {"type": "transformer", "num_layers": 1, "num_heads": 4, "ffn_size": 48, "norm_position": "pre",
                    "final_norm": True, "mask": "bidirectional"},
        "targets": [{"type": "cls", "num_labels": 3, "pooler": False}],
    }
    make_run(tmp_path / "run", model)
    with pytest.raises(UserError) as info:
        convert("pentad-to-tencentpretrain", tmp_path / "run", tmp_path / "tp")
    message = str(info.value)
    assert "has a bias in its projection" in message and "cls target 'cls' has no pooler" in message
    assert not (tmp_path / "tp").exists()
