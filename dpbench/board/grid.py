"""A grid file (:mod:`dpbench.board.sweep`) as the board reads it: the JSON object, and the seeds it asks of each task.

The sweep checks every key (:func:`dpbench.board.sweep.load_grid`); the board reads only what it draws or checks
against: the declarations (:mod:`.infeasible`), the notes (:mod:`.notes`) and the seed counts (``too-few-seeds``,
:mod:`.check`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpbench.errors import UsageError

SEEDS_WHAT = ('a whole number from 1 to 10000 (how many seeds: 0, 1, ... run), or a mapping of task names and '
              '"default" to such numbers')


def read(path: Path) -> dict[str, Any]:
    """The grid file at ``path`` as a JSON object (UsageError otherwise)."""
    try:
        grid = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"cannot read grid {path}: {error}") from None
    if not isinstance(grid, dict):
        raise UsageError(f"grid {path}: not a JSON object")
    return grid


def count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 10_000


def valid_seeds(value: Any) -> bool:
    """A count, or a non-empty mapping of task names (or "default") to counts."""
    return count(value) or (isinstance(value, dict) and bool(value) and all(
        isinstance(key, str) and count(number) for key, number in value.items()))


def seeds_for(grid: dict[str, Any], task: str) -> int | None:
    """How many seeds (0, 1, ...) the grid runs on ``task``: its ``seeds``, the task's entry or the default (None:
    the mapping has neither)."""
    seeds = grid["seeds"]
    return seeds if isinstance(seeds, int) else seeds.get(task, seeds.get("default"))


def seeds_asked(grid: dict[str, Any], where: str) -> dict[str, int]:
    """The seeds the grid asks of each of its tasks (none without ``seeds``: a grid the sweep would refuse asks
    nothing of the board); UsageError if its ``seeds`` is not a valid value."""
    if "seeds" not in grid:
        return {}
    if not valid_seeds(grid["seeds"]):
        raise UsageError(f"{where}: seeds must be {SEEDS_WHAT}")
    tasks = grid.get("tasks") if isinstance(grid.get("tasks"), list) else []
    return {task: number for task in tasks if isinstance(task, str) and (number := seeds_for(grid, task)) is not None}
