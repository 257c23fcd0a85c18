"""``dpbench leaderboard --check``: what a reader would find wrong with a board, listed, unless explained.

Violations (each a line: kind, task, relation, track, method, ε, and the numbers), in every track:

* ``above-reference``: a private cell, in any track, above the task's converged non-private reference
  (:mod:`dpbench.tuning.reference`) by more than two standard errors of the difference (the reference is the
  minimizer of the loss every method trains: a private cell above it is selection noise on the test set, or a bug);
* ``above-non-private``: a private cell above the same task's validation-tuned non-private baseline by more than two
  standard errors of the difference (private training should not beat the tuned non-private reference);
* ``decreasing``: a method's mean at some ε below its mean at a smaller ε (any two, not only neighbours) by more than
  two standard errors of the difference (a method should not get worse with more budget); reported at the larger ε;
* ``collapsed``: a cell of two seeds or more at or above the test set's majority-class rate but not significantly
  above it (the board's "not above trivial": one-sided one-sample t-test over seeds, α = 0.05);
* ``below-majority``: a cell whose mean is below the majority-class rate (worse than predicting one class);
* ``wide-interval``: a cell whose 95% interval is wider than 0.1 where no comparison has decided it: in a column's
  tied set (≈), or in a column where it was not compared (a tie, or a rank, that may rest on too few seeds). A cell
  the column's Welch-Holm comparison shows below the best, or the winner (▲), was decided despite its width, and a
  collapsed or below-majority cell is reported as such: they are left out. (On the rebuild's first 700 private cells
  the literal rule, every interval wider than 0.1, listed 283: 93 collapsed, below the majority rate or declared
  infeasible, 53 significantly below their column's best, 5 winners, 136 tied.) Declared-infeasible cells are left
  out too: nothing was expected to learn there, and their test is ``infeasible-above-trivial`` (which a wide
  interval leaves with little power: at n·ε_train < 150 that is the regime, not a defect of one cell);
* ``boundary-hit``: a method whose selections, over its cells of a task and track (every ε, every study), lie on a
  boundary of the space their trials drew from (:mod:`dpbench.board.boundary`: the end of an ordered numeric list,
  the outer 5% of a range), or at the top of the compute budget (``epochs``, ``steps``), significantly more often
  than a selection among near-tied trials would by chance (the Poisson-binomial upper tail of the selections'
  chances, Holm-corrected across every such test of the board that could hit, α = 0.05), with the hyperparameters,
  ends and ε named: the search lists, not the method, decide the cells. (One selection on an end says little:
  DP-SGD's adult space puts 76% of uniform draws on some boundary, so a per-cell rule would list most cells of a
  board whose lists do not bind.)
* ``inconsistent-runs``: a cell whose runs disagree on the test set's majority-class rate or size
  (``test_majority_rate``, ``n_test``: verify ties both to the task's test set, but the board also reads records
  verify has not seen); the cell's tests that read them do not run (review of 27 November: one seed's rate changed by
  1e-7 switched its ``collapsed`` off);
* ``seeds``: a cell whose runs are not the grid's seeds 0, ..., k − 1 for its task, each once (too few, others,
  repeats, or ``--secret-seed`` runs, which a sweep never makes: five seeds picked from ten, a seed's run repeated,
  or one run copied under secret seeds, passed), or of a task the grid does not name; without a grid, a cell of
  fewer than two public seeds, or with a seed repeated or secret (a secret seed cannot be told from a copy). Its
  interval, its t-test against the majority-class rate and its column's comparison rest on other runs than the
  board's statistics assume, and a cell of one seed has none of them, so that every other check passed it silently
  (a sweep stopped mid-cell, runs added by hand). In tables of every metric, where the rest apply to accuracies
  (higher is better) only;
* ``mixed-code``: a method with runs of more than one version of its code in a table's track (whatever their
  hyperparameters or ε): a store that kept the runs of code since edited shows the method twice, and its rows are
  compared as two methods (the rebuild's store held quantile_clip's validation cells of two versions of its file).
  Reported once per track and method, ε None (the detail names each version's ε); the board of one version exports
  only that version's runs;
* ``infeasible-above-trivial``: a cell the grid declares infeasible (:mod:`dpbench.board.infeasible`) whose mean is
  significantly above the majority-class rate: the declaration is wrong. Declared cells are never reported
  ``collapsed`` or ``below-majority``: nothing was expected to learn there.

The declarations are the ``infeasible`` key of the grid (by default ``grid.json`` beside the records file; ``--grid``).

An exceptions file (JSON list; by default ``exceptions.json`` beside the records file) explains the ones that remain
after investigation, one entry per cause, with the command that tests it (:mod:`dpbench.board.exceptions`). Every cell
an entry names must match a violation of its kinds: one that matches none is a stale explanation, itself a violation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpbench.board import boundary, exceptions
from dpbench.board.exceptions import Explanation
from dpbench.board.model import Cell, Table
from dpbench.board.reference import reference as reference_of
from dpbench.board.stats import ALPHA, holm

KINDS = ("above-reference", "above-non-private", "decreasing", "collapsed", "below-majority", "wide-interval",
         "boundary-hit", "infeasible-above-trivial", "inconsistent-runs", "seeds",
         "mixed-code")
#: fields the cell's statistics read from its runs (verify ties them to the task's test set; the board also reads files
#: it has not seen): runs disagreeing on one left the cell without a majority rate (its collapsed, below-majority and
#: infeasible tests silently off) or a test size
SHARED = ("test_majority_rate", "n_test")
WIDEST_INTERVAL = 0.1
_BELOW = 1e-9  # a mean this far under the rate is below it (not float rounding of equal accuracies)
EVERY_TASK = "every task"  # the task of a boundary-hit pooled over a method's tasks


@dataclass(frozen=True)
class Violation:
    kind: str
    task: str
    relation: str | None
    track: str
    method: str
    epsilon: float | None
    detail: str

    def line(self) -> str:
        every = self.kind in ("boundary-hit", "mixed-code")
        budget = ("every ε" if every else "non-private") if self.epsilon is None else f"ε = {self.epsilon:g}"
        relation = f" ({self.relation})" if self.relation else ""
        return f"{self.kind}: {self.task}{relation} · {self.track} · {self.method} · {budget}: {self.detail}"


def _se_difference(a: Cell, b: Cell) -> float:
    return math.sqrt((a.se or 0.0) ** 2 + (b.se or 0.0) ** 2)


def _cell_violations(cell: Cell, reference: Cell | None, private: bool, infeasible: bool = False,
                     decided: bool = False) -> list[tuple[str, str]]:
    """(kind, detail) of one cell's violations other than ``decreasing``, ``above-reference`` and ``boundary-hit``;
    ``infeasible``: the grid declares the cell infeasible; ``decided``: its column's comparison made it the winner or
    showed it below the best."""
    found = []
    rate = cell.majority_rate
    disagreeing = [key for key in SHARED if not cell.agrees(key)]
    if disagreeing:
        found.append(("inconsistent-runs", f"its runs disagree on {', '.join(disagreeing)}: the tests that read them "
                                           f"did not run"))
    if infeasible:
        p = cell.trivial_p
        if p is not None and p < ALPHA:
            found.append(("infeasible-above-trivial", f"declared infeasible, but its mean {cell.mean:.4f} is "
                                                      f"significantly above the majority-class rate {rate:.4f} "
                                                      f"(one-sided t-test p = {p:.3g})"))
    elif rate is not None and cell.mean < rate - _BELOW:
        found.append(("below-majority", f"mean {cell.mean:.4f} below the majority-class rate {rate:.4f}"))
    elif cell.not_above_trivial:
        found.append(("collapsed", f"mean {cell.mean:.4f} not significantly above the majority-class rate "
                                   f"{rate:.4f} (one-sided t-test p = {cell.trivial_p:.3g})"))
    interval = cell.ci95
    reported = any(kind in ("below-majority", "collapsed") for kind, _ in found)
    if not (decided or reported or infeasible) and interval is not None and interval[1] - interval[0] > WIDEST_INTERVAL:
        found.append(("wide-interval", f"95% interval [{interval[0]:.4f}, {interval[1]:.4f}] wider than "
                                       f"{WIDEST_INTERVAL:g} (n = {cell.n_seeds}), undecided in its column"))
    if reference is not None and private:
        excess, bound = cell.mean - reference.mean, 2 * _se_difference(cell, reference)
        if excess > bound and excess > 0:
            found.append(("above-non-private", f"{cell.mean:.4f} vs the tuned non-private {reference.mean:.4f} "
                                               f"(2 SE = {bound:.4f})"))
    return found


def _decreasing(points: list[tuple[float, Cell]]) -> list[tuple[float, str]]:
    """(larger ε, detail) wherever a row's mean falls below its mean at any smaller ε by more than 2 SE."""
    points = sorted(points, key=lambda point: point[0])
    found = []
    for index, (high, b) in enumerate(points):
        drops = [f"{a.mean:.4f} at ε = {low:g} (2 SE = {2 * _se_difference(a, b):.4f})"
                 for low, a in points[:index] if a.mean - b.mean > 2 * _se_difference(a, b) and a.mean > b.mean]
        if drops:
            found.append((high, f"{b.mean:.4f} at ε = {high:g} below " + ", ".join(drops)))
    return found


