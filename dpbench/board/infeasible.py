"""Infeasible cells, declared up front: the (task, track, ε) cells of a grid where no method is expected to learn.

A grid (:mod:`dpbench.board.sweep`) may say::

    "infeasible": {"n_epsilon_below": 150, "cells": {"breast_cancer": [0.1]}}

(either key may be left out). A private (task, track, ε) cell is *declared infeasible* when n·ε_train <
``n_epsilon_below``, or, in every track, when ``cells`` lists (task, ε). n is the training-set size as the track's
records carry it (``n_train``, the largest among them: the tuning tracks' records carry the part left after holding
out their validation rows); ε_train is the budget one training run of the cell spends: ε in the untuned and validation
tracks, and in the random-stopping track the accountant's per-trial ε (``tuning.per_trial_epsilon`` of private
random-stopping records, which verify checks: the largest among the column's runs), which Papernot & Steinke's bound
leaves of ε after paying for the random number of trials (about half of it at the grid's mean of 16). Both numbers are
fixed before any training: by the data split and the accountant, not by the results.

The rule's reason: a private gradient method releases averages of n clipped gradients, each with sensitivity C/n; at
(ε, δ = 1/n²) even one Gaussian release of such an average has noise of standard deviation
sqrt(2 ln(1.25 n²))·C/(n·ε), about 0.04·C at n·ε = 150 (n = 1,437), and training composes tens to thousands of
releases. The threshold 150 of ``leaderboards/grid.json`` was set on 27 November 2026 from the rebuilt board's complete
digits and breast_cancer tracks (chosen after seeing them, and said so): no private method is significantly above the
majority-class rate on digits at ε = 0.1 (n·ε = 144 in the validation track, 68 per trial in random stopping) or on
breast_cancer at ε = 0.1 (46), and one of twelve is on breast_cancer's random stopping at ε = 0.5 (104 per trial),
while at n·ε_train ≥ 215 (breast_cancer's random stopping at ε = 1) half the methods or more learn. The earlier
threshold, 100 on ε alone, came from the board before the budgets were widened, where one method was above trivial on
digits at ε = 0.1.

The sweep still runs declared cells: a declaration is a claim the board tests (``dpbench leaderboard --check``
lists a declared cell significantly above the majority-class rate as ``infeasible-above-trivial``: then the
declaration is wrong for it), and such cells are cheap (n·ε_train < 150 at the grid's ε ≥ 0.1 means n < 3,000).
The board draws them as "infeasible (declared)" and ``--check`` does not report them ``collapsed`` or
``below-majority``.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
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
    """The grid's infeasible cells: n·ε_train below ``n_epsilon_below`` (None: no rule), or listed in ``cells``."""

    n_epsilon_below: float | None = None
    cells: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def covers(self, task: str, epsilon: float, n: int | None, training_epsilon: float | None = None) -> bool:
        """Whether the private cell (task, ε) of a track of ``n`` training rows (None: unknown) whose runs each train
        at ``training_epsilon`` (None: ε) is declared."""
        if any(math.isclose(epsilon, listed, rel_tol=1e-9) for listed in self.cells.get(task, ())):
            return True
        spent = epsilon if training_epsilon is None else training_epsilon
        return self.n_epsilon_below is not None and n is not None and n * spent < self.n_epsilon_below


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


def from_grid(grid: dict[str, Any], where: str) -> Declaration:
    """The declaration of a grid (its ``infeasible`` value, checked against its tasks and ε)."""
    tasks, epsilons = grid.get("tasks"), grid.get("epsilons")
    return parse(grid.get("infeasible"), tasks if isinstance(tasks, list) else None,
                 epsilons if isinstance(epsilons, list) else None, where)


def training_size(runs: list[dict[str, Any]]) -> int | None:
    """n of the rule: the largest ``n_train`` among the private ``runs`` (a track's; module docstring; verify checks a
    private record's n_train, not a non-private one's); None if none says."""
    sizes = [run.get("n_train") for run in runs if run.get("private") is True]
    sizes = [n for n in sizes if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return max(sizes) if sizes else None


def training_epsilon(column: Column, track: str, runs: list[dict[str, Any]]) -> float:
    """ε_train of the rule for the column's ``runs`` in ``track``: in the random-stopping track, the largest per-trial
    ε of their private random-stopping tunings (``dpbench verify`` refuses a per-trial ε below what the tuning spent;
    a larger one only declares less); the column's ε in every other track, and wherever a run states no such ε (a
    field of another track's record is not read: it would be unchecked)."""
    if track != "random-stopping":
        return column.epsilon
    per_trial = []
    for run in runs:
        tuning = run.get("tuning") or {}
        epsilon = tuning.get("per_trial_epsilon")
        if tuning.get("mode") != "random-stopping" or tuning.get("private") is not True or not _positive(epsilon):
            return column.epsilon
        per_trial.append(epsilon)
    return max(per_trial) if per_trial else column.epsilon


def declare(tables: list[Table], declaration: Declaration) -> list[Table]:
    """Mark each table's declared infeasible (track, ε) (``Table.infeasible``), for the check and the renderers."""
    for table in tables:
        runs: dict[str, dict[Column, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
        for (row, column), cell in table.cells.items():
            runs[row.tuning][column] += cell.runs
        found = set()
        for track, by_column in runs.items():
            n = training_size([run for column_runs in by_column.values() for run in column_runs])
            for column, column_runs in by_column.items():
                if column.kind != "non-private" and declaration.covers(table.task, column.epsilon, n,
                                                                       training_epsilon(column, track, column_runs)):
                    found.add((track, column.epsilon))
        table.infeasible = frozenset(found)
    return tables
