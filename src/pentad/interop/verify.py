"""``--verify``: a converted model run against its source, one :class:`Check` per compared output.

Hugging Face: :func:`verify_hf` runs transformers' model of the converted (or exported) directory and
the pentad model on one seeded batch (:func:`sample_batch`: padded rows included; encoder-decoder
models get a padded decoder batch too) and compares, per layer of each stack and per output, the
largest absolute difference with the reference's largest magnitude; what a family's models need
beyond that (segments, a shuffled image, fixed-length audio, two towers) is declared on its
:class:`~pentad.interop.hf.HFFamily`. TencentPretrain and other sources that cannot run here are
checked exactly: :func:`bitwise_checks` compares two state dicts bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.embeddings.speech import subsampled_lengths
from pentad.components.stream import stream_embedding, stream_names
from pentad.errors import UserError
from pentad.interop import hf as hfio
from pentad.layers.pooling import pool
from pentad.training.checkpoint import load_weights


@dataclass(frozen=True)
class Check:
    """One row of a ``--verify`` report.

    A *numeric* check compares an output of the converted model with the reference's:
    ``absolute`` is max |Δ| over the compared positions and ``scale`` max |reference| there; it
    passes when ``relative`` = absolute / scale is within the tolerance. Floating-point error in a
    layer's output grows with the size of the values it sums, and the largest values of a tensor set
    that size, so the error of every element is measured against the tensor's largest magnitude:
    an absolute tolerance fails exact conversions of models with large logits, and an element-wise
    relative one fails near-zero elements that carry the rounding of their large neighbours.

    An *exact* check (``exact=True``) passes only when ``problem`` is empty: bitwise comparisons of
    weights (keys, shapes, dtypes, values), finiteness. ``detail`` says what was compared.
    """

    name: str
    absolute: float = 0.0
    scale: float = 0.0
    exact: bool = False
    problem: str = ""
    detail: str = ""

    @property
    def relative(self) -> float:
        if self.absolute == 0.0:
            return 0.0
        if not math.isfinite(self.absolute) or self.scale == 0.0 or not math.isfinite(self.scale):
            return math.inf
        return self.absolute / self.scale

    def passed(self, tolerance: float) -> bool:
        if self.exact:
            return not self.problem
        return self.relative <= tolerance



def _bits(t: Tensor) -> Tensor:
    """The bytes of a tensor (NaN payloads and the sign of zero included)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def shown_keys(keys: list[str], limit: int = 4) -> str:
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def bitwise_checks(reference: dict[str, Tensor], candidate: dict[str, Tensor], what: str,
                   tied: int = 0) -> list[Check]:
    """Exact checks that ``candidate`` is ``reference`` bit for bit: the same keys, then per key the
    same shape, dtype and bytes (``tied``: how many of the keys are tied copies of another)."""
    missing = sorted(set(reference) - set(candidate))
    extra = sorted(set(candidate) - set(reference))
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing ({shown_keys(missing)})")
    if extra:
        problems.append(f"{len(extra)} not in {what} ({shown_keys(extra)})")
    common = [k for k in reference if k in candidate]
    shapes = [f"{k} {tuple(candidate[k].shape)} instead of {tuple(reference[k].shape)}" for k in common
              if candidate[k].shape != reference[k].shape]
    dtypes = [f"{k} {candidate[k].dtype} instead of {reference[k].dtype}" for k in common
              if candidate[k].dtype != reference[k].dtype]
    differ = []
    for k in common:
        a, b = reference[k], candidate[k]
        if a.shape == b.shape and a.dtype == b.dtype and not torch.equal(_bits(a), _bits(b)):
            gap = float((a.double() - b.double()).abs().max()) if a.is_floating_point() else math.nan
            differ.append(f"{k} (max |Δ| {gap:.3e})")
    copies = f", {tied} tied cop{'y' if tied == 1 else 'ies'} among them" if tied else ""
    return [
        Check("same tensor names", exact=True, detail=f"{len(reference)} names of {what}",
              problem="; ".join(problems)),
        Check("same shapes", exact=True, detail=f"{len(common)} tensors",
              problem=f"{len(shapes)} differ: {shown_keys(shapes)}" if shapes else ""),
        Check("same dtypes", exact=True, detail=f"{len(common)} tensors",
              problem=f"{len(dtypes)} differ: {shown_keys(dtypes)}" if dtypes else ""),
        Check("bitwise-identical values", exact=True, detail=f"{len(common)} tensors{copies}",
              problem=f"{len(differ)} differ: {shown_keys(differ)}" if differ else ""),
    ]



