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

``verify=True`` checks the result (:mod:`pentad.interop.verify`): a Hugging Face conversion runs both
models on the same sample batch and reports, per layer of each stack and per output, the largest
absolute difference, the reference's largest magnitude and their ratio; the report is not ``ok`` when
a ratio exceeds ``tolerance`` (a relative tolerance: see :class:`~pentad.interop.verify.Check`).
TencentPretrain cannot run here, so its checks are exact: the written output, read back and mapped
to the other layout, equals the input bit for bit (names, shapes, dtypes, values), and the pentad
model runs.
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
from pydantic import ValidationError
from safetensors.torch import load_file
from torch import Tensor

from pentad.builder import build_model
from pentad.components.model_config import model_config_class
from pentad.components.norms import norm_kind_of
from pentad.config.loader import problems_from_validation
from pentad.conversions import DIRECTIONS
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import ConfigError, UserError
from pentad.interop import ctranslate2, keymap, numerics
from pentad.interop import hf as hfio
from pentad.interop.hf import sbert
from pentad.interop.hf.families import family_for, guess_family, guess_layout
from pentad.interop.verify import Check, bitwise_checks, hf_scope, pentad_model, sample_batch, shown_keys, verify_hf
from pentad.layout import INTEROP, INTEROP_EXTRA, LABELS, TOKENIZER_DIR, WEIGHTS
from pentad.outputs import OutputLock, check_apart
from pentad.run_config import validate_raw
from pentad.runs import load_run, prepare_run_dir
from pentad.tencentpretrain import checkpoint as tp
from pentad.training.checkpoint import find_weights, read_weights, weights_to_save


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
        guessed = guess_layout(state)
        if guessed is None or family_for(None, guessed, label).layout == family.layout:  # the same tensor names
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
        report.scope = hf_scope(plan.architecture, family)
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
        notes.append(f"a qa run ({LABELS} holds no labels): `pentad infer OUT data.test=FILE.json --output "
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
                 f"`pentad infer OUT data.test=FILE` predicts with it")
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
    capped = [t.target_name for t in cfg.model.targets if getattr(t, "logit_softcap", None) is not None]
    if capped and not family.logit_softcap:
        raise UserError(f"cannot export {in_dir} as {family.name}: target(s) {', '.join(capped)} soft-cap their logits "
                        f"(logit_softcap), which {family.name} does not.")
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
        report.scope = hf_scope(plan.architecture, family)
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
    measured = numerics.measured_difference(cfg.model, tensors, swapped, tensors, sample_batch(cfg.model, pad=0)[0])
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
        measured = numerics.measured_difference(cfg.model, tensors, back_cfg, back, sample_batch(cfg.model, pad=0)[0])
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
                 problem=f"{len(apart)} written as separate copies: {shown_keys(apart)}" if apart else "")


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
    model = pentad_model(model_cfg, tensors)
    batch, _ = sample_batch(model_cfg, pad=0)
    with torch.no_grad():
        hidden, mask = model.encode(batch)
        stacks = "embedding and encoder"
        if model.decoder is not None:
            hidden = model.decode(batch, hidden, mask)
            stacks += " and decoder"
    bad = int((~torch.isfinite(hidden)).sum())
    if model.stream_plan is not None:  # two streams: the second over its own seeded batch, both pooled
        view = tp.streams(model_cfg)[1][0]
        batch = dataclasses.replace(batch, pair=sample_batch(view, pad=0)[0])
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

def read_interop(run_dir: Path) -> dict[str, Any]:
    """The ``interop.json`` record of a converted run directory ({} when there is none)."""
    path = Path(run_dir) / INTEROP
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
