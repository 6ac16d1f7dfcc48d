"""ViT conversion parity: Hugging Face ``ViTForImageClassification`` / ``ViTModel`` built from tiny
configs with random weights (no download) convert to pentad and back.

* HF -> pentad: every hidden state, the final norm, the logits (and ViTModel's pooler output) equal
  HF's within 1e-5 relative in fp32 on a seeded batch of images, and the ``--verify`` report agrees.
* HF -> pentad -> HF: bitwise-identical state dicts (patch bias kept) and the same config.
* pentad -> HF: a pentad ViT (no family given: guessed from the patch part) loads with
  ``AutoModelForImageClassification`` and gives the same logits; a TencentPretrain-layout ViT (no
  patch bias, a pooler before the classifier) is refused with the reason.
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.unit.interop.helpers import assert_hf_round_trip, load_pentad_run, make_run, relative, save_perturbed

from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.interop import convert
from pentad.runs import load_run

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 1e-5
HIDDEN, LAYERS, HEADS, FFN = 32, 2, 4, 48


def vit_config(**over):
    return transformers.ViTConfig(**{"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                                     "intermediate_size": FFN, "image_size": 16, "patch_size": 4, "num_channels": 3,
                                     "num_labels": 3, **over})


def save_hf(directory, class_name, config, **kwargs):
    torch.manual_seed(0)
    return save_perturbed(getattr(transformers, class_name)(config, **kwargs), directory)


pentad_model = load_pentad_run


# (id, HF class, config, model keyword arguments)
CASES = [
    ("classification", "ViTForImageClassification", lambda: vit_config(), {}),
    ("classification-rectangular", "ViTForImageClassification",
     lambda: vit_config(image_size=[16, 24], num_channels=1, num_labels=5), {}),
    ("model-pooler", "ViTModel", lambda: vit_config(), {}),
    ("model-no-pooler", "ViTModel", lambda: vit_config(), {"add_pooling_layer": False}),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hf_to_pentad_outputs_match(tmp_path, case):
    _, class_name, make_config, kwargs = case
    hf = save_hf(tmp_path / "hf", class_name, make_config(), **kwargs)
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert report.architecture == class_name
    assert len(report.verification) >= LAYERS + 2  # embeddings, each layer, and a head or the final norm
    cfg, ours = pentad_model(tmp_path / "pentad")
    patch = cfg.model.embedding.parts[0]
    assert patch.type == "patch" and patch.bias  # HF's patch bias is kept
    pixels = torch.randn(3, hf.config.num_channels, *patch.image_size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(pixel_values=pixels, output_hidden_states=True)
        hidden, _ = ours.encode(Batch(pixels=pixels))
        target = ours.targets["cls"]
    if class_name == "ViTForImageClassification":
        with torch.no_grad():
            logits = target(hidden, Batch(pixels=pixels)).logits
        assert logits.shape == ref.logits.shape
        assert relative(logits, ref.logits) <= TOL
        assert not cfg.model.targets[0].pooler
        assert cfg.task.type == "image_classification" and cfg.task.normalise == "half"
    else:
        assert relative(hidden, ref.last_hidden_state) <= TOL
        assert cfg.model.targets[0].pooler == ("add_pooling_layer" not in kwargs)
        if cfg.model.targets[0].pooler:
            with torch.no_grad():
                pooled = target.pooler(hidden[:, 0]).tanh()
            assert relative(pooled, ref.pooler_output) <= TOL
        interop = json.loads((tmp_path / "pentad" / "interop.json").read_text())
        assert interop["synthesized"] == ["targets.cls.classifier.weight", "targets.cls.classifier.bias"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hf_to_pentad_to_hf_is_bitwise(tmp_path, case):
    _, class_name, make_config, kwargs = case
    save_hf(tmp_path / "hf", class_name, make_config(), **kwargs)
    assert_hf_round_trip(tmp_path, class_name)


TINY_VIT = {
    "hidden_size": HIDDEN, "max_seq_length": 17,
    "embedding": {"parts": [{"type": "patch", "image_size": 16, "patch_size": 4, "channels": 3}, "pos"],
                  "norm": False, "dropout": 0.0},
    "encoder": {"type": "transformer", "num_layers": LAYERS, "num_heads": HEADS, "ffn_size": FFN, "activation": "gelu",
                "norm_position": "pre", "final_norm": True, "mask": "bidirectional", "dropout": 0.0,
                "layer_norm_eps": 1e-12},
    "targets": [{"type": "cls", "num_labels": 4, "pooling": "first", "pooler": False, "dropout": 0.0}],
}


def test_pentad_vit_exports_and_loads_with_auto_class(tmp_path):
    _, net = make_run(tmp_path / "run", TINY_VIT)
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", verify=True)
    assert report.ok, report.render()
    assert report.family == "vit" and any("guessed" in note for note in report.notes)
    hf = transformers.AutoModelForImageClassification.from_pretrained(str(tmp_path / "hf"),
                                                                      local_files_only=True).eval()
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in net.parameters())
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = hf(pixel_values=pixels).logits
        batch = Batch(pixels=pixels)
        ours = net.targets["cls"](net.encode(batch)[0], batch).logits
    assert relative(ours, theirs) <= TOL


@pytest.mark.parametrize("change, message", [
    ({"embedding": {**TINY_VIT["embedding"],
                    "parts": [{"type": "patch", "image_size": 16, "patch_size": 4, "bias": False}, "pos"]}},
     "the patch projection has no bias"),
    ({"targets": [{"type": "cls", "num_labels": 4, "pooler": True}]}, "has a pooler (dense + tanh)"),
    ({"targets": [{"type": "cls", "num_labels": 4, "pooling": "mean", "pooler": False}]}, "pooling: first"),
])
def test_tencentpretrain_layout_vit_is_refused(tmp_path, change, message):
    make_run(tmp_path / "run", {**TINY_VIT, **change})
    with pytest.raises(UserError, match="cannot export .* as vit") as info:
        convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family="vit")
    assert message in str(info.value)
    assert not (tmp_path / "hf").exists()


def test_vit_checkpoint_options_pentad_cannot_hold(tmp_path):
    save_hf(tmp_path / "hf", "ViTForImageClassification", vit_config(qkv_bias=False))
    with pytest.raises(UserError, match="qkv_bias false"):
        convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")


@pytest.mark.parametrize("mean, std, normalise, noted", [
    ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], "imagenet", False),
    ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], "half", False),
    ([0.1, 0.2, 0.3], [0.5, 0.5, 0.5], "half", True),
])
def test_image_processor_picks_the_normalisation(tmp_path, mean, std, normalise, noted):
    save_hf(tmp_path / "hf", "ViTForImageClassification", vit_config())
    (tmp_path / "hf" / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "ViTImageProcessor", "image_mean": mean, "image_std": std}))
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    cfg, _ = load_run(tmp_path / "pentad")
    assert cfg.task.normalise == normalise
    assert any("not one of pentad's normalisations" in note for note in report.notes) == noted
