"""ViLT conversion parity: Hugging Face ``ViltModel`` / ``ViltForMaskedLM`` /
``ViltForImageAndTextRetrieval`` built from tiny configs with random weights (no download) convert
to pentad and back.

* HF -> pentad: the final states at every real position (the caption's, and the image's once HF's
  random patch order is undone with the ``patch_index`` its ``visual_embed`` returns for the same
  seed), the pooled output, the MLM logits and the retrieval score equal HF's within 1e-5 relative in
  fp32 on a seeded batch with a padded caption, and the ``--verify`` report agrees.
* HF -> pentad -> HF: bitwise-identical state dicts and the same config.
* pentad -> HF: a pentad ViLT in Hugging Face's layout (no family given: guessed from the word_patch
  part) loads with ``ViltForMaskedLM`` and gives the same logits; TencentPretrain's ViLT layout
  (the ``vilt/base`` recipe's) is refused with the reason.
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.unit.interop.helpers import assert_hf_round_trip, load_pentad_run, make_run, relative, save_perturbed

from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.interop import convert

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 1e-5
HIDDEN, LAYERS, HEADS, FFN, VOCAB, TEXT = 32, 2, 4, 48, 60, 12
IMAGE, PATCH = 16, 4
GRID = IMAGE // PATCH


def vilt_config(**over):
    return transformers.ViltConfig(**{"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                                      "intermediate_size": FFN, "vocab_size": VOCAB, "max_position_embeddings": TEXT,
                                      "image_size": IMAGE, "patch_size": PATCH, "num_channels": 3, **over})


def save_hf(directory, class_name, config, **kwargs):
    torch.manual_seed(0)
    return save_perturbed(getattr(transformers, class_name)(config, **kwargs), directory)


# (id, HF class, config, model keyword arguments)
CASES = [
    ("model-pooler", "ViltModel", lambda: vilt_config(), {}),
    ("model-no-pooler", "ViltModel", lambda: vilt_config(), {"add_pooling_layer": False}),
    ("masked-lm", "ViltForMaskedLM", lambda: vilt_config(), {}),
    ("masked-lm-3-modalities", "ViltForMaskedLM",
     lambda: vilt_config(modality_type_vocab_size=3, type_vocab_size=1, layer_norm_eps=1e-6), {}),
    ("retrieval", "ViltForImageAndTextRetrieval", lambda: vilt_config(), {}),
]
IDS = [c[0] for c in CASES]


def sample(text=7):
    """A seeded caption batch (row 1 right-padded by 3) with its segments, and images."""
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(1, VOCAB, (3, text), generator=g)
    padding = torch.zeros(3, text, dtype=torch.bool)
    padding[1, text - 3:] = True
    tokens[padding] = 0
    pixels = torch.randn(3, 3, IMAGE, IMAGE, generator=g)
    segments = torch.cat([torch.zeros(3, text), torch.ones(3, GRID * GRID + 1)], 1).long()
    return Batch(tokens=tokens, padding_mask=padding, segments=segments, pixels=pixels)


def run_hf(hf, batch, seed=7):
    """HF's outputs on ``batch`` and, for the same seed, the order in which it fed the patches:
    ``order[b, j]`` is the patch (row-major) at HF's image position 1 + j."""
    base = getattr(hf, "vilt", hf)
    mask = torch.ones(batch.pixels.shape[0], IMAGE, IMAGE, dtype=torch.long)
    torch.manual_seed(seed)
    with torch.no_grad():
        _, _, (patch_index, _) = base.embeddings.visual_embed(batch.pixels, mask, max_image_length=-1)
    inputs = {"input_ids": batch.tokens, "attention_mask": (~batch.padding_mask).long(),
              "pixel_values": batch.pixels, "pixel_mask": mask}
    torch.manual_seed(seed)
    with torch.no_grad():
        states = base(**inputs)
    torch.manual_seed(seed)
    with torch.no_grad():
        head = hf(**inputs)
    return states, head, patch_index[..., 0] * GRID + patch_index[..., 1]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hf_to_pentad_outputs_match(tmp_path, case):
    _, class_name, make_config, kwargs = case
    hf = save_hf(tmp_path / "hf", class_name, make_config(), **kwargs)
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert report.architecture == class_name
    assert len(report.verification) >= LAYERS + 2
    cfg, ours = load_pentad_run(tmp_path / "pentad")
    part = cfg.model.embedding.parts[0]
    assert part.type == "word_patch" and part.text_positions == TEXT and part.text_norm and part.image_positions
    assert not cfg.model.embedding.norm and cfg.model.embedding.parts[1].type == "seg"
    batch = sample()
    states, head, order = run_hf(hf, batch)
    with torch.no_grad():
        hidden, _ = ours.encode(batch)
        outputs = {name: target(hidden, batch) for name, target in ours.targets.items()}
    text = batch.tokens.shape[1]
    real = ~batch.padding_mask
    # the caption's real positions
    assert relative(hidden[:, :text][real], states.last_hidden_state[:, :text][real]) <= TOL
    # the image: CLS, then each patch where HF put it
    image = hidden[:, text:]
    unshuffled = torch.cat([image[:, :1], torch.gather(image[:, 1:], 1, order[..., None].expand(-1, -1, HIDDEN))], 1)
    assert relative(unshuffled, states.last_hidden_state[:, text:]) <= TOL
    pooler = next((t.pooler for t in ours.targets.values() if getattr(t, "pooler", None) is not None), None)
    if states.pooler_output is not None:
        with torch.no_grad():
            pooled = pooler(hidden[:, 0]).tanh()
        assert relative(pooled, states.pooler_output) <= TOL
    if class_name == "ViltForMaskedLM":
        assert cfg.task.type == "image_text_match" and cfg.task.normalise == "half"
        logits = outputs["mlm"].logits[:, :text]
        assert logits.shape == head.logits.shape
        assert relative(logits[real], head.logits[real]) <= TOL
    if class_name == "ViltForImageAndTextRetrieval":
        assert outputs["regression"].logits.shape == head.logits.shape == (3, 1)
        assert relative(outputs["regression"].logits, head.logits) <= TOL
    if class_name != "ViltForImageAndTextRetrieval":
        interop = json.loads((tmp_path / "pentad" / "interop.json").read_text())
        assert interop["synthesized"][:2] == ["targets.sp.classifier.weight", "targets.sp.classifier.bias"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hf_to_pentad_to_hf_is_bitwise(tmp_path, case):
    _, class_name, make_config, kwargs = case
    save_hf(tmp_path / "hf", class_name, make_config(), **kwargs)
    assert_hf_round_trip(tmp_path, class_name)


HF_LAYOUT = {
    "hidden_size": HIDDEN, "vocab_size": VOCAB, "max_seq_length": TEXT + GRID * GRID + 1, "tie_word_embeddings": True,
    "embedding": {"parts": [{"type": "word_patch", "patch": {"image_size": IMAGE, "patch_size": PATCH, "bias": True},
                             "text_positions": TEXT, "text_segments": 2, "text_norm": True, "image_positions": True},
                            {"type": "seg", "num_segments": 2}], "norm": False, "dropout": 0.0},
    "encoder": {"type": "transformer", "num_layers": LAYERS, "num_heads": HEADS, "ffn_size": FFN, "activation": "gelu",
                "norm_position": "pre", "final_norm": True, "mask": "bidirectional", "dropout": 0.0,
                "layer_norm_eps": 1e-12},
    "targets": [{"type": "mlm", "activation": "gelu", "layer_norm_eps": 1e-12}, {"type": "sp"}],
}


def test_pentad_vilt_exports_and_loads_with_transformers(tmp_path):
    _, net = make_run(tmp_path / "run", HF_LAYOUT)
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", verify=True)
    assert report.ok, report.render()
    assert report.family == "vilt" and report.architecture == "ViltForMaskedLM"
    assert any("guessed" in note for note in report.notes)
    assert any("image-text matching head" in note for note in report.notes)  # the trained sp classifier
    hf = transformers.ViltForMaskedLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True).eval()
    itm = sum(p.numel() for p in net.targets["sp"].classifier.parameters())
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in net.parameters()) - itm
    batch = sample()
    _, head, _ = run_hf(hf, batch)
    with torch.no_grad():
        ours = net.targets["mlm"](net.encode(batch)[0], batch).logits[:, :batch.tokens.shape[1]]
    real = ~batch.padding_mask
    assert relative(ours[real], head.logits[real]) <= TOL


@pytest.mark.parametrize("change, message", [
    ({"max_seq_length": 40,
      "embedding": {"parts": [{"type": "word_patch", "patch": {"image_size": IMAGE, "patch_size": PATCH,
                                                               "bias": False}},
                              "pos", {"type": "seg", "num_segments": 3}], "norm": True, "dropout": 0.0},
      "encoder": {**HF_LAYOUT["encoder"], "norm_position": "post", "final_norm": False}},
     "TencentPretrain's ViLT layout"),
    ({"embedding": {**HF_LAYOUT["embedding"],
                    "parts": [{**HF_LAYOUT["embedding"]["parts"][0], "text_norm": False},
                              {"type": "seg", "num_segments": 2}]}}, "has no text_norm"),
    ({"targets": [{"type": "sp"}]}, "trained image-text matching classifier"),
])
def test_what_hf_cannot_hold_is_refused(tmp_path, change, message):
    make_run(tmp_path / "run", {**HF_LAYOUT, **change})
    with pytest.raises(UserError, match="cannot export .* as vilt") as info:
        convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family="vilt")
    assert message in str(info.value)
    assert not (tmp_path / "hf").exists()
