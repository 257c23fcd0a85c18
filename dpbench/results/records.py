"""What every run record carries, whichever run path produced it: provenance, identity and storage."""
from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.metadata
import inspect
import math
import platform
import subprocess
from pathlib import Path
from typing import Any

from dpbench.catalog import PLUGIN_MODULES
from dpbench.data.taskdata import TaskData
from dpbench.results import store

#: Changes with every privacy-relevant fix of the engine; the sweep and the leaderboard use only records of the
#: current version. 1 (records without the field): up to commit ca2e673. 2: independent random streams per purpose
#: (dpbench.privacy.streams), tuning trials sampled as accounted (Poisson), no released K, layers that mix examples
#: refused, the spent-ε guard against every target, AdaCliP's clipped contributions bounded by C, the sampling
#: guard, the neighbouring relation recorded and chosen (--neighbouring), one model (with bias) for every method.
LEDGER_VERSION = 2
BUILTIN_PACKAGES = ("dpbench.methods.", "dpbench.tasks.")


@functools.cache  # once per process, like the following: a process runs the code it loaded
def versions() -> dict[str, str]:
    names = ["dpbench", "torch", "pytorch-lightning", "dp-accounting", "numpy", "scikit-learn", "pandas", "scipy"]
    found = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def _read_git_commit() -> str | None:
    source = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


#: Read when dpbench's code is loaded, not when the first record is written: a checkout updated under a running
#: sweep made its workers' records name the new commit while they ran the code loaded before.
_GIT_COMMIT = _read_git_commit()


def git_commit() -> str | None:
    """Commit of the dpbench source tree this process loaded, with ``+dirty`` if tracked files differed from it;
    None outside git."""
    return _GIT_COMMIT


def file_sha256(path: str) -> str:
    stat = Path(path).stat()
    return _sha256_of(path, stat.st_mtime_ns, stat.st_size)


