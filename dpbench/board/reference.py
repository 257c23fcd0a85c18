"""What the board shows of the converged non-private references (:mod:`dpbench.tuning.reference`): a row in every
track of their table, never ranked and never a leader; each private cell's *privacy cost*, reference − cell with a
95% interval; and the label of the tuned non-private baseline, which trains under the same budget of epochs and
trials as the private methods ("non-private, same budget").

The interval: where the reference is one solve (or its seeds agree), its value is a constant and the interval is
the cell's own, reflected; otherwise Welch's, from both standard errors.
"""
from __future__ import annotations

import math

from scipy import stats

from dpbench.board.model import Cell, Column, Row, Table
from dpbench.choices import REFERENCE_MODE

NON_PRIVATE = Column(math.inf, "non-private")
LABEL = "reference: converged non-private ERM (not ranked)"
SAME_BUDGET = "non-private, same budget"


def reference(table: Table) -> tuple[Row, Cell] | None:
    """The table's reference row and cell; of several (other code or settings), the newest."""
    if not table.references:
        return None
    return max(table.references.items(), key=lambda item: (max(run["created_at"] for run in item[1].runs), item[0]))


def columns(table: Table) -> list[Column]:
    """The table's columns, with the non-private one where a reference needs it."""
    return sorted({*table.columns, NON_PRIVATE}) if table.references else table.columns


def tracks(table: Table) -> list[str]:
    """The table's tracks, each with the reference row; a table of references only shows them in one of their own."""
    return table.tracks or ([REFERENCE_MODE] if table.references else [])


def privacy_cost(table: Table, cell: Cell) -> tuple[float, tuple[float, float] | None] | None:
    """(reference − cell, its 95% interval or None for a cell of one seed) on the metric's scale, higher = more
    lost to privacy; None without a reference or where the metric's direction is unknown."""
    found = reference(table)
    if found is None or table.direction is None:
        return None
    ref = found[1]
    cost = table.sign * (ref.mean - cell.mean)
    if not ref.std:  # one solve, or seeds that agree: a constant
        interval = cell.ci95
        if interval is None:
            return cost, None
        low, high = sorted(table.sign * (ref.mean - end) for end in interval)
        return cost, (low, high)
    if cell.se is None:
        return cost, None
    se = math.hypot(ref.se, cell.se)
    df = se**4 / (ref.se**4 / (ref.n_seeds - 1) + cell.se**4 / (cell.n_seeds - 1))  # Welch–Satterthwaite
    half = float(stats.t.ppf(0.975, df)) * se
    return cost, (cost - half, cost + half)


def cost_text(cost: tuple[float, tuple[float, float] | None] | None) -> str:
    if cost is None:
        return ""
    value, interval = cost
    return f"privacy cost {value:+.4f}" + ("" if interval is None else f" [{interval[0]:+.4f}, {interval[1]:+.4f}]")


def row_label(table: Table, row: Row, label: str) -> str:
    """A non-private method's row says that it trained under the same budget as the private ones."""
    return f"{label} ({SAME_BUDGET})" if (row, NON_PRIVATE) in table.cells else label
