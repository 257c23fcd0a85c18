"""``dpbench leaderboard``: per-task tables (methods × privacy budgets) and plots built from the results store.

How runs are grouped, so that no cell mixes runs that are not comparable:

* A table holds the runs of one task, data id, δ and metric. δ is compared at 10 significant digits (the
  release methods record δ as a sum of per-release δ's, which can differ from the target in the last bits).
  Non-private runs (``"private": false``, no δ) appear as the "non-private" column in every table of their task,
  data id and metric, and in a table of their own when there are no private runs.
* A row is one method under one tuning mode, sampler, accountant and — for untuned runs — one set of
  hyperparameters (runs of the same method with other hyperparameters get a row of their own, labelled with the
  ones that differ). The tuning mode is the record's ``tuning["mode"]``; records without ``tuning`` ran with
  default (or given) hyperparameters and no tuning, mode "none". Tuned runs' hyperparameters are the tuning's
  output, so they do not split rows. Mode "oracle" (selection on the test set, ``dpbench tune --mode oracle``) is
  shown as "oracle (tuning not private)" in every format (CSV: its ``tuning_note`` column).
* A column is the run's target ε (``epsilon_target``); runs given a noise multiplier instead have no target and
  go to a column "ε ≈ x (spent)" by their spent ε rounded to 2 significant digits; non-private runs to
  "non-private".
* A cell's value is the mean over seeds and the sample standard deviation (n − 1; none for one seed) of the
  test metric, with the number of seeds; a seed run more than once counts once, with the mean of its runs.
* The metric is ``test_accuracy`` where a run has it, else the first metric of its record (by name: the store
  keeps keys sorted); higher is better for accuracies, lower for errors and losses. In each column the best mean
  among the rows of the same tuning mode is marked: tuning modes differ in what they charge to the budget, so
  they are not ranked against each other.
* The seed papers' published figures (:mod:`dpbench.published`) are extra rows of their own, labelled with the
  paper, its dataset and δ, never averaged with measurements and never marked best.
"""
from __future__ import annotations

import csv
import html
import io
import json
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpbench import store, tracking
from dpbench.engine import UsageError
from dpbench.published import PUBLISHED, PublishedResult
from dpbench.records import LEDGER_VERSION, check_stored

FORMATS = ("md", "html", "csv", "jsonl")
CSV_COLUMNS = ["task", "data_id", "method", "epsilon", "epsilon_kind", "delta", "neighbouring", "tuning", "tuning_note",
               "accountant", "sampler", "hyperparameters", "external_plugin", "code_sha256", "metric", "direction", "mean",
               "std", "n_seeds", "run_ids"]
NOT_PRIVATE_TUNING = "tuning not private"
_DIRECTIONS = [("accuracy", "higher"), ("error", "lower"), ("loss", "lower")]  # by substring of the metric name


def _round_significant(value: float, digits: int) -> float:
    return float(f"{value:.{digits}g}")


def tuning_mode(record: dict[str, Any]) -> str:
    """The record's tuning mode: ``tuning["mode"]``, or "none" for records without tuning."""
    tuning = record.get("tuning")
    if tuning is None:
        return "none"
    if not isinstance(tuning, dict) or not isinstance(tuning.get("mode"), str):
        raise UsageError(f"run {record['run_id']}: 'tuning' must be a dict with a 'mode', got {tuning!r}")
    return tuning["mode"]


def tuning_label(mode: str) -> str:
    """The tuning mode as shown: "oracle" (test-set selection) always says that the tuning was not private."""
    return f"{mode} ({NOT_PRIVATE_TUNING})" if mode == "oracle" else mode


def metric_name(record: dict[str, Any]) -> str:
    """``test_accuracy`` if the run measured it, else the first metric of the record (by name, as stored)."""
    metrics = record["metrics"]
    if "test_accuracy" in metrics:
        return "test_accuracy"
    if not metrics:
        raise UsageError(f"run {record['run_id']} has no metrics")
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


