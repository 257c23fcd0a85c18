"""The board's answer in one matrix: per table (task) and ε column, per track, the winner or the tied set, each name
with its privacy cost (reference − cell mean, where the table has a reference).

Nothing is recomputed: the marks are :meth:`dpbench.board.model.Table.comparisons` — the same Welch + Holm
comparisons whose result the last row of each track's sub-table names (:func:`dpbench.board.text.best_text`) — and the
cost is :func:`dpbench.board.reference.privacy_cost`. A cell not above trivial is never marked there, so it is never
named here; a column where no cell is above trivial says so.
"""
from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass

from dpbench.board import reference
from dpbench.board.model import MARKS, TRACK_ORDER, Column, Row, Table, anchor, tuning_label

NONE_ABOVE_TRIVIAL = "no cell above trivial"
NOT_COMPARED = "not compared"
DECLARED = "infeasible (declared)"
EXPLAIN = ("Per task, ε and track: ▲ the winner (significantly above every other cell of its column) or ≈ the tied set "
           "(not significantly below the best), from the same one-sided Welch tests with Holm's correction as the "
           "tables below, whose last rows name the same; cells not above trivial (the majority-class rate) are never "
           "named. Tracks are not compared with each other.")


@dataclass
class Entry:
    """One track's answer in one ε column of one table."""

    mark: str | None  # "winner", "tied", or None (nothing marked)
    names: list[tuple[str, tuple[float, tuple[float, float] | None] | None]]  # row label, privacy cost
    note: str = ""  # without a mark: why (DECLARED, NONE_ABOVE_TRIVIAL, NOT_COMPARED), "" where the track has no cell

    def text(self) -> str:
        """As the sub-table's last row would put it (``best_text``), without the costs."""
        if self.mark is None:
            return self.note
        return f"{MARKS[self.mark]} " + ", ".join(name for name, _ in self.names)


Comparisons = dict[tuple[str, Column], tuple[dict[Row, str], dict[Row, float]]]


def tracks(tables: list[Table]) -> list[str]:
    present = {track for table in tables for track in table.tracks}
    return sorted(present, key=lambda t: (TRACK_ORDER.index(t) if t in TRACK_ORDER else len(TRACK_ORDER), t))


def matrix(tables: list[Table], comparisons: list[Comparisons] | None = None,
           labels: list[dict[Row, str]] | None = None) -> list[tuple[Table, Column, dict[str, Entry]]]:
    """Per table and private ε column with runs: each track's :class:`Entry`. ``comparisons`` and ``labels``: the
    tables' :meth:`~dpbench.board.model.Table.comparisons` and ``row_labels``, where the caller has them already."""
    found = []
    for index, table in enumerate(tables):
        marks_of = comparisons[index] if comparisons is not None else table.comparisons()
        names_of = labels[index] if labels is not None else table.row_labels()
        columns = sorted({column for _, column in table.cells if column.kind != "non-private"})
        for column in columns:
            by_track = {}
            for track in table.tracks:
                cells = {row: cell for (row, c), cell in table.cells.items() if c == column and row.tuning == track}
                if not cells:
                    continue
                marks = marks_of.get((track, column), ({}, {}))[0]
                if marks:
                    names = sorted(((names_of[row], reference.privacy_cost(table, cells[row])) for row in marks),
                                   key=lambda item: item[0])
                    by_track[track] = Entry(next(iter(marks.values())), names)
                elif table.direction is None:
                    by_track[track] = Entry(None, [], NOT_COMPARED)
                elif table.declared_infeasible(column, track):
                    by_track[track] = Entry(None, [], DECLARED)
                else:
                    trivial = all(cell.not_above_trivial for cell in cells.values())
                    by_track[track] = Entry(None, [], NONE_ABOVE_TRIVIAL if trivial else NOT_COMPARED)
            found.append((table, column, by_track))
    return found


