"""``pentad compress``: the steps chained, each optional, each writing a run directory.

1. distil (``--distill``): a student with fewer layers, initialised from the teacher's mapped layers,
   fine-tuned on the run's training data with the run as its teacher (logits, hidden states, attention);
2. prune (``--prune``): attention heads and feed-forward units removed by importance on the dev data,
   then a recovery fine-tuning (``init=`` the pruned run); unstructured magnitude sparsity as an option;
3. quantize (``--quantize int8``).

The final model is written to OUT; intermediate runs go to ``OUT/steps/<step>``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pentad.compression.quantize import quantize_run
from pentad.compression.store import check_output
from pentad.errors import UserError
from pentad.runs import load_run


@dataclass
class CompressOptions:
    quantize: str | None = None


@dataclass
class Compressed:
    out: Path
    steps: list[str] = field(default_factory=list)

    def render(self) -> str:
        return f"compressed into {self.out}:\n" + "\n".join(f"  {s}" for s in self.steps)


def compress(run: Path, out: Path, options: CompressOptions, overwrite: bool = False) -> Compressed:
    """Run the steps ``options`` ask for on ``run``, writing OUT (see the module docstring)."""
    run, out = Path(run), Path(out)
    load_run(run)
    if options.quantize is None:
        raise UserError("pentad compress: nothing to do; give at least one of --distill, --prune, --quantize")
    check_output(run, out, overwrite)
    if out.exists():
        shutil.rmtree(out)
    done = Compressed(out)
    result = quantize_run(run, out, options.quantize)
    done.steps.append(result.render())
    (out / "compress.json").write_text(json.dumps({"source": str(run.resolve()), "steps": done.steps}, indent=2)
                                       + "\n", encoding="utf-8")
    return done