def row_of(record: dict[str, Any]) -> Row:
    mode = tuning_mode(record)
    code = record.get("code", {}).get("method", {})
    return Row(mode, record["method"], str(record["sampler"]), record["accountant"] or "",
               json.dumps(record["hyperparameters"], sort_keys=True) if mode == "none" else "",
               code.get("sha256", ""), bool(code.get("external")))


@dataclass
class Cell:
    """The runs of one row and column of a table, and their metric over seeds."""

    metric: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def per_seed(self) -> dict[int, float]:
        by_seed: dict[int, list[float]] = defaultdict(list)
        for run in self.runs:
            by_seed[run["seed"]].append(run["metrics"][self.metric])
        return {seed: statistics.fmean(values) for seed, values in sorted(by_seed.items())}

    @property
    def mean(self) -> float:
        return statistics.fmean(self.per_seed.values())

    @property
    def std(self) -> float | None:
        values = list(self.per_seed.values())
        return statistics.stdev(values) if len(values) > 1 else None

    @property
    def n_seeds(self) -> int:
        return len(self.per_seed)

    @property
    def run_ids(self) -> list[str]:
        return [run["run_id"] for run in self.runs]


@dataclass
class Table:
    task: str
    data_id: str
    delta: float | None  # None: a table of non-private runs only
    metric: str
    neighbouring: str | None = None  # of every private run in the table: ε under other relations is not comparable
    cells: dict[tuple[Row, Column], Cell] = field(default_factory=dict)
    published: list[PublishedResult] = field(default_factory=list)

    @property
    def direction(self) -> str | None:
        return metric_direction(self.metric)

    @property
    def runs(self) -> list[dict[str, Any]]:
        return [run for cell in self.cells.values() for run in cell.runs]

    @property
    def rows(self) -> list[Row]:
        return sorted({row for row, _ in self.cells}, key=lambda row: (row.tuning != "none", row))

    @property
    def columns(self) -> list[Column]:
        columns = {column for _, column in self.cells} | {published_column(entry) for entry in self.published}
        return sorted(columns)

    def best(self) -> set[tuple[Row, Column]]:
        """The cells with the best mean of their column among the rows of the same tuning mode."""
        if self.direction is None:
            return set()
        sign = 1 if self.direction == "higher" else -1
        candidates: dict[tuple[Column, str], list[tuple[float, Row]]] = defaultdict(list)
        for (row, column), cell in self.cells.items():
            if not math.isnan(cell.mean):
                candidates[column, row.tuning].append((sign * cell.mean, row))
        best = set()
        for (column, _), scored in candidates.items():
            top = max(score for score, _ in scored)
            best |= {(row, column) for score, row in scored if score == top}
        return best

    def row_labels(self) -> dict[Row, str]:
        """The method, with the hyperparameters that differ between untuned rows of the same method."""
        by_method: dict[tuple[str, str, str, str], list[Row]] = defaultdict(list)
        for row in self.rows:
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
                name = f"{row.method} [external plugin]" if row.external else row.method
                labels[row] = f"{name} ({', '.join(shown)})" if shown else name
        return labels

    def legend_labels(self) -> dict[Row, str]:
        """Row labels that are unique within the table, for the plot: the method, its tuning mode unless "none",
        and the sampler or accountant where rows of the method differ in them."""
        labels = self.row_labels()
        by_method: dict[str, list[Row]] = defaultdict(list)
        for row in self.rows:
            by_method[row.method].append(row)
        legend = {}
        for rows in by_method.values():
            varying = [name for name in ("sampler", "accountant") if len({getattr(row, name) for row in rows}) > 1]
            for row in rows:
                extra = ", ".join(([f"tuning {tuning_label(row.tuning)}"] if row.tuning != "none" else [])
                                  + [f"{name} {getattr(row, name) or '—'}" for name in varying])
                legend[row] = f"{labels[row]} [{extra}]" if extra else labels[row]
        return legend

    @property
    def n_train(self) -> int | None:
        sizes = {run.get("n_train") for run in self.runs}
        return sizes.pop() if len(sizes) == 1 else None

    @property
    def data_notes(self) -> list[str]:
        return sorted({run["data_note"] for run in self.runs if run.get("data_note")})


