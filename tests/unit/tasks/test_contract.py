"""Every registered task keeps the Task contract; the runner holds no task-specific code; docs/tasks.md is current."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

from pentad.registry import TASKS
from pentad.tasks import catalog
from pentad.tasks.base import Task, TaskConfig

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", list(TASKS.names()))
def test_task_keeps_the_contract(name):
    cls = TASKS.get(name)
    assert issubclass(cls, Task), f"{name}: not a pentad.tasks.base.Task"
    assert not inspect.isabstract(cls), f"{name}: abstract members left: {cls.__abstractmethods__}"
    assert issubclass(cls.Config, TaskConfig), f"{name}: its Config is not a TaskConfig"
    fields = cls.Config.model_fields
    assert typing.get_args(fields["type"].annotation) == (name,), f"{name}: Config.type must be Literal[{name!r}]"
    metrics = typing.get_args(fields["metric"].annotation)
    assert metrics and set(metrics) <= set(cls.metric_names), \
        f"{name}: task.metric choices {metrics} are not all among the metrics it reports {cls.metric_names}"
    assert cls.input_format, f"{name}: no input_format for `pentad list tasks`"
    assert cls.__doc__ and cls.__doc__.strip(), f"{name}: no docstring (its summary in `pentad list tasks`)"


def _runner_names() -> set[str]:
    tree = ast.parse((ROOT / "src" / "pentad" / "tasks" / "runner.py").read_text(encoding="utf-8"))
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return names


def test_the_runner_uses_only_the_contract():
    """What the runner calls on a task is declared by Task; it names no task and no task's internals."""
    tree = ast.parse((ROOT / "src" / "pentad" / "tasks" / "runner.py").read_text(encoding="utf-8"))
    called = {n.attr for n in ast.walk(tree)
              if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "task"}
    declared = {name for name in dir(Task) if not name.startswith("_")}
    assert called and called <= declared, f"the runner uses undeclared task members: {sorted(called - declared)}"
    names = _runner_names()
    for task_name in TASKS.names():
        assert task_name not in names, f"the runner names the task {task_name!r}"
    assert not {"label_map", "num_labels", "fit_labels", "logits"} & names


def test_docs_tasks_table_is_current():
    text = (ROOT / "docs" / "tasks.md").read_text(encoding="utf-8")
    documented = text[text.index(catalog.START):text.index(catalog.END) + len(catalog.END)]
    assert documented == catalog.markdown(), "docs/tasks.md is stale: regenerate it with `pentad list tasks --table`"


def test_list_tasks_shows_format_and_metrics(capsys):
    from pentad.cli.main import main

    assert main(["list", "tasks"]) == 0
    out = capsys.readouterr().out
    for name in TASKS.names():
        cls = TASKS.get(name)
        assert f"\n{name} " in "\n" + out and cls.input_format in out
        assert ", ".join(cls.metric_names) in out


def test_infer_writes_by_default_where_the_task_says(tmp_path, monkeypatch):
    """``pentad infer`` without --output: the run's task's predictions_file (JSON for JSON-writing tasks)."""
    from pentad.tasks.runner import default_predictions

    for name in TASKS.names():
        suffix = Path(TASKS.get(name).predictions_file).suffix
        assert suffix in (".tsv", ".json", ".jsonl"), name
    assert TASKS.get("qa").predictions_file == "predictions.json"
    assert default_predictions(tmp_path / "missing") == tmp_path / "missing" / "predictions.tsv"
    import types

    import pentad.tasks.runner as runner

    run = tmp_path / "run"
    monkeypatch.setattr(runner, "load_run", lambda d: (types.SimpleNamespace(task=types.SimpleNamespace(type="qa")),
                                                       None))
    assert default_predictions(run) == run / "predictions.json"