def _boundary_hits(tables: list[Table]) -> list[Violation]:
    """``boundary-hit`` per (task, relation, track, method), and per (relation, track, method) over every task (task
    ``every task``), whose selections hit a boundary, or the budget's top, more often than chance (module
    docstring); ε is None (the detail names the cells' ε, with their task where pooled)."""
    groups: dict[tuple, list[tuple[str, boundary.Study]]] = {}  # each selection with its cell's ε, as named
    pooled: dict[tuple, list[tuple[str, str, boundary.Study]]] = {}
    for table, row, column, cell in boundary.tuned_cells(tables):
        epsilon = "non-private" if column.kind == "non-private" else f"{column.epsilon:g}"
        groups.setdefault((table.task, table.neighbouring, row.tuning, row.method), []).extend(
            (epsilon, study) for study in boundary.studies(cell))
        pooled.setdefault((table.neighbouring, row.tuning, row.method), []).extend(
            (table.task, epsilon, study) for study in boundary.studies(cell))
    for (relation, tuning, method), selections in pooled.items():  # every task together, where there are several:
        if len({task for task, _, _ in selections}) > 1:  # five selections per task left a budget that binds on
            # every task unlisted (27 November: epochs at the top in 117 of 436 validation cells, 18% by chance)
            groups[(EVERY_TASK, relation, tuning, method)] = [(f"{task} {e}", study) for task, e, study in selections]
    tests = []  # (key, what, (hit, chance) per selection, selections); a test that cannot hit is no test
    for key, selections in sorted(groups.items(), key=lambda item: str(item[0])):
        for what, outcomes in (("on a boundary", [study.outcome for _, study in selections]),
                               ("at the top of the compute budget", [study.budget_outcome for _, study in selections])):
            if any(hit or p > 0 for hit, p in outcomes):
                tests.append((key, what, outcomes, selections))
    pvalues = [boundary.tail(outcomes) for _, _, outcomes, _ in tests]
    found = []
    for (key, what, outcomes, selections), p, adjusted in zip(tests, pvalues, holm(pvalues)):
        if adjusted >= ALPHA:
            continue
        hits, expected = sum(hit for hit, _ in outcomes), sum(chance for _, chance in outcomes)
        ends: dict[tuple[str, str], list[str]] = {}
        for epsilon, study in selections:
            for name, end in study.hits.items():
                ends.setdefault((name, end), []).append(epsilon)
        named = "; ".join(f"{name} {end} at ε = {', '.join(sorted(set(at), key=lambda e: (e == 'non-private', e)))}"
                          for (name, end), at in sorted(ends.items(), key=lambda item: -len(item[1])))
        found.append(Violation("boundary-hit", *key, None,
                               f"{hits} of {len(outcomes)} selections {what}, {expected:.1f} expected by chance "
                               f"(P = {p:.2g}, Holm-adjusted {adjusted:.2g}): {named}"))
    return found