def published_column(entry: PublishedResult) -> Column:
    if entry.epsilon is None:
        return Column(math.inf, "non-private")
    return Column(_round_significant(entry.epsilon, 10), "target")


def build_tables(records: list[dict[str, Any]], published: list[PublishedResult] = PUBLISHED) -> list[Table]:
    """Group records into tables (see the module docstring) and attach the published figures of their tasks."""
    private: dict[tuple[str, str, float, str, str], Table] = {}
    nonprivate: dict[tuple[str, str, str], dict[tuple[Row, Column], Cell]] = defaultdict(dict)
    for record in records:
        metric = metric_name(record)
        key = (row_of(record), epsilon_column(record))
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
    for (task, data_id, metric), cells in nonprivate.items():
        hosts = [table for table in tables if (table.task, table.data_id, table.metric) == (task, data_id, metric)]
        if not hosts:
            hosts = [Table(task, data_id, None, metric)]
            tables.append(hosts[0])
        for table in hosts:
            table.cells.update(cells)  # the same Cell objects: one group, shown in several tables
    for table in tables:
        table.published = [entry for entry in published if (entry.task, entry.metric) == (table.task, table.metric)]
    return sorted(tables, key=lambda t: (t.task, t.data_id, t.metric, t.delta is None, t.delta or 0.0,
                                         t.neighbouring or ""))


def unmatched_published(tables: list[Table], task: str | None,
                        published: list[PublishedResult] = PUBLISHED) -> list[PublishedResult]:
    """Published figures that no table shows (no runs of their task here, or no dpbench task for them)."""
    shown = {id(entry) for table in tables for entry in table.published}
    return [entry for entry in published if id(entry) not in shown and (task is None or entry.task == task)]


# ---- formatting ---------------------------------------------------------------------------------------------

def _value_text(cell: Cell) -> str:
    std = f" ± {cell.std:.2g}" if cell.std is not None else ""
    return f"{cell.mean:.4g}{std}"


def _published_text(entry: PublishedResult) -> str:
    return f"{entry.value:.4g}" + (f" ± {entry.spread:.2g}" if entry.spread is not None else "")


def _delta_text(table: Table) -> str:
    if table.delta is None:
        return "no δ (non-private runs only)"
    n = table.n_train
    if n and math.isclose(table.delta, 1 / n**2, rel_tol=1e-9):
        return f"δ = {table.delta:.3g} (1/n², n = {n:,})"
    return f"δ = {table.delta:.3g}"


def _title(table: Table) -> str:
    relation = f" · ε under {table.neighbouring} neighbours" if table.neighbouring else ""
    return f"{table.task} · data {table.data_id} · {_delta_text(table)}{relation}"


def _explanation(table: Table) -> str:
    direction = {"higher": "higher is better", "lower": "lower is better"}.get(table.direction,
                                                                               "direction unknown: nothing marked")
    marked = "" if table.direction is None else (
        " The best mean of each column among rows of the same tuning mode is in bold.")
    return (f"Metric: {table.metric} ({direction}). Cells: mean ± standard deviation over "
            f"seeds (n − 1), n = number of seeds. Columns: the runs' target ε; \"ε ≈ x (spent)\" holds runs "
            f"given a noise multiplier, by the ε they spent.{marked}")


def _published_label(entry: PublishedResult, table: Table) -> tuple[str, str]:
    """What the row is (paper, method) and on what (the paper's dataset and δ, and whether they are this table's)."""
    detail = f"{entry.paper_dataset}, δ = {entry.delta}"
    if entry.epsilon is not None and entry.epsilon_label != f"ε = {entry.epsilon:g}":
        detail += f", {entry.epsilon_label}"  # an ε the paper gives only approximately
    if entry.paper_data_id != table.data_id:
        detail += f"; not this table's data ({table.data_id})"
    return f"published: {entry.paper_method} → {entry.method} ({entry.source})", detail


