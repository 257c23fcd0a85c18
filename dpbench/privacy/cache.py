"""A disk cache for pure, slow privacy computations (calibrated σ, ε of a mechanism), shared by the processes of
a sweep: one SQLite table under ``$DPBENCH_HOME/cache``. A key is the repr of the arguments (frozen dataclasses
and numbers, whose repr is exact) with the version of dp-accounting and the sha256 of the modules that compute the
cached values, so that a fix to the accounting can never be masked by values the old code stored; a value is the
float the computation returned. Losing the file only costs time."""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import sqlite3
from pathlib import Path
from typing import Callable

from dpbench.data.files import dpbench_home

#: The modules whose functions are memoized here, and the accounting modules they compute with: their source is part
#: of every key (``tests/test_cache.py`` checks that every accounting module they import is listed).
COMPUTED_BY = ("privacy/accounting.py", "privacy/correlated.py", "tuning/accounting.py")  # relative to dpbench/


@functools.cache
def _salt() -> str:
    source = hashlib.sha256()
    for name in COMPUTED_BY:
        source.update((Path(__file__).parents[1] / name).read_bytes())
    return f"{source.hexdigest()}:{importlib.metadata.version('dp-accounting')}"


def _connect() -> sqlite3.Connection:
    folder = dpbench_home() / "cache"
    folder.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(folder / "privacy.sqlite", timeout=60)
    connection.execute("CREATE TABLE IF NOT EXISTS computed (key TEXT PRIMARY KEY, value REAL NOT NULL)")
    return connection


def memoized(kind: str, arguments: tuple, compute: Callable[[], float]) -> float:
    key = hashlib.sha256(f"{_salt()}:{kind}:{arguments!r}".encode()).hexdigest()
    try:
        connection = _connect()
    except sqlite3.Error:
        return compute()
    try:
        row = connection.execute("SELECT value FROM computed WHERE key = ?", (key,)).fetchone()
        if row is not None:
            return row[0]
        value = compute()
        with connection:
            connection.execute("INSERT OR REPLACE INTO computed VALUES (?, ?)", (key, value))
        return value
    except sqlite3.Error:  # a locked or broken cache file never fails a run
        return compute()
    finally:
        connection.close()
