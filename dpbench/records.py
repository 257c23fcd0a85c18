"""What every run record carries, whichever run path produced it: provenance, identity and storage."""
from __future__ import annotations

import datetime
import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

from dpbench import store
from dpbench.task import TaskData


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


@functools.cache
def git_commit() -> str | None:
    """Commit of the dpbench source tree, with ``+dirty`` if tracked files differ from it; None outside git."""
    source = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


def provenance(task: str, method: str, data: TaskData, seed: int, hyperparameters: dict[str, Any],
               overrides: dict[str, Any]) -> dict[str, Any]:
    """The fields that say what was run on which data, known before training."""
    return {
        "task": task,
        "method": method,
        "data_id": data.data_id,
        "data_note": data.note,
        "preprocessing": data.preprocessing,
        "n_train": data.n_train,
        "n_test": len(data.x_test),
        "seed": seed,
        "hyperparameters": hyperparameters,
        "overrides": dict(overrides),  # what the command line changed from the defaults
        "versions": versions(),
        "git_commit": git_commit(),
    }


def seal(record: dict[str, Any]) -> dict[str, Any]:
    """Stamp the finished record with its time and content hash ``run_id``."""
    record["created_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record["run_id"] = store.content_id(record)
    return record
