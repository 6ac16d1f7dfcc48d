"""Dependencies point down the floors of docs/architecture.md ("Floors"): no module imports a module on
a higher floor, counting imports inside functions (only ``if TYPE_CHECKING:`` blocks are left out)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pentad

ROOT = Path(pentad.__file__).parent
DOC = ROOT.parents[1] / "docs" / "architecture.md"

# Bottom to top; a module belongs to the floor of the longest name here that is it or a package above it.
FLOORS: list[tuple[str, ...]] = [
    ("pentad", "pentad.errors", "pentad.log", "pentad.registry", "pentad.files", "pentad.layout", "pentad.memory",
     "pentad.outputs", "pentad.conversions"),
    ("pentad.layers",),
    ("pentad.config",),
    ("pentad.components",),
    ("pentad.model", "pentad.data"),
    ("pentad.builder",),
    ("pentad.training", "pentad.runs", "pentad.run_config"),
    ("pentad.generation",),
    ("pentad.tasks",),
    ("pentad.interop", "pentad.tencentpretrain", "pentad.compression"),
    ("pentad.assembly", "pentad.compression.pipeline", "pentad.cli", "pentad.__main__", "pentad.demo",
     "pentad.zoo_table"),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    return {id(n) for top in ast.walk(tree) if isinstance(top, ast.If) and "TYPE_CHECKING" in ast.unparse(top.test)
            for stmt in top.body for n in ast.walk(stmt)}


def modules() -> dict[str, Path]:
    """Every module of src/pentad by dotted name."""
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def imports(type_checking: bool = False) -> list[tuple[str, int, str]]:
    """``(module, line, imported module)`` for every import of a pentad module inside src/pentad, those
    inside functions included; ``type_checking``: also those under ``if TYPE_CHECKING:``."""
    modules_ = modules()
    found = []
    for name, path in sorted(modules_.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = set() if type_checking else _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules_ else base
                           for alias in node.names]
            for target in targets:
                while target and target not in modules_:  # a name imported from a module: that module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.append((name, node.lineno, target))
    return found


def floor_of(module: str) -> int:
    best, floor = -1, None
    for i, names in enumerate(FLOORS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), i
    assert floor is not None, f"{module} is on no floor: add it to FLOORS and docs/architecture.md"
    return floor


def upward(found: list[tuple[str, int, str]]) -> list[str]:
    return [f"{name}:{line} imports {target} (floor {floor_of(target)} > {floor_of(name)})"
            for name, line, target in found if floor_of(target) > floor_of(name)]


def test_no_import_runs_up_the_floors():
    found = imports()
    assert len(found) > 500
    assert upward(found) == []


def test_every_module_has_a_floor_and_every_floor_a_module():
    modules = {name for name, _, _ in imports()} | {target for _, _, target in imports()}
    for module in modules:
        floor_of(module)
    for names in FLOORS:
        for prefix in names:
            assert any(m == prefix or m.startswith(prefix + ".") for m in modules), f"{prefix} names no module"


def test_the_check_finds_an_upward_import():
    assert upward([("pentad.layers.attention", 3, "pentad.builder")]) == [
        "pentad.layers.attention:3 imports pentad.builder (floor 5 > 1)"]
    assert upward([("pentad.builder", 3, "pentad.layers.attention")]) == []


def test_the_floors_are_the_documented_ones():
    """docs/architecture.md lists the floors bottom to top, one line each: ``N. `a`, `b` ...``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("<!-- floors:start -->")[1].split("<!-- floors:end -->")[0]
    documented = [tuple("pentad" if n == "pentad" else f"pentad.{n}" for n in re.findall(r"`([\w.]+)`",
                                                                                          line.split(":")[0]))
                  for line in section.splitlines() if re.match(r"\d+\. ", line.strip())]
    assert documented == FLOORS


def test_reading_a_saved_run_imports_no_task_module(tmp_path):
    """The task union is the tasks registered (the top floor registers them): reading a run's config
    imports none of pentad.tasks; a fine-tuned run's task section is then kept as it is (generation from
    a fine-tuned run through the Python API reads its model, not its task)."""
    import subprocess
    import sys

    from pentad import layout
    from pentad.assembly import load_config
    from pentad.config.loader import dump_config

    for name, overrides in (("pretrained", []), ("finetuned", ["task.type=classification", "task.num_labels=3"])):
        run = tmp_path / name
        run.mkdir()
        (run / layout.CONFIG).write_text(dump_config(load_config("bert/tiny", ["model.vocab_size=50", *overrides])),
                                         encoding="utf-8")
        code = ("import sys; from pathlib import Path; from pentad.runs import load_run; "
                f"cfg, _ = load_run(Path({str(run)!r})); assert cfg.model.hidden_size > 0; "
                "print(cfg.task and cfg.task['type'], "
                "sorted(m for m in sys.modules if m == 'pentad.tasks' or m.startswith('pentad.tasks.')))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                              env={**__import__("os").environ, "PYTHONPATH": str(ROOT.parent)})
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == ("classification []" if overrides else "None []")