def _seeds(cell: Cell, asked: int | None) -> str | None:
    """What is wrong with the cell's seeds (``seeds``, module docstring), else None. ``asked``: the grid's k for the
    task, 0 if the grid does not name it, None without a grid."""
    seeds = [run["seed"] for run in cell.runs]
    public = sorted(seed for seed in seeds if seed != "secret")
    secret = len(seeds) - len(public)
    shown = f"seeds {', '.join(map(str, public)) or 'none'}{f' and {secret} secret' if secret else ''}"
    if asked == 0:
        return f"{shown}, of a task the grid does not name"
    if asked is None:
        if len(set(public)) >= 2 and len(public) == len(set(public)) and not secret:
            return None
        return f"{shown}: not two seeds or more, each run once (a secret seed cannot be told from a copy)"
    if public == list(range(asked)) and not secret:
        return None
    return (f"{shown}, not the grid's 0 to {asked - 1}, each once: its interval, tests and comparisons rest on other "
            f"runs")


def _mixed_code(table: Table) -> list[Violation]:
    """``mixed-code`` (module docstring): per track and method (whatever its hyperparameters or ε), the code versions
    of its rows, reported once with the ε of each."""
    versions: dict[tuple, dict[str, set[str]]] = {}
    for row, column in table.cells:
        key = (row.tuning, row.method, row.sampler, row.accountant, row.external, row.isolation)
        versions.setdefault(key, {}).setdefault(row.code, set()).add(column.label)
    return [Violation("mixed-code", table.task, table.neighbouring, tuning, method, None,
                      f"runs of {len(codes)} versions of its code, shown as separate rows: " + "; ".join(
                          f"{code[:12] or 'unrecorded'} at {', '.join(sorted(labels))}"
                          for code, labels in sorted(codes.items())))
            for (tuning, method, *_), codes in versions.items() if len(codes) > 1]


