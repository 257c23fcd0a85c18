"""The leaderboard as markdown and CSV (the HTML page is :mod:`dpbench.board.html`)."""
from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict

from dpbench.board import reference
from dpbench.board.model import (MARKS, NOT_PRIVATE_TUNING, TRACK_NOTES, Cell, Column, Row, Table, anchor,
                                 published_column, tuning_label)
from dpbench.board.published import PublishedResult
from dpbench.choices import REFERENCE_MODE

CSV_COLUMNS = ["task", "data_id", "method", "epsilon", "epsilon_kind", "delta", "neighbouring", "track", "tuning",
               "tuning_note", "accountant", "sampler", "hyperparameters", "selected_hyperparameters", "external_plugin",
               "code_sha256", "metric", "direction",
               "mean", "std", "se", "ci95_low", "ci95_high", "n_seeds", "leader", "p_below_best_holm",
               "not_above_trivial", "p_above_trivial", "majority_rate", "privacy_cost", "privacy_cost_low",
               "privacy_cost_high", "notes", "run_ids"]
TRIVIAL = "not above trivial"
LEGEND = ("Cells: mean over seeds [95% interval], n = number of seeds; accuracies' intervals are Student's t on the "
          "empirical-logit scale, mapped back (inside [0, 1]). Within each track and column, the best cell is "
          "compared with every other cell of two seeds or more by one-sided Welch t-tests (unpaired: seeds share no "
          "randomness across methods), Holm-corrected across the column, α = 0.05: ▲ winner, it beats them all; "
          "otherwise ≈ it and the cells not significantly below it (the column's last row names them). "
          f"\"{TRIVIAL}\" (greyed): not significantly above the test set's majority-class rate (one-sided "
          "one-sample t-test over seeds, α = 0.05); such cells and cells of one seed are never marked. Rows are not "
          "ranked, and tracks are not compared with each other. The reference row, in every track, is the "
          "converged non-private minimizer of the same loss and model (its L2 strength chosen on the validation "
          "track's held-out data), never marked; a private cell's privacy cost is reference − cell, with a 95% "
          "interval (the CSV, and the page's tooltips).")


def value_text(cell: Cell, mark: str | None = None) -> str:
    interval = cell.ci95
    shown = f" [{interval[0]:.4g}, {interval[1]:.4g}]" if interval else ""
    return f"{MARKS[mark] + ' ' if mark else ''}{cell.mean:.4g}{shown}"


def best_text(marks: dict[Row, str], labels: dict[Row, str]) -> str:
    """A column's answer: "▲ winner", "≈ the tied rows", or "" (nothing compared)."""
    if not marks:
        return ""
    mark = next(iter(marks.values()))
    return f"{MARKS[mark]} " + ", ".join(sorted(labels[row] for row in marks))


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


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _md_cell(cell: Cell | None, mark: str | None, note: str = "") -> str:
    """A cell's text; ``note``: the marks of the grid's notes on it (:mod:`dpbench.board.notes`)."""
    if cell is None:
        return ""
    if cell.not_above_trivial:
        return f"*{value_text(cell)}{note} (n = {cell.n_seeds}, {TRIVIAL})*"
    return f"{value_text(cell, mark)}{note} (n = {cell.n_seeds})"