def _published_rows(table: Table) -> list[tuple[tuple[str, str], dict[Column, PublishedResult]]]:
    """One row per (paper, method, dataset, setting): its figures by column."""
    rows: dict[tuple[str, str, str, str], dict[Column, PublishedResult]] = {}
    for entry in table.published:
        rows.setdefault((entry.citation, entry.paper_method, entry.paper_dataset, entry.setting), {})[
            published_column(entry)] = entry
    return [(_published_label(next(iter(by_column.values())), table), by_column) for by_column in rows.values()]


def _unmatched_lines(entries: list[PublishedResult]) -> list[str]:
    """One line per paper, dataset and method: its figures at each ε."""
    groups: dict[tuple[str, str, str, str], list[PublishedResult]] = {}
    for entry in entries:
        groups.setdefault((entry.source, entry.paper_dataset, entry.paper_method, entry.method), []).append(entry)
    return [f"{source} · {dataset} · {paper_method} → {method}: "
            + "; ".join(f"{e.epsilon_label}: {_published_text(e)}" for e in group)
            + f" ({group[0].metric}, δ = {group[0].delta}, dpbench task: {group[0].task or 'none yet'})"
            for (source, dataset, paper_method, method), group in groups.items()]


def _published_notes(entries: list[PublishedResult]) -> list[str]:
    """Each source once: its full citation, its datasets with their settings, and the clauses of its notes."""
    datasets: dict[str, dict[str, list[str]]] = defaultdict(dict)
    notes: dict[str, dict[str, None]] = defaultdict(dict)
    for entry in entries:
        names = datasets[entry.citation].setdefault(entry.setting, [])
        if entry.paper_dataset not in names:
            names.append(entry.paper_dataset)
        notes[entry.citation].update(dict.fromkeys(entry.note.split("; ")))
    return [f"{citation}. " + " ".join(f"{', '.join(names)}: {setting}." for setting, names in by_setting.items())
            + " Notes: " + "; ".join(notes[citation]) + "."
            for citation, by_setting in datasets.items()]


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(tables: list[Table], unmatched: list[PublishedResult]) -> str:
    lines = ["# dpbench leaderboard", ""]
    for table in tables:
        columns, best, labels = table.columns, table.best(), table.row_labels()
        lines += [f"## {_title(table)}", "", _explanation(table), ""]
        lines += [f"Data: {note}" for note in table.data_notes] + ([""] if table.data_notes else [])
        lines.append("| method | tuning | sampler | accountant | " + " | ".join(c.label for c in columns) + " |")
        lines.append("| --- " * (4 + len(columns)) + "|")
        for row in table.rows:
            cells = []
            for column in columns:
                cell = table.cells.get((row, column))
                if cell is None:
                    cells.append("")
                else:
                    value = _value_text(cell)
                    cells.append(f"{f'**{value}**' if (row, column) in best else value} (n = {cell.n_seeds})")
            lines.append("| " + " | ".join(_md_escape(text) for text in
                                           [labels[row], tuning_label(row.tuning), row.sampler,
                                            row.accountant or "—", *cells])
                         + " |")
        for (label, detail), by_column in _published_rows(table):
            cells = [f"*{_published_text(by_column[c])}*" if c in by_column else "" for c in columns]
            lines.append("| " + " | ".join(_md_escape(t) for t in [f"*{label}; {detail}*", "paper's", "", "", *cells])
                         + " |")
        lines += ["", "Runs per cell:", ""]
        order = {row: index for index, row in enumerate(table.rows)}
        for (row, column), cell in sorted(table.cells.items(), key=lambda item: (order[item[0][0]], item[0][1])):
            lines.append(f"- {labels[row]} · {tuning_label(row.tuning)} · {row.sampler} · {row.accountant or '—'} · "
                         f"{column.label}: " + ", ".join(f"`{run_id}`" for run_id in cell.run_ids))
        if table.published:
            lines += ["", "Published figures (not measured here, not ranked):", ""]
            lines += [f"- {note}" for note in _published_notes(table.published)]
        lines.append("")
    if unmatched:
        lines += ["## Published figures without runs here", ""]
        lines += [f"- {_md_escape(line)}" for line in _unmatched_lines(unmatched)]
        lines += [""] + [f"- {note}" for note in _published_notes(unmatched)] + [""]
    return "\n".join(lines)


