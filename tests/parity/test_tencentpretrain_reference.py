"""Converted TencentPretrain checkpoints against TencentPretrain's own forward pass.

``tests/data/tencentpretrain_reference/FAMILY.safetensors`` holds, per family, a tiny checkpoint built
by TencentPretrain's model builder from its shipped config (shrunk) with trained-like weights, a fixed
batch, and what TencentPretrain computed on it: the embedding output, every layer's output, each
stack's output, the heads' logits and the losses (``make_reference.py`` there regenerates them
from a TencentPretrain checkout). Each checkpoint is converted with ``tencentpretrain-to-pentad`` as
a user would, and the pentad model must reproduce every recorded tensor to 1e-5 relative to the
reference's largest magnitude.

Speech (``s2t``) rows are feature frames, the second padded with zeros; TencentPretrain's loader marks
frames / 4 positions real where the subsampler gives ceil(frames / 4) (a padded row whose frame count
is not divisible by 4 has one subsampled position that mixes real frames and padding, which
TencentPretrain treats as padding and pentad as real), so the reference's frame counts are
divisible by 4. Images (``vit``) are unpadded pixels with a class label. ``clip`` pairs captions (the
second padded) with images; the image tower's tensors are named ``pair.*``.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pentad.builder import build_model
from pentad.components.base import IGNORE_INDEX, Batch
from pentad.interop import convert
from pentad.interop.numerics import swap_norm_kinds
from pentad.runs import load_run
from pentad.training.checkpoint import find_weights, load_weights, read_weights

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "tencentpretrain_reference"
FAMILIES = sorted(p.stem for p in REFERENCE.glob("*.safetensors"))
TOLERANCE = 1e-5  # max |pentad - TencentPretrain| / max |TencentPretrain|, per recorded tensor
# TencentPretrain's bidirectional recurrent encoders flip the whole row, so the backward direction of a
# padded row starts on padding and its outputs depend on how much padding the batch has; pentad's
# starts at the row's last real token (components/encoders/rnn.py). Rows without padding are compared.
UNPADDED_ROWS_ONLY = {"bilstm"}


def load_reference(family: str) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    """(TencentPretrain config, state dict with its aliases, inputs, outputs)."""
    with safe_open(str(REFERENCE / f"{family}.safetensors"), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    aliases = json.loads(meta["aliases"])
    state = collections.OrderedDict()
    for key in json.loads(meta["state_order"]):
        state[key] = tensors[f"state.{aliases.get(key, key)}"]
    inputs = {k.removeprefix("input."): v for k, v in tensors.items() if k.startswith("input.")}
    outputs = {name: tensors[f"output.{name}"] for name in json.loads(meta["outputs"])}
    return json.loads(meta["config"]), state, inputs, outputs


def converted_model(tmp_path: Path, family: str, config: dict, state: dict, norms_as_torch: bool = False):
    source = tmp_path / "tp"
    source.mkdir()
    torch.save(state, source / "model.bin")
    (source / "config.json").write_text(json.dumps(config))
    report = convert("tencentpretrain-to-pentad", source, tmp_path / "run", verify=True)
    assert report.ok, report.render()
    cfg, _ = load_run(tmp_path / "run")
    model_cfg = cfg.model
    if norms_as_torch:
        model_cfg = swap_norm_kinds(model_cfg, "layernorm_unbiased", "layernorm")
    model = build_model(model_cfg)
    load_weights(model, read_weights(find_weights(tmp_path / "run")), "converted")
    model.eval()
    model.target_types = {t.target_name: t.type for t in model_cfg.targets}
    return model


def pentad_batch(model, inputs: dict[str, torch.Tensor], with_labels: bool) -> Batch:
    """TencentPretrain's inputs as a pentad Batch: its segments (1 = A, 2 = B, 0 = padding) become
    segments 0/1 and a padding mask; its target tensors become labels. Speech features become
    ``audio`` with a frame padding mask from each row's frame count (the subsampler derives the
    positions' mask from it); images become ``pixels``."""
    seg = inputs["seg"]
    has_segments = hasattr(model.embedding, "seg")
    if "src_image" in inputs:
        batch = Batch(tokens=inputs["src"], padding_mask=seg == 0, pair=Batch(pixels=inputs["src_image"]))
    elif "src_frames" in inputs:
        frames = torch.arange(inputs["src"].shape[1])[None, :] >= inputs["src_frames"][:, None]
        batch = Batch(audio=inputs["src"], audio_padding_mask=frames)
    elif inputs["src"].dim() == 4:
        batch = Batch(pixels=inputs["src"])
    else:
        batch = Batch(tokens=inputs["src"], segments=(seg - 1).clamp(min=0) if has_segments else None,
                      padding_mask=seg == 0)
    if "tgt_in" in inputs:
        batch.decoder_tokens, batch.decoder_padding_mask = inputs["tgt_in"], inputs["tgt_seg"] == 0
    if not with_labels:
        return batch
    names = {kind: name for name, kind in model.target_types.items()}
    if "tgt_mlm" in inputs:
        batch.labels[names["mlm"]] = torch.where(inputs["tgt_mlm"] > 0, inputs["tgt_mlm"], IGNORE_INDEX)
    if "tgt_sp" in inputs:
        batch.labels[names.get("sp", names.get("sop"))] = inputs["tgt_sp"]
    if "tgt_cls" in inputs:
        batch.labels[names["cls"]] = inputs["tgt_cls"]
    if "tgt_lm" in inputs:
        scored = inputs["tgt_seg"] > 0 if "tgt_in" in inputs else seg > 0
        batch.labels[names["lm"]] = torch.where(scored, inputs["tgt_lm"], IGNORE_INDEX)
    return batch


