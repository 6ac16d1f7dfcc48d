"""sentence-transformers directories: a Hugging Face encoder plus a pooling recipe.

A sentence-transformers model (e.g. all-MiniLM-L6-v2) is a HF model directory with
``modules.json``: module 0 is the transformer (the directory's own ``config.json`` and weights),
then ``Pooling`` (``1_Pooling/config.json``: mean, CLS or max over the non-padding tokens) and
often ``Normalize`` (unit length). The transformer converts like any other ``BertModel`` (or
RoBERTa, ALBERT...); the pooling recipe has no weights. The import records it in ``interop.json``
(``sentence_transformers``: pooling kind, normalisation, and the small JSON files verbatim), the
export writes those files back so the result is again a sentence-transformers directory, and
``--verify`` compares the pooled sentence embeddings too. pentad's pooling (``pentad.layers.pooling``)
computes the same mean / first / max.

Modules with weights (``Dense`` projections) are not part of the pentad model: the import names
them in a note and keeps their configuration files only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pentad.errors import UserError

MODULES = "modules.json"
TEXT_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")
# Pooling config flag -> pentad pooling kind.
POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "first",
                 "pooling_mode_max_tokens": "max", "pooling_mode_lasttoken": "last"}
UNSUPPORTED_MODES = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")


def read(in_dir: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """(the record for interop.json, notes) of a sentence-transformers directory; (None, []) for a
    plain HF directory."""
    path = in_dir / MODULES
    if not path.is_file():
        return None, []
    try:
        modules = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e}).") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise UserError(f"{path}: expected a list of modules, each an object with 'type' and 'path'.")
    notes: list[str] = []
    files: dict[str, str] = {}
    for name in TEXT_FILES:
        if (in_dir / name).is_file():
            files[name] = (in_dir / name).read_text(encoding="utf-8")
    pooling = None
    normalize = False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        sub = str(module.get("path", ""))
        sub_dir = in_dir / sub if sub else in_dir
        for config in sorted(sub_dir.glob("*.json")) if sub else []:
            files[f"{sub}/{config.name}"] = config.read_text(encoding="utf-8")
        if kind == "Transformer" and sub not in ("", "."):
            notes.append(f"modules.json: the transformer lives in {sub}/, not beside modules.json; convert that "
                         "directory")
        elif kind == "Pooling":
            pooling = _pooling(sub_dir / "config.json", notes)
        elif kind == "Normalize":
            normalize = True
            if sub:
                files.setdefault(f"{sub}/", "")  # the module's directory, empty in most models
        elif kind != "Transformer":
            notes.append(f"sentence-transformers module {module.get('name', sub)} ({kind}) is not converted: pentad "
                         "keeps its configuration files only, not its weights")
    record = {"pooling": pooling, "normalize": normalize, "files": files}
    notes.append(f"sentence-transformers model: {pooling or 'no'} pooling" + (", normalised" if normalize else "")
                 + " (recorded in interop.json and written back on export)")
    return record, notes


def _pooling(path: Path, notes: list[str]) -> str | None:
    if not path.is_file():
        notes.append(f"{path} is missing: the pooling recipe is unknown")
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    modes = [POOLING_MODES[k] for k in POOLING_MODES if config.get(k)]
    unsupported = [k for k in UNSUPPORTED_MODES if config.get(k)]
    if unsupported or len(modes) != 1:
        notes.append(f"{path}: pooling {unsupported or modes} is not one of pentad's poolings (mean, first, max, "
                     "last); sentence embeddings are not verified")
        return None
    return modes[0]


def write(out_dir: Path, record: dict[str, Any]) -> None:
    """Write the sentence-transformers files of ``record`` (from :func:`read`) into ``out_dir``."""
    for name, text in (record.get("files") or {}).items():
        target = out_dir / name
        if name.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
