"""The top floor's part of configs: it fills every registry and knows every config importer, so that the
floors below read what is registered and never import upward (docs/architecture.md, "Floors").

* :func:`fill_registries` imports every package that registers something: components, objectives,
  tokenizers and tasks. The run config's task union (``pentad.run_config``) has the tasks registered
  when it is made, so a command that reads task sections calls this first (the ``pentad`` command does).
* :func:`load_config` loads a run config from a file (YAML, JSON, a zoo recipe name, or a TencentPretrain
  JSON config), applies ``key.path=value`` overrides and validates it strictly, reporting every problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pentad.config.loader import load_raw
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
    if not preprocess_only:
        fill_registries()
    return validate_raw(raw, applied, label, preprocess_only)


def run_config_class() -> Any:
    """The complete ``RunConfig`` (every registry filled): what ``pentad schema`` exports."""
    from pentad.run_config import run_config_class as assembled

    fill_registries()
    return assembled()