def _cost_html(cost: tuple[float, tuple[float, float] | None] | None) -> str:
    if cost is None:
        return ""
    return f' <small class="cost" title="{html.escape(reference.cost_text(cost))}">{cost[0]:+.3f}</small>'


def _entry_html(table: Table, column: Column, track: str, entry: Entry | None) -> str:
    where = (f'data-table="{anchor(table)}" data-track="{html.escape(track)}" '
             f'data-column="{html.escape(column.label)}"')
    if entry is None:
        return f'<td class="summary" {where}></td>'
    if entry.mark is None:
        return f'<td class="summary none" {where}>{html.escape(entry.note)}</td>'
    names = ", ".join(f'<span class="name">{html.escape(name)}</span>{_cost_html(cost)}' for name, cost in entry.names)
    return f'<td class="summary {entry.mark}" {where}>{MARKS[entry.mark]} {names}</td>'


def table_names(tables: list[Table]) -> dict[int, str]:
    """The task, with the table's data, δ and relation where a task has several tables."""
    counts = Counter(table.task for table in tables)
    return {id(table): table.task if counts[table.task] == 1 else table.title() for table in tables}


def summary_html(tables: list[Table], comparisons: list[Comparisons] | None = None,
                 labels: list[dict[Row, str]] | None = None) -> str:
    """The summary section of the page: the matrix, tracks as columns, one row per task and ε."""
    rows = matrix(tables, comparisons, labels)
    shown = tracks([table for table, _, _ in rows])
    if not rows:
        return ""
    names = table_names(tables)
    has_reference = any(table.references for table, _, _ in rows)
    body, spans = [], Counter(id(table) for table, _, _ in rows)
    previous = None
    for table, column, by_track in rows:
        head = ""
        if table is not previous:
            head = (f'<th rowspan="{spans[id(table)]}" class="task"><a class="to-table" href="#{anchor(table)}">'
                    f"{html.escape(names[id(table)])}</a></th>")
            previous = table
        body.append(f'<tr>{head}<td class="eps">{html.escape(table.column_label(column))}</td>'
                    + "".join(_entry_html(table, column, track, by_track.get(track)) for track in shown) + "</tr>")
    cost = (" After each name, its privacy cost: the converged reference's mean − the cell's mean, higher is more lost "
            "to privacy (hover for its 95% interval)." if has_reference
            else " No table has a converged reference yet: no privacy costs.")
    head = "".join(f"<th>{html.escape(tuning_label(track))}</th>" for track in shown)
    return (f'<section id="summary"><h2>Summary: who wins where</h2><p class="explain">{html.escape(EXPLAIN)}{cost}'
            '</p><div class="scroll"><table class="summary"><thead><tr><th>task</th><th>ε</th>'
            f"{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div></section>")


def summary_markdown(tables: list[Table], comparisons: list[Comparisons] | None = None,
                     labels: list[dict[Row, str]] | None = None) -> list[str]:
    """The same matrix as markdown lines (the costs in parentheses)."""
    rows = matrix(tables, comparisons, labels)
    if not rows:
        return []
    shown, names = tracks([table for table, _, _ in rows]), table_names(tables)
    lines = ["## Summary: who wins where", "", "▲ winner or ≈ tied set per task, ε and track (the tables' own "
             "comparisons; cells not above trivial never named); in parentheses the privacy cost, reference − cell.",
             "", "| task | ε | " + " | ".join(tuning_label(track) for track in shown) + " |",
             "| --- " * (2 + len(shown)) + "|"]
    for table, column, by_track in rows:
        cells = []
        for track in shown:
            entry = by_track.get(track)
            if entry is None or entry.mark is None:
                cells.append(entry.note if entry else "")
                continue
            cells.append(f"{MARKS[entry.mark]} " + ", ".join(
                name + (f" ({cost[0]:+.3f})" if cost else "") for name, cost in entry.names))
        lines.append("| " + " | ".join(text.replace("|", "\\|") for text in
                                       [names[id(table)], column.label, *cells]) + " |")
    return lines + [""]