def pentad_pair_outputs(model, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the reference records of a two-tower model (CLIP), from the pentad model: each tower's
    embedding, layers and output (the image tower's as ``pair.*``), the clr logits and loss."""
    out: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(module, args_, output) -> None:
            hidden = output.hidden if hasattr(output, "hidden") else output
            out.setdefault(name, hidden[0] if isinstance(hidden, tuple) else hidden)
        return hook

    hooks = []
    for prefix, embedding, encoder in (("", model.embedding, model.encoder),
                                       ("pair.", *model.stream_slots(1))):  # the reference's names
        hooks.append(embedding.register_forward_hook(keep(f"{prefix}embedding")))
        hooks.append(encoder.register_forward_hook(keep(f"{prefix}encoder")))
        for i, layer in enumerate(encoder.layers):
            hooks.append(layer.register_forward_hook(keep(f"{prefix}encoder.layer.{i}")))
    with torch.no_grad():
        heads = model(pentad_batch(model, inputs, with_labels=False))  # (a two-stream model trims nothing)
    for hook in hooks:
        hook.remove()
    out["clr.logits"], out["clr.loss"] = heads["clr"].logits, heads["clr"].loss
    return out


def pentad_outputs(model, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors TencentPretrain's reference records, named alike, from the pentad model."""
    if model.stream_plan is not None:
        return pentad_pair_outputs(model, inputs)
    seg = inputs["seg"]
    real = seg > 0
    out: dict[str, torch.Tensor] = {}
    calls: dict[str, list[torch.Tensor]] = {"encoder.layer": [], "decoder.layer": []}
    hooks = [model.embedding.dropout.register_forward_hook(lambda m, i, o: out.__setitem__("embedding", o))]
    for stack in ("encoder", "decoder"):
        module = getattr(model, stack, None)
        for layer in {id(x): x for x in getattr(module, "layers", [])}.values():
            hooks.append(layer.register_forward_hook(
                lambda m, i, o, stack=stack: calls[f"{stack}.layer"].append(o[0] if isinstance(o, tuple) else o)))
    if model.target_embedding is not None:
        hooks.append(model.target_embedding.dropout.register_forward_hook(
            lambda m, i, o: out.__setitem__("target_embedding", o)))
    batch = pentad_batch(model, inputs, with_labels=False)
    with torch.no_grad():
        hidden, mask = model.encode(batch)
        out["encoder"] = hidden
        if model.decoder is not None:
            out["decoder"] = model.decode(batch, hidden, mask)
        heads = model(batch)
        losses = model(pentad_batch(model, inputs, with_labels=True))
    for hook in hooks:
        hook.remove()
    for name, tensors in calls.items():
        n = len(tensors) // (2 if model.decoder is not None and name == "encoder.layer" else 1)
        # model(batch) ran the stacks again: keep the first pass of each.
        for i, tensor in enumerate(tensors[:n]):
            out[f"{name}.{i}"] = tensor
    scored = inputs["tgt_seg"] > 0 if "tgt_in" in inputs else real
    for name, kind in model.target_types.items():
        kind = {"sop": "sp"}.get(kind, kind)
        logits = heads[name].logits
        if kind == "mlm":
            logits = logits[inputs["tgt_mlm"] > 0]
        elif kind == "lm":
            logits = logits[scored]
        out[f"{kind}.logits"] = logits
        if losses[name].loss is not None:
            out[f"{kind}.loss"] = losses[name].loss
    return out


def relative_difference(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    assert ours.shape == theirs.shape, (tuple(ours.shape), tuple(theirs.shape))
    scale = float(theirs.double().abs().max())
    return float((ours.double() - theirs.double()).abs().max()) / max(scale, 1e-12)


def compare(family: str, ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor],
            inputs: dict[str, torch.Tensor]) -> dict[str, float]:
    real = inputs["seg"] > 0
    if family in UNPADDED_ROWS_ONLY:
        real = real & real.all(dim=1, keepdim=True)
    target_real = inputs["tgt_seg"] > 0 if "tgt_in" in inputs else None
    found = {}
    for name, theirs in reference.items():
        assert name in ours, f"{family}: pentad has no '{name}' to compare"
        mine = ours[name]
        if name.startswith(("embedding", "encoder")) or name == "bilm.logits":
            mine, theirs = mine[real], theirs[real]  # padding positions are not read by anything
        elif name.startswith(("target_embedding", "decoder")):
            mine, theirs = mine[target_real], theirs[target_real]
        found[name] = relative_difference(mine, theirs)
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_converted_checkpoint_reproduces_tencentpretrain(tmp_path, family):
    config, state, inputs, reference = load_reference(family)
    model = converted_model(tmp_path, family, config, state)
    found = compare(family, pentad_outputs(model, inputs), reference, inputs)
    worst = {name: f"{value:.1e}" for name, value in found.items() if value > TOLERANCE}
    assert not worst, f"{family}: above {TOLERANCE:g} relative: {worst} (all: {found})"


def test_reference_set_covers_every_converted_family():
    assert set(FAMILIES) >= {"bert", "albert", "xlm-roberta", "gpt2", "bart", "pegasus", "transformer", "t5",
                             "t5-v1_1", "llama", "llama2-70b", "bloom", "lstm", "bilstm", "gatedcnn", "s2t", "vit",
                             "clip"}
    total = sum(p.stat().st_size for p in REFERENCE.glob("*.safetensors"))
    assert total < 1.5 * 2**20


@pytest.mark.parametrize("family", ["bert", "gpt2", "bart"])
def test_torchs_layernorm_would_miss_the_reference(tmp_path, family):
    """The reference tells the norms apart: with torch's LayerNorm in place of TencentPretrain's,
    the same checkpoint misses the logits by far more than the tolerance."""
    config, state, inputs, reference = load_reference(family)
    model = converted_model(tmp_path, family, config, state, norms_as_torch=True)
    found = compare(family, pentad_outputs(model, inputs), reference, inputs)
    logits = max(v for k, v in found.items() if k.endswith("logits"))
    assert logits > 1e-3, found


def test_bloom_checkpoint_converts_without_alibi_as_tencentpretrain_computes(tmp_path):
    """TencentPretrain accepts alibi_position_embedding and never applies it: a converted checkpoint does
    the same (the parity above holds without overrides), and the conversion says how to turn ALiBi on."""
    config, state, _, _ = load_reference("bloom")
    assert config.get("alibi_position_embedding")
    source = tmp_path / "tp"
    source.mkdir()
    torch.save(state, source / "model.bin")
    (source / "config.json").write_text(json.dumps(config))
    report = convert("tencentpretrain-to-pentad", source, tmp_path / "run")
    cfg, _ = load_run(tmp_path / "run")
    assert cfg.model.encoder.positions == "none"
    alibi = [n for n in report.notes if "alibi" in n.lower()]
    assert len(alibi) == 1 and "never applies" in alibi[0] and "positions: alibi" in alibi[0]
