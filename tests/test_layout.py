"""The package's layout: dependencies point one way, and no module imports itself back through another.

Every import in ``dpbench`` (function-level ones included; names imported only for type checking excepted) goes to
a unit of the same or a lower layer, and within a layer there is no import circle. The layers, lowest first, are
the order of ``LAYERS``; a subpackage's modules may import each other, and the plugin contract's names may be
imported from the package root (``from dpbench import Method``), which loads them lazily.
"""
from __future__ import annotations

import ast
from pathlib import Path

import dpbench
import dpbench.methods
import dpbench.tasks

#: Lowest first. A unit is a top-level module or a subpackage of ``dpbench``.
LAYERS = [
    {"errors"},
    {"choices", "catalog", "checks", "threads"},  # the base: no PyTorch, no data
    {"data"},
    {"privacy"},
    {"method", "task"},  # the plugin contract
    {"spec"},
    {"results"},
    {"release"},
    {"methods", "tasks"},  # the built-in plugins
    {"registry"},
    {"run"},
    {"federated"},
    {"tuning"},
    {"trust"},
    {"board"},
    {"cli"},
    {"__main__"},
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
ROOTS = {"dpbench": Path(dpbench.__file__).parent, "dpbench.methods": Path(dpbench.methods.__file__).parent,
         "dpbench.tasks": Path(dpbench.tasks.__file__).parent}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (``dpbench.methods`` and ``dpbench.tasks`` live in the top-level
    folders ``methods/`` and ``tasks/``)."""
    found = {}
    for root_name, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((root_name, *parts))] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The package's modules that the module ``name`` at ``path`` imports (``from a import b`` counts as a.b when
    a.b is a module, else as a)."""
    found = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names if alias.name.startswith("dpbench"))
            elif isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("dpbench"):
                assert child.level == 0, f"{name}: relative import"
                for alias in child.names:
                    found.add(f"{child.module}.{alias.name}" if f"{child.module}.{alias.name}" in known
                              else child.module)
            visit(child)

    visit(ast.parse(path.read_text()))
    return found - {name}


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "dpbench"


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(path, name, set(found)) for name, path in found.items()}


def test_every_unit_has_a_layer():
    assert {unit(m) for m in modules()} - {"dpbench"} == set(RANK)


def test_dependencies_point_down():
    upward = []
    for module, targets in graph().items():
        if module == "dpbench":  # the root: the allocator's set-up, and the contract's names loaded lazily
            assert targets <= {"dpbench.run", "dpbench.run.allocator"}, targets
            continue
        for target in targets:
            if target == "dpbench":  # ``from dpbench import Method``: the contract, loaded lazily
                continue
            here, there = unit(module), unit(target)
            if here != there and RANK[there] >= RANK[here]:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_no_import_circles():
    edges = graph()
    state: dict[str, int] = {}
    circles = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                circles.append(path[path.index(target):] + [target] if target in path else [node, target])
            elif target not in state:
                walk(target, path + [target])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            walk(start, [start])
    assert circles == []


def test_the_check_catches_an_upward_import(tmp_path):
    """The walk itself can fail: a privacy module importing the engine is reported."""
    planted = tmp_path / "clipping.py"
    planted.write_text("from dpbench.run import engine\n")
    targets = imports_of(planted, "dpbench.privacy.clipping", set(modules()))
    assert targets == {"dpbench.run.engine"}
    assert RANK[unit("dpbench.run.engine")] > RANK[unit("dpbench.privacy.clipping")]


def test_the_plugin_contract_is_importable_from_the_root():
    from dpbench import Method, Task, apply_gradient
    from dpbench.method import Method as FromModule

    assert Method is FromModule and callable(apply_gradient) and Task.__name__ == "Task"
