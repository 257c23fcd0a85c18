"""The leaderboard's model: which runs share a cell, the statistics of a cell, ranks and leaders, collapsed cells.

How runs are grouped, so that no cell mixes runs that are not comparable:

* A table holds the runs of one task, data id, δ, metric and neighbouring relation (ε under add/remove-one and
  under replace-one are not comparable). δ is compared at 10 significant digits (the release methods record δ as a
  sum of per-release δ's). Non-private runs appear as the "non-private" column in every table of their task, data
  id and metric, and in a table of their own when there are no private runs.
* A row is one method under one track (the record's ``tuning["mode"]``; "none" without tuning), sampler, accountant,
  code (the sha256 of the method's source files: an edited plugin gets a row of its own) and, for untuned runs, one
  set of hyperparameters. Tuned runs' hyperparameters are their tuning's output and do not split rows.
* A column is the run's target ε; runs given a noise multiplier go to "ε ≈ x (spent)" by their spent ε (2
  significant digits); non-private runs to "non-private".
* A cell is the runs of one row and column: the mean over seeds, the sample standard deviation, the standard error
  and a 95% interval (:func:`dpbench.board.stats.interval`: for accuracies Student's t on the empirical-logit scale,
  mapped back, inside [0, 1]); a seed run more than once counts once, with the mean of its runs.
* An accuracy cell is *not above trivial* unless its mean is significantly above the test set's majority-class rate
  (one-sided one-sample t-test over seeds, α = 0.05; :func:`dpbench.board.stats.above_rate_p`). It is greyed and
  never marked; cells of one seed are neither tested nor marked.
* Within a track and a column (:func:`dpbench.board.stats.compare_column`): the best eligible cell (two seeds or more,
  not "not above trivial") is compared with every other cell of two seeds or more by one-sided Welch t-tests, Holm's
  correction across them; it is the *winner* only if it beats all of them, otherwise it and the eligible cells not
  significantly below it are *tied*. Tracks are never compared with each other: they charge different things to the
  budget. Rows are listed by method, not ranked.
* A row of an external plugin says so, and how far it can be trusted (:func:`~dpbench.trust.marks.plugin_mark`):
"isolated" only when
  its runs ran the method in a process of its own (``dpbench run --isolate``, :mod:`dpbench.run.isolation`: the method
  never held the data), otherwise "unverified: in-process plugin"; then, as evidence only, whether a white-box audit
  of the same code on the task passed (``dpbench audit``): "unaudited" unless one did, "audit failed" if any failed.
  A passed audit never makes an in-process plugin verified: a plugin can behave differently under audit.
* The seed papers' published figures (:mod:`dpbench.board.published`) are rows of their own, never averaged with
  measurements and never ranked.
* The converged non-private references (:mod:`dpbench.tuning.reference`, tuning mode ``reference``) are no track:
  they are held apart (``Table.references``), in every table of their task, data id and metric, never ranked; what
  the board shows of them is :mod:`dpbench.board.reference`.
* The grid's notes (:mod:`dpbench.board.notes`) mark the cells they name, a disclosure beside the value.
* A private (track, ε) column of a task that the grid declares infeasible (:mod:`dpbench.board.infeasible`: nothing
  is expected to learn there) is listed in ``Table.infeasible``, for the renderers to draw as "infeasible (declared)".
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dpbench.board import stats
from dpbench.board.published import PUBLISHED, PublishedResult
from dpbench.choices import REFERENCE_MODE
from dpbench.errors import UsageError
from dpbench.trust.marks import AuditEvidence, plugin_mark

NOT_PRIVATE_TUNING = "tuning not private"
TRACK_ORDER = ("validation", "random-stopping", "adaptive", "none", "oracle")
TRACK_NOTES = {
    "validation": "selection not charged: 16 trials per method on held-out training data, then the seeds",
    "random-stopping": "tuning charged: the total ε covers the random number of trials (Papernot & Steinke)",
    "adaptive": "tuning charged: every trial composed",
    "none": "each method's defaults, the task's epochs and batch size",
    "oracle": f"{NOT_PRIVATE_TUNING}: selected on the test set",
}
_DIRECTIONS = [("accuracy", "higher"), ("error", "lower"), ("loss", "lower")]  # by substring of the metric name


def _round_significant(value: float, digits: int) -> float:
    return float(f"{value:.{digits}g}")


def tuning_mode(record: dict[str, Any]) -> str:
    """The record's track: ``tuning["mode"]``, or "none" for records without tuning."""
    tuning = record.get("tuning")
    if tuning is None:
        return "none"
    if not isinstance(tuning, dict) or not isinstance(tuning.get("mode"), str):
        raise UsageError(f"run {record.get('run_id')}: 'tuning' must be a dict with a 'mode', got {tuning!r}")
    return tuning["mode"]


