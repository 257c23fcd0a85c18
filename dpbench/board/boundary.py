"""Boundary hits: a tuned cell whose selected hyperparameters lie on a boundary of the space its trials drew from.

A selection at the edge of its search list says the list, not the method, may have decided the cell: a learning rate
at the top of its range might have gone higher, epochs (or a full-batch method's steps) at the largest choice mean
the compute budget may bind. What counts as a boundary, per entry of the space (``tuning.config.search_space``,
else ``tuning.search_space``: the space the trials drew from):

* an ordered numeric categorical list of three or more distinct numbers (epochs, steps, batch sizes, AMP's
  constants): the selected value equals its smallest choice ("low") or its largest ("high"). A list of two numbers
  is a switch (momentum on or off), not a range with an inside: it has no boundary (a budget list of two would be
  hit by every selection, so the budgets' lists have four or more);
* a float or int range ``{low, high[, log]}``: the selected value lies in the outer 5% of the range (:data:`EDGE`),
  measured in log space where the range is log-scaled ("low" or "high");
* a categorical list of anything else (variant names, booleans, None among the choices): not ordered, no boundary.

What a cell counts. A cell's *studies* are its separate selections: the validation track selects one configuration
per cell and runs every seed with it (one study; several only if the cell's records hold several selections), the
random-stopping track runs one study per tuning seed (each record is one released study, told apart by
``tuning.study``). A cell's hit fraction is the share of its studies whose selection lies on some boundary; the
boundary-hit rate of a method (:func:`rates`) is the mean of its cells' fractions, so every (task, ε) cell weighs
the same whatever its number of studies (with five tuning seeds everywhere it is the share of studies). ``dpbench
leaderboard --check`` tests a method's selections of a task and track against chance (below; ``boundary-hit`` in
:mod:`dpbench.board.check`).

Only tuned tracks have selections: rows of the ``none`` track and the converged references are never counted.

What a rate is compared with: chance. Where the held-out scores of a cell's trials are near-ties (a flat optimum, or
differences under the selection's noise), the selection is in effect a uniform draw among its trials, whose
configurations are draws from the search space; a list of four batch sizes then has its selection on an end half
the time, and a space of several lists almost always has some hit. :func:`chance` is that probability for a space
(each entry's probability of a boundary under the search's uniform draws: the share of a list's choices at its
ends, 2 · :data:`EDGE` of a range; the entries independent), and :func:`rates` sets each method's observed rate
beside the mean of its studies' chances, with the probability of at least as many hits by chance (Poisson-binomial
upper tail over the studies). A rate above chance with a small probability says the lists bind (the selections
press against an end); a rate at chance says nothing either way, since a budget that does not bind is hit at
chance. The same for the budget alone: a selection at the top of its ``epochs`` or ``steps`` list, against the
share of the list's choices at its top.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dpbench.board.model import Cell, Column, Row, Table

EDGE = 0.05  # the outer share of a float range (each end) that counts as its boundary
BUDGET_KEYS = ("epochs", "steps")  # a "high" hit on these: the compute budget may bind


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _position(value: float, low: float, high: float, log: bool) -> float | None:
    """Where ``value`` lies in [low, high], 0 at low and 1 at high (log scale if ``log``); None if undefined."""
    if log:
        if min(value, low, high) <= 0:
            return None
        value, low, high = math.log(value), math.log(low), math.log(high)
    return None if high <= low else (value - low) / (high - low)


def boundary(entry: dict[str, Any], value: Any) -> str | None:
    """"low" or "high" if ``value`` lies on that boundary of the search-space ``entry``, else None."""
    if not isinstance(entry, dict) or not _number(value):
        return None
    if entry.get("type") == "categorical":
        choices = entry.get("choices")
        if not isinstance(choices, list) or not all(_number(choice) for choice in choices) or len(set(choices)) < 3:
            return None  # not an ordered numeric list: names, booleans, None, or nothing to choose
        return "low" if value <= min(choices) else "high" if value >= max(choices) else None
    if entry.get("type") in ("float", "int") and _number(entry.get("low")) and _number(entry.get("high")):
        where = _position(value, entry["low"], entry["high"], bool(entry.get("log")))
        if where is None:
            return None
        return "low" if where <= EDGE else "high" if where >= 1 - EDGE else None
    return None


def _entry_chance(entry: dict[str, Any], ends: tuple[str, ...] = ("low", "high")) -> float:
    """The probability that the search's uniform draw from ``entry`` lies on one of its ``ends`` (:func:`boundary`)."""
    if not isinstance(entry, dict):
        return 0.0
    if entry.get("type") == "categorical":
        choices = entry.get("choices")
        if not isinstance(choices, list) or not choices:
            return 0.0
        return sum(boundary(entry, choice) in ends for choice in choices) / len(choices)
    if entry.get("type") in ("float", "int") and _number(entry.get("low")) and _number(entry.get("high")):
        low, high = entry["low"], entry["high"]
        if entry.get("type") == "int" and not entry.get("log") and high - low < 100_000:
            values = range(int(low), int(high) + 1)
            return sum(boundary(entry, value) in ends for value in values) / len(values)
        if _position(high, low, high, bool(entry.get("log"))) is None:
            return 0.0
        return EDGE * len(ends)  # uniform on its (log) scale
    return 0.0


