"""Finds methods and tasks: built-in files, a user's plugin folders, and installed packages' entry points.

* built-in: every module of ``dpbench.methods`` and ``dpbench.tasks`` (the top-level ``methods/``, ``tasks/``);
* plugin folders: every ``*.py`` file in the folders named by ``--plugins`` or ``DPBENCH_PLUGINS``
  (``os.pathsep``-separated); a file may define methods, tasks or both;
* entry points in the groups ``dpbench.methods`` and ``dpbench.tasks``, each naming a class or a module.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import os
import pkgutil
import sys
import warnings
from pathlib import Path
from types import ModuleType

import dpbench.methods
import dpbench.tasks
from dpbench.catalog import PLUGIN_MODULES
from dpbench.errors import RegistryError
from dpbench.method import Method
from dpbench.task import Task


def _classes_in(module: ModuleType, base: type) -> list[type]:
    return [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, base) and cls.__module__ == module.__name__ and "name" in cls.__dict__
    ]


#: {path: source} that plugin files are compiled from instead of the disk (:func:`pin_sources`); None: the disk.
_PINNED: dict[str, bytes] | None = None


def pin_sources(sources: dict[str, bytes]) -> None:
    """From now on, in this process, load plugin files only from ``sources`` ({resolved path: bytes}), never from
    the disk: an isolated method's process (:mod:`dpbench.run.isolation`) runs exactly the bytes its parent hashed,
    whatever happened to the files since. A plugin folder's files are then the pinned paths in it, and an import
    that would load anything else from a plugin folder (a sibling module through ``sys.path``, its cached or
    sourceless bytecode, a package) is served from the pinned bytes or refused (:class:`_PinnedFinder`)."""
    global _PINNED
    _PINNED = dict(sources)
    sys.meta_path.insert(0, _PinnedFinder({Path(path).parent for path in _PINNED}))


class _PinnedFinder(importlib.abc.MetaPathFinder):
    """Imports of files in the plugin ``folders``: a pinned ``*.py`` file is compiled from its pinned bytes, anything
    else there is an ImportError (the record's hash covers only the pinned files)."""

    def __init__(self, folders: set[Path]):
        self.folders = folders

    def find_spec(self, fullname, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin or not spec.has_location:
            return None
        origin = Path(spec.origin).resolve()
        if not any(folder == origin.parent or folder in origin.parents for folder in self.folders):
            return None
        if str(origin) in _PINNED and spec.submodule_search_locations is None:
            return importlib.util.spec_from_loader(fullname, _PinnedLoader(origin), origin=str(origin))
        raise ImportError(f"{fullname}: {origin} is in a plugin folder but is none of the files its hash covers")


class _PinnedLoader(importlib.abc.Loader):
    def __init__(self, path: Path):
        self.path = path

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        module.__file__ = str(self.path)
        exec(compile(_PINNED[str(self.path)], str(self.path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102


def _load_file(path: Path) -> ModuleType:
    """A plugin file as module ``dpbench_plugin_<stem>_<hash of its path>``, registered in ``sys.modules`` (so that
    its classes' source files can be found and hashed for the record's ``code``); imported again only when its
    bytes changed, so that a sweep does not import it once per run."""
    path = path.resolve()
    module = _import_source(path, _PINNED[str(path)] if _PINNED is not None else path.read_bytes())
    sys.modules[module.__name__] = module  # the name's current bytes (a failed import of others unregistered it)
    return module


@functools.lru_cache(maxsize=None)
def _import_source(path: Path, source: bytes) -> ModuleType:
    """Compiled from ``source`` itself, never from cached bytecode: a ``__pycache__`` file beside the plugin (even
    one whose header matches the source's time and size, or an unchecked hash-based one) would otherwise run code
    that is not the hashed source."""
    name = f"{PLUGIN_MODULES}{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None, origin=str(path)))
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - the plugin
    except BaseException as error:
        del sys.modules[name]
        if isinstance(error, Exception):  # a plugin that does not import: one line, not a traceback
            raise RegistryError(f"plugin {path} does not load: {type(error).__name__}: {error}") from None
        raise
    return module


def _plugin_files(folder: Path) -> list[ModuleType]:
    """The plugin files of a folder, imported; a folder that is missing, or defines no method or task with a name,
    is refused (a typo in --plugins would otherwise run silently without the plugin), and a plugin class without a
    ``name`` is named in a warning (it is not registered)."""
    if _PINNED is not None:
        paths = sorted(Path(path) for path in _PINNED if Path(path).parent == folder.resolve())
    elif not folder.is_dir():
        raise RegistryError(f"plugin folder {folder} does not exist")
    else:
        paths = sorted(folder.glob("*.py"))
    modules = [_load_file(path) for path in paths]
    named = 0
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not issubclass(cls, (Method, Task)):
                continue
            if "name" in cls.__dict__:
                named += 1
            elif not any(getattr(sub, "__module__", None) == module.__name__ for sub in cls.__subclasses__()):
                _warn_once(f"{module.__file__}: class {cls.__name__} has no `name`: it is not registered")
    if not named:
        raise RegistryError(f"plugin folder {folder} defines no method or task (a subclass of dpbench.method.Method "
                            f"or dpbench.task.Task with a `name`)")
    return modules


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def _modules(package: ModuleType, group: str, plugin_dirs: list[Path], installed: bool) -> list[ModuleType | type]:
    found: list[ModuleType | type] = [
        importlib.import_module(f"{package.__name__}.{info.name}") for info in pkgutil.iter_modules(package.__path__)
    ]
    for folder in plugin_dirs:
        found += _plugin_files(folder)
    if installed:
        found += [entry.load() for entry in _entry_points(group, tuple(sys.path))]
    return found


@functools.lru_cache(maxsize=None)
def _entry_points(group: str, search_path: tuple[str, ...]) -> tuple[importlib.metadata.EntryPoint, ...]:
    """The installed entry points of ``group`` (scanning every installed distribution is slow: once per process and
    search path)."""
    return tuple(importlib.metadata.entry_points(group=group))


def plugin_dirs(option: list[str] | None = None) -> list[Path]:
    from_env = [p for p in os.environ.get("DPBENCH_PLUGINS", "").split(os.pathsep) if p]
    return [Path(p) for p in [*from_env, *(option or [])]]


def _collect(package: ModuleType, group: str, base: type, folders: list[Path], installed: bool) -> dict[str, type]:
    registry: dict[str, type] = {}
    for source in _modules(package, group, folders, installed):
        classes = [source] if inspect.isclass(source) else _classes_in(source, base)
        for cls in classes:
            if not isinstance(cls.name, str) or not cls.name:
                raise RegistryError(f"{base.__name__.lower()} {cls.__qualname__} of {cls.__module__} has no name "
                                    f"(a non-empty string), got {cls.name!r:.40}")
            if cls.name in registry and registry[cls.name] is not cls:
                raise RegistryError(f"two {base.__name__.lower()}s are named {cls.name!r}: "
                                    f"{registry[cls.name].__module__} and {cls.__module__}")
            registry[cls.name] = cls
    return dict(sorted(registry.items()))


def methods(folders: list[Path] | None = None, installed: bool = True) -> dict[str, type[Method]]:
    """The methods by name: built-in, of plugin ``folders`` (default: ``DPBENCH_PLUGINS``) and, unless
    ``installed`` is False, of installed packages' entry points (whose code then runs in this process)."""
    return _collect(dpbench.methods, "dpbench.methods", Method, plugin_dirs() if folders is None else folders,
                    installed)


def tasks(folders: list[Path] | None = None, installed: bool = True) -> dict[str, type[Task]]:
    """The tasks by name, from the same sources as :func:`methods`."""
    return _collect(dpbench.tasks, "dpbench.tasks", Task, plugin_dirs() if folders is None else folders, installed)