def to_csv(tables: list[Table]) -> str:
    """One line per measured cell (a non-private cell shown in several tables is written once)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    written: set[int] = set()
    for table in tables:
        for row in table.rows:
            for column in table.columns:
                cell = table.cells.get((row, column))
                if cell is None or id(cell) in written:
                    continue
                written.add(id(cell))
                writer.writerow({
                    "task": table.task, "data_id": table.data_id, "method": row.method,
                    "epsilon": "inf" if column.kind == "non-private" else repr(column.epsilon),
                    "epsilon_kind": column.kind,
                    "delta": "" if column.kind == "non-private" else repr(table.delta),
                    "neighbouring": "" if column.kind == "non-private" else table.neighbouring,
                    "external_plugin": row.external, "code_sha256": row.code,
                    "tuning": row.tuning, "tuning_note": NOT_PRIVATE_TUNING if row.tuning == "oracle" else "",
                    "accountant": row.accountant, "sampler": row.sampler,
                    "hyperparameters": row.hyperparameters, "metric": table.metric,
                    "direction": table.direction or "", "mean": repr(cell.mean),
                    "std": "" if cell.std is None else repr(cell.std), "n_seeds": cell.n_seeds,
                    "run_ids": " ".join(cell.run_ids),
                })
    return buffer.getvalue()


def _plot_svg(table: Table, salt: str) -> str | None:
    """Metric versus ε, one line per row with error bars (std over seeds), log ε axis; None without private runs.

    Non-private rows are horizontal dashed lines with a ±std band; published figures are hollow markers, one shape
    per source (dotted lines for non-private ones). matplotlib is imported here: only the HTML page needs it.
    """
    import matplotlib
    from matplotlib.figure import Figure

    private_columns = [c for c in table.columns if c.kind != "non-private"]
    if not private_columns:
        return None
    legend, methods = table.legend_labels(), sorted({row.method for row in table.rows}
                                                    | {entry.method for entry in table.published})
    colours = {method: f"C{index % 10}" for index, method in enumerate(methods)}
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "path"}):
        figure = Figure(figsize=(8.5, 4.2), layout="constrained")
        axes = figure.subplots()
        for row in table.rows:
            points = sorted((column.epsilon, cell) for (r, column), cell in table.cells.items()
                            if r == row and column.kind != "non-private")
            colour = colours[row.method]
            if points:
                axes.errorbar([eps for eps, _ in points], [cell.mean for _, cell in points],
                              yerr=[cell.std or 0.0 for _, cell in points], color=colour, marker="o",
                              markersize=4, capsize=3, label=legend[row],
                              linestyle="-" if row.tuning == "none" else "--")
            cell = table.cells.get((row, Column(math.inf, "non-private")))
            if cell is not None:
                axes.axhline(cell.mean, color=colour, linestyle="--", linewidth=1,
                             label=f"{legend[row]} (non-private)")
                if cell.std:
                    axes.axhspan(cell.mean - cell.std, cell.mean + cell.std, color=colour, alpha=0.12)
        sources = sorted({entry.source for entry in table.published})
        for _, by_column in _published_rows(table):
            entries = list(by_column.values())
            short = f"published: {entries[0].paper_method} ({entries[0].source})"
            colour, marker = colours[entries[0].method], _PUBLISHED_MARKERS[sources.index(entries[0].source) % 5]
            private = sorted((e.epsilon, e.value) for e in entries if e.epsilon is not None)
            if private:
                axes.plot(*zip(*private), linestyle="none", marker=marker, markersize=6, markerfacecolor="none",
                          color=colour, label=short)
            for entry in entries:
                if entry.epsilon is None:
                    axes.axhline(entry.value, color=colour, linestyle=":", linewidth=1, label=f"{short} (non-private)")
        axes.set_xscale("log")
        ticks = sorted({column.epsilon for column in private_columns})
        axes.set_xticks(ticks, labels=[f"{tick:g}" for tick in ticks])
        axes.minorticks_off()
        axes.set_xlabel("ε (target; spent for noise-multiplier runs)")
        axes.set_ylabel(f"{table.metric} ({table.direction or '?'} is better)")
        axes.set_title(_title(table), fontsize=10)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    return svg[svg.index("<svg"):]


_PUBLISHED_MARKERS = ["D", "s", "^", "v", "P"]
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.value { white-space: nowrap; }
div.scroll { overflow-x: auto; }
table.runs { font-size: 12px; }
td.best strong { color: #0a5; }
tr.published td { background: #f6f3e8; font-style: italic; color: #555; }
tr.published .detail { font-size: 12px; }
details.runs summary { color: #36c; cursor: pointer; font-size: 12px; }
details.runs a { font-family: monospace; font-size: 12px; display: block; }
figure.plot svg { max-width: 100%; height: auto; }
p.explain, ul.notes { font-size: 13px; color: #444; }
"""