def chance(space: dict[str, Any], names: tuple[str, ...] | None = None, ends: tuple[str, ...] = ("low", "high")) \
        -> float:
    """The probability that a uniform draw from ``space`` (only its ``names``, if given) lies on some boundary (one
    of ``ends``): the rate a selection among near-tied trials hits by chance (module docstring)."""
    miss = 1.0
    for name, entry in (space or {}).items():
        if names is None or name in names:
            miss *= 1.0 - _entry_chance(entry, ends)
    return 1.0 - miss


def upper_tail(observed: int, chances: list[float]) -> float:
    """P(S ≥ ``observed``) for S a sum of independent Bernoulli(p) over ``chances`` (Poisson-binomial), exactly."""
    distribution = [1.0]
    for p in chances:
        distribution = [(distribution[k] if k < len(distribution) else 0.0) * (1 - p)
                        + (distribution[k - 1] * p if k >= 1 else 0.0) for k in range(len(distribution) + 1)]
    return min(1.0, sum(distribution[observed:]))


def tail(outcomes: list[tuple[bool, float]]) -> float:
    """P(at least as many of ``outcomes`` (hit, its chance) hit by chance as did): :func:`upper_tail`."""
    return upper_tail(sum(hit for hit, _ in outcomes), [p for _, p in outcomes])


def hits(space: dict[str, Any], selected: dict[str, Any]) -> dict[str, str]:
    """{hyperparameter: "low" | "high"} of the ``selected`` values on a boundary of ``space``."""
    found = {}
    for name, entry in sorted((space or {}).items()):
        if name in (selected or {}):
            end = boundary(entry, selected[name])
            if end is not None:
                found[name] = end
    return found


def _space(tuning: dict[str, Any]) -> dict[str, Any] | None:
    config = tuning.get("config") if isinstance(tuning.get("config"), dict) else {}
    space = config.get("search_space", tuning.get("search_space"))
    return space if isinstance(space, dict) else None


@dataclass(frozen=True)
class Study:
    """One selection: the space its trials drew from and the selected values."""

    space: dict[str, Any]
    selected: dict[str, Any]

    @cached_property
    def hits(self) -> dict[str, str]:
        return hits(self.space, self.selected)

    @cached_property
    def outcome(self) -> tuple[bool, float]:
        """(the selection lies on some boundary, the chance of that: :func:`chance` of its space)."""
        return bool(self.hits), chance(self.space)

    @cached_property
    def budget_outcome(self) -> tuple[bool, float]:
        """(the selection is at the top of its compute budget (``epochs`` or ``steps``), the chance of that)."""
        return (any(self.hits.get(name) == "high" for name in BUDGET_KEYS),
                chance(self.space, BUDGET_KEYS, ("high",)))


def studies(cell: Cell) -> list[Study]:
    """The cell's separate selections (module docstring): one per ``tuning.study`` (random stopping), else one per
    distinct (space, selection) (the validation track's one selection). Runs without a selection (untuned, the
    references) give none."""
    found: dict[str, Study] = {}
    for run in cell.runs:
        tuning = run.get("tuning")
        if not isinstance(tuning, dict) or not isinstance(tuning.get("selected_params"), dict):
            continue
        space = _space(tuning)
        if space is None:
            continue
        selected = tuning["selected_params"]
        key = str(tuning.get("study") or json.dumps([space, selected], sort_keys=True, default=str))
        found.setdefault(key, Study(space, selected))
    return list(found.values())


@dataclass(frozen=True)
class Hit:
    """A boundary of one hyperparameter hit by ``count`` of a cell's ``studies`` studies, at ``end``."""

    name: str
    end: str  # "low" or "high"
    count: int
    studies: int
    values: tuple[Any, ...]  # the selected values on that boundary
    entry: dict[str, Any]


