"""The leaderboard as markdown and CSV (the HTML page is :mod:`dpbench.board.html`)."""
from __future__ import annotations

import csv
import io
import math
from collections import defaultdict

from dpbench.board import reference
from dpbench.board.model import (NOT_PRIVATE_TUNING, TRACK_NOTES, Cell, Column, Row, Table, published_column,
                                 tuning_label)
from dpbench.board.published import PublishedResult
from dpbench.choices import REFERENCE_MODE

CSV_COLUMNS = ["task", "data_id", "method", "epsilon", "epsilon_kind", "delta", "neighbouring", "tuning", "tuning_note",
               "accountant", "sampler", "hyperparameters", "external_plugin", "code_sha256", "metric", "direction",
               "mean", "std", "se", "ci95_low", "ci95_high", "n_seeds", "rank", "leader", "collapsed",
               "majority_rate", "privacy_cost", "privacy_cost_low", "privacy_cost_high", "run_ids"]
MARKS = {"winner": "▲", "tied": "≈"}
LEGEND = ("Cells: mean over seeds ± half-width of its 95% confidence interval (Student's t), n = number of seeds. "
          "Within each track and column: ▲ the leader beats the runner-up (one-sided Welch test, p < 0.05); "
          "≈ the leaders not significantly apart (p ≥ 0.05 against the best); ⚠ collapsed: the mean is the test "
          "set's majority-class rate. Tracks are not ranked against each other. The reference row, in every track, is "
          "the converged non-private minimizer of the same loss and model (its L2 strength chosen on the validation "
          "track's held-out data), never ranked; a private cell's privacy cost is reference − cell, with a 95% "
          "interval (the CSV, and the page's tooltips).")


def value_text(cell: Cell, mark: str | None = None) -> str:
    interval = cell.ci95
    half = f" ± {(interval[1] - interval[0]) / 2:.2g}" if interval else ""
    flags = (MARKS[mark] + " " if mark else "") + ("⚠ " if cell.collapsed else "")
    return f"{flags}{cell.mean:.4g}{half}"


def reference_text(cell: Cell) -> str:
    """A reference cell: its value and the L2 strength its solve chose."""
    chosen = sorted({run["hyperparameters"].get("l2") for run in cell.runs}, key=str)
    return f"{cell.mean:.4g} (l2 = {', '.join(map(str, chosen))}, n = {cell.n_seeds})"


def published_text(entry: PublishedResult) -> str:
    return f"{entry.value:.4g}" + (f" ± {entry.spread:.2g}" if entry.spread is not None else "")


def explanation(table: Table) -> str:
    direction = {"higher": "higher is better", "lower": "lower is better"}.get(table.direction,
                                                                               "direction unknown: nothing marked")
    return (f"Metric: {table.metric} ({direction}). {LEGEND} Columns: the runs' target ε; \"ε ≈ x (spent)\" holds "
            f"runs given a noise multiplier, by the ε they spent.")


def published_label(entry: PublishedResult, table: Table) -> tuple[str, str]:
    """What the row is (paper, method) and on what (the paper's dataset and δ, and whether they are this table's)."""
    detail = f"{entry.paper_dataset}, δ = {entry.delta}"
    if entry.epsilon is not None and entry.epsilon_label != f"ε = {entry.epsilon:g}":
        detail += f", {entry.epsilon_label}"  # an ε the paper gives only approximately
    if entry.paper_data_id != table.data_id:
        detail += f"; not this table's data ({table.data_id})"
    return f"published: {entry.paper_method} → {entry.method} ({entry.source})", detail


def published_rows(table: Table) -> list[tuple[tuple[str, str], dict[Column, PublishedResult]]]:
    """One row per (paper, method, dataset, setting): its figures by column."""
    rows: dict[tuple[str, str, str, str], dict[Column, PublishedResult]] = {}
    for entry in table.published:
        rows.setdefault((entry.citation, entry.paper_method, entry.paper_dataset, entry.setting), {})[
            published_column(entry)] = entry
    return [(published_label(next(iter(by_column.values())), table), by_column) for by_column in rows.values()]


def unmatched_lines(entries: list[PublishedResult]) -> list[str]:
    """One line per paper, dataset and method: its figures at each ε."""
    groups: dict[tuple[str, str, str, str], list[PublishedResult]] = {}
    for entry in entries:
        groups.setdefault((entry.source, entry.paper_dataset, entry.paper_method, entry.method), []).append(entry)
    return [f"{source} · {dataset} · {paper_method} → {method}: "
            + "; ".join(f"{e.epsilon_label}: {published_text(e)}" for e in group)
            + f" ({group[0].metric}, δ = {group[0].delta}, dpbench task: {group[0].task or 'none yet'})"
            for (source, dataset, paper_method, method), group in groups.items()]


def published_notes(entries: list[PublishedResult]) -> list[str]:
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