def violations(tables: list[Table]) -> list[Violation]:
    found: list[Violation] = _boundary_hits(tables)
    for table in tables:
        found += _mixed_code(table)
        for (row, column), cell in table.cells.items():
            problem = _seeds(cell, table.seeds_asked)
            if problem is not None:
                found.append(Violation("seeds", table.task, table.neighbouring, row.tuning, row.method,
                                       column.epsilon if column.kind != "non-private" else None, problem))
        if table.direction != "higher":
            continue
        reference = next((cell for (row, column), cell in table.cells.items()
                          if column.kind == "non-private" and row.tuning == "validation"), None)
        converged = reference_of(table)
        comparisons = table.comparisons()
        by_row: dict[Any, list[tuple[float, Cell]]] = {}
        for (row, column), cell in table.cells.items():
            private = column.kind != "non-private"
            epsilon = column.epsilon if private else None
            infeasible = table.declared_infeasible(column, row.tuning)
            marks, adjusted = comparisons.get((row.tuning, column), ({}, {}))
            decided = marks.get(row) == "winner" or adjusted.get(row, 1.0) < ALPHA
            found += [Violation(kind, table.task, table.neighbouring, row.tuning, row.method, epsilon, detail)
                      for kind, detail in _cell_violations(cell, reference, private, infeasible, decided)]
            if converged is not None and private:
                excess, two_se = cell.mean - converged[1].mean, 2 * _se_difference(cell, converged[1])
                if excess > two_se and excess > 0:
                    found.append(Violation("above-reference", table.task, table.neighbouring, row.tuning,
                                           row.method, epsilon, f"{cell.mean:.4f} vs the converged reference "
                                           f"{converged[1].mean:.4f} (2 SE = {two_se:.4f})"))
            if column.kind == "target":
                by_row.setdefault(row, []).append((column.epsilon, cell))
        for row, points in by_row.items():
            found += [Violation("decreasing", table.task, table.neighbouring, row.tuning, row.method, high, detail)
                      for high, detail in _decreasing(points)]
    return sorted(set(found), key=lambda v: (v.task, v.kind, v.track, v.method, v.epsilon or 0.0, v.relation or ""))


def check(tables: list[Table], explanations: list[Explanation]) -> list[str]:
    """The lines to report: unexplained violations, and explanations (or cells they name) that match nothing."""
    found = violations(tables)
    problems = [v.line() for v in found if not any(entry.explains(v) for entry in explanations)]
    for entry in explanations:
        stale = entry.stale(found)
        if stale:
            problems.append(f"stale exception ({', '.join(stale)} matches no violation): {entry.text}")
    return problems


def load_exceptions(path: Path) -> list[Explanation]:
    """The exceptions file at ``path`` (:mod:`dpbench.board.exceptions`)."""
    return exceptions.load(path, KINDS)