def pentad_model(model_cfg: Any, tensors: dict[str, Tensor]) -> Any:
    model = build_model(model_cfg)
    load_weights(model, tensors, "converted weights")
    return model.float().eval()


def sample_batch(model_cfg: Any, pad: int, seq: int = 12, batch: int = 3,
                  family: hfio.HFFamily | None = None) -> tuple[Any, dict[str, Tensor]]:
    """A seeded batch with two right-padded rows and segments A/B where the model has two segments;
    an encoder-decoder model also gets decoder tokens, two of three rows right-padded; an image
    model (a ``patch`` part) gets seeded pixels instead, a speech model (a ``speech`` part) seeded
    features: rows of three lengths with their padding mask, padded with zero frames as feature extractors
    pad (Speech2Text's convolutions read the padding, pentad's read zeros), or, where the family always
    reads the same number of frames (Whisper), as many as its positions take and no mask.

    Returns (pentad Batch, HF keyword inputs without the model-specific ones)."""
    parts = {p.type: p for p in model_cfg.embedding.parts}
    g = torch.Generator().manual_seed(0)
    if "patch" in parts:  # an image model: seeded normalised pixels, no padding
        patch = parts["patch"]
        pixels = torch.randn(batch, patch.channels, *patch.image_size, generator=g)
        return Batch(pixels=pixels), {"pixel_values": pixels}
    positions = model_cfg.max_seq_length
    for part in parts.values():
        if getattr(part, "max_positions", None):
            positions = min(positions, part.max_positions)
    seq = max(2, min(seq, positions))
    if "speech" in parts:
        speech = parts["speech"]
        shrink = math.prod(speech.strides or [2] * len(speech.kernel_sizes))
        fixed = family is not None and not family.speech_padding
        frames = positions * shrink if fixed else min(positions * shrink, 12 * shrink)
        audio = torch.randn(batch, frames, speech.feature_size, generator=g)
        lengths = [frames, frames - 3 * shrink + 1, frames // 2][:batch]
        padding = None if fixed else torch.arange(frames)[None, :] >= torch.tensor(lengths)[:, None]
        if padding is not None:
            audio[padding] = 0.0
        out = Batch(audio=audio, audio_padding_mask=padding)
        hf_inputs = (family or hfio.HFFamily()).speech_inputs(audio, padding)
        _add_decoder_tokens(out, hf_inputs, model_cfg, pad, batch, g)
        return out, hf_inputs

    image = parts["word_patch"].patch if "word_patch" in parts else None
    if image is not None:  # ViLT: the caption, then the image's CLS and patches, within the positions
        image_length = int(image.cls) + (image.image_size[0] // image.patch_size) * (image.image_size[1] //
                                                                                     image.patch_size)
        seq = max(2, min(seq, positions - image_length))
    lengths = [seq, max(1, seq - 3), max(1, seq // 2)]
    tokens, padding = _sample_rows(seq, int(model_cfg.vocab_size), lengths, pad, batch, g)
    segments = None
    if image is not None:
        pixels = torch.randn(batch, image.channels, *image.image_size, generator=g)
        # segment 0 over the caption, 1 over the image (as pentad's image_text_match data gives them)
        segments = torch.cat([torch.zeros(batch, seq), torch.ones(batch, image_length)], 1).long() \
            if "seg" in parts else None
        return Batch(tokens=tokens, segments=segments, padding_mask=padding, pixels=pixels), \
            {"input_ids": tokens, "attention_mask": (~padding).long(), "pixel_values": pixels}
    if "seg" in parts:
        two = parts["seg"].num_segments >= 2
        index = torch.arange(seq)[None, :]
        segments = ((index >= (torch.tensor(lengths[:batch])[:, None] // 2)) & ~padding & two).long()
    hf_inputs = {"input_ids": tokens, "attention_mask": (~padding).long()}
    if segments is not None:
        hf_inputs["token_type_ids"] = segments
    out = Batch(tokens=tokens, segments=segments, padding_mask=padding)
    _add_decoder_tokens(out, hf_inputs, model_cfg, pad, batch, g)
    return out, hf_inputs


def _sample_rows(length: int, vocab: int, lengths: list[int], pad: int, batch: int,
                 g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Seeded token rows [batch, length] padded after ``lengths`` (real tokens never equal ``pad``:
    RoBERTa derives positions from it) and their padding mask."""
    tokens = torch.randint(0, vocab, (batch, length), generator=g)
    if vocab > 1:
        tokens = torch.where(tokens == pad, (tokens + 1) % vocab, tokens)
    padding = torch.arange(length)[None, :] >= torch.tensor(lengths[:batch])[:, None]
    tokens[padding] = pad
    return tokens, padding


def _add_decoder_tokens(out: Batch, hf_inputs: dict[str, Tensor], model_cfg: Any, pad: int, batch: int,
                        g: torch.Generator) -> None:
    """An encoder-decoder's seeded decoder tokens, two of three rows right-padded (nothing otherwise)."""
    if model_cfg.decoder is None:
        return
    target_positions = model_cfg.max_seq_length
    for part in model_cfg.target_embedding.parts:
        if getattr(part, "max_positions", None):
            target_positions = min(target_positions, part.max_positions)
    length = max(2, min(7, target_positions))
    vocab = int(model_cfg.target_vocab_size or model_cfg.vocab_size)
    decoder_tokens, decoder_padding = _sample_rows(length, vocab, [length, max(1, length - 2), max(1, length // 2)],
                                                   pad, batch, g)
    out.decoder_tokens, out.decoder_padding_mask = decoder_tokens, decoder_padding
    hf_inputs["decoder_input_ids"] = decoder_tokens
    hf_inputs["decoder_attention_mask"] = (~decoder_padding).long()


def speech_padding_mask(model_cfg: Any, batch: Batch) -> Tensor | None:
    """[B, T'] True at the padding positions of a speech model's encoder (its ``speech`` part's
    subsampled frame counts); None for a batch without a frame padding mask."""
    frames = batch.audio_padding_mask
    if frames is None:
        return None
    speech = next(p for p in model_cfg.embedding.parts if p.type == "speech")
    lengths = subsampled_lengths((~frames).sum(dim=1), speech.kernel_sizes, speech.strides)
    total = int(subsampled_lengths(torch.tensor(frames.shape[1]), speech.kernel_sizes, speech.strides))
    return torch.arange(total)[None, :] >= lengths[:, None]


def _compare(name: str, ours: Tensor, reference: Tensor, keep: Tensor | None = None) -> Check:
    """A numeric :class:`Check` of ``ours`` against ``reference`` at the positions ``keep`` selects."""
    if tuple(ours.shape) != tuple(reference.shape):
        return Check(name, math.inf, math.inf,
                     problem=f"shape {tuple(ours.shape)} instead of {tuple(reference.shape)}")
    if keep is not None:
        ours, reference = ours[keep], reference[keep]
    if not ours.numel():
        return Check(name)
    ours, reference = ours.double(), reference.double()
    return Check(name, float((ours - reference).abs().max()), float(reference.abs().max()))


def _capture(stack_input: Any, layers: Any, captured: list[Tensor]) -> list[Any]:
    """Forward hooks that append the embedding slot's output and each layer call's output (a
    shared layer is called, and captured, once per use)."""
    hooks = [stack_input.register_forward_hook(lambda m, i, o: captured.append(o.hidden))]
    for layer in {id(layer): layer for layer in layers}.values():
        hooks.append(layer.register_forward_hook(lambda m, i, o: captured.append(o[0])))
    return hooks


def hf_scope(architecture: str, family: hfio.HFFamily) -> str:
    """The sentence of a report saying what :func:`verify_hf` compares for ``family``."""
    return (f"transformers' {architecture} and the pentad model run in fp32 on {family.verify_batch}; "
            "the embeddings, every layer's output and every head's output are compared at real positions")


def verify_hf(hf_dir: Path, architecture: str, family: hfio.HFFamily, hf_config: dict[str, Any], model_cfg: Any,
              tensors: dict[str, Tensor], synthesized: set[str],
              sentence: dict[str, Any] | None = None) -> list[Check]:
    """Run the HF model in ``hf_dir`` and the pentad model on one batch; one :class:`Check` (max |Δ|
    and max |reference|) per layer of each stack (encoder; decoder for encoder-decoder models) and
    per output.

    Only real (non-padding) positions are compared: padding positions hold meaningless values
    that differ between the libraries by design. ``sentence``: a sentence-transformers pooling
    recipe, whose pooled embeddings are compared too.
    """
    try:
        import transformers
    except ImportError:
        raise UserError("--verify needs the transformers package (pip install 'pentad[hf]').") from None
    hf_cls = getattr(transformers, architecture, None)
    if hf_cls is None:
        raise UserError(f"--verify: this transformers version has no {architecture} class.")
    hf = hf_cls.from_pretrained(str(hf_dir), local_files_only=True, dtype=torch.float32).eval()
    ours = pentad_model(model_cfg, tensors)
    if family.two_towers:
        return _verify_towers(hf, ours, model_cfg, hf_config)
    batch, inputs = sample_batch(model_cfg, pad=family.pad_token_id(hf_config), family=family)
    if not family.token_types:
        inputs.pop("token_type_ids", None)
    encoder_decoder = ours.decoder is not None
    keep = ~batch.padding_mask if batch.padding_mask is not None else None
    if batch.audio_padding_mask is not None:  # real positions after the speech part's subsampling
        keep = ~speech_padding_mask(model_cfg, batch)
    stacks = [("encoder", ours.embedding, ours.encoder, keep)]
    if encoder_decoder:
        stacks.append(("decoder", ours.target_embedding, ours.decoder, ~batch.decoder_padding_mask))
    captured: dict[str, list[Tensor]] = {name: [] for name, *_ in stacks}
    hooks = [h for name, slot, stack, _ in stacks for h in _capture(slot, stack.layers, captured[name])]
    try:
        with torch.no_grad():
            reference = hf(**inputs, output_hidden_states=True)
            hidden, padding = ours.encode(batch)
            finals = {"encoder": hidden}
            if encoder_decoder:
                hidden = finals["decoder"] = ours.decode(batch, hidden, padding)
            outputs = {name: target(hidden, batch) for name, target in ours.targets.items()}
    finally:
        for hook in hooks:
            hook.remove()
    # ViLT: HF shuffles the image's positions, so its states are compared over the caption only.
    text = batch.tokens.shape[1] if family.shuffles_image_positions and batch.tokens is not None else None

    def cut(tensor: Tensor) -> Tensor:
        return tensor[:, :text] if text is not None and tensor.dim() == 3 else tensor

    rows: list[Check] = []
    for name, _, stack, keep in stacks:
        states = reference.hidden_states if not encoder_decoder else getattr(reference, f"{name}_hidden_states")
        layers = stack.num_layers
        if states is None or len(states) != layers + 1 or len(captured[name]) != layers + 1:
            raise UserError(f"--verify: {architecture} returned {len(states or ())} {name} hidden states for "
                            f"{layers} layers.")
        prefix = f"{name} " if encoder_decoder else ""
        for i, state in enumerate(states):
            label = "embeddings" if i == 0 else f"layer {i}"
            ours_state = captured[name][i]
            if i == layers and not family.states_before_final_norm:
                # HF's last hidden state is after the final norm (GPT-2's ln_f)
                ours_state = finals[name]
                label += " + final norm" if stack.final_norm is not None else ""
            rows.append(_compare(prefix + label, cut(ours_state), cut(state), keep))
        if family.states_before_final_norm and getattr(reference, "last_hidden_state", None) is not None:
            rows.append(_compare(prefix + "final norm", cut(finals[name]), cut(reference.last_hidden_state), keep))
    fields = family.outputs(architecture)
    head_keep = stacks[-1][3]
    for target in model_cfg.targets:
        name = target.target_name
        if target.type in fields and getattr(reference, fields[target.type], None) is not None:
            logits = outputs[name].logits
            theirs = getattr(reference, fields[target.type])
            rows.append(_compare(f"{name} logits", cut(logits), cut(theirs), head_keep if logits.dim() == 3 else None))
        for column, part in ((0, "start"), (1, "end")):
            field = fields.get(f"{target.type}:{part}")
            if field and getattr(reference, field, None) is not None:  # span heads: start and end scores
                rows.append(_compare(f"{name} {part} logits", outputs[name].logits[..., column],
                                     getattr(reference, field), head_keep))
        pooled_field = fields.get(f"{target.type}:pooled")
        if pooled_field and getattr(reference, pooled_field, None) is not None \
                and f"targets.{name}.pooler.weight" not in synthesized \
                and getattr(ours.targets[name], "pooler", None) is not None:
            with torch.no_grad():
                pooled = ours.targets[name].pooler(finals["encoder"][:, 0]).tanh()
            rows.append(_compare(f"{name} pooler output", pooled, getattr(reference, pooled_field)))
    if sentence and sentence.get("pooling") and not encoder_decoder:
        kind = sentence["pooling"]
        states = reference.hidden_states[-1]
        with torch.no_grad():
            mine, theirs = pool(finals["encoder"], batch.padding_mask, kind), pool(states, batch.padding_mask, kind)
            if sentence.get("normalize"):
                mine, theirs = F.normalize(mine, dim=-1), F.normalize(theirs, dim=-1)
        normalised = ", normalised" if sentence.get("normalize") else ""
        rows.append(_compare(f"sentence embedding ({kind} pooling{normalised})", mine, theirs))
    return rows


def clip_sample(model_cfg: Any, hf_config: dict[str, Any], batch: int = 3) -> tuple[Batch, dict[str, Tensor]]:
    """A seeded text + image batch for a CLIP model: texts of three lengths that end with the
    end-of-text token, padded after it (where pentad's last real token and Hugging Face's pooled
    end-of-text token are the same position), and seeded pixels. Returns (pentad Batch, HF inputs)."""
    text = hf_config.get("text_config") or {}
    vocab = int(model_cfg.vocab_size)
    eos = text.get("eos_token_id", vocab - 1)
    # the legacy eos_token_id 2: HF pools at the row's largest id, which is CLIP's end-of-text (the last id)
    end = vocab - 1 if eos == 2 or not isinstance(eos, int) else eos
    pad = text.get("pad_token_id", 1)
    pad = pad if isinstance(pad, int) and pad != end else (end + 1) % vocab
    g = torch.Generator().manual_seed(0)
    seq = max(2, min(12, model_cfg.max_seq_length))
    lengths = [seq, max(2, seq - 3), max(2, seq // 2)][:batch]
    # real tokens are neither the end token nor padding (and, with the legacy id, below the end token)
    allowed = torch.tensor([i for i in range(vocab) if i not in (end, pad) and (eos != 2 or i < end)])
    tokens = allowed[torch.randint(0, len(allowed), (batch, seq), generator=g)]
    padding = torch.arange(seq)[None, :] >= torch.tensor(lengths)[:, None]
    tokens[torch.arange(batch), torch.tensor(lengths) - 1] = end
    tokens[padding] = pad
    parts = {p.type: p for p in stream_embedding(model_cfg, stream_names(model_cfg)[1]).parts}
    patch = parts["patch"]
    pixels = torch.randn(batch, patch.channels, *patch.image_size, generator=g)
    out = Batch(tokens=tokens, padding_mask=padding, pair=Batch(pixels=pixels))
    return out, {"input_ids": tokens, "attention_mask": (~padding).long(), "pixel_values": pixels}


def _verify_towers(hf: Any, ours: Any, model_cfg: Any, hf_config: dict[str, Any]) -> list[Check]:
    """CLIPModel against the pentad two-stream model: the embeddings and every layer of both towers, each
    tower's pooled output (after its final norm), the normalised projected features and the logits."""
    batch, inputs = clip_sample(model_cfg, hf_config)
    text_states: list[Tensor] = []
    image_states: list[Tensor] = []
    hooks = _capture(ours.embedding, ours.encoder.layers, text_states)
    image_embedding, image_encoder = ours.stream_slots(1)
    hooks += _capture(image_embedding, image_encoder.layers, image_states)
    try:
        with torch.no_grad():
            reference = hf(**inputs, output_hidden_states=True)
            pooled = ours.encode_pair(batch)
            target = next(iter(ours.targets.values()))
            text, image = target.features(pooled)
            logits = target(pooled, batch).logits
    finally:
        for hook in hooks:
            hook.remove()
    keep = ~batch.padding_mask
    rows: list[Check] = []
    for tower, mine, theirs, mask in (("text", text_states, reference.text_model_output.hidden_states, keep),
                                      ("image", image_states, reference.vision_model_output.hidden_states, None)):
        if len(mine) != len(theirs):
            raise UserError(f"--verify: CLIPModel returned {len(theirs)} {tower} hidden states, pentad {len(mine)}.")
        for i, (a, b) in enumerate(zip(mine, theirs)):
            rows.append(_compare(f"{tower} {'embeddings' if i == 0 else f'layer {i}'}", a, b, mask))
    for tower, mine, projection, theirs in (
            ("text", pooled.first, target.projection_0, reference.text_model_output.pooler_output),
            ("image", pooled.second, target.projection_1, reference.vision_model_output.pooler_output)):
        what = "end token" if tower == "text" else "CLS"
        if theirs.shape[-1] != mine.shape[-1]:  # transformers 5 projects the towers' pooler_output in place
            with torch.no_grad():
                mine = projection(mine)
            what += ", projected"
        rows.append(_compare(f"{tower} pooled (final norm, {what})", mine, theirs))
    rows += [_compare("text features", text, reference.text_embeds),
             _compare("image features", image, reference.image_embeds),
             _compare("logits per image", logits.T, reference.logits_per_image)]
    return rows