def tuning_label(mode: str) -> str:
    """The track as shown: "oracle" (test-set selection) always says that the tuning was not private."""
    return f"{mode} ({NOT_PRIVATE_TUNING})" if mode == "oracle" else mode


def metric_name(record: dict[str, Any]) -> str:
    """``test_accuracy`` if the run measured it, else the first metric of the record (by name, as stored)."""
    metrics = record["metrics"]
    if "test_accuracy" in metrics:
        return "test_accuracy"
    if not metrics:
        raise UsageError(f"run {record.get('run_id')} has no metrics")
    return next(iter(metrics))


def metric_direction(metric: str) -> str | None:
    """"higher" or "lower" (is better), or None when the name does not say."""
    for part, direction in _DIRECTIONS:
        if part in metric:
            return direction
    return None


@dataclass(frozen=True, order=True)
class Column:
    """An ε column: ``kind`` is "target", "spent" (noise multiplier given) or "non-private"."""

    epsilon: float  # math.inf for non-private
    kind: str

    @property
    def label(self) -> str:
        if self.kind == "non-private":
            return "non-private"
        return f"ε ≈ {self.epsilon:g} (spent)" if self.kind == "spent" else f"ε = {self.epsilon:g}"


def epsilon_column(record: dict[str, Any]) -> Column:
    if not record["private"]:
        return Column(math.inf, "non-private")
    if record["epsilon_target"] is not None:
        return Column(_round_significant(record["epsilon_target"], 10), "target")
    return Column(_round_significant(record["epsilon"], 2), "spent")


@dataclass(frozen=True, order=True)
class Row:
    tuning: str
    method: str
    sampler: str
    accountant: str  # "" for non-private runs
    hyperparameters: str  # canonical JSON for untuned runs, "" for tuned ones
    code: str = ""  # sha256 of the method's source files: runs of different code never share a row
    external: bool = False  # a user's plugin, not a built-in method
    isolation: str = ""  # an external plugin's: "process" (dpbench.run.isolation) or "in-process"; "" for built-ins


def row_of(record: dict[str, Any]) -> Row:
    mode = tuning_mode(record)
    code = (record.get("code") or {}).get("method") or {}
    return Row(mode, record["method"], str(record["sampler"]), record["accountant"] or "",
               json.dumps(record["hyperparameters"], sort_keys=True) if mode in ("none", REFERENCE_MODE) else "",
               code.get("sha256", ""), bool(code.get("external")),
               (record.get("isolation") or "in-process") if code.get("external") else "")


@dataclass
class Cell:
    """The runs of one row and column of a table, and their metric over seeds."""

    metric: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    @cached_property
    def per_seed(self) -> dict[tuple[int, str], float]:
        """The metric per seed; a ``--secret-seed`` run (seed "secret") is a seed of its own, keyed by its run id."""
        by_seed: dict[tuple[int, str], list[float]] = defaultdict(list)
        for run in self.runs:
            key = (0, run["run_id"]) if run["seed"] == "secret" else (run["seed"], "")
            by_seed[key].append(run["metrics"][self.metric])
        return {seed: statistics.fmean(values) for seed, values in sorted(by_seed.items())}

    @property
    def values(self) -> list[float]:
        return list(self.per_seed.values())

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    @property
    def n_seeds(self) -> int:
        return len(self.per_seed)

    @property
    def se(self) -> float | None:
        return None if self.std is None else self.std / math.sqrt(self.n_seeds)

    @property
    def bounded(self) -> bool:
        """An accuracy: its interval stays in [0, 1]."""
        return "accuracy" in self.metric and all(0 <= value <= 1 for value in self.values)

    def agrees(self, key: str) -> bool:
        """Whether the runs hold one value of ``key`` (a field the stored-record check does not cover)."""
        values = [run.get(key) for run in self.runs]
        return all(value == values[0] for value in values)

    def _shared(self, key: str) -> Any:
        """The runs' common value of a field that the stored-record check does not cover, else None."""
        return self.runs[0].get(key) if self.agrees(key) else None

    @property
    def n_test(self) -> int | None:
        size = self._shared("n_test")
        return size if isinstance(size, int) and not isinstance(size, bool) and 0 < size < 2**53 else None

    @property
    def ci95(self) -> tuple[float, float] | None:
        """The 95% interval over seeds (:func:`dpbench.board.stats.interval`; None for one seed)."""
        return stats.interval(self.values, self.n_test, self.bounded)

    @property
    def run_ids(self) -> list[str]:
        return [run["run_id"] for run in self.runs]

    @property
    def majority_rate(self) -> float | None:
        rate = self._shared("test_majority_rate")
        return float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 <= rate <= 1 \
            else None

    @property
    def trivial_p(self) -> float | None:
        """One-sided p-value that the mean accuracy exceeds the majority-class rate (None: one seed, no known rate,
        or not an accuracy)."""
        rate = self.majority_rate
        if rate is None or "accuracy" not in self.metric:
            return None
        return stats.above_rate_p(self.values, rate)

    @property
    def not_above_trivial(self) -> bool:
        """Not significantly above the majority-class rate (module docstring); False where untested."""
        p = self.trivial_p
        return p is not None and p >= stats.ALPHA


