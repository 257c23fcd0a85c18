"""Infeasible cells, declared up front: the (task, ε) cells of a grid where no method is expected to learn.

A grid (:mod:`dpbench.board.sweep`) may say::

    "infeasible": {"n_epsilon_below": 100, "cells": {"breast_cancer": [0.1]}}

(either key may be left out). A private (task, ε) cell is *declared infeasible* when n·ε < ``n_epsilon_below``, n
the task's training-set size as its records carry it (``n_train``; the largest among the task's records: the tuning
tracks' records carry the part left after holding out their validation rows), or when ``cells`` lists it. The rule's
reason: a private gradient method releases averages of n clipped gradients, each with sensitivity C/n; at (ε, δ =
1/n²) even one Gaussian release of such an average has noise of standard deviation sqrt(2 ln(1.25 n²))·C/(n·ε),
about 0.11·C at n·ε = 45 (breast_cancer, ε = 0.1), and training needs tens of releases. The threshold 100 of
``leaderboards/grid.json`` is a round number below the n·ε (144, digits at ε = 0.1) of the least budget at which
some method of the committed board is significantly above the majority-class rate, and above breast_cancer's 45 at
ε = 0.1, where none of the 28 rows is.

The sweep still runs declared cells: a declaration is a claim the board tests (``dpbench leaderboard --check``
lists a declared cell significantly above the majority-class rate as ``infeasible-above-trivial``: then the
declaration is wrong), and such cells are cheap (n·ε < 100 at the grid's ε ≥ 0.1 means n < 1,000). The board draws
them as "infeasible (declared)" and ``--check`` does not report them ``collapsed`` or ``below-majority``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpbench.board.model import Column, Table
from dpbench.errors import UsageError

KEYS = {"n_epsilon_below", "cells"}
TAKES = ('an object {"n_epsilon_below": a positive number, "cells": {task: [ε, ...]}} (either key optional; '
         "cells' tasks and ε from the grid)")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


@dataclass(frozen=True)
class Declaration:
    """The grid's infeasible cells: n·ε below ``n_epsilon_below`` (None: no rule), or listed in ``cells``."""

    n_epsilon_below: float | None = None
    cells: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def covers(self, task: str, epsilon: float, n: int | None) -> bool:
        """Whether the private cell (task, ε) of a task of ``n`` training rows (None: unknown) is declared."""
        if any(math.isclose(epsilon, listed, rel_tol=1e-9) for listed in self.cells.get(task, ())):
            return True
        return self.n_epsilon_below is not None and n is not None and n * epsilon < self.n_epsilon_below

    def describe(self) -> str:
        parts = [f"n·ε < {self.n_epsilon_below:g}"] if self.n_epsilon_below is not None else []
        parts += [f"{task} at ε = {', '.join(f'{e:g}' for e in epsilons)}" for task, epsilons in self.cells.items()]
        return "; ".join(parts) or "none"


def parse(value: Any, tasks: list[str] | None = None, epsilons: list[float] | None = None,
          where: str = "grid") -> Declaration:
    """The declaration of a grid's ``infeasible`` value (None: nothing declared); UsageError naming what is wrong.
    ``tasks`` and ``epsilons``: the grid's, which listed cells must name (a listed cell outside the grid is a typo)."""
    if value is None:
        return Declaration()
    if not isinstance(value, dict) or not value or set(value) - KEYS:
        raise UsageError(f"{where}: infeasible must be {TAKES}, got {_short(value)}")
    rule = value.get("n_epsilon_below")
    if rule is not None and not _positive(rule):
        raise UsageError(f"{where}: infeasible.n_epsilon_below must be a positive number, got {_short(rule)}")
    listed = value.get("cells", {})
    if not isinstance(listed, dict) or not all(
            isinstance(task, str) and isinstance(found, list) and found and all(_positive(e) for e in found)
            for task, found in listed.items()):
        raise UsageError(f"{where}: infeasible.cells must map task names to non-empty lists of positive ε, got "
                         f"{_short(listed)}")
    outside = [task for task in listed if tasks is not None and task not in tasks]
    outside += [f"{task} at ε = {e:g}" for task, found in listed.items() for e in found
                if epsilons is not None and not any(math.isclose(e, g, rel_tol=1e-9) for g in epsilons)]
    if outside:
        raise UsageError(f"{where}: infeasible.cells names cells not in the grid: {', '.join(outside)}")
    return Declaration(None if rule is None else float(rule),
                       {task: tuple(float(e) for e in found) for task, found in listed.items()})


def _short(value: Any) -> str:
    import json

    return json.dumps(value, default=str)[:80]


def read_grid(path: Path) -> dict[str, Any]:
    """The grid file at ``path`` as a JSON object (UsageError otherwise); its keys are the sweep's to check
    (:func:`dpbench.board.sweep.load_grid`), but for what the board reads: this module's and :mod:`.notes`'."""
    import json

    try:
        grid = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"cannot read grid {path}: {error}") from None
    if not isinstance(grid, dict):
        raise UsageError(f"grid {path}: not a JSON object")
    return grid


def from_grid_file(path: Path) -> Declaration:
    """The declaration of the grid file at ``path`` (its ``infeasible`` value, checked against its tasks and ε)."""
    grid = read_grid(path)
    tasks, epsilons = grid.get("tasks"), grid.get("epsilons")
    return parse(grid.get("infeasible"), tasks if isinstance(tasks, list) else None,
                 epsilons if isinstance(epsilons, list) else None, f"grid {path}")


def training_size(table: Table) -> int | None:
    """n of the rule: the largest ``n_train`` among the table's runs (module docstring); None if none says."""
    sizes = [run.get("n_train") for run in table.runs]
    sizes = [n for n in sizes if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return max(sizes) if sizes else None


def declared(table: Table, column: Column, declaration: Declaration) -> bool:
    """Whether the table's private ``column`` is declared infeasible."""
    return column.kind != "non-private" and declaration.covers(table.task, column.epsilon, training_size(table))


def declare(tables: list[Table], declaration: Declaration) -> list[Table]:
    """Mark each table's declared infeasible ε (``Table.infeasible``), for the check and the renderers."""
    for table in tables:
        table.infeasible = frozenset(column.epsilon for column in table.columns
                                     if declared(table, column, declaration))
    return tables