def cell_hits(cell: Cell) -> tuple[int, list[Hit]]:
    """(the cell's number of studies, its hits by hyperparameter and end, most frequent first)."""
    found = studies(cell)
    by_end: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for study in found:
        for name, end in study.hits.items():
            by_end[name, end].append(study.selected[name])
    entries = {name: study.space[name] for study in found for name in study.space}
    listed = [Hit(name, end, len(values), len(found), tuple(values), entries[name])
              for (name, end), values in by_end.items()]
    return len(found), sorted(listed, key=lambda hit: (-hit.count, hit.name, hit.end))


def fraction(cell: Cell) -> float | None:
    """The share of the cell's studies that hit any boundary (None: no studies, an untuned cell)."""
    found = studies(cell)
    return sum(bool(study.hits) for study in found) / len(found) if found else None


def tuned_cells(tables: list[Table]) -> list[tuple[Table, Row, Column, Cell]]:
    """Every cell with selections, once (the non-private cells are shown in several tables of their task)."""
    seen: set[int] = set()
    found = []
    for table in tables:
        for (row, column), cell in sorted(table.cells.items(), key=lambda item: item[0]):
            if id(cell) in seen or row.tuning == "none" or not studies(cell):
                continue
            seen.add(id(cell))
            found.append((table, row, column, cell))
    return found


@dataclass
class Rate:
    """The boundary-hit rate of one method in one track (or of all, ``method`` = "all")."""

    track: str
    method: str
    cells: int = 0
    studies: int = 0
    hit_share: float = 0.0  # sum over cells of each cell's fraction of studies hitting
    by_end: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))  # studies hitting each
    chance_share: float = 0.0  # sum over cells of the mean chance of its studies' spaces
    outcomes: list[tuple[bool, float]] = field(default_factory=list)  # per study: (hit, chance)
    budget: list[tuple[bool, float]] = field(default_factory=list)  # per study: (at its budget's top, chance)

    @property
    def rate(self) -> float:
        return self.hit_share / self.cells if self.cells else 0.0

    @property
    def chance(self) -> float:
        return self.chance_share / self.cells if self.cells else 0.0

    @property
    def p_value(self) -> float:
        """P(at least this many studies hit by chance)."""
        return tail(self.outcomes)

    @property
    def budget_p_value(self) -> float:
        return tail(self.budget)

    def add(self, cell: Cell) -> None:
        n, found = cell_hits(cell)
        self.cells += 1
        self.studies += n
        self.hit_share += fraction(cell) or 0.0
        for hit in found:
            self.by_end[hit.name, hit.end] += hit.count
        selections = studies(cell)
        outcomes = [study.outcome for study in selections]
        self.outcomes += outcomes
        self.budget += [study.budget_outcome for study in selections]
        self.chance_share += sum(p for _, p in outcomes) / len(selections)


def rates(tables: list[Table]) -> list[Rate]:
    """The boundary-hit rate per (track, method), then per track over all its methods, then over every tuned cell
    (track "all tuned", method "all"): :attr:`Rate.rate` is the mean of the cells' fractions of studies hitting."""
    by_key: dict[tuple[str, str], Rate] = {}
    for _, row, _, cell in tuned_cells(tables):
        for key in [(row.tuning, row.method), (row.tuning, "all"), ("all tuned", "all")]:
            by_key.setdefault(key, Rate(*key)).add(cell)
    order = {"all tuned": 1}
    return sorted(by_key.values(), key=lambda r: (order.get(r.track, 0), r.track, r.method == "all", r.method))


def rates_markdown(tables: list[Table]) -> str:
    """:func:`rates` as a markdown table (``dpbench leaderboard --boundary-hits``), each rate beside its chance
    (module docstring), with which ends were hit."""
    lines = ["| track | method | cells | studies | boundary-hit rate | by chance | P(as many by chance) | "
             "budget at its top (studies) | by chance | P | hits (studies) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for rate in rates(tables):
        ends = ", ".join(f"{name} {end} {count}" for (name, end), count in
                         sorted(rate.by_end.items(), key=lambda item: (-item[1], item[0])))
        at_top = sum(hit for hit, _ in rate.budget)
        budget_chance = sum(p for _, p in rate.budget) / len(rate.budget) if rate.budget else 0.0
        lines.append(f"| {rate.track} | {rate.method} | {rate.cells} | {rate.studies} | {rate.rate:.1%} | "
                     f"{rate.chance:.1%} | {rate.p_value:.2g} | {at_top} ({at_top / max(1, rate.studies):.0%}) | "
                     f"{budget_chance:.0%} | {rate.budget_p_value:.2g} | {ends or '—'} |")
    return "\n".join(lines) + "\n"