@dataclass
class Table:
    task: str
    data_id: str
    delta: float | None  # None: a table of non-private runs only
    metric: str
    neighbouring: str | None = None  # of every private run in the table: ε under other relations is not comparable
    cells: dict[tuple[Row, Column], Cell] = field(default_factory=dict)
    published: list[PublishedResult] = field(default_factory=list)
    #: the audits of external plugins (``dpbench.trust.audit.audit_status``)
    audits: AuditEvidence = field(default_factory=AuditEvidence)
    references: dict[Row, Cell] = field(default_factory=dict)  # the task's converged non-private references
    #: the (track, ε) of the private columns the grid declares infeasible (:mod:`dpbench.board.infeasible`; set by
    #: its ``declare``)
    infeasible: frozenset[tuple[str, float]] = field(default_factory=frozenset)
    #: the grid's count k of seeds for the task (its cells must hold seeds 0, ..., k − 1; set from the grid by
    #: ``dpbench.board.leaderboard``); 0 if the grid does not name the task, None without a grid
    seeds_asked: int | None = None
    #: the grid's notes (:mod:`dpbench.board.notes`; set by its ``annotate``): each noted cell's marks, and the
    #: (mark, text) of the notes this table shows
    cell_notes: dict[tuple[Row, Column], str] = field(default_factory=dict)
    notes: list[tuple[str, str]] = field(default_factory=list)

    @property
    def direction(self) -> str | None:
        return metric_direction(self.metric)

    def declared_infeasible(self, column: Column, track: str | None = None) -> bool:
        """The grid declares this private column of ``track`` infeasible ("infeasible (declared)"; never
        ``collapsed``); without a track: in every track of the table that has runs in it."""
        if column.kind == "non-private":
            return False
        if track is not None:
            return (track, column.epsilon) in self.infeasible
        present = {row.tuning for row, c in self.cells if c == column}
        return bool(present) and all((t, column.epsilon) in self.infeasible for t in present)

    def column_label(self, column: Column, track: str | None = None) -> str:
        """The column's heading (in ``track``'s table; without one, for every track): its ε, and "infeasible
        (declared)" where the grid declares it so."""
        return f"{column.label} · infeasible (declared)" if self.declared_infeasible(column, track) else column.label

    @property
    def sign(self) -> int:
        return -1 if self.direction == "lower" else 1

    @property
    def runs(self) -> list[dict[str, Any]]:
        return [run for cell in [*self.cells.values(), *self.references.values()] for run in cell.runs]

    @property
    def tracks(self) -> list[str]:
        present = {row.tuning for row, _ in self.cells}
        return sorted(present, key=lambda t: (TRACK_ORDER.index(t) if t in TRACK_ORDER else len(TRACK_ORDER), t))

    @property
    def columns(self) -> list[Column]:
        columns = {column for _, column in self.cells} | {published_column(entry) for entry in self.published}
        return sorted(columns)

    def rows(self, track: str | None = None) -> list[Row]:
        """The rows (of one track), by track, then method: not ranked."""
        return sorted({row for row, _ in self.cells if track is None or row.tuning == track},
                      key=lambda row: (self.tracks.index(row.tuning), row))

    def comparisons(self) -> dict[tuple[str, Column], tuple[dict[Row, str], dict[Row, float]]]:
        """Per (track, column): the marks {row: "winner" | "tied"} and the Holm-adjusted p-values of the best against
        each other row (:func:`dpbench.board.stats.compare_column`); none where the metric's direction is unknown."""
        if self.direction is None:
            return {}
        by_column: dict[tuple[str, Column], dict[Row, Cell]] = defaultdict(dict)
        for (row, column), cell in sorted(self.cells.items()):
            by_column[row.tuning, column][row] = cell
        return {key: stats.compare_column({row: cell.values for row, cell in cells.items()},
                                          {row for row, cell in cells.items() if not cell.not_above_trivial},
                                          self.sign) for key, cells in by_column.items()}

    def row_labels(self) -> dict[Row, str]:
        """The method, marked if it is an external plugin, with the hyperparameters (or code) that differ between
        rows of the same method, track, sampler and accountant."""
        by_method: dict[tuple[str, str, str, str], list[Row]] = defaultdict(list)
        for row in self.rows():
            by_method[row.tuning, row.method, row.sampler, row.accountant].append(row)
        labels = {}
        for rows in by_method.values():
            settings = [json.loads(row.hyperparameters) if row.hyperparameters else {} for row in rows]
            differing = sorted({key for s in settings for key in s if any(o.get(key) != s.get(key) for o in settings)})
            codes = {row.code for row in rows}
            for row, setting in zip(rows, settings):
                shown = [f"{key}={setting.get(key, '—')}" for key in differing]
                if len(codes) > 1:  # the same method name, different code (an edited plugin)
                    shown.append(f"code {row.code[:8]}")
                audit = self.audits.of((row.code, self.task, row.isolation or "in-process"),
                                       [run for run in self.runs if row_of(run) == row])
                name = f"{row.method} [external plugin, {plugin_mark(row.isolation, audit)}]" \
                    if row.external else row.method
                labels[row] = f"{name} ({', '.join(shown)})" if shown else name
        return labels

    @property
    def n_train(self) -> int | None:
        sizes = {run.get("n_train") for run in self.runs}
        return sizes.pop() if len(sizes) == 1 else None

    @property
    def data_notes(self) -> list[str]:
        return sorted({run["data_note"] for run in self.runs if run.get("data_note")})

    def title(self) -> str:
        relation = f" · ε under {self.neighbouring} neighbours" if self.neighbouring else ""
        return f"{self.task} · data {self.data_id} · {self.delta_text()}{relation}"

    def delta_text(self) -> str:
        if self.delta is None:
            return "no δ (non-private runs only)"
        n = self.n_train
        if n and math.isclose(self.delta, 1 / n**2, rel_tol=1e-9):
            return f"δ = {self.delta:.3g} (1/n², n = {n:,})"
        return f"δ = {self.delta:.3g}"


