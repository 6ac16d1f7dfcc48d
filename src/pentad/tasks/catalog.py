"""What ``pentad list tasks`` prints and docs/tasks.md's generated table: each registered task's
summary, input format, metrics and options, read from the task classes themselves."""

from __future__ import annotations

import re
from typing import Any

import pentad.tasks  # noqa: F401  (registers every task)
from pentad.registry import TASKS
from pentad.tasks.base import TaskConfig

START = "<!-- tasks-table:start -->"
END = "<!-- tasks-table:end -->"


def _summary(doc: str | None) -> str:
    paragraph = re.split(r"\n\s*\n", (doc or "").strip())[0]
    text = " ".join(paragraph.split()).replace("``", "`")
    return re.split(r"(?<=[.!?])\s+(?=[A-Z(`\[])", text)[0]


def _options(cls: Any) -> list[str]:
    """The task's own config keys (``type``, ``metric`` and the keys every task shares left out)."""
    return [name for name in cls.Config.model_fields if name not in ("type", "metric", *TaskConfig.model_fields)]


def _default_metric(cls: Any) -> str:
    return str(cls.Config.model_fields["metric"].default)


def entries() -> list[dict[str, Any]]:
    """One record per task: name, summary, input format, metrics, the default selection metric, options."""
    return [{"name": name, "summary": _summary(cls.__doc__), "input": cls.input_format,
             "metrics": list(cls.metric_names), "metric": _default_metric(cls), "options": _options(cls)}
            for name, cls in TASKS.items()]


def text() -> str:
    """``pentad list tasks``: every line a whole sentence."""
    lines = []
    for e in entries():
        lines.append(f"{e['name']:16s} {e['summary']}")
        lines.append(f"{'':16s}   input: {e['input']}.")
        lines.append(f"{'':16s}   metrics: {', '.join(e['metrics'])} (task.metric, default {e['metric']}, picks "
                     "the best model on dev).")
    return "\n".join(lines)


def markdown() -> str:
    """The Markdown table of docs/tasks.md, between its markers."""
    rows = [START, "", "| task | what | input file | metrics (default picks the best model) | options (`task.*`) |",
            "|---|---|---|---|---|"]
    for e in entries():
        metrics = ", ".join(f"**`{m}`**" if m == e["metric"] else f"`{m}`" for m in e["metrics"])
        options = ", ".join(f"`{o}`" for o in e["options"]) or "-"
        rows.append(f"| `{e['name']}` | {e['summary'].replace('|', '/')} | `{e['input']}` | {metrics} | {options} |")
    return "\n".join(rows + ["", END])