@functools.cache  # once per version of a file: a sweep hashes the same method files for every run
def _sha256_of(path: str, modified_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def plugin_sources(folders: list[Path]) -> dict[str, bytes]:
    """{resolved path: bytes} of every ``*.py`` file of plugin ``folders``, read once (an isolated method's process
    is given these bytes, and their hashes go in the record: :mod:`dpbench.run.isolation`)."""
    return {str(path): path.read_bytes()
            for folder in folders for path in sorted(p.resolve() for p in Path(folder).glob("*.py"))}


def plugin_files(folders: list[Path]) -> dict[str, str]:
    """{path: sha256} of every ``*.py`` file of plugin ``folders``: what ``dpbench.registry`` imports from them."""
    return {str(path): file_sha256(str(path))
            for folder in folders for path in sorted(p.resolve() for p in Path(folder).glob("*.py"))}


def combined_sha256(files: dict[str, str]) -> str:
    """One sha256 over {path: sha256} (the files' names and contents, in the order of their paths)."""
    return hashlib.sha256("".join(f"{Path(p).name}:{h}\n" for p, h in sorted(files.items())).encode()).hexdigest()


def code_of(cls: type, base: type) -> dict[str, Any]:
    """Which code a method or task class is: its file, whether it is an external plugin, and the sha256 over the
    source files of every class between it and ``base`` (a plugin subclassing a built-in method covers both files;
    a class from a plugin folder, every file of that folder, all of which the registry imported: as
    ``dpbench.run.isolation`` hashes an isolated method). Two records of different code never share a leaderboard
    cell."""
    files = {}
    for klass in cls.__mro__:
        if klass is base or not (isinstance(klass, type) and issubclass(klass, base)) or \
                klass.__module__.startswith("dpbench.") and not klass.__module__.startswith(BUILTIN_PACKAGES):
            continue  # the engine's own base classes are covered by the ledger version and the git commit
        path = inspect.getsourcefile(klass)
        if klass.__module__.startswith(PLUGIN_MODULES):
            files.update(plugin_files([Path(path).parent]))
        else:
            files[path] = file_sha256(path)
    own = inspect.getsourcefile(cls)
    external = not cls.__module__.startswith(BUILTIN_PACKAGES)
    return {"name": cls.name, "file": own if external else f"{cls.__module__.split('.')[1]}/{Path(own).name}",
            "external": external, "sha256": combined_sha256(files)}


def majority_rate(data: TaskData) -> float | None:
    """The share of the test set's most common class (what a model that always predicts it scores), for integer
    class labels; None otherwise. The test set is public."""
    labels = data.y_test
    if labels.dtype.is_floating_point or labels.dim() != 1 or len(labels) == 0:
        return None
    return float(labels.bincount().max()) / len(labels)


def provenance(task: type, method: type, data: TaskData, seed: int | str, hyperparameters: dict[str, Any],
               overrides: dict[str, Any]) -> dict[str, Any]:
    """The fields that say what was run on which data by which code, known before training; ``seed`` is "secret"
    for a run whose seed came from the OS's entropy and is never written (``--secret-seed``)."""
    from dpbench.method import Method
    from dpbench.task import Task

    return {
        "task": task.name,
        "method": method.name,
        "data_id": data.data_id,
        "data_note": data.note,
        "preprocessing": data.preprocessing,
        "n_train": data.n_train,
        "n_test": len(data.x_test),
        "test_majority_rate": majority_rate(data),
        "seed": seed,
        "hyperparameters": hyperparameters,
        "overrides": dict(overrides),  # what the command line changed from the defaults
        "versions": versions(),
        "git_commit": git_commit(),
        "code": {"method": code_of(method, Method), "task": code_of(task, Task)},
        "ledger_version": LEDGER_VERSION,
    }


def seal(record: dict[str, Any]) -> dict[str, Any]:
    """Stamp the finished record with PyTorch's thread count (dpbench/threads.py), its time and content hash
    ``run_id``."""
    import torch

    record.setdefault("threads", torch.get_num_threads())
    record["created_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record["run_id"] = store.content_id(record)
    return record


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


#: What a stored record's fields must be for the code that reads records (leaderboard, sweep): field -> (what it
#: must be, test). Records come from the store, a records file or W&B, which anyone can edit.
STORED_FIELDS = {
    "run_id": ("a string", lambda v: isinstance(v, str)),
    "task": ("a string", lambda v: isinstance(v, str)),
    "method": ("a string", lambda v: isinstance(v, str)),
    "data_id": ("a string", lambda v: isinstance(v, str)),
    "created_at": ("a string", lambda v: isinstance(v, str)),
    "seed": ("a whole number or \"secret\"",
             lambda v: v == "secret" or isinstance(v, int) and not isinstance(v, bool)),
    "private": ("true or false", lambda v: isinstance(v, bool)),
    "metrics": ("an object of numbers", lambda v: isinstance(v, dict) and bool(v) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in v.values())),
    "hyperparameters": ("an object", lambda v: isinstance(v, dict)),
    "sampler": ("a string", lambda v: isinstance(v, str)),
    "accountant": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "epsilon": ("a number or null", lambda v: v is None or _number(v)),
    "epsilon_target": ("a positive number or null", lambda v: v is None or _number(v) and v > 0),
    "delta": ("a number in (0, 1) or null", lambda v: v is None or _number(v) and 0 < v < 1),
}
_CODE = ("an object whose 'method' is an object with a string 'sha256' (required for an external plugin)",
         lambda v: isinstance(v, dict) and ("method" not in v or isinstance(v["method"], dict) and isinstance(
             v["method"].get("sha256", None if v["method"].get("external") else ""), str)))
OPTIONAL_FIELDS = {
    "neighbouring": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "n_train": ("a whole number or null", lambda v: v is None or isinstance(v, int) and not isinstance(v, bool)),
    "data_note": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "tuning": ("a dict with a 'mode' (a string), or null",
               lambda v: v is None or isinstance(v, dict) and isinstance(v.get("mode"), str)),
    "code": _CODE,
}
#: The fields of an audit record (``kind`` "audit", :mod:`dpbench.trust.audit`) that the board reads.
AUDIT_FIELDS = {
    "run_id": ("a string", lambda v: isinstance(v, str)),
    "task": ("a string", lambda v: isinstance(v, str)),
    "threat_model": ("a string", lambda v: isinstance(v, str)),
    "passed": ("true or false", lambda v: isinstance(v, bool)),
    "code": ("an object whose 'method' is an object with a string 'sha256'", lambda v: isinstance(v, dict) and
             isinstance(v.get("method"), dict) and isinstance(v["method"].get("sha256"), str)),
}


def check_stored(record: Any) -> None:
    """Raise ValueError, naming the run and the field, unless ``record`` has the fields the leaderboard and the
    sweep read, of the right types (a private run with its δ and its target or spent ε; an audit record with what
    the board's audit marks read)."""
    if not isinstance(record, dict):
        raise ValueError(f"a stored record is not an object: {str(record)[:80]}")
    run = f"{'audit' if record.get('kind') == 'audit' else 'run'} {' '.join(str(record.get('run_id'))[:40].split())}"
    tables = ((AUDIT_FIELDS, True),) if record.get("kind") == "audit" else ((STORED_FIELDS, True),
                                                                             (OPTIONAL_FIELDS, False))
    for table, required in tables:
        for key, (kind, valid) in table.items():
            if key not in record:
                if required:
                    raise ValueError(f"{run} has no {key!r}")
            elif not valid(record[key]):
                raise ValueError(f"{run}: {key!r} must be {kind}, got {str(record[key])[:80]}")
    if record.get("kind") != "audit" and record["private"] and (
            record["delta"] is None or record["epsilon_target"] is None and record["epsilon"] is None):
        raise ValueError(f"{run} is private but lacks its delta or epsilon")