def published_column(entry: PublishedResult) -> Column:
    if entry.epsilon is None:
        return Column(math.inf, "non-private")
    return Column(_round_significant(entry.epsilon, 10), "target")


def _hosts(tables: list[Table], task: str, data_id: str, metric: str) -> list[Table]:
    """The tables of a task, data id and metric, where its non-private rows go; a new one if there are none."""
    hosts = [table for table in tables if (table.task, table.data_id, table.metric) == (task, data_id, metric)]
    if not hosts:
        hosts = [Table(task, data_id, None, metric)]
        tables.append(hosts[0])
    return hosts


def build_tables(records: list[dict[str, Any]], published: list[PublishedResult] = PUBLISHED,
                 audits: AuditEvidence | None = None) -> list[Table]:
    """Group records into tables (see the module docstring) and attach the published figures of their tasks and
    the audits of external plugins."""
    private: dict[tuple, Table] = {}
    nonprivate: dict[tuple[str, str, str], dict[tuple[Row, Column], Cell]] = defaultdict(dict)
    references: dict[tuple[str, str, str], dict[Row, Cell]] = defaultdict(dict)
    for record in records:
        metric = metric_name(record)
        key = (row_of(record), epsilon_column(record))
        if tuning_mode(record) == REFERENCE_MODE:
            references[record["task"], record["data_id"], metric].setdefault(key[0], Cell(metric)).runs.append(record)
            continue
        if record["private"]:
            delta = _round_significant(record["delta"], 10)
            relation = record.get("neighbouring") or "add-remove"
            table = private.setdefault((record["task"], record["data_id"], delta, metric, relation),
                                       Table(record["task"], record["data_id"], delta, metric, relation))
            cells = table.cells
        else:
            cells = nonprivate[record["task"], record["data_id"], metric]
        cells.setdefault(key, Cell(metric)).runs.append(record)
    tables = list(private.values())
    for key, cells in nonprivate.items():
        for table in _hosts(tables, *key):
            table.cells.update(cells)  # the same Cell objects: one group, shown in several tables
    for key, found in references.items():
        for table in _hosts(tables, *key):
            table.references = found
    for table in tables:
        table.published = [entry for entry in published if (entry.task, entry.metric) == (table.task, table.metric)]
        table.audits = audits or AuditEvidence()
    return sorted(tables, key=lambda t: (t.task, t.data_id, t.metric, t.delta is None, t.delta or 0.0,
                                         t.neighbouring or ""))


def unmatched_published(tables: list[Table], task: str | None,
                        published: list[PublishedResult] = PUBLISHED) -> list[PublishedResult]:
    """Published figures that no table shows (no runs of their task here, or no dpbench task for them)."""
    shown = {id(entry) for table in tables for entry in table.published}
    return [entry for entry in published if id(entry) not in shown and (task is None or entry.task == task)]


#: The marks of a column's winner and of the cells not significantly below the best.
MARKS = {"winner": "▲", "tied": "≈"}


def anchor(table: Table) -> str:
    return "-".join(part for part in [table.task, table.data_id, table.neighbouring or "nonprivate",
                                      f"{table.delta:.3g}" if table.delta else ""] if part).replace(".", "_")
