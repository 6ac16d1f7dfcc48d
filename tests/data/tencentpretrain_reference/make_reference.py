"""Regenerate the TencentPretrain reference tensors in this folder (not run by the test suite).

Usage::

    python tests/data/tencentpretrain_reference/make_reference.py TENCENTPRETRAIN_CHECKOUT [FAMILY ...]

TENCENTPRETRAIN_CHECKOUT is a checkout of TencentPretrain's public repository (its ``models/`` folder
and the ``tencentpretrain`` package); its Python requirements (torch, six, regex, sentencepiece)
must be importable. For each family below, this script

1. takes the family's shipped config file and shrinks it (``SHRINK``: hidden 24, 4 heads, 2 layers,
   feed-forward 32, 16 positions, a 40-entry vocabulary; the embedding width stays smaller than
   the hidden size where the config makes it so),
2. builds the model with TencentPretrain's own ``model_builder.build_model`` from the arguments
   ``pretrain.py`` would parse for that file,
3. gives it trained-like weights (``trained_like``: unit-scale norm scales 1 + 0.1 N(0, 1),
   biases N(0, 0.1), matrices N(0, 1/fan_in), embedding tables N(0, 0.5)) — freshly initialised
   N(0, 0.02) weights would hide mistakes in norms and query/key layouts,
4. runs its forward pass in eval mode and fp32 on a fixed batch of two rows (the second padded; speech:
   feature frames as its s2t loader pads them, images: pixels, see ``speech_inputs``/``image_inputs``) and
   records, through forward hooks, the embedding output, every transformer layer's output, each
   stack's output, the target heads' logits and the losses,

and writes ``FAMILY.safetensors``: the checkpoint's distinct tensors under ``state.NAME`` (tied
names are listed in the metadata as aliases, as TencentPretrain's ``save_model`` repeats them), the
inputs under ``input.NAME`` and the recorded tensors under ``output.NAME``, with the exact config
used and the list of outputs as JSON in the file's metadata. ``tests/parity/test_tencentpretrain_reference.py``
converts each checkpoint with ``pentad convert tencentpretrain-to-pentad`` and compares.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
VOCAB = 40
SRC_LEN, TGT_LEN = 8, 6
# speech rows: 32 frames, the second with 20 real ones (TencentPretrain's loader marks frames / 4
# positions real, exact for frame counts divisible by 4), i.e. 8 and 5 positions after the subsampler
AUDIO_FRAMES, AUDIO_REAL = 32, (32, 20)
# family -> (shipped config under models/, extra overrides)
FAMILIES = {
    "bert": ("bert/base_config.json", {}),
    "albert": ("albert/base_config.json", {}),
    "xlm-roberta": ("xlm-roberta/base_config.json", {}),
    "gpt2": ("gpt2/config.json", {}),
    "bart": ("bart/base_config.json", {}),
    "pegasus": ("pegasus/base_config.json", {}),
    "transformer": ("transformer/base_config.json", {}),
    "t5": ("t5/small_config.json", {}),
    "t5-v1_1": ("t5-v1_1/small_config.json", {}),
    "llama": ("llama/7b_config.json", {}),
    "llama2-70b": ("llama2/70b_config.json", {"local_kv_heads_num": 2}),
    "bloom": ("bloom/1b1_config.json", {}),
    "lstm": ("rnn/lstm_config.json", {}),
    "bilstm": ("rnn/bilstm_config.json", {}),
    "gatedcnn": ("cnn/gatedcnn_9_config.json", {"layers_num": 4}),
    # speech: 10 features per frame, 32 frames; two stride-2 convolutions of 32 then 48 channels, each
    # halved by its GLU, so the second takes 16 and gives the 24-wide embedding
    "s2t": ("s2t/small_config.json", {"audio_feature_size": 10, "conv_channels": [32, 48],
                                      "max_audio_frames": AUDIO_FRAMES}),
    # images: 3 x 12 x 8 pixels in 4 x 4 patches (3 x 2 of them, plus the CLS position), 5 classes
    "vit": ("vit/base-16-224_config.json", {"image_height": 12, "image_width": 8, "patch_size": 4,
                                            "labels_num": 5}),
    # two towers: the text tower shrunk as the others, a 16-wide image tower over 3 x 12 x 8 pixels in
    # 4 x 4 patches, both projected to 12 features
    "clip": ("clip/base-32_config.json", {"image_height": 12, "image_width": 8, "patch_size": 4, "feature_size": 12}),
}
IMAGE_TOWER = {"emb_size": 16, "hidden_size": 16, "feedforward_size": 32, "heads_num": 4, "layers_num": 2}
SHRINK = {"hidden_size": 24, "feedforward_size": 32, "heads_num": 4, "layers_num": 2, "max_seq_length": 16}


def shrunk_config(checkout: Path, family: str) -> dict:
    path, extra = FAMILIES[family]
    config = json.loads((checkout / "models" / path).read_text(encoding="utf-8"))
    if "stream_0" in config:  # two towers (CLIP): text as the others, the image tower IMAGE_TOWER
        config["stream_0"].update(SHRINK, emb_size=SHRINK["hidden_size"])
        config["stream_1"].update(IMAGE_TOWER)
        config.update(extra)
        patches = (config["image_height"] // config["patch_size"]) * (config["image_width"] // config["patch_size"])
        config["stream_1"]["max_seq_length"] = patches + 1
        return config
    narrow = config.get("emb_size", config["hidden_size"]) != config["hidden_size"]
    config.update(SHRINK)
    config["emb_size"] = 16 if narrow else SHRINK["hidden_size"]
    if "decoder_layers_num" in config:
        config["decoder_layers_num"] = 2
    if "attention_head_size" in config:
        config["attention_head_size"] = SHRINK["hidden_size"] // SHRINK["heads_num"]
    config.update(extra)
    return config


def tencentpretrain_args(config: dict, vocab: dict):
    """The argument namespace pretrain.py builds for ``config``: its option defaults, then the file."""
    import tencentpretrain.opts as opts

    parser = argparse.ArgumentParser()
    for add in (opts.model_opts, opts.tokenizer_opts, opts.tgt_tokenizer_opts, opts.mp_opts, opts.log_opts,
                opts.deepspeed_opts, opts.lora_opts, opts.optimization_opts):
        add(parser)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--labels_num", type=int, default=None)
    parser.add_argument("--data_processor", default="bert")
    parser.add_argument("--deep_init", action="store_true")
    parser.add_argument("--batch_size", type=int, default=2)  # ClrTarget reads it (and does nothing with it)
    args = parser.parse_args([])
    vars(args).update(config)
    args.tokenizer = SimpleNamespace(vocab=vocab)
    args.tgt_tokenizer = SimpleNamespace(vocab=vocab)
    args.lora_params = None
    return args


def is_norm_scale(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return leaf == "gamma" or (leaf == "weight" and "layer_norm" in name)


def trained_like(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied parameters once
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 0:  # CLIP's logit scale keeps TencentPretrain's log(1 / 0.07)
                continue
            if is_norm_scale(name):
                p.copy_(1 + 0.1 * noise)
            elif p.dim() == 1 or name.startswith(("encoder.conv_b", "encoder.gate_b")):  # biases
                p.copy_(0.1 * noise)
            elif "embedding" in name or "relative_attention_bias" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise / math.sqrt(p[0].numel()))


def speech_inputs(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """What TencentPretrain's s2t loader gives: feature frames [2, frames, features] padded with zeros
    to ``max_audio_frames``, and seg with frames / (conv_layers_num * 2) ones per row (``src_frames``
    keeps each row's frame count for the pentad side)."""
    frames = config["max_audio_frames"]
    src = torch.randn(2, frames, config["audio_feature_size"], generator=g)
    positions = frames // (len(config["conv_channels"]) * 2)
    seg = torch.zeros(2, positions, dtype=torch.long)
    for row, real in enumerate(AUDIO_REAL):
        src[row, real:] = 0.0
        seg[row, :real // (len(config["conv_channels"]) * 2)] = 1
    return {"src": src, "seg": seg, "src_frames": torch.tensor(AUDIO_REAL)}


def image_inputs(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """What TencentPretrain's vit loader gives: pixels [2, channels, height, width], seg all ones over
    the patches and the CLS position (images are not padded), and a class per image."""
    pixels = torch.randn(2, config.get("channels_num", 3), config["image_height"], config["image_width"], generator=g)
    patches = (config["image_height"] // config["patch_size"]) * (config["image_width"] // config["patch_size"])
    out = {"src": pixels, "seg": torch.ones(2, patches + 1, dtype=torch.long)}
    if "labels_num" in config:
        out["tgt_cls"] = torch.randint(0, config["labels_num"], (2,), generator=g)
    return out


def fixed_inputs(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Source tokens and segments (TencentPretrain's: 1 = A, 2 = B, 0 = padding), and per target
    what its forward reads; the second row is padded. Speech and image families take their
    modality's source instead (``speech_inputs``, ``image_inputs``)."""
    g = torch.Generator().manual_seed(seed)
    if "stream_0" in config:  # CLIP: captions (the second padded) and images, as its clip loader gives
        src = torch.randint(1, VOCAB, (2, SRC_LEN), generator=g)
        seg = torch.ones(2, SRC_LEN, dtype=torch.long)
        seg[1, SRC_LEN - 3:] = 0
        src[seg == 0] = 0
        image = image_inputs(config, g)
        return {"src": src, "seg": seg, "src_image": image["src"], "seg_image": image["seg"]}
    if "speech" in config["embedding"]:
        out = speech_inputs(config, g)
    elif "patch" in config["embedding"]:
        return image_inputs(config, g)
    else:
        src = torch.randint(1, VOCAB, (2, SRC_LEN), generator=g)
        seg = torch.ones(2, SRC_LEN, dtype=torch.long)
        if "seg" in config["embedding"] and config.get("data_processor") in ("bert", "albert"):
            seg[:, SRC_LEN // 2:] = 2
        seg[1, SRC_LEN - 3:] = 0
        src[seg == 0] = 0
        out = {"src": src, "seg": seg}
    targets = config["target"]
    if "mlm" in targets:
        tgt = torch.zeros(2, SRC_LEN, dtype=torch.long)
        for row, positions in enumerate(([1, 4, 6], [0, 2, 3])):
            tgt[row, positions] = torch.randint(1, VOCAB, (3,), generator=g)
        out["tgt_mlm"] = tgt
    if "sp" in targets:
        out["tgt_sp"] = torch.tensor([0, 1])
    if config.get("decoder"):
        tgt_in = torch.randint(1, VOCAB, (2, TGT_LEN), generator=g)
        tgt_seg = torch.ones(2, TGT_LEN, dtype=torch.long)
        tgt_seg[1, TGT_LEN - 2:] = 0
        tgt_in[tgt_seg == 0] = 0
        out.update(tgt_in=tgt_in, tgt_seg=tgt_seg, tgt_lm=torch.randint(1, VOCAB, (2, TGT_LEN), generator=g))
    elif "lm" in targets:
        out["tgt_lm"] = torch.randint(1, VOCAB, (2, SRC_LEN), generator=g)
    if "bilm" in targets:
        out["tgt_forward"] = torch.randint(1, VOCAB, (2, SRC_LEN), generator=g)
        out["tgt_backward"] = torch.randint(1, VOCAB, (2, SRC_LEN), generator=g)
    return out


def first_of(result):
    """The loss of a target's result: (loss, correct, ...) for mlm and sp, the loss alone for lm."""
    return result[0] if isinstance(result, tuple) else result


def run_family(checkout: Path, family: str, seed: int) -> None:
    from tencentpretrain.model_builder import build_model
    from tencentpretrain.utils.constants import PAD_TOKEN

    config = shrunk_config(checkout, family)
    vocab = {PAD_TOKEN: 0, **{f"token{i}": i for i in range(1, VOCAB)}}
    args = tencentpretrain_args(config, vocab)
    torch.manual_seed(seed)
    model = build_model(args)
    trained_like(model, seed)
    model.eval()
    inputs = fixed_inputs(config, seed)

    captured: dict[str, torch.Tensor] = {}
    names: list[str] = []

    def keep(name):
        def hook(module, args_, output):
            tensor = output[0] if isinstance(output, tuple) else output
            key = name
            if name.endswith("layer"):  # a shared layer is called once per use
                key = f"{name}.{sum(1 for n in names if n.startswith(name + '.'))}"
            captured[key] = tensor.detach().clone()
            names.append(key)
        return hook

    if "stream_0" in config:
        run_two_towers(model, config, inputs, captured, names)
    else:
        run_one_stream(model, config, inputs, captured, names, keep)
    write_reference(model, family, config, inputs, captured, names)


def run_two_towers(model, config: dict, inputs: dict, captured: dict, names: list) -> None:
    """CLIP: each tower's embedding, layers and output (the image tower's under ``pair.``), the
    contrastive logits and TencentPretrain's loss. ClrTarget keeps its logits to itself, so they are
    recomputed from the recorded towers as its forward computes them (its own pooling, projections
    and scale); the loss is its forward's."""
    from tencentpretrain.utils.misc import pooling

    def record(name, tensor):
        captured[name] = tensor.detach().clone()
        names.append(name)

    def both(stage):
        def hook(module, args_, out) -> None:  # a hook returning something would replace the output
            record(stage, out[0])
            record(f"pair.{stage}", out[1])
        return hook

    def one(name):
        def hook(module, args_, out) -> None:
            record(name, out[0] if isinstance(out, tuple) else out)
        return hook

    model.embedding.dual.register_forward_hook(both("embedding"))
    for prefix, tower in (("encoder", model.encoder.encoder_0), ("pair.encoder", model.encoder.encoder_1)):
        for i, layer in enumerate(tower.transformer):
            layer.register_forward_hook(one(f"{prefix}.layer.{i}"))
    model.encoder.register_forward_hook(both("encoder"))
    src, seg = (inputs["src"], inputs["src_image"]), (inputs["seg"], inputs["seg_image"])
    with torch.no_grad():
        loss, _ = model(src, None, seg)
        clr = model.target.clr
        features = []
        for stream, (name, projection) in enumerate((("encoder", clr.encoder_0_projection),
                                                      ("pair.encoder", clr.encoder_1_projection))):
            pooled = pooling(captured[name], seg[stream], clr.pooling_type[stream]) @ projection
            features.append(pooled / pooled.norm(dim=-1, keepdim=True))
        record("clr.logits", clr.logit_scale.exp() * features[0] @ features[1].T)
    record("clr.loss", loss.reshape(()))


def run_one_stream(model, config: dict, inputs: dict, captured: dict, names: list, keep) -> None:
    model.embedding.register_forward_hook(keep("embedding"))
    model.encoder.register_forward_hook(keep("encoder"))
    layers = getattr(model.encoder, "transformer", None)
    if isinstance(layers, torch.nn.ModuleList):
        for layer in layers:
            layer.register_forward_hook(keep("encoder.layer"))
    elif layers is not None:  # parameter_sharing: one layer, called layers_num times
        layers.register_forward_hook(keep("encoder.layer"))
    if model.decoder is not None:
        model.tgt_embedding.register_forward_hook(keep("target_embedding"))
        model.decoder.register_forward_hook(keep("decoder"))
        for layer in model.decoder.transformer_decoder:
            layer.register_forward_hook(keep("decoder.layer"))
    heads = {"mlm": "linear_2", "sp": "linear_2", "lm": "output_layer", "cls": "linear_2"}
    for target in config["target"]:
        if target in heads:
            getattr(getattr(model.target, target), heads[target]).register_forward_hook(keep(f"{target}.logits"))

    losses: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        src, seg = inputs["src"], inputs["seg"]
        targets = config["target"]
        if "bilm" in targets:
            # TencentPretrain's BilmTarget.forward calls lm() without its seg argument and fails, so the
            # reference stops at the encoder and applies the head's output layer to each direction.
            memory = model.encoder(model.embedding(src, seg), seg)
            half = config["hidden_size"] // 2
            layer = model.target.bilm.output_layer
            captured["bilm.logits"] = torch.stack([layer(memory[..., :half]), layer(memory[..., half:])], dim=2)
            names.append("bilm.logits")
        elif config.get("decoder"):
            losses["lm"] = first_of(model(src, inputs["tgt_lm"], seg, inputs["tgt_in"], inputs["tgt_seg"]))
        else:
            tgt = {"mlm": inputs.get("tgt_mlm"), "sp": inputs.get("tgt_sp"), "lm": inputs.get("tgt_lm"),
                   "cls": inputs.get("tgt_cls")}
            result = model(src, tgt if len(targets) > 1 else tgt[targets[0]], seg)
            if len(targets) > 1:
                losses.update({name: first_of(info) for name, info in result.items()})
            else:
                losses[targets[0]] = first_of(result)
    for name, loss in losses.items():
        captured[f"{name}.loss"] = loss.detach().reshape(())
        names.append(f"{name}.loss")


def write_reference(model, family: str, config: dict, inputs: dict, captured: dict, names: list) -> None:
    state = model.state_dict()
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        ident = value.data_ptr()
        if ident in first and state[first[ident]].shape == value.shape:
            aliases[key] = first[ident]
            continue
        first[ident] = key
        tensors[f"state.{key}"] = value.detach().clone().contiguous()
    tensors.update({f"input.{k}": v.contiguous() for k, v in inputs.items()})
    tensors.update({f"output.{k}": v.float().contiguous() for k, v in captured.items()})
    metadata = {"config": json.dumps(config), "aliases": json.dumps(aliases), "state_order": json.dumps(list(state)),
                "outputs": json.dumps(list(dict.fromkeys(names))), "family": family,
                "shipped_config": FAMILIES[family][0]}
    save_file(tensors, str(HERE / f"{family}.safetensors"), metadata=metadata)
    size = (HERE / f"{family}.safetensors").stat().st_size
    print(f"{family}: {len(state)} state entries ({len(aliases)} aliases), outputs {list(dict.fromkeys(names))}, "
          f"{size / 1024:.0f} KiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", type=Path, help="a checkout of TencentPretrain's repository")
    parser.add_argument("families", nargs="*", default=list(FAMILIES))
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    # TencentPretrain reads models/special_tokens_map.json relative to the working directory at import.
    os.chdir(checkout)
    sys.path.insert(0, str(checkout))
    torch.set_num_threads(1)
    for family in args.families:
        run_family(checkout, family, seed=list(FAMILIES).index(family) + 1)


if __name__ == "__main__":
    main()