def anchor(table: Table) -> str:
    return "-".join(part for part in [table.task, table.data_id, table.neighbouring or "nonprivate",
                                      f"{table.delta:.3g}" if table.delta else ""] if part).replace(".", "_")


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(tables: list[Table], unmatched: list[PublishedResult]) -> str:
    lines = ["# dpbench leaderboard", "", "Contents:", ""]
    lines += [f"- [{table.title()}](#{anchor(table)})" for table in tables] + [""]
    for table in tables:
        columns, leaders, labels, ranks = reference.columns(table), table.leaders(), table.row_labels(), table.ranks()
        found = reference.reference(table)
        lines += [f'<a id="{anchor(table)}"></a>', "", f"## {table.title()}", "", explanation(table), ""]
        lines += [f"Data: {note}" for note in table.data_notes] + ([""] if table.data_notes else [])
        for track in reference.tracks(table):
            lines += [f"### {tuning_label(track)}", "", TRACK_NOTES.get(track, ""), ""]
            lines.append("| rank | method | sampler | accountant | " + " | ".join(c.label for c in columns) + " |")
            lines.append("| --- " * (4 + len(columns)) + "|")
            for position, row in enumerate(table.rows(track), 1):
                cells = []
                for column in columns:
                    cell = table.cells.get((row, column))
                    cells.append("" if cell is None else
                                 f"{value_text(cell, leaders.get((row, column)))} (n = {cell.n_seeds})")
                rank = f"{position}" + (f" ({ranks[row]:.1f})" if row in ranks else "")
                label = reference.row_label(table, row, labels[row])
                lines.append("| " + " | ".join(_md_escape(text) for text in
                                               [rank, label, row.sampler, row.accountant or "—", *cells]) + " |")
            if found is not None:
                cells = [reference_text(found[1]) if column == reference.NON_PRIVATE else "" for column in columns]
                lines.append("| " + " | ".join(_md_escape(text) for text in
                                               ["—", reference.LABEL, found[0].sampler, "—", *cells]) + " |")
            lines.append("")
        if table.published:
            lines.append("| published | | | | " + " | ".join(c.label for c in columns) + " |")
            lines.append("| --- " * (4 + len(columns)) + "|")
            for (label, detail), by_column in published_rows(table):
                cells = [f"*{published_text(by_column[c])}*" if c in by_column else "" for c in columns]
                lines.append("| " + " | ".join(_md_escape(t) for t in ["", f"*{label}; {detail}*", "", "", *cells])
                             + " |")
            lines += ["", "Published figures (not measured here, not ranked):", ""]
            lines += [f"- {note}" for note in published_notes(table.published)] + [""]
        lines += ["Runs per cell:", ""]
        lines += [f"- {reference.LABEL} · {row.sampler}: " + ", ".join(f"`{run_id}`" for run_id in cell.run_ids)
                  for row, cell in table.references.items()]
        for row in table.rows():
            for column in columns:
                cell = table.cells.get((row, column))
                if cell is not None:
                    lines.append(f"- {labels[row]} · {tuning_label(row.tuning)} · {row.sampler} · "
                                 f"{row.accountant or '—'} · {column.label}: "
                                 + ", ".join(f"`{run_id}`" for run_id in cell.run_ids))
        lines.append("")
    if unmatched:
        lines += ["## Published figures without runs here", ""]
        lines += [f"- {_md_escape(line)}" for line in unmatched_lines(unmatched)]
        lines += [""] + [f"- {note}" for note in published_notes(unmatched)] + [""]
    return "\n".join(lines)


def _csv_line(table: Table, row: Row, column: Column, cell: Cell, leader: str, rank: str) -> dict[str, object]:
    interval, cost = cell.ci95, reference.privacy_cost(table, cell) if column.kind != "non-private" else None
    cost_interval = cost[1] if cost else None
    return {
        "task": table.task, "data_id": table.data_id, "method": row.method,
        "epsilon": "inf" if column.kind == "non-private" else repr(column.epsilon), "epsilon_kind": column.kind,
        "delta": "" if column.kind == "non-private" else repr(table.delta),
        "neighbouring": "" if column.kind == "non-private" else table.neighbouring,
        "tuning": row.tuning, "tuning_note": NOT_PRIVATE_TUNING if row.tuning == "oracle" else
        f"{reference.LABEL}: {reference_text(cell)}" if row.tuning == REFERENCE_MODE else "",
        "accountant": row.accountant, "sampler": row.sampler,
        "hyperparameters": row.hyperparameters, "external_plugin": row.external, "code_sha256": row.code,
        "metric": table.metric, "direction": table.direction or "", "mean": repr(cell.mean),
        "std": "" if cell.std is None else repr(cell.std), "se": "" if cell.se is None else repr(cell.se),
        "ci95_low": "" if interval is None else repr(interval[0]),
        "ci95_high": "" if interval is None else repr(interval[1]),
        "n_seeds": cell.n_seeds, "rank": rank, "leader": leader, "collapsed": cell.collapsed,
        "majority_rate": "" if cell.majority_rate is None else repr(cell.majority_rate),
        "privacy_cost": "" if cost is None else repr(cost[0]),
        "privacy_cost_low": "" if cost_interval is None else repr(cost_interval[0]),
        "privacy_cost_high": "" if cost_interval is None else repr(cost_interval[1]),
        "run_ids": " ".join(cell.run_ids),
    }


def to_csv(tables: list[Table]) -> str:
    """One line per measured cell (a non-private cell shown in several tables is written once), and one per
    reference (method ``reference``, never ranked)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    written: set[int] = set()
    for table in tables:
        leaders, ranks = table.leaders(), table.ranks()
        found = [(row, reference.NON_PRIVATE, cell, "", "") for row, cell in table.references.items()]
        for row in table.rows():
            for column in table.columns:
                cell = table.cells.get((row, column))
                if cell is not None:
                    found.append((row, column, cell, leaders.get((row, column), ""),
                                  "" if row not in ranks else f"{ranks[row]:.2f}"))
        for row, column, cell, leader, rank in found:
            if id(cell) not in written:
                written.add(id(cell))
                writer.writerow(_csv_line(table, row, column, cell, leader, rank))
    return buffer.getvalue()


def fmt_or_dash(value: float | None, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)
