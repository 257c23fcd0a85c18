"""The names and descriptions of methods and tasks, read from their source files without importing them.

``dpbench list`` and the refusal of an unknown name must not pay for importing PyTorch and Lightning (seconds):
this module finds what :mod:`dpbench.registry` would register by parsing the files with :mod:`ast`. A class is
registered if it is a subclass of ``dpbench.method.Method`` (or ``dpbench.task.Task``), directly or through classes
of the files read, and assigns ``name`` a string in its body; its description is the first string ``description``
along its bases. Where a file is not plain enough to be sure (a base from a module not read, a ``name`` that is not
a string literal, a class statement inside ``if`` or ``try``, a file that does not parse, two classes of one name)
or installed packages register entry points, :func:`names` returns None and callers import through the registry,
which is always right, only slower. Nothing here is privacy-relevant: the registry decides what runs.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The prefix of the module names of plugin folders' files (``dpbench.registry`` imports them under it; the
#: record's code hash reads every file of a plugin folder).
PLUGIN_MODULES = "dpbench_plugin_"

KINDS = {"method": ("dpbench.methods", "dpbench.methods", "dpbench.method.Method"),
         "task": ("dpbench.tasks", "dpbench.tasks", "dpbench.task.Task")}
ROOTS = {root for _, _, root in KINDS.values()}


class Unsure(Exception):
    """A file this module cannot read with certainty: ask the registry."""


@dataclass
class _Class:
    module: str
    name: str | None  # the registered name, if the body assigns a string literal to ``name``
    description: str | None
    bases: list[str]  # qualified names (module.Class), "?" for a base that cannot be resolved
    #: Literal values the body assigns to :data:`FACTS` (:data:`UNKNOWN` where it assigns something else).
    facts: dict[str, Any]


#: A task's attributes read for the refusals made before importing (``dpbench.cli``): its option names and the
#: lower bound on its training examples (``Task.min_train_examples``).
FACTS = ("options", "min_train_examples")
UNKNOWN = object()


def _fact(key: str, value: ast.expr) -> Any:
    """``options`` as the set of its keys, ``min_train_examples`` as a whole number or None; else UNKNOWN."""
    try:
        literal = ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return UNKNOWN
    if key == "options":
        return frozenset(literal) if isinstance(literal, dict) and all(isinstance(k, str) for k in literal) \
            else UNKNOWN
    valid = literal is None or isinstance(literal, int) and not isinstance(literal, bool) and literal >= 1
    return literal if valid else UNKNOWN


def _qualified(node: ast.expr, imports: dict[str, str], module: str, local: set[str]) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return "?"
    head = node.id
    if not parts and head in local:
        return f"{module}.{head}"
    if head in imports:
        return ".".join([imports[head], *reversed(parts)])
    return "?"


def _literal(value: ast.expr) -> str | None:
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value
    raise Unsure("not a string literal")


def _nested_classes(statements: list[ast.stmt]) -> list[str]:
    """Class statements inside top-level ``if``/``try``/``with``/loops (not inside functions or classes)."""
    found = []
    for statement in statements:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(statement, field, None) or []
            found += [s.name for s in inner if isinstance(s, ast.ClassDef)]
            found += _nested_classes([s for s in inner if isinstance(s, ast.stmt)] +
                                     [h for h in inner if isinstance(h, ast.ExceptHandler)])
        if isinstance(statement, ast.ExceptHandler):
            found += [s.name for s in statement.body if isinstance(s, ast.ClassDef)]
    return found


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> qualified name of what the file imports (absolute imports; relative ones are not resolved)."""
    imports: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imports[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return imports


def _read(path: Path, module: str) -> dict[str, _Class]:
    """The top-level classes of one file by qualified name; :class:`Unsure` where the file is not plain enough."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError) as error:
        raise Unsure(f"{path}: {error}") from None
    if nested := _nested_classes(tree.body):
        raise Unsure(f"{path}: class {nested[0]} is defined inside a statement")
    for node in ast.walk(tree):  # classes made by calls: type(name, bases, namespace), types.new_class(...)
        if isinstance(node, ast.Call) and (
                isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 3 or
                isinstance(node.func, ast.Attribute) and node.func.attr == "new_class"):
            raise Unsure(f"{path}: a class made by a call (line {node.lineno})")
    imports = _imports(tree)
    local = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    classes = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        found: dict[str, str | None] = {}
        facts: dict[str, Any] = {}
        for statement in node.body:
            targets = (statement.targets if isinstance(statement, ast.Assign) else
                       [statement.target] if isinstance(statement, ast.AnnAssign) and statement.value else [])
            for target in targets:
                if isinstance(target, ast.Name) and target.id in ("name", "description"):
                    try:
                        found[target.id] = _literal(statement.value)
                    except Unsure:
                        raise Unsure(f"{path}: {node.name}.{target.id} is not a string literal") from None
                elif isinstance(target, ast.Name) and target.id in FACTS:
                    facts[target.id] = _fact(target.id, statement.value)
        classes[f"{module}.{node.name}"] = _Class(module, found.get("name"), found.get("description"),
                                                   [_qualified(base, imports, module, local) for base in node.bases],
                                                   facts)
    return classes


def _package_folder(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    return Path(next(iter(spec.submodule_search_locations)))


def _engine_module(qualified: str, classes: dict[str, _Class]) -> None:
    """Read the dpbench module that defines ``qualified`` (e.g.
    ``dpbench.release.mechanisms.OutputPerturbationMethod``), if it is one and not read yet: the base classes of the
    engine, found without importing the module."""
    module = qualified.rpartition(".")[0]
    if not module.startswith("dpbench.") or any(c.module == module for c in classes.values()):
        return
    spec = importlib.util.find_spec(module)  # imports the parent packages only (dpbench/__init__.py)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise Unsure(f"no source file for {module}")
    classes.update(_read(Path(spec.origin), module))


def _derives(qualified: str, root: str, classes: dict[str, _Class]) -> bool | None:
    """Whether the class derives from ``root``; None if a class along the way is outside dpbench and the files
    read. The two roots end the search (a task is never a method)."""
    if qualified in ROOTS:
        return qualified == root
    if qualified not in classes:
        _engine_module(qualified, classes)
    if qualified not in classes:
        return None
    answers = [_derives(base, root, classes) for base in classes[qualified].bases]
    return True if True in answers else None if None in answers else False


def _lineage(qualified: str, classes: dict[str, _Class]) -> list[str]:
    """The class and its bases among ``classes``, nearest first (breadth first; Python's order for the single
    inheritance of dpbench's tasks and methods)."""
    order, queue = [], [qualified]
    while queue:
        current = queue.pop(0)
        if current in classes and current not in order:
            order.append(current)
            queue += classes[current].bases
    return order


def _description(qualified: str, classes: dict[str, _Class]) -> str:
    return next((classes[c].description for c in _lineage(qualified, classes) if classes[c].description is not None),
                "")


def _facts(qualified: str, classes: dict[str, _Class]) -> dict[str, Any]:
    """The nearest assignment of ``min_train_examples`` and the union of the ``options`` the lineage assigns (they
    merge along the class hierarchy: ``Task.__init_subclass__``); UNKNOWN where a base is not read or none
    assigns it."""
    lineage = _lineage(qualified, classes)
    if any(base == "?" for c in lineage for base in classes[c].bases):
        return {key: UNKNOWN for key in FACTS}
    facts = {key: next((classes[c].facts[key] for c in lineage if key in classes[c].facts), UNKNOWN) for key in FACTS}
    assigned = [classes[c].facts["options"] for c in lineage if "options" in classes[c].facts]
    facts["options"] = UNKNOWN if not assigned or UNKNOWN in assigned else frozenset().union(*assigned)
    return facts


def _scan(plugin_folders: tuple[Path, ...]) -> tuple[dict[str, dict[str, str]], dict[str, _Class]]:
    """{kind: {name: qualified class name}} for both kinds, and the classes read; :class:`Unsure` where the
    registry must decide."""
    classes: dict[str, _Class] = {}
    read: list[tuple[Path | None, dict[str, _Class]]] = []
    for kind, (package, group, _) in KINDS.items():
        if importlib.metadata.entry_points(group=group):
            raise Unsure(f"installed packages register {group} entry points")
        for path in sorted(_package_folder(package).glob("*.py")):
            if path.stem != "__init__":
                read.append((None, _read(path, f"{package}.{path.stem}")))
    for folder in plugin_folders:
        if not folder.is_dir():
            raise Unsure(f"no plugin folder {folder}")  # the registry refuses it in its own words
        read += [(folder, _read(path, f"plugin:{path.resolve()}")) for path in sorted(folder.glob("*.py"))]
    for _, own in read:
        classes.update(own)
    registered: dict[str, dict[str, str]] = {kind: {} for kind in KINDS}
    plugins_found = {folder: 0 for folder in plugin_folders}
    for folder, own in read:
        for qualified, cls in own.items():
            for kind, (_, _, root) in KINDS.items():
                derives = _derives(qualified, root, classes)
                if derives is None and cls.name is not None:
                    raise Unsure(f"{qualified}: a base class outside dpbench and the files read")
                if not derives:
                    continue  # unnamed helpers (e.g. an nn.Module) are never registered
                if cls.name is None:
                    if folder is not None:  # the registry names an unnamed plugin class in a warning
                        raise Unsure(f"{qualified} has no name")
                    continue
                if cls.name in registered[kind]:
                    raise Unsure(f"two {kind}s named {cls.name!r}")
                registered[kind][cls.name] = qualified
                if folder is not None:
                    plugins_found[folder] += 1
    if not all(plugins_found.values()):
        raise Unsure("a plugin folder without a method or task")  # refused by the registry
    return {kind: dict(sorted(found.items())) for kind, found in registered.items()}, classes


def names(kind: str, plugin_folders: list[Path]) -> dict[str, str] | None:
    """{registered name: description} of the ``kind`` ("method" or "task") that :mod:`dpbench.registry` would
    register (built-ins and ``plugin_folders``), or None where only importing can tell (see the module docstring):
    also for a missing plugin folder, one without a method or task, or a plugin class without a name, which the
    registry refuses or warns of in its own words."""
    try:
        registered, classes = _scan(tuple(plugin_folders))
    except Unsure:
        return None
    return {name: _description(qualified, classes) for name, qualified in registered[kind].items()}


def _task_class(name: str, plugin_folders: list[Path]):
    """(qualified class name, the scanned classes) of task ``name``, or None where the files do not say it."""
    try:
        registered, classes = _scan(tuple(plugin_folders))
    except Unsure:
        return None
    return (registered["task"][name], classes) if name in registered["task"] else None


def task_size(name: str, plugin_folders: list[Path]) -> tuple[int, frozenset[str]] | None:
    """(``min_train_examples``, option names) of task ``name`` as its files assign them, or None where they do not
    say both with certainty (no bound, a value that is not a literal, a task that only importing can find)."""
    found = _task_class(name, plugin_folders)
    if found is None:
        return None
    facts = _facts(*found)
    bound, options = facts["min_train_examples"], facts["options"]
    return None if bound in (None, UNKNOWN) or options is UNKNOWN else (bound, options)


def task_derives(name: str, base: str, plugin_folders: list[Path]) -> bool | None:
    """Whether task ``name`` is a subclass of the class ``base`` (qualified, e.g.
    ``dpbench.tasks.linear.LinearClassification``), or None where its files do not say with certainty."""
    found = _task_class(name, plugin_folders)
    if found is None:
        return None
    qualified, classes = found
    lineage = _lineage(qualified, classes)
    if base in lineage:
        return True
    unread = {b for c in lineage if c not in ROOTS for b in classes[c].bases} - set(lineage) - ROOTS
    return False if all(b.startswith("dpbench.") and not b.startswith("dpbench.tasks.") for b in unread) else None


def plugin_folders(option: list[str] | None = None) -> list[Path]:
    """The plugin folders of ``DPBENCH_PLUGINS`` and ``--plugins`` (as :func:`dpbench.registry.plugin_dirs`)."""
    from_env = [p for p in os.environ.get("DPBENCH_PLUGINS", "").split(os.pathsep) if p]
    return [Path(p) for p in [*from_env, *(option or [])]]
