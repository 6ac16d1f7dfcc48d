"""CLIP conversion parity: a Hugging Face ``CLIPModel`` built from a tiny ``CLIPConfig`` with random
weights (no download) converts to a pentad model with two streams (text, image) with a ``clr`` head and back.

* HF -> pentad: text features, image features and ``logits_per_image`` equal HF's within 1e-5
  relative in fp32 on texts that end with the end-of-text token (padded after it) and seeded
  images; the ``--verify`` report (every layer of both towers) agrees.
* HF -> pentad -> HF: bitwise-identical state dicts and the same config.
* pentad -> HF: a pentad CLIP (family guessed from its streams) loads with ``CLIPModel``;
  models CLIP cannot express are refused with the reason.
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.unit.interop.helpers import assert_hf_round_trip, load_pentad_run, make_run, relative, save_perturbed

from pentad.errors import UserError
from pentad.interop import convert
from pentad.interop.verify import clip_sample
from pentad.runs import load_run

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 1e-5
VOCAB = 40


def clip_config(eos: int | None = None, vocab_size: int = VOCAB, **over):
    eos = vocab_size - 1 if eos is None else eos
    text = {"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 16, "pad_token_id": 1, "bos_token_id": vocab_size - 2,
            "eos_token_id": eos}
    vision = {"hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 16, "patch_size": 4, "num_channels": 3}
    return transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=20, **over)


def save_hf(directory, config):
    torch.manual_seed(0)
    return save_perturbed(transformers.CLIPModel(config), directory)


pentad_model = load_pentad_run


def outputs(hf, net, cfg, hf_config):
    batch, inputs = clip_sample(cfg.model, hf_config)
    assert batch.padding_mask.any() and (inputs["input_ids"] == inputs["input_ids"].max()).any()
    with torch.no_grad():
        ref = hf(**inputs)
        pooled = net.encode_pair(batch)
        target = net.targets["clr"]
        text, image = target.features(pooled)
        logits = target(pooled, batch).logits
    return ref, text, image, logits


@pytest.mark.parametrize("eos", [VOCAB - 1, 2], ids=["eos-id", "legacy-eos-2"])
def test_hf_to_pentad_outputs_match(tmp_path, eos):
    hf = save_hf(tmp_path / "hf", clip_config(eos=eos))
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    assert report.family == "clip" and report.architecture == "CLIPModel"
    assert len(report.verification) == 2 * (2 + 1) + 5  # embeddings + 2 layers per tower, pooled, features, logits
    cfg, net = pentad_model(tmp_path / "pentad")
    assert list(cfg.model.streams) == ["text", "image"] and cfg.model.encoder.mask == "causal"
    assert [s.pooling for s in cfg.model.streams.values()] == ["last", "first"]
    assert cfg.task.type == "image_text" and cfg.task.normalise == "clip"
    assert sum(p.numel() for p in net.parameters()) == sum(p.numel() for p in hf.parameters())
    ref, text, image, logits = outputs(hf, net, cfg, json.loads((tmp_path / "hf" / "config.json").read_text()))
    assert relative(text, ref.text_embeds) <= TOL
    assert relative(image, ref.image_embeds) <= TOL
    assert relative(logits.T, ref.logits_per_image) <= TOL
    # the logit scale is stored as a log on both sides
    assert float(net.targets["clr"].logit_scale.detach()) == float(hf.logit_scale.detach())


def test_hf_to_pentad_to_hf_is_bitwise(tmp_path):
    save_hf(tmp_path / "hf", clip_config())
    assert_hf_round_trip(tmp_path, "CLIPModel")


def test_position_ids_buffers_of_older_checkpoints_are_read(tmp_path):
    save_hf(tmp_path / "hf", clip_config())
    path = tmp_path / "hf" / "model.safetensors"
    state = safetensors_torch.load_file(str(path))
    state["text_model.embeddings.position_ids"] = torch.arange(16)[None]
    state["vision_model.embeddings.position_ids"] = torch.arange(17)[None]
    safetensors_torch.save_file(state, str(path), metadata={"format": "pt"})
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back")
    back = safetensors_torch.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert not any(k.endswith("position_ids") for k in back)


TINY_CLIP = {
    "hidden_size": 32, "vocab_size": VOCAB, "max_seq_length": 16, "tie_word_embeddings": False,
    "embedding": {"parts": ["word", "pos"], "norm": False, "dropout": 0.0},
    "encoder": {"type": "transformer", "num_layers": 2, "num_heads": 4, "ffn_size": 48,
                "activation": "quick_gelu", "norm_position": "pre", "final_norm": True,
                "mask": "causal", "dropout": 0.0, "layer_norm_eps": 1e-5},
    "streams": {
        "caption": {"pooling": "last"},
        "picture": {"hidden_size": 24, "max_seq_length": 17,  # any names: the export reads them
                    "embedding": {"parts": [{"type": "patch", "image_size": 16, "patch_size": 4, "bias": False},
                                            "pos"], "norm": True, "layer_norm_eps": 1e-5, "dropout": 0.0},
                    "encoder": {"type": "transformer", "num_layers": 1, "num_heads": 2, "ffn_size": 40,
                                "activation": "quick_gelu", "norm_position": "pre", "final_norm": True,
                                "mask": "bidirectional", "dropout": 0.0, "layer_norm_eps": 1e-5},
                    "pooling": "first"}},
    "targets": [{"type": "clr", "projection": True, "feature_size": 20}],
}


def test_pentad_clip_exports_and_loads(tmp_path):
    _, net = make_run(tmp_path / "run", TINY_CLIP)
    report = convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", verify=True)
    assert report.ok, report.render()
    assert report.family == "clip" and any("guessed" in note for note in report.notes)
    hf = transformers.CLIPModel.from_pretrained(str(tmp_path / "hf"), local_files_only=True).eval()
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in net.parameters())
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["text_config"]["eos_token_id"] == VOCAB - 1
    cfg, net = pentad_model(tmp_path / "run")
    ref, text, image, logits = outputs(hf, net, cfg, config)
    assert relative(logits.T, ref.logits_per_image) <= TOL


@pytest.mark.parametrize("change, message", [
    ({"streams": {**TINY_CLIP["streams"], "picture": {**TINY_CLIP["streams"]["picture"], "pooling": "mean"}}},
     "CLIP pools the text's end token (last) and the image's CLS (first)"),
    ({"targets": [{"type": "clr", "projection": True, "feature_size": 20, "streams": ["picture", "caption"]}]},
     "CLIP compares text with image"),
    ({"targets": [{"type": "clr", "projection": True, "feature_size": 20, "temperature": 0.05}]},
     "learn its logit scale"),
    ({"embedding": {"parts": ["word", "pos"], "norm": True}}, "without a norm"),
])
def test_models_clip_cannot_express_are_refused(tmp_path, change, message):
    make_run(tmp_path / "run", {**TINY_CLIP, **change})
    with pytest.raises(UserError, match="cannot export .* as clip") as info:
        convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf", family="clip")
    assert message in str(info.value)
    assert not (tmp_path / "hf").exists()


def test_clip_checkpoint_options_pentad_cannot_hold(tmp_path):
    save_hf(tmp_path / "hf", clip_config())
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    config["text_config"]["hidden_act"] = "no_such_act"
    path.write_text(json.dumps(config))
    with pytest.raises(UserError, match="text_config.hidden_act 'no_such_act'"):
        convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    assert not (tmp_path / "pentad").exists()


def _bytes_to_unicode() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes (GPT-2's and CLIP's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(rest))]


def save_clip_tokenizer(directory):
    """A tiny CLIP BPE (the byte alphabet, each with a '</w>' twin, a few merges, start/end of text)."""
    chars = _bytes_to_unicode()
    merges = [("t", "h"), ("th", "e</w>"), ("c", "a"), ("ca", "t</w>"), ("p", "h"), ("o", "t"), ("ph", "ot"),
              ("phot", "o</w>"), ("o", "f</w>")]
    tokens = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    tokenizer = transformers.CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    tokenizer.save_pretrained(directory)
    return tokenizer


def test_clip_tokenizer_converts_both_ways(tmp_path):
    theirs = save_clip_tokenizer(tmp_path / "hf")
    vocab = len(theirs)
    save_hf(tmp_path / "hf", clip_config(vocab_size=vocab))
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad", verify=True)
    assert report.ok, report.render()
    _, ours = load_run(tmp_path / "pentad")
    texts = ["A photo of the cat!", "the  Cat photo", "of of the\tphoto"]
    for text in texts:  # CLIPTokenizer adds the start and end of text; pentad's tasks add cls and sep
        assert theirs(text).input_ids == [ours.cls_id, *ours.encode(text), ours.sep_id]
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (vocab - 2, vocab - 1, vocab - 1)
    convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back")
    back = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "back"), local_files_only=True)
    assert type(back).__name__ == "CLIPTokenizer"
    for text in texts:
        assert back(text).input_ids == theirs(text).input_ids
    assert back.eos_token_id == back.pad_token_id == vocab - 1
