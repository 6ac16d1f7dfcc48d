"""The top floor's part of configs: it fills every registry and knows every config importer, so that the
floors below read what is registered and never import upward (docs/architecture.md, "Floors").

* :func:`fill_registries` imports every package that registers something: components, objectives,
  tokenizers and tasks. The run config's task union (``pentad.run_config``) has the tasks registered
  when it is made, so a command that reads task sections calls this first (the ``pentad`` command does).
* :func:`load_config` loads a run config from a file (YAML, JSON, a zoo recipe name, or a TencentPretrain
  JSON config), applies ``key.path=value`` overrides and validates it strictly, reporting every problem.
  A run initialised from a run directory (``init=RUN``) takes that run's model as its own when the config
  gives none (:func:`with_init_model`): the run rebuilds its model, as ``from_pretrained`` does; ``init=hf:NAME``
  first converts a Hugging Face Hub model into such a run, once (:func:`with_hub_init`); a run on
  a preprocessed dataset (``data.dataset=DIR``) takes the objective and tokenizer the dataset was made
  with when the config gives none (:func:`with_dataset_description`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pentad import layout
from pentad.config.loader import load_raw, read_config_file
from pentad.errors import UserError
from pentad.run_config import validate_raw


class TencentPretrainImporter:
    """TencentPretrain's flat JSON model configs (``"encoder": "transformer", "target": ["mlm", "sp"], ...``)."""

    def detects(self, raw: dict[str, Any]) -> bool:
        from pentad.tencentpretrain.config import is_tencentpretrain_config

        return is_tencentpretrain_config(raw)

    def convert(self, raw: dict[str, Any], overrides: list[str], label: str) -> tuple[dict[str, Any], list[str]]:
        from pentad.tencentpretrain.config import import_config

        return import_config(raw, overrides, label)


IMPORTERS = (TencentPretrainImporter(),)


def fill_registries() -> None:
    """Import every package that registers components, objectives, tokenizers or tasks."""
    import pentad.components  # noqa: F401
    import pentad.data.objectives  # noqa: F401
    import pentad.data.tokenizers  # noqa: F401
    import pentad.tasks  # noqa: F401


def load_raw_config(config: str | Path | None, overrides: list[str] | tuple[str, ...] = ()
                    ) -> tuple[dict[str, Any], dict[str, str], str]:
    """:func:`pentad.config.loader.load_raw` with every importer: (raw data, {override path: text}, label)."""
    return load_raw(config, overrides, IMPORTERS)


def load_config(config: str | Path | None, overrides: list[str] | tuple[str, ...] = (), *,
                preprocess_only: bool = False) -> Any:
    """Load, override and validate a run config (a ``RunConfig``; ``preprocess_only``: the model and task
    sections kept as given, see :func:`pentad.run_config.preprocess_config_class`, and no torch imported)."""
    raw, applied, label = load_raw_config(config, overrides)
    raw = with_hub_init(raw)
    raw, label = with_init_model(raw, applied, label)
    raw, label = with_dataset_description(raw, applied, label)
    if not preprocess_only:
        fill_registries()
    return validate_raw(raw, applied, label, preprocess_only)


