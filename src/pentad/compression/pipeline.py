"""``pentad compress``: the steps chained, each optional, each writing a run directory.

1. distil (``--distill layers=N``): a student with N encoder layers, initialised from the teacher's
   mapped layers (:mod:`.distil`), fine-tuned on the run's training data with the run as its teacher:
   logits, hidden states and attention (``train.distill``; ``hidden=``, ``attention=``, ``alpha=``,
   ``temperature=``, ``epochs=`` set them);
2. prune (``--prune heads=F,ffn=F[,sparsity=F]``): attention heads and feed-forward units removed by
   importance on the dev data (:mod:`.prune`), then a recovery fine-tuning of ``--recover-epochs``
   epochs (``init=`` the pruned run; a distilled student keeps learning from its teacher);
3. quantize (``--quantize int8``, :mod:`.quantize`).

Fine-tuning steps read the run's own config (its data, task and training settings); ``overrides``
(``key=value``, e.g. ``train.threads=2``) apply to each of them. The final model is written to OUT,
the intermediate runs to ``OUT/steps/<step>``, and ``OUT/compress.json`` lists the steps with their dev
scores and sizes.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pentad.assembly import load_config
from pentad.compression.distil import make_student
from pentad.compression.prune import prune_run
from pentad.compression.quantize import quantize_run
from pentad.compression.store import check_output, load_run_model, weights_bytes, write_run
from pentad.errors import UserError
from pentad.files import temporary_dir
from pentad.layout import COMPRESSION_RECORD, COMPRESSION_STEPS, CONFIG, RESULTS
from pentad.outputs import OutputLock, check_apart
from pentad.runs import load_run
from pentad.tasks.runner import finetune

DISTILL_KEYS = {"layers": int, "epochs": int, "hidden": float, "attention": float, "alpha": float,
                "temperature": float}


def parse_distill(text: str) -> dict[str, Any]:
    """``layers=2,epochs=3,hidden=1,attention=1`` -> options (``layers`` required)."""
    found: dict[str, Any] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in DISTILL_KEYS:
            raise UserError(f"--distill {text!r}: expected KEY=VALUE items separated by commas, KEY one of "
                            f"{', '.join(DISTILL_KEYS)} (e.g. --distill layers=2,hidden=1,attention=1); found {item!r}")
        try:
            found[key] = DISTILL_KEYS[key](value)
        except ValueError:
            kind = "an integer" if DISTILL_KEYS[key] is int else "a number"
            raise UserError(f"--distill {text!r}: {key}={value!r} is not {kind}") from None
    if "layers" not in found:
        raise UserError(f"--distill {text!r}: layers=N (the student's encoder layers) is required")
    for key in ("epochs", "layers"):
        if key in found and found[key] < 1:
            raise UserError(f"--distill {text!r}: {key} must be at least 1")
    for key in ("hidden", "attention"):
        if found.get(key, 0.0) < 0:
            raise UserError(f"--distill {text!r}: {key} is a weight, at least 0")
    if not 0.0 <= found.get("alpha", 0.5) <= 1.0:
        raise UserError(f"--distill {text!r}: alpha is between 0 and 1")
    if found.get("temperature", 1.0) <= 0:
        raise UserError(f"--distill {text!r}: temperature must be above 0")
    return found


@dataclass
class CompressOptions:
    distill: dict[str, Any] | None = None  # parse_distill
    prune: dict[str, float] | None = None  # prune.parse_prune
    recover_epochs: int = 1
    quantize: str | None = None
    data: Path | None = None  # importance scoring data (default: the run's dev file)
    overrides: list[str] = field(default_factory=list)


@dataclass
class Compressed:
    out: Path
    steps: list[dict[str, Any]] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"compressed into {self.out}:"]
        for step in self.steps:
            dev = step.get("dev") or {}
            score = ", ".join(f"{k} {v:.4f}" for k, v in dev.items())
            lines.append(f"  {step['step']:<9} {step['mb']:8.2f} MB  {score}  {step['note']}")
        return "\n".join(lines)


def _finetune(config: Path, init: Path, output: Path, overrides: list[str]) -> dict[str, Any]:
    cfg = load_config(str(config), [*overrides, f"init={init}", f"output={output}"])
    results = finetune(cfg)
    if "stopped_at" in results:
        raise UserError(f"the fine-tuning step {output} stopped early (train.stop_at?): leave train.stop_at unset "
                        "for pentad compress")
    return json.loads((output / RESULTS).read_text(encoding="utf-8"))


def _step(done: Compressed, name: str, run: Path, note: str, results: dict[str, Any] | None = None) -> None:
    model, _, _ = load_run_model(run)
    done.steps.append({"step": name, "run": str(run), "mb": weights_bytes(model) / 1e6, "note": note,
                       "dev": (results or {}).get("dev")})


def compress(run: Path, out: Path, options: CompressOptions, overwrite: bool = False) -> Compressed:
    """Run the steps ``options`` ask for on ``run``, writing OUT (see the module docstring)."""
    run, out = Path(run), Path(out)
    check_apart(out, "--output", [("run directory", run), ("--data", options.data)])
    with OutputLock(out, "--output", "pentad compress"):  # from the checks to the last write
        return _compress(run, out, options, overwrite)


def _compress(run: Path, out: Path, options: CompressOptions, overwrite: bool) -> Compressed:
    cfg, _ = load_run(run)
    if options.distill is None and options.prune is None and options.quantize is None:
        raise UserError("pentad compress: nothing to do; give at least one of --distill, --prune, --quantize")
    if (options.distill is not None or options.prune is not None) and cfg.task is None:
        raise UserError(f"{run} is not a fine-tuned run (its config has no task): --distill and --prune fine-tune "
                        "on the run's task data; a pre-trained run can only be quantized (--quantize int8)")
    if options.recover_epochs < 0:
        raise UserError(f"--recover-epochs {options.recover_epochs}: expected 0 (no recovery) or more")
    check_output(run, out, overwrite)  # an existing OUT (--overwrite) is replaced only once the steps succeed
    out.parent.mkdir(parents=True, exist_ok=True)
    for left in out.parent.glob(f".{out.name}.steps.*"):  # a killed earlier compress's (we hold OUT's lock)
        shutil.rmtree(left, ignore_errors=True)
    steps = temporary_dir(out.parent, f".{out.name}.steps.")  # this process's own
    try:
        done = _run_steps(run, out, steps, options)
    except BaseException:
        shutil.rmtree(steps, ignore_errors=True)  # a failed step leaves nothing behind
        raise
    shutil.move(str(steps), str(out / COMPRESSION_STEPS))
    for step in done.steps:  # where the intermediate runs are now
        for key in ("run", "note"):
            step[key] = step[key].replace(str(steps), str(out / COMPRESSION_STEPS))
    (out / COMPRESSION_RECORD).write_text(json.dumps({"source": str(run.resolve()), "steps": done.steps}, indent=2)
                                       + "\n", encoding="utf-8")
    return done


def _run_steps(run: Path, out: Path, steps: Path, options: CompressOptions) -> Compressed:
    done = Compressed(out)
    _step(done, "source", run, "the run compressed")
    current = run
    if options.distill is not None:
        d = options.distill
        student = make_student(run, steps / "student", d["layers"])
        overrides = [f"train.distill.teacher={run.resolve()}", f"train.distill.hidden_weight={d.get('hidden', 1.0)}",
                     f"train.distill.attention_weight={d.get('attention', 1.0)}",
                     f"train.distill.layer_map={json.dumps(student.layer_map)}",
                     f"train.distill.alpha={d.get('alpha', 0.5)}",
                     f"train.distill.temperature={d.get('temperature', 2.0)}"]
        if "epochs" in d:
            overrides.append(f"train.epochs={d['epochs']}")
        current = steps / "distilled"
        results = _finetune(student.out / CONFIG, student.out, current, [*overrides, *options.overrides])
        _step(done, "distilled", current, student.render(), results)
    if options.prune is not None:
        pruned = prune_run(current, steps / "pruned", options.prune, data=options.data)
        _step(done, "pruned", pruned.out, pruned.render())
        current = pruned.out
        if options.recover_epochs > 0:
            recovered = steps / "recovered"
            results = _finetune(pruned.out / CONFIG, pruned.out, recovered,
                                [f"train.epochs={options.recover_epochs}", *options.overrides])
            _step(done, "recovered", recovered, f"{options.recover_epochs} epoch(s) of recovery fine-tuning", results)
            current = recovered
    if options.quantize is not None:
        quantized = quantize_run(current, out, options.quantize, overwrite=True)
        _step(done, "quantized", out, quantized.render())
    else:
        model, final_cfg, _ = load_run_model(current)
        write_run(current, out, final_cfg, model, {"step": "final", "source": str(current)})
    return done