def to_markdown(tables: list[Table], unmatched: list[PublishedResult]) -> str:
    from dpbench.board.summary import summary_markdown  # it formats with this module's helpers

    lines = ["# dpbench leaderboard", "", "Contents:", ""]
    lines += [f"- [{table.title()}](#{anchor(table)})" for table in tables] + [""]
    every = [table.comparisons() for table in tables]  # once per table: the summary and the tables share them
    all_labels = [table.row_labels() for table in tables]
    lines += summary_markdown(tables, every, all_labels)
    for table, comparisons, labels in zip(tables, every, all_labels):
        columns = reference.columns(table)
        found = reference.reference(table)
        lines += [f'<a id="{anchor(table)}"></a>', "", f"## {table.title()}", "", explanation(table), ""]
        lines += [f"Data: {note}" for note in table.data_notes] + ([""] if table.data_notes else [])
        for track in reference.tracks(table):
            lines += [f"### {tuning_label(track)}", "", TRACK_NOTES.get(track, ""), ""]
            lines.append("| method | sampler | accountant | " + " | ".join(table.column_label(c, track) for c in columns)
                         + " |")
            lines.append("| --- " * (3 + len(columns)) + "|")
            marks = {column: comparisons.get((track, column), ({}, {}))[0] for column in columns}
            for row in table.rows(track):
                cells = [_md_cell(table.cells.get((row, column)), marks[column].get(row),
                                  table.cell_notes.get((row, column), "")) for column in columns]
                label = reference.row_label(table, row, labels[row])
                lines.append("| " + " | ".join(_md_escape(text) for text in
                                               [label, row.sampler, row.accountant or "—", *cells]) + " |")
            if table.direction is not None:
                lines.append("| " + " | ".join(_md_escape(text) for text in [
                    "*winner (▲) or not significantly below the best (≈)*", "", "",
                    *(best_text(marks[column], labels) for column in columns)]) + " |")
            if found is not None:
                cells = [reference_text(found[1]) if column == reference.NON_PRIVATE else "" for column in columns]
                lines.append("| " + " | ".join(_md_escape(text) for text in
                                               [reference.LABEL, found[0].sampler, "—", *cells]) + " |")
            lines.append("")
        lines += [f"{mark} {text}" for mark, text in table.notes] + ([""] if table.notes else [])
        if table.published:
            lines.append("| published | | | " + " | ".join(table.column_label(c) for c in columns) + " |")
            lines.append("| --- " * (3 + len(columns)) + "|")
            for (label, detail), by_column in published_rows(table):
                cells = [f"*{published_text(by_column[c])}*" if c in by_column else "" for c in columns]
                lines.append("| " + " | ".join(_md_escape(t) for t in [f"*{label}; {detail}*", "", "", *cells])
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


def selected_hyperparameters(cell: Cell) -> str:
    """What the tuning of a cell's runs selected (``tuning["selected_params"]``), as JSON: one object where every
    run selected the same (the validation track selects once for all seeds), else a list of one object per run, by
    seed (random-stopping tunes per seed); "" for untuned runs."""
    chosen = [json.dumps(run["tuning"]["selected_params"], sort_keys=True)
              for run in sorted(cell.runs, key=lambda r: (not isinstance(r["seed"], int),
                                                        r["seed"] if isinstance(r["seed"], int) else 0, r["run_id"]))
              if isinstance(run.get("tuning"), dict) and isinstance(run["tuning"].get("selected_params"), dict)]
    if not chosen:
        return ""
    return chosen[0] if len(set(chosen)) == 1 else "[" + ", ".join(chosen) + "]"


def _csv_line(table: Table, row: Row, column: Column, cell: Cell, marks: dict[Row, str],
              adjusted: dict[Row, float], track: str) -> dict[str, object]:
    """A cell's CSV line: ``marks`` and ``adjusted`` (Holm-adjusted p below the best) of its track and column;
    ``track``: the track it is shown in (a measured row's own; each track of its table for the reference)."""
    interval, cost = cell.ci95, reference.privacy_cost(table, cell) if column.kind != "non-private" else None
    cost_interval = cost[1] if cost else None
    return {
        "task": table.task, "data_id": table.data_id, "method": row.method,
        "epsilon": "inf" if column.kind == "non-private" else repr(column.epsilon), "epsilon_kind": column.kind,
        "delta": "" if column.kind == "non-private" else repr(table.delta),
        "neighbouring": "" if column.kind == "non-private" else table.neighbouring,
        "track": track, "tuning": row.tuning, "tuning_note": NOT_PRIVATE_TUNING if row.tuning == "oracle" else
        f"{reference.LABEL}: {reference_text(cell)}" if row.tuning == REFERENCE_MODE else "",
        "accountant": row.accountant, "sampler": row.sampler,
        "hyperparameters": row.hyperparameters, "selected_hyperparameters": selected_hyperparameters(cell),
        "external_plugin": row.external, "code_sha256": row.code,
        "metric": table.metric, "direction": table.direction or "", "mean": repr(cell.mean),
        "std": "" if cell.std is None else repr(cell.std), "se": "" if cell.se is None else repr(cell.se),
        "ci95_low": "" if interval is None else repr(interval[0]),
        "ci95_high": "" if interval is None else repr(interval[1]),
        "n_seeds": cell.n_seeds, "leader": marks.get(row, ""),
        "p_below_best_holm": repr(adjusted[row]) if row in adjusted else "",
        "not_above_trivial": cell.not_above_trivial,
        "p_above_trivial": "" if cell.trivial_p is None else repr(cell.trivial_p),
        "majority_rate": "" if cell.majority_rate is None else repr(cell.majority_rate),
        "privacy_cost": "" if cost is None else repr(cost[0]),
        "privacy_cost_low": "" if cost_interval is None else repr(cost_interval[0]),
        "privacy_cost_high": "" if cost_interval is None else repr(cost_interval[1]),
        "notes": " ".join(text for mark, text in table.notes if mark in table.cell_notes.get((row, column), "")),
        "run_ids": " ".join(cell.run_ids),
    }


def to_csv(tables: list[Table]) -> str:
    """One line per measured cell (a non-private cell shown in several tables is written once), its ``track`` its
    row's; and per reference (method ``reference``, never ranked) one line per track of its table, as the page shows
    it in every track (``track`` that track, ``tuning`` "reference")."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    written: set[tuple[int, str]] = set()
    for table in tables:
        comparisons = table.comparisons()
        found = [(row, reference.NON_PRIVATE, cell, ({}, {}), track) for row, cell in table.references.items()
                 for track in reference.tracks(table)]
        for row in table.rows():
            for column in table.columns:
                cell = table.cells.get((row, column))
                if cell is not None:
                    found.append((row, column, cell, comparisons.get((row.tuning, column), ({}, {})), row.tuning))
        for row, column, cell, marks, track in found:
            if (id(cell), track) not in written:
                written.add((id(cell), track))
                writer.writerow(_csv_line(table, row, column, cell, *marks, track))
    return buffer.getvalue()


def fmt_or_dash(value: float | None, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)