def with_hub_init(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with ``init=hf:NAME[@REV]`` (a Hugging Face Hub model) replaced by that model converted into a
    pentad run in pentad's cache (:func:`pentad.interop.hub.converted_run`: once per commit), which the
    run then initialises from as from any run directory."""
    init = raw.get("init")
    if not (isinstance(init, str) and init.startswith("hf:")):
        return raw
    from pentad.interop.hub import converted_run
    from pentad.log import info

    run = converted_run(init, say=info)
    info(f"init={init}: {run}")
    return {**raw, "init": str(run)}


def with_init_model(raw: dict[str, Any], applied: dict[str, str], label: str) -> tuple[dict[str, Any], str]:
    """``raw`` with the model of the run it is initialised from: when ``init`` names a run directory (one
    with a ``config.yaml``) and the config has no ``model`` section, that run's ``model`` (and, when the
    config has neither an objective nor a dataset, its ``data.objective``, whose sequence length
    fine-tuning uses) becomes this config's; overrides of ``model.*`` keys apply on top of it (they were
    applied to an empty section: they are merged into the run's; ``applied`` names them). Only those
    sections are taken, and the run's tokenizer when the config names none (so that ``pentad preprocess
    init=RUN`` tokenizes as the run does): the training settings stay this command's own (fine-tuning's
    defaults among them). Returns (raw, label)."""
    init = raw.get("init")
    if not isinstance(init, str) or not init.strip():
        return raw, label
    saved = Path(init).expanduser() / layout.CONFIG
    given = raw.get("model")
    if not _from_overrides(given, applied):
        return raw, label
    if not Path(init).expanduser().exists():  # the first cause, before "model: field required"
        raise UserError(f"init={init} does not exist (expected a run directory, whose model this run would "
                        "take, or a checkpoint file with a config giving the model)")
    if not saved.is_file():
        return raw, label
    run = read_config_file(saved, "run config")
    if not isinstance(run.get("model"), dict):
        return raw, label
    raw = dict(raw)
    raw["model"] = _merged(run["model"], given or {})
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    run_data = run.get("data") if isinstance(run.get("data"), dict) else {}
    if "objective" not in data and "dataset" not in data and isinstance(run_data.get("objective"), dict):
        raw["data"] = {**data, "objective": run_data["objective"]}
    if raw.get("tokenizer") is None and isinstance(run.get("tokenizer"), dict):
        raw["tokenizer"] = run["tokenizer"]  # (preprocess's; training reads it from the run's tokenizer/ folder)
    return raw, f"{label} (model from {saved})"


def with_dataset_description(raw: dict[str, Any], applied: dict[str, str], label: str
                             ) -> tuple[dict[str, Any], str]:
    """``raw`` with what its preprocessed dataset records (``data.dataset``'s ``manifest.json``): the objective
    (type, sequence length and every option it was built with) when the config gives none, overrides of
    ``data.objective.*`` merged on top; the tokenizer when the config gives none. A value that contradicts
    the dataset is refused when the dataset is opened, naming the key and both values. Returns (raw, label)."""
    from pentad.data.shards import MANIFEST, read_manifest  # (numpy only: no torch for preprocess)

    data = raw.get("data")
    dataset = data.get("dataset") if isinstance(data, dict) else None
    if not isinstance(dataset, str) or not (Path(dataset).expanduser() / MANIFEST).is_file():
        return raw, label
    manifest = read_manifest(Path(dataset).expanduser())
    taken = []
    raw = dict(raw)
    built = (manifest.get("objective") or {}).get("config")
    if isinstance(built, dict) and _from_overrides(data.get("objective"), applied, "data.objective"):
        raw["data"] = {**data, "objective": _merged(built, data.get("objective") or {})}
        taken.append("objective")
    tokenizer = (manifest.get("tokenizer") or {}).get("config")
    if isinstance(tokenizer, dict) and raw.get("tokenizer") is None:
        raw["tokenizer"] = tokenizer
        taken.append("tokenizer")
    return raw, f"{label} ({' and '.join(taken)} from {dataset}/{MANIFEST})" if taken else label


def _from_overrides(section: Any, applied: dict[str, str], name: str = "model") -> bool:
    """Whether the section ``name`` is absent or made only of ``name.*`` overrides (no config file gave one)."""
    if section is None:
        return True
    if not isinstance(section, dict):
        return False
    model = section

    def paths(node: dict[str, Any], prefix: str) -> list[str]:
        out: list[str] = []
        for key, value in node.items():
            out += paths(value, f"{prefix}.{key}") if isinstance(value, dict) and value else [f"{prefix}.{key}"]
        return out

    return all(any(path == key or path.startswith(key + ".") for key in applied) for path in paths(model, name))


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def run_config_class() -> Any:
    """The complete ``RunConfig`` (every registry filled): what ``pentad schema`` exports."""
    from pentad.run_config import run_config_class as assembled

    fill_registries()
    return assembled()
