"""A grid file, read and checked: the cells the sweep runs (:mod:`dpbench.board.sweep`) and the seeds of each task.

:func:`load` checks every key, for the sweep that runs the grid and for the board that checks its records against it:
the declarations (:mod:`.infeasible`), the notes (:mod:`.notes`) and the seeds of each task (:mod:`.check`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dpbench.board import infeasible, notes
from dpbench.choices import NEIGHBOURING
from dpbench.errors import UsageError

SEEDS_WHAT = ('a whole number from 1 to 10000 (how many seeds: 0, 1, ... run), or a mapping of task names and '
              '"default" to such numbers')
TRACKS = ("none", "validation", "random-stopping")
GRID_KEYS = {"tasks", "methods", "epsilons", "seeds", "tracks", "trials", "neighbouring", "reference", "infeasible",
             "notes"}
DEFAULTS = {"tracks": ["none"], "trials": 16, "neighbouring": None, "reference": False}


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


def finite(value: Any) -> bool:
    """A finite real number (an int too large for a float is not: 10**400 crashed the sweep's float())."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _names(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


#: What each field of a grid takes (``neighbouring`` is checked against its choices): field -> (what, test).
GRID_FIELDS = {
    "tasks": ("a non-empty list of names", _names),
    "methods": ("a non-empty list of names", _names),
    "tracks": (f"a non-empty list of names ({', '.join(TRACKS)})", _names),
    "epsilons": ("a non-empty list of positive numbers", lambda v: isinstance(v, list) and bool(v) and all(
        finite(e) and e > 0 for e in v)),
    "seeds": (SEEDS_WHAT, valid_seeds),
    "trials": ("a whole number from 1 to 10000 (configurations or the mean of K per cell)", count),
    "reference": ("true or false (each task's converged non-private reference)", lambda v: isinstance(v, bool)),
}


def read(path: Path) -> dict[str, Any]:
    """The grid file at ``path`` as a JSON object (UsageError otherwise)."""
    try:
        grid = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"cannot read grid {path}: {error}") from None
    if not isinstance(grid, dict):
        raise UsageError(f"grid {path}: not a JSON object")
    return grid


def load(path: str) -> dict[str, Any]:
    """The grid file at ``path`` with its defaults, every key checked (UsageError naming the first that is wrong);
    the sweep runs it and the board checks its records against it."""
    grid = read(Path(path))
    missing, unknown = {"tasks", "methods", "epsilons", "seeds"} - set(grid), set(grid) - GRID_KEYS
    if missing or unknown:
        raise UsageError(f"grid {path}: " + "; ".join(
            part for part in [f"lacks {', '.join(sorted(missing))}" if missing else "",
                              f"unknown keys {', '.join(sorted(unknown))}" if unknown else ""] if part))
    grid = {**DEFAULTS, **grid}
    for key, (takes, valid) in GRID_FIELDS.items():
        if not valid(grid[key]):
            raise UsageError(f"grid {path}: {key} must be {takes}, got {json.dumps(grid[key])[:80]}")
    if unknown_tracks := [t for t in grid["tracks"] if t not in TRACKS]:
        raise UsageError(f"grid {path}: unknown tracks {', '.join(unknown_tracks)}; choose from {', '.join(TRACKS)}")
    if grid["neighbouring"] not in (None, *NEIGHBOURING):
        raise UsageError(f"grid {path}: neighbouring must be one of {', '.join(NEIGHBOURING)}")
    if isinstance(grid["seeds"], dict):
        if stray := [key for key in grid["seeds"] if key != "default" and key not in grid["tasks"]]:
            raise UsageError(f"grid {path}: seeds names tasks not in the grid: {', '.join(stray)}")
        if uncounted := [task for task in grid["tasks"] if seeds_for(grid, task) is None]:
            raise UsageError(f"grid {path}: seeds gives no count for {', '.join(uncounted)} (and no \"default\")")
    infeasible.parse(grid.get("infeasible"), grid["tasks"], grid["epsilons"], f"grid {path}")
    notes.parse(grid.get("notes"), f"grid {path}", grid)
    return grid


def seeds_asked(grid: dict[str, Any]) -> dict[str, int]:
    """The seeds a grid (:func:`load`) asks of each of its tasks."""
    return {task: seeds_for(grid, task) for task in grid["tasks"]}