def _html_cell(cell: Cell, best: bool) -> str:
    value = html.escape(_value_text(cell))
    links = "".join(f'<a href="#run-{html.escape(run_id)}">{html.escape(run_id)}</a>' for run_id in cell.run_ids)
    runs = f"{len(cell.runs)} run{'s' if len(cell.runs) != 1 else ''}"
    return (f'<td class="value{" best" if best else ""}">{f"<strong>{value}</strong>" if best else value}'
            f'<details class="runs"><summary>n = {cell.n_seeds} · {runs}'
            f"</summary>{links}</details></td>")


def _html_table(table: Table) -> str:
    columns, best, labels = table.columns, table.best(), table.row_labels()
    head = "".join(f"<th>{html.escape(text)}</th>" for text in
                   ["method", "tuning", "sampler", "accountant", *(c.label for c in columns)])
    body = []
    for row in table.rows:
        cells = "".join(_html_cell(table.cells[row, c], (row, c) in best) if (row, c) in table.cells else "<td></td>"
                        for c in columns)
        body.append("<tr class=\"measured\">" + "".join(f"<td>{html.escape(text)}</td>" for text in
                    [labels[row], tuning_label(row.tuning), row.sampler, row.accountant or "—"]) + cells + "</tr>")
    for (label, detail), by_column in _published_rows(table):
        cells = "".join(f'<td class="value">{html.escape(_published_text(by_column[c]))}</td>' if c in by_column
                        else "<td></td>" for c in columns)
        body.append(f'<tr class="published"><td colspan="4">{html.escape(label)}<br>'
                    f'<span class="detail">{html.escape(detail)}</span></td>{cells}</tr>')
    return (f'<div class="scroll"><table class="leaderboard"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _number(value: float | None, spec: str) -> str | None:
    return None if value is None else format(value, spec)


def _html_runs(tables: list[Table]) -> str:
    runs = {run["run_id"]: run for table in tables for run in table.runs}
    rows = []
    for run in sorted(runs.values(), key=lambda r: (r["task"], r["data_id"], r["method"], r["created_at"])):
        metric = metric_name(run)
        values = [run["run_id"], run["task"], run["data_id"], run["method"], tuning_label(tuning_mode(run)),
                  run["seed"],
                  run["epsilon_target"], _number(run["epsilon"], ".4g"), _number(run["delta"], ".3g"),
                  run["sampler"], run["accountant"],
                  f"{metric} = {run['metrics'][metric]:.6g}",
                  ", ".join(f"{key}={value}" for key, value in sorted(run["hyperparameters"].items())),
                  run.get("git_commit"), run["created_at"]]
        cells = "".join(f"<td>{html.escape('—' if v is None else str(v))}</td>" for v in values)
        rows.append(f'<tr id="run-{html.escape(run["run_id"])}">{cells}</tr>')
    head = "".join(f"<th>{name}</th>" for name in ["run", "task", "data", "method", "tuning", "seed", "ε target",
                                                     "ε spent", "δ", "sampler", "accountant", "metric",
                                                     "hyperparameters", "git commit", "created"])
    return (f'<div class="scroll"><table class="runs"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def to_html(tables: list[Table], unmatched: list[PublishedResult]) -> str:
    """One self-contained page: inline CSS and inline SVG plots, no scripts, no external files."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>dpbench leaderboard</title>", f"<style>{_STYLE}</style></head><body>",
             "<h1>dpbench leaderboard</h1>",
             "<p class=\"explain\">Built by <code>dpbench leaderboard</code> from the local results store. Rows "
             "marked <em>published</em> are the seed papers' own figures on their own data and settings: shown "
             "for reference, never averaged with or ranked against runs measured here.</p>"]
    for index, table in enumerate(tables):
        parts.append(f'<section class="task" id="table-{index}"><h2>{html.escape(_title(table))}</h2>')
        parts.append(f'<p class="explain">{html.escape(_explanation(table))}</p>')
        parts += [f'<p class="explain">Data: {html.escape(note)}</p>' for note in table.data_notes]
        parts.append(_html_table(table))
        if table.published:
            parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(note)}</li>"
                                                       for note in _published_notes(table.published)) + "</ul>")
        svg = _plot_svg(table, salt=f"dpbench-leaderboard-{index}")
        parts.append(f'<figure class="plot">{svg}<figcaption>{html.escape(table.metric)} versus ε; error bars: '
                     f"standard deviation over seeds.</figcaption></figure>" if svg else
                     '<p class="explain">No private runs: no plot.</p>')
        parts.append("</section>")
    if unmatched:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in _unmatched_lines(unmatched))
        notes = "".join(f"<li>{html.escape(note)}</li>" for note in _published_notes(unmatched))
        parts.append(f'<section id="published-unmatched"><h2>Published figures without runs here</h2>'
                     f'<ul class="notes">{items}</ul><ul class="notes">{notes}</ul></section>')
    parts.append(f'<section id="runs"><h2>Runs</h2>{_html_runs(tables)}</section></body></html>')
    return "\n".join(parts) + "\n"


def render(records: list[dict[str, Any]], fmt: str, task: str | None = None) -> str:
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "jsonl":  # the records the tables are built from, one per line
        return "".join(json.dumps(record, sort_keys=True) + "\n" for record in records)
    tables = build_tables(records)
    if fmt == "csv":
        return to_csv(tables)
    unmatched = unmatched_published(tables, task)
    return to_markdown(tables, unmatched) if fmt == "md" else to_html(tables, unmatched)


def write(fmt: str, task: str | None = None, out: str | None = None, wandb_path: str | None = None) -> None:
    """``dpbench leaderboard``: build from the store under ``DPBENCH_HOME`` (or from the records logged to the W&B
    project ``wandb_path``, merged by run id) and write to ``out`` or stdout."""
    if wandb_path:  # merged by run id: the same record logged from several machines
        logged = tracking.records_from_wandb(wandb_path)
        merged = {str(r.get("run_id")) if isinstance(r, dict) else f"#{i}": r for i, r in enumerate(logged)}
        records = [r for r in merged.values() if task is None or isinstance(r, dict) and r.get("task") == task]
        source = f"W&B project {wandb_path}"
    else:
        records = store.load(task=task) if task else store.load()
        source = str(store.default_path())
    current = [r for r in records if isinstance(r, dict) and r.get("ledger_version") == LEDGER_VERSION]
    for record in current:
        try:
            check_stored(record)
        except ValueError as error:
            raise UsageError(f"{source}: {error}") from None
    older = (f"{len(records) - len(current)} records of older ledger versions (made before privacy fixes of the "
             f"engine; see dpbench/records.py)")
    if not current:
        raise UsageError(f"no runs{f' of task {task!r}' if task else ''} of ledger version {LEDGER_VERSION} in {source}"
                         + (f" ({older} left out)" if records else ""))
    if len(current) < len(records):
        print(f"dpbench: leaving out {older}", file=sys.stderr)
    records = current
    text = render(records, fmt, task)
    if out is None:
        sys.stdout.write(text)
    else:
        path = Path(out)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {out}: {error.strerror or error}") from None
