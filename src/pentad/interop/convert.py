"""``pentad convert``: Hugging Face <-> pentad run directories, TencentPretrain <-> pentad.

* ``hf-to-pentad IN OUT``: IN is a Hugging Face model directory (``config.json``, weights,
  tokenizer files); OUT becomes a pentad run directory (``config.yaml``, ``model.safetensors``,
  ``tokenizer/``) that ``pentad.runs.load_run`` and ``find_weights`` accept, plus ``interop.json``
  (where it came from, which tensors were synthesized) and, when needed,
  ``interop_extra.safetensors`` (foreign rows pentad has no slot for, kept for the way back).
* ``pentad-to-hf IN OUT``: IN is a pentad run directory; OUT is a directory that
  ``transformers.AutoModel*.from_pretrained(OUT)`` loads offline, with the tokenizer files.
* ``tencentpretrain-to-pentad IN OUT``: IN holds one ``.bin`` checkpoint, its JSON config and
  (optionally) its vocabulary file.
* ``pentad-to-tencentpretrain IN OUT``: OUT gets ``model.bin`` (``torch.save`` of TencentPretrain's
  state dict, tied tensors under every name, one storage, as TencentPretrain saves them), ``config.json`` (its
  flat JSON config) and the vocabulary file.

``verify=True`` runs both models on the same sample batch (padded rows included; encoder-decoder
models get a padded decoder batch too) and reports, per layer of each stack and per output, the
largest absolute difference, the reference's largest magnitude and their ratio; the report is not
``ok`` when a ratio exceeds ``tolerance`` (a relative tolerance: see :class:`Check`). TencentPretrain
cannot run here, so its checks are exact: the written output, read back and mapped to the other
layout, equals the input bit for bit (names, shapes, dtypes, values), and the pentad model runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import ValidationError
from safetensors.torch import load_file
from torch import Tensor

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.embeddings.speech import subsampled_lengths
from pentad.components.model_config import model_config_class
from pentad.config.loader import problems_from_validation
from pentad.config.streams import stream_embedding, stream_names
from pentad.conversions import DIRECTIONS
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import ConfigError, UserError
from pentad.interop import ctranslate2, keymap, numerics
from pentad.interop import hf as hfio
from pentad.interop.hf import sbert
from pentad.interop.hf.families import family_for
from pentad.layers.norms import norm_kind_of
from pentad.layers.pooling import pool
from pentad.layout import INTEROP, INTEROP_EXTRA, LABELS, TOKENIZER_DIR, WEIGHTS
from pentad.outputs import OutputLock, check_apart
from pentad.run_config import validate_raw
from pentad.runs import load_run, prepare_run_dir
from pentad.tencentpretrain import checkpoint as tp
from pentad.training.checkpoint import find_weights, load_weights, read_weights, weights_to_save


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


@dataclass
class ConversionReport:
    """What a conversion did: notes for the user, and with ``verify`` one :class:`Check` per row.

    ``scope``: one sentence saying what the verification compared (and what it could not)."""

    direction: str
    source: Path
    output: Path
    family: str
    architecture: str
    notes: list[str] = field(default_factory=list)
    verification: list[Check] | None = None
    tolerance: float = 1e-5
    scope: str = ""

    @property
    def ok(self) -> bool:
        return self.verification is None or all(c.passed(self.tolerance) for c in self.verification)

    def checks(self) -> dict[str, Check]:
        """The verification rows by name ({} without ``verify``)."""
        return {c.name: c for c in self.verification or []}

    def max_difference(self) -> float | None:
        """The largest absolute difference of the numeric rows (0.0 when every row is exact)."""
        if self.verification is None:
            return None
        return max((c.absolute for c in self.verification if not c.exact), default=0.0)

    def max_relative(self) -> float | None:
        """The largest relative difference (max |Δ| / max |reference|) of the numeric rows."""
        if self.verification is None:
            return None
        return max((c.relative for c in self.verification if not c.exact), default=0.0)

    def render(self) -> str:
        lines = [f"{self.direction}: {self.source} -> {self.output} ({self.family}, {self.architecture})"]
        lines += [f"  note: {n}" for n in self.notes]
        if self.verification is None:
            return "\n".join(lines)
        if self.scope:
            lines.append(f"  verification: {self.scope}")
        numeric = [c for c in self.verification if not c.exact]
        exact = [c for c in self.verification if c.exact]
        width = max((len(c.name) for c in self.verification), default=0)
        if numeric:
            lines.append(f"  outputs (relative = max |Δ| / max |reference|, tolerance {self.tolerance:g}):")
            lines.append(f"    {'':<{width}}  {'max |Δ|':>9}  {'max |ref|':>9}  {'relative':>9}")
            for c in numeric:
                flag = "ok" if c.passed(self.tolerance) else "ABOVE TOLERANCE"
                lines.append(f"    {c.name:<{width}}  {c.absolute:9.3e}  {c.scale:9.3e}  {c.relative:9.3e}  {flag}")
        if exact:
            lines.append("  exact checks:")
            for c in exact:
                result = "ok" if not c.problem else f"FAILED: {c.problem}"
                detail = f" ({c.detail})" if c.detail else ""
                lines.append(f"    {c.name}{detail}: {result}")
        failed = [c.name for c in self.verification if not c.passed(self.tolerance)]
        if not failed:
            parts = []
            if numeric:
                parts.append(f"{len(numeric)} output comparison(s) within relative tolerance {self.tolerance:g} "
                             f"(largest relative {self.max_relative():.2e}, absolute {self.max_difference():.2e})")
            if exact:
                parts.append(f"{len(exact)} exact check(s) passed")
            lines.append("  verified: yes, " + "; ".join(parts))
        else:
            lines.append(f"  verified: NO, {len(failed)} check(s) failed: {', '.join(failed)}")
        return "\n".join(lines)


def convert(direction: str, in_dir: str | Path, out_dir: str | Path, family: str | None = None,
            verify: bool = False, tolerance: float = 1e-5, allow_norm_change: bool = False) -> ConversionReport:
    """Convert the model in ``in_dir`` into ``out_dir`` (created; must not hold files yet).

    family: HF family (``bert``, ``roberta``, ``xlm-roberta``, ``gpt2``, ``albert``, ``t5``, ``bart``,
    ``pegasus``, ``llama``, ``mixtral``, ``bloom``, ``vit``, ``clip``, ``vilt``, ``speech_to_text``); by default the one
    ``config.json`` names (import) or the one recorded / guessed from the pentad config (export).
    allow_norm_change: ``pentad-to-hf`` of a model with TencentPretrain's LayerNorm
    (``layernorm_unbiased``), which Hugging Face has no equivalent of, is refused with the measured
    difference of the outputs; with this set it writes torch's LayerNorm in its place and notes
    that difference.
    """
    in_path, out_path = Path(in_dir), Path(out_dir)
    if direction not in DIRECTIONS:
        raise UserError(f"unknown conversion '{direction}'; choose one of {', '.join(DIRECTIONS)}.")
    check_apart(out_path, "OUT", [("input", in_path)])
    with OutputLock(out_path, "OUT", f"pentad convert {direction}"):  # from the checks to the last write
        return _convert(direction, in_path, out_path, family, verify, tolerance, allow_norm_change)


def _convert(direction: str, in_path: Path, out_path: Path, family: str | None, verify: bool, tolerance: float,
             allow_norm_change: bool) -> ConversionReport:
    if not in_path.exists():
        raise UserError(f"{in_path} does not exist.")
    if not math.isfinite(tolerance) or tolerance < 0:
        raise UserError(f"--tolerance must be a non-negative number, got {tolerance}.")
    if out_path.exists() and (not out_path.is_dir() or any(out_path.iterdir())):
        raise UserError(f"output directory {out_path} already exists and is not empty; choose a new one.")
    if ("tencentpretrain" in direction or "ctranslate2" in direction) and family is not None:
        raise UserError("--family applies to Hugging Face conversions; a TencentPretrain config names its modules "
                        "and pentad converts CTranslate2 Whisper models only.")
    created = not out_path.exists()
    try:
        if direction == "hf-to-pentad":
            return _hf_to_pentad(in_path, out_path, family, verify, tolerance)
        if direction == "pentad-to-hf":
            return _pentad_to_hf(in_path, out_path, family, verify, tolerance, allow_norm_change)
        if direction == "pentad-to-tencentpretrain":
            return _pentad_to_tencentpretrain(in_path, out_path, verify, tolerance)
        if direction.startswith("ctranslate2"):
            return _ctranslate2(direction, in_path, out_path, verify, tolerance)
        return _tencentpretrain_to_pentad(in_path, out_path, verify, tolerance)
    except BaseException:
        if created:  # never leave half a conversion behind
            shutil.rmtree(out_path, ignore_errors=True)
        raise


# ------------------------------------------------------------------------------------ ctranslate2
def _ctranslate2(direction: str, in_dir: Path, out_dir: Path, verify: bool, tolerance: float) -> ConversionReport:
    """A CTranslate2 Whisper model -> a HF Whisper directory, and on to a pentad run
    (``ctranslate2-to-pentad``); ``verify`` compares the pentad model with transformers' on the HF
    directory, as ``hf-to-pentad --verify`` does."""
    if direction == "ctranslate2-to-hf":
        notes = ctranslate2.whisper_to_hf(in_dir, out_dir)
        report = ConversionReport(direction, in_dir, out_dir, "whisper", "WhisperForConditionalGeneration", notes,
                                  tolerance=tolerance)
        if verify:
            with tempfile.TemporaryDirectory() as tmp:
                checked = _hf_to_pentad(out_dir, Path(tmp) / "run", None, True, tolerance)
            report.scope, report.verification = checked.scope, checked.verification
        return report
    with tempfile.TemporaryDirectory() as tmp:
        notes = ctranslate2.whisper_to_hf(in_dir, Path(tmp))
        report = _hf_to_pentad(Path(tmp), out_dir, None, verify, tolerance)
    report.direction, report.source, report.notes = direction, in_dir, notes + report.notes
    return report


# ------------------------------------------------------------------------------------ pentad runs
def expected_shapes(model_cfg: Any) -> dict[str, tuple[int, ...]]:
    """Weight name -> shape of the model a ``ModelConfig`` builds (tied aliases excluded)."""
    model = build_model(model_cfg, device="meta")
    return {k: tuple(v.shape) for k, v in weights_to_save(model).items()}


def _write_run(out_dir: Path, raw: dict[str, Any], tensors: dict[str, Tensor], extras: dict[str, Tensor],
               interop: dict[str, Any], tokenizer_cfg: dict[str, Any] | None, tokenizer_base: Path | None,
               notes: list[str], files: dict[str, Any] | None = None) -> Any:
    """Write a pentad run directory (``files``: more JSON files, name -> data); returns its RunConfig."""
    tokenizer = None
    if tokenizer_cfg is not None:
        tok_dir = (out_dir / TOKENIZER_DIR).resolve()
        loaded = load_tokenizer(tokenizer_cfg, base_dir=tokenizer_base)
        # Point the config at the run's own copy of the files, not at the source directory.
        tokenizer = load_tokenizer(loaded.save(tok_dir), base_dir=tok_dir)
        raw["tokenizer"] = tokenizer.config().model_dump(mode="json")
        if tokenizer.vocab_size != raw["model"].get("vocab_size"):
            rows = raw["model"].get("vocab_size")
            notes.append(f"the tokenizer has {tokenizer.vocab_size} ids, the embedding {rows} rows (kept as in "
                         "the checkpoint)")
    if raw.get("task") is not None:
        import pentad.tasks  # noqa: F401  (registers the task a converted classifier names)
    cfg = validate_raw(raw, {}, f"converted config for {out_dir}")
    prepare_run_dir(out_dir, cfg, tokenizer, extra=files)
    hfio.write_safetensors(out_dir / WEIGHTS, tensors, {"source": str(interop["source"].get("path", ""))})
    if extras:
        hfio.write_safetensors(out_dir / INTEROP_EXTRA, extras)
        interop["extra_weights"] = INTEROP_EXTRA
    interop["notes"] = notes
    hfio.write_json(out_dir / INTEROP, interop)
    return cfg


def _read_run(in_dir: Path) -> tuple[Any, Any, dict[str, Tensor], dict[str, Any], dict[str, Tensor]]:
    """(run config, tokenizer, weights, interop record, extra tensors) of a pentad run directory."""
    cfg, tokenizer = load_run(in_dir)
    weights_path = find_weights(in_dir)
    tensors = read_weights(weights_path)
    expected = expected_shapes(cfg.model)
    missing = sorted(k for k in expected if k not in tensors)
    unexpected = sorted(k for k in tensors if k not in expected)
    shapes = sorted(f"{k} {tuple(tensors[k].shape)} (config: {expected[k]})" for k in expected
                    if k in tensors and tuple(tensors[k].shape) != expected[k])
    if missing or unexpected or shapes:
        parts = [f"{len(v)} {what} ({', '.join(v[:5])}{', ...' if len(v) > 5 else ''})"
                 for what, v in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", shapes)) if v]
        raise UserError(f"weights {weights_path} do not match the config of {in_dir}: " + "; ".join(parts) + ".")
    interop = hfio.read_json(in_dir / INTEROP) if (in_dir / INTEROP).is_file() else {}
    extras: dict[str, Tensor] = {}
    if interop.get("extra_weights") and (in_dir / interop["extra_weights"]).is_file():
        extras = load_file(str(in_dir / interop["extra_weights"]))
    return cfg, tokenizer, tensors, interop, extras


# ----------------------------------------------------------------------------------- hf -> pentad
def _hf_to_pentad(in_dir: Path, out_dir: Path, family_name: str | None, verify: bool,
                  tolerance: float) -> ConversionReport:
    config = hfio.read_config(in_dir)
    label = str(in_dir / hfio.CONFIG)
    family = family_for(config.get("model_type"), family_name, label)
    state, weights_name = hfio.read_weights(in_dir)
    plan = family.plan_import(config, {k: tuple(v.shape) for k, v in state.items()}, label,
                              hfio.model_max_length(in_dir))
    try:
        model_cfg = model_config_class().model_validate(plan.model)
    except ValidationError as e:
        raise ConfigError(problems_from_validation(e, plan.model, model_config_class(), lambda _: label),
                          f"{label} translates to an invalid pentad model config") from None
    try:
        tensors, extras = keymap.to_pentad(state, plan.rules, expected_shapes(model_cfg),
                                           source=str(in_dir / weights_name), layout=f"Hugging Face {family.name}",
                                           synthesize=plan.synthesized)
    except UserError as e:
        guessed = hfio.guess_layout(state)
        if guessed is None or guessed == family.name:
            raise
        raise UserError(f"{e} The tensors look like a {guessed} checkpoint while {label} says "
                        f"'{config.get('model_type')}': are config.json and the weights from the same model?") from None
    notes = list(plan.notes)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_type = str(config.get("model_type", family.model_types[0]))
    tok_cfg, tok_notes = hfio.import_tokenizer(in_dir, out_dir / TOKENIZER_DIR, family, model_type)
    notes += tok_notes
    sentence, sentence_notes = sbert.read(in_dir)
    notes += sentence_notes
    interop = {"format": 1, "source": {"kind": "hf", "path": str(in_dir.resolve()), "family": family.name,
                                       "model_type": model_type, "architecture": plan.architecture},
               "synthesized": plan.synthesized, "hf_config": config}
    if sentence is not None:
        interop["sentence_transformers"] = sentence
    raw = {"description": f"converted from Hugging Face {plan.architecture} ({in_dir.resolve()})", "model": plan.model}
    files = _classifier_task(raw, config, notes, in_dir)
    image_task = family.image_task(plan.architecture)
    if image_task is not None:  # CLIP's image_text, ViLT's image_text_match
        raw["task"] = {"type": image_task[0], **_image_normalisation(in_dir, notes, default=image_task[1])}
    task, task_notes = family.task_config(config, in_dir)
    if task is not None:  # a run `pentad infer` and `finetune init=` use as it is (a task without state)
        raw["task"] = task
        notes += task_notes
        files = {**(files or {}), LABELS: {}}
    cfg = _write_run(out_dir, raw, tensors, extras, interop, tok_cfg, out_dir / TOKENIZER_DIR, notes, files)
    report = ConversionReport("hf-to-pentad", in_dir, out_dir, family.name, plan.architecture, notes,
                              tolerance=tolerance)
    if verify:
        report.scope = _hf_scope(plan.architecture, images=not family.needs_tokenizer, texts=family.name == "clip",
                                 audio=family.name == "speech_to_text")
        report.verification = verify_hf(in_dir, plan.architecture, family, config, cfg.model, tensors,
                                        set(plan.synthesized), sentence)
    return report


def _classifier_task(raw: dict[str, Any], hf_config: dict[str, Any], notes: list[str],
                     in_dir: Path | None = None) -> dict[str, Any]:
    """For a model whose only head is a classifier (``cls``) or tagger, the task and the label
    names (``labels.json``, from HF's ``id2label``) that make the converted directory a fine-tuned
    run: ``pentad infer`` predicts with it and ``pentad finetune init=DIR`` continues from it. A span
    head makes a qa run (no labels)."""
    from pentad.tasks.ner import is_chunk_tag_set

    targets = raw["model"].get("targets") or []
    if len(targets) == 1 and targets[0].get("type") == "span":
        raw["task"] = {"type": "qa"}
        notes.append(f"a qa run ({LABELS} holds no labels): `pentad infer --model OUT data.test=FILE.json --output "
                     "answers.json` predicts with it")
        return {LABELS: {}}
    if len(targets) != 1 or targets[0].get("type") not in ("cls", "tagger"):
        return {}
    n = int(targets[0]["num_labels"])
    id2label = hf_config.get("id2label")
    names = [str(i) for i in range(n)]
    labels: dict[str, Any] = {"kind": "integer", "num_labels": n}  # no names known: ids 0..n-1
    if isinstance(id2label, dict) and {str(k) for k in id2label} == {str(i) for i in range(n)}:
        given = [str(id2label.get(str(i), id2label.get(i))) for i in range(n)]  # type: ignore[call-overload]
        if len(set(given)) == n:
            names = given
            labels = {"kind": "string", "labels": names}
    task = "classification" if targets[0]["type"] == "cls" else "ner"
    parts = raw["model"].get("embedding", {}).get("parts", [])
    if any(isinstance(p, dict) and p.get("type") == "patch" for p in parts):
        task = "image_classification"
    imported = raw.get("task") if isinstance(raw.get("task"), dict) and raw["task"].get("type") == task else None
    raw["task"] = {"type": task}
    if imported is not None:  # a TencentPretrain ViT: the config import's task (normalise, augment)
        raw["task"] = imported
    elif task == "image_classification":
        raw["task"].update(pooler=bool(targets[0].get("pooler")), head_dropout=float(targets[0].get("dropout", 0.0)))
        raw["task"].update(_image_normalisation(in_dir, notes))
    if task == "ner" and not is_chunk_tag_set(names):
        raw["task"]["metric"] = "accuracy"
    article = "an" if task[0] in "aeiou" else "a"
    notes.append(f"{article} {task} run: labels {names if n <= 12 else names[:12] + ['...']} in {LABELS}; "
                 f"`pentad infer --model OUT data.test=FILE` predicts with it")
    return {LABELS: labels}


def _image_normalisation(in_dir: Path | None, notes: list[str], default: str = "half") -> dict[str, str]:
    """``task.normalise`` from a HF image processor's ``image_mean`` / ``image_std``
    (``preprocessor_config.json``), when they are a pair pentad knows; else ``default`` (ViT's
    half, CLIP's clip) and a note."""
    from pentad.data.images import NORMALISE

    path = in_dir / "preprocessor_config.json" if in_dir is not None else None
    if path is None or not path.is_file():
        what = {"half": "mean and std 0.5 (task.normalise: half, Hugging Face ViT's default)",
                "clip": "CLIP's mean and std (task.normalise: clip)"}[default]
        notes.append(f"no preprocessor_config.json: pixels are normalised with {what}")
        return {"normalise": default}
    processor = hfio.read_json(path)
    mean, std = processor.get("image_mean"), processor.get("image_std")
    for name, (want_mean, want_std) in NORMALISE.items():
        if isinstance(mean, list) and isinstance(std, list) and len(mean) == len(std) == 3 \
                and all(abs(float(a) - b) < 1e-6 for a, b in zip(mean + std, want_mean + want_std)):
            return {"normalise": name}
    notes.append(f"{path}: image_mean {mean} / image_std {std} are not one of pentad's normalisations "
                 f"({', '.join(NORMALISE)}); task.normalise is {default}: set it to match the model's training")
    return {"normalise": default}


LABEL2ID = "label2id.json"


# ----------------------------------------------------------------------------------- pentad -> hf
def guess_family(model_cfg: Any) -> str:
    """The HF family a pentad model most likely belongs to (``--family`` overrides it)."""
    parts = {p.type: p for p in model_cfg.embedding.parts}
    if "patch" in parts:
        return "vit"
    if "word_patch" in parts:
        return "vilt"
    if "speech" in parts:  # Whisper's stem has a stride-1 convolution first; S2T subsamples at every layer
        strides = parts["speech"].strides
        return "whisper" if strides and strides[0] == 1 else "speech_to_text"
    enc = model_cfg.encoder
    if getattr(model_cfg, "streams", None):
        return "clip"  # the only two-tower model Hugging Face has a class for
    positions = getattr(enc, "positions", "none")
    if model_cfg.decoder is not None:
        if positions == "relative":
            return "switch_transformers" if getattr(enc, "ffn", None) == "moe" else "t5"
        return "pegasus" if "sinusoidal" in parts else "bart"
    if getattr(enc, "mask", None) == "causal" or any(t.type == "lm" for t in model_cfg.targets):
        if positions == "rotary" and getattr(enc, "ffn", None) == "moe":
            return "qwen2_moe" if getattr(enc, "moe", None) is not None and enc.moe.shared_gate else "mixtral"
        return {"rotary": "llama", "alibi": "bloom"}.get(positions, "gpt2")
    if getattr(enc, "share_layers", False) or model_cfg.embedding_size not in (None, model_cfg.hidden_size):
        return "albert"
    seg = parts.get("seg")
    pos = parts.get("pos")
    if seg is not None and seg.num_segments == 1 and pos is not None and pos.max_positions:
        return "roberta"
    return "bert"


def _pentad_to_hf(in_dir: Path, out_dir: Path, family_name: str | None, verify: bool,
                  tolerance: float, allow_norm_change: bool = False) -> ConversionReport:
    cfg, tokenizer, tensors, interop, extras = _read_run(in_dir)
    source = interop.get("source", {}) if interop.get("source", {}).get("kind") == "hf" else {}
    notes: list[str] = []
    cfg = _hf_norms(cfg, tensors, in_dir, allow_norm_change, notes)
    if family_name is None and source:
        family_name = source.get("model_type")
    if family_name is None:
        family_name = guess_family(cfg.model)
        notes.append(f"family '{family_name}' guessed from the config (pass --family to choose)")
    family = family_for(None, family_name, str(in_dir))
    same = bool(source) and family_for(None, source.get("model_type"), str(in_dir)) is family
    synthesized = set(interop.get("synthesized", [])) if same else set()
    omittable = {k for k in synthesized if k in tensors and not tensors[k].any()}
    labels = None
    if (in_dir / LABELS).is_file():
        data = hfio.read_json(in_dir / LABELS)
        labels = [str(x) for x in data["labels"]] if data.get("kind") == "string" else None
    model_type = family_name if family_name in family.model_types else (
        source.get("model_type") if same else family.model_types[0])
    plan = family.plan_export(
        cfg.model, label=str(in_dir), model_type=model_type, base_config=interop.get("hf_config") if same else None,
        omittable=omittable, pad_id=tokenizer.pad_id if tokenizer is not None else None,
        eos_id=tokenizer.eos_id if tokenizer is not None else None, labels=labels)
    notes += plan.notes
    if plan.omit:
        notes.append(f"left out (synthesized on import, still zero): {', '.join(sorted(plan.omit))}")
    theirs = keymap.to_foreign(tensors, plan.rules, source=str(in_dir), layout=f"Hugging Face {family.name}",
                               extras=extras if same else {}, omit=plan.omit)
    out_dir.mkdir(parents=True, exist_ok=True)
    hfio.write_json(out_dir / hfio.CONFIG, plan.config)
    hfio.write_safetensors(out_dir / hfio.SAFETENSORS, theirs)
    if tokenizer is not None:
        notes += hfio.export_tokenizer(tokenizer, out_dir, family, cfg.model.max_seq_length, model_type)
    elif family.needs_tokenizer:
        notes.append("the run has no tokenizer: none exported")
    sentence = interop.get("sentence_transformers") if same else None
    if sentence:
        sbert.write(out_dir, sentence)
        notes.append("sentence-transformers files written back (modules.json and the pooling recipe)")
    report = ConversionReport("pentad-to-hf", in_dir, out_dir, family.name, plan.architecture, notes,
                              tolerance=tolerance)
    if verify:
        report.scope = _hf_scope(plan.architecture, images=not family.needs_tokenizer, texts=family.name == "clip",
                                 audio=family.name == "speech_to_text")
        report.verification = verify_hf(out_dir, plan.architecture, family, plan.config, cfg.model, tensors,
                                        set(plan.omit), sentence)
    return report


def _hf_norms(cfg: Any, tensors: dict[str, Tensor], in_dir: Path, allow: bool, notes: list[str]) -> Any:
    """Hugging Face has no TencentPretrain LayerNorm (``layernorm_unbiased``): refuse with the
    measured difference, or with ``allow`` put torch's LayerNorm in its place and note it."""
    model = cfg.model
    odd = [f"model.{name}.final_norm_kind is {stack.final_norm_kind!r} after {stack.norm!r} layers"
           for name, stack in (("encoder", model.encoder), ("decoder", model.decoder))
           if getattr(stack, "final_norm_kind", None) not in (None, getattr(stack, "norm", None))]
    odd += [f"model.{name}.final_norm_eps {stack.final_norm_eps:g} differs from layer_norm_eps "
            f"{stack.layer_norm_eps:g}" for name, stack in (("encoder", model.encoder), ("decoder", model.decoder))
            if getattr(stack, "final_norm_eps", None) not in (None, getattr(stack, "layer_norm_eps", None))]
    if odd:
        raise UserError(f"cannot export {in_dir} to Hugging Face: {'; '.join(odd)} (Hugging Face models end each "
                        "stack with a norm of its layers' kind and eps).")
    places = numerics.norm_places(model, "layernorm_unbiased")
    if not places:
        return cfg
    swapped = numerics.swap_norm_kinds(cfg.model, "layernorm_unbiased", "layernorm")
    measured = numerics.measured_difference(cfg.model, tensors, swapped, tensors, _sample_batch(cfg.model, pad=0)[0])
    what = (f"{', '.join(places)} {'is' if len(places) == 1 else 'are'} TencentPretrain's LayerNorm "
            "(layernorm_unbiased: divides by the unbiased std + eps), which Hugging Face Transformers has no "
            "equivalent of; written as torch's LayerNorm (biased variance, sqrt(var + eps)) the model's outputs "
            f"change {measured}")
    if not allow:
        raise UserError(f"cannot export {in_dir} to Hugging Face exactly: {what}. Pass --allow-norm-change to "
                        "export it anyway with that difference (pentad-to-tencentpretrain keeps the model exact).")
    notes.append(what + " (--allow-norm-change)")
    return cfg.model_copy(update={"model": swapped})


# ------------------------------------------------------------------------ tencentpretrain <-> pentad
def _tencentpretrain_to_pentad(in_dir: Path, out_dir: Path, verify: bool, tolerance: float) -> ConversionReport:
    weights_path, config_path = tp.find_files(in_dir)
    raw = hfio.read_json(config_path)
    state = tp.read_state_dict(weights_path)
    run_raw, layout, notes = tp.plan(raw, state, str(config_path), tags=(in_dir / LABEL2ID).is_file())
    try:
        model_cfg = model_config_class().model_validate(run_raw["model"])
    except ValidationError as e:
        label = str(config_path)
        raise ConfigError(problems_from_validation(e, run_raw["model"], model_config_class(), lambda _: label),
                          f"{label} translates to an invalid pentad model config") from None
    rules = tp.rules(model_cfg, layout)
    tensors, extras = keymap.to_pentad(state, rules, expected_shapes(model_cfg), source=str(weights_path),
                                       layout="TencentPretrain")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok_cfg, tok_notes = tp.find_tokenizer(in_dir, raw, out_dir / TOKENIZER_DIR)
    notes += tok_notes
    run_raw.pop("tokenizer", None)
    run_raw["description"] = f"converted from TencentPretrain {weights_path.resolve()}"
    interop = {"format": 1, "source": {"kind": "tencentpretrain", "path": str(weights_path.resolve()),
                                       "config": str(config_path.resolve()), "finetuned_classifier": layout.finetuned,
                                       "layout": layout.record(), "tencentpretrain_config": raw},
               "synthesized": []}
    files = _classifier_task(run_raw, {"id2label": _tencentpretrain_labels(in_dir)}, notes)
    cfg = _write_run(out_dir, run_raw, tensors, extras, interop, tok_cfg, None, notes, files)
    targets = "+".join(t.type for t in cfg.model.targets)
    report = ConversionReport("tencentpretrain-to-pentad", in_dir, out_dir, "tencentpretrain", targets, notes,
                              tolerance=tolerance)
    if verify:
        report.scope = ("TencentPretrain's code does not run here, so its outputs are not compared: the written run "
                        "directory is read back (config and weights), mapped to TencentPretrain's layout and compared "
                        "bitwise with the input checkpoint, and the pentad model is run")
        written_cfg, _, written, written_interop, written_extras = _read_run(out_dir)
        written_layout = tp.Layout.from_record(written_interop.get("source", {}).get("layout"))
        back = tp.to_tencentpretrain(written_cfg.model, written, written_extras, layout=written_layout,
                                     source=str(out_dir))
        tied = sum(r.transform == "tied" for r in tp.rules(written_cfg.model, written_layout))
        report.verification = bitwise_checks(state, back, "the input checkpoint", tied) + \
            [_finite_forward(written_cfg.model, written)]
    return report


def _tencentpretrain_labels(in_dir: Path) -> dict[str, str] | None:
    """id -> label from the ``label2id.json`` next to a TencentPretrain checkpoint (run_ner.py's
    ``--label2id_path`` file), when there is one."""
    path = in_dir / LABEL2ID
    if not path.is_file():
        return None
    data = hfio.read_json(path)
    if not all(isinstance(v, int) for v in data.values()):
        raise UserError(f"{path}: expected {{label: id}} with integer ids, found {str(data)[:80]!r}.")
    return {str(i): label for label, i in data.items()}


def _pentad_to_tencentpretrain(in_dir: Path, out_dir: Path, verify: bool, tolerance: float) -> ConversionReport:
    cfg, tokenizer, tensors, interop, extras = _read_run(in_dir)
    source = interop.get("source", {})
    same = source.get("kind") == "tencentpretrain"
    layout = tp.Layout.from_record(source.get("layout") if same else None)
    notes: list[str] = []
    state = tp.to_tencentpretrain(cfg.model, tensors, extras if same else {}, layout=layout, source=str(in_dir))
    base = source.get("tencentpretrain_config") if same else None
    objective = getattr(getattr(getattr(cfg, "data", None), "objective", None), "type", None)
    config, config_notes = tp.export_config(cfg.model, label=str(in_dir), base=base, objective=objective)
    notes += config_notes
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        extra_config, tok_notes = tp.export_tokenizer(tokenizer, out_dir)
        config.update(extra_config)
        notes += tok_notes
    else:
        notes.append("the run has no tokenizer: no vocabulary file written")
    hfio.write_json(out_dir / tp.CONFIG_NAME, config)
    tp.write_state_dict(out_dir / tp.WEIGHTS_NAME, state)
    if (in_dir / LABELS).is_file():
        data = hfio.read_json(in_dir / LABELS)
        if data.get("kind") == "string":
            hfio.write_json(out_dir / LABEL2ID, {name: i for i, name in enumerate(data["labels"])})
            notes.append(f"{LABEL2ID} written from the run's label names (run_ner.py's --label2id_path)")
    report = ConversionReport("pentad-to-tencentpretrain", in_dir, out_dir, "tencentpretrain",
                              "+".join(t.type for t in cfg.model.targets), notes, tolerance=tolerance)
    written = tp.read_state_dict(out_dir / tp.WEIGHTS_NAME)
    run_raw, back_layout, _ = tp.plan(hfio.read_json(out_dir / tp.CONFIG_NAME), written, str(out_dir),
                                      tags=(out_dir / LABEL2ID).is_file())
    back_cfg = model_config_class().model_validate(run_raw["model"])
    differences = model_differences(cfg.model, back_cfg)
    if differences:
        back, _ = keymap.to_pentad(written, tp.rules(back_cfg, back_layout), expected_shapes(back_cfg),
                                   source=str(out_dir / tp.WEIGHTS_NAME), layout="TencentPretrain")
        measured = numerics.measured_difference(cfg.model, tensors, back_cfg, back, _sample_batch(cfg.model, pad=0)[0])
        notes.append("TencentPretrain builds this config slightly differently (" + "; ".join(differences)
                     + f"): the weights are exact, the outputs differ {measured}")
    if verify:
        report.scope = ("TencentPretrain's code does not run here, so its outputs are not compared: the written "
                        "model.bin and config.json are read back as a TencentPretrain checkpoint and compared bitwise "
                        "with the run's weights, and tied tensors must be stored once")
        back, _ = keymap.to_pentad(written, tp.rules(back_cfg, back_layout), expected_shapes(back_cfg),
                                   source=str(out_dir / tp.WEIGHTS_NAME), layout="TencentPretrain")
        report.verification = bitwise_checks(tensors, _two_segment_rows(back, tensors), "the run's weights")
        report.verification.append(_shared_storage_check(written, tp.tied_names(tp.rules(back_cfg, back_layout))))
    return report


def _shared_storage_check(state: dict[str, Tensor], tied: list[tuple[str, str]]) -> Check:
    """An exact check that each tied name shares its tensor's storage in a file read back with
    ``weights_only=True`` (so the file holds it once, as TencentPretrain's own files do)."""
    apart = [f"{name} (of {source})" for name, source in tied
             if name in state and source in state
             and state[name].untyped_storage().data_ptr() != state[source].untyped_storage().data_ptr()]
    return Check("tied tensors stored once", exact=True,
                 detail=f"{len(tied)} tied name(s) share their tensor's storage" if tied else "no tied tensors",
                 problem=f"{len(apart)} written as separate copies: {_shown_keys(apart)}" if apart else "")


def _two_segment_rows(back: dict[str, Tensor], ours: dict[str, Tensor]) -> dict[str, Tensor]:
    """A pentad model with segment rows (A, B) comes back from TencentPretrain with (A, B, pad)."""
    out = dict(back)
    for key, tensor in ours.items():
        if key.endswith("seg.weight") and key in out and out[key].shape[0] == tensor.shape[0] + 1:
            out[key] = out[key][:-1]
    return out


def model_differences(ours: Any, theirs: Any) -> list[str]:
    """What differs between the models two configs build: parameter shapes, and the options that
    change the computation without changing a shape (norm eps, scales, position schemes...)."""
    a, b = _model_facts(ours), _model_facts(theirs)
    found = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        if key.endswith("seg.weight") and a.get(key) and b.get(key) and a[key][0] + 1 == b[key][0]:
            continue  # TencentPretrain's padding row (see _two_segment_rows)
        found.append(f"{key} {b.get(key)} instead of {a.get(key)}")
    return found


def _model_facts(model_cfg: Any) -> dict[str, Any]:
    facts: dict[str, Any] = dict(expected_shapes(model_cfg))
    model = build_model(model_cfg, device="meta")
    for name, module in model.named_modules():
        for attr in ("mask_kind", "position_kind", "rotary_base", "rotary_dim", "pre_norm", "hidden_scale", "scale",
                     "eps", "residual_attention", "num_layers", "num_kv_heads", "head_size", "num_buckets",
                     "max_distance", "bidirectional", "pooling"):
            value = getattr(module, attr, None)
            if isinstance(value, (int, float, str, bool)):
                facts[f"{name}.{attr}"] = value
        if norm_kind_of(module) is not None:
            facts[f"{name}.kind"] = norm_kind_of(module)
        if isinstance(getattr(module, "layout", None), dict):  # the sinusoidal table's
            facts[f"{name}.layout"] = dict(module.layout)
    return facts


def _finite_forward(model_cfg: Any, tensors: dict[str, Tensor]) -> Check:
    name = "pentad forward pass is finite"
    model = _pentad_model(model_cfg, tensors)
    batch, _ = _sample_batch(model_cfg, pad=0)
    with torch.no_grad():
        hidden, mask = model.encode(batch)
        stacks = "embedding and encoder"
        if model.decoder is not None:
            hidden = model.decode(batch, hidden, mask)
            stacks += " and decoder"
    bad = int((~torch.isfinite(hidden)).sum())
    if model.stream_plan is not None:  # two streams: the second over its own seeded batch, both pooled
        view = tp.streams(model_cfg)[1][0]
        batch = dataclasses.replace(batch, pair=_sample_batch(view, pad=0)[0])
        with torch.no_grad():
            pooled = model.encode_pair(batch)
        bad += int((~torch.isfinite(pooled.first)).sum()) + int((~torch.isfinite(pooled.second)).sum())
        stacks = "both streams' embeddings and encoders, pooled"
        second = batch.pair
        rows = (f"{batch.tokens.shape[0]} rows, two padded, and " if batch.tokens is not None else "") + \
            (f"{second.pixels.shape[0]} images" if second.pixels is not None else f"{second.tokens.shape[0]} rows")
        return Check(name, exact=True, detail=f"{stacks} on a seeded batch of {rows}",
                     problem=f"{bad} non-finite values in the last hidden states" if bad else "")
    rows = (f"{batch.tokens.shape[0]} captions, two padded, each followed by an image"
            if batch.pixels is not None and batch.tokens is not None
            else f"{batch.pixels.shape[0]} images" if batch.pixels is not None
            else f"{batch.audio.shape[0]} utterances, two padded" if batch.audio is not None
            else f"{batch.tokens.shape[0]} rows, two padded")
    return Check(name, exact=True, detail=f"{stacks} on a seeded batch of {rows}",
                 problem=f"{bad} non-finite values in the last hidden state" if bad else "")


def _bits(t: Tensor) -> Tensor:
    """The bytes of a tensor (NaN payloads and the sign of zero included)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _shown_keys(keys: list[str], limit: int = 4) -> str:
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def bitwise_checks(reference: dict[str, Tensor], candidate: dict[str, Tensor], what: str,
                   tied: int = 0) -> list[Check]:
    """Exact checks that ``candidate`` is ``reference`` bit for bit: the same keys, then per key the
    same shape, dtype and bytes (``tied``: how many of the keys are tied copies of another)."""
    missing = sorted(set(reference) - set(candidate))
    extra = sorted(set(candidate) - set(reference))
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing ({_shown_keys(missing)})")
    if extra:
        problems.append(f"{len(extra)} not in {what} ({_shown_keys(extra)})")
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
              problem=f"{len(shapes)} differ: {_shown_keys(shapes)}" if shapes else ""),
        Check("same dtypes", exact=True, detail=f"{len(common)} tensors",
              problem=f"{len(dtypes)} differ: {_shown_keys(dtypes)}" if dtypes else ""),
        Check("bitwise-identical values", exact=True, detail=f"{len(common)} tensors{copies}",
              problem=f"{len(differ)} differ: {_shown_keys(differ)}" if differ else ""),
    ]


# ------------------------------------------------------------------------------------ verification
def _pentad_model(model_cfg: Any, tensors: dict[str, Tensor]) -> Any:
    model = build_model(model_cfg)
    load_weights(model, tensors, "converted weights")
    return model.float().eval()


def _sample_batch(model_cfg: Any, pad: int, seq: int = 12, batch: int = 3,
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


def _hf_scope(architecture: str, images: bool = False, texts: bool = False, audio: bool = False) -> str:
    batch = "one seeded batch of images" if images else "one seeded batch with padded rows"
    if audio:
        batch = "one seeded batch of feature frames with rows padded by zero frames (and padded decoder rows)"
    if texts:  # CLIP: texts and images
        batch = "one seeded batch of images and of texts ending with the end-of-text token, two padded after it"
    return (f"transformers' {architecture} and the pentad model run in fp32 on {batch}; "
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
    ours = _pentad_model(model_cfg, tensors)
    if family.name == "clip":
        return _verify_clip(hf, ours, model_cfg, hf_config)
    batch, inputs = _sample_batch(model_cfg, pad=family.pad_token_id(hf_config), family=family)
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


def _verify_clip(hf: Any, ours: Any, model_cfg: Any, hf_config: dict[str, Any]) -> list[Check]:
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


def read_interop(run_dir: Path) -> dict[str, Any]:
    """The ``interop.json`` record of a converted run directory ({} when there is none)."""
    path = Path(run_dir) / INTEROP
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
