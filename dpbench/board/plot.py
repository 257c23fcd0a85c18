"""The page's plots: a table's metric against ε, one panel per track, written as compact inline SVG (a few kB per
table: matplotlib's SVG of the same plot was 130–170 kB, a third of the page budget each).

Each panel: one line per row with 95% intervals over seeds (log ε axis, fixed colours per method), filled points for
cells above trivial and hollow ones for cells not above trivial; the converged reference (dotted), the majority-class
rate (dash-dot) and the track's non-private same-budget rows (dashed) as horizontal lines; published figures of the
same data as hollow diamonds (published points are never drawn on axes of other data).

The y-axis is set by the cells above trivial (their means and intervals), the reference and the non-private rows —
never by a cell not above trivial, so one collapsed method cannot squash the others into a line. A point outside the
axis is drawn as a triangle on the panel's edge, pointing the way it lies.
"""
from __future__ import annotations

import hashlib
import html
import math

from dpbench.board import reference
from dpbench.board.model import Cell, Row, Table, tuning_label
from dpbench.board.text import published_rows

#: One colour per method on every plot: the built-in methods in a fixed order, others by a hash of their name.
METHOD_ORDER = ["nonprivate", "dpsgd", "dpgd", "norm_bound", "adaclip", "ada_dp", "dpadam", "dpadam_bc",
                "output_perturbation", "amp", "amp_nt"]
PALETTE = ["#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5"]
REFERENCE_COLOUR, MAJORITY_COLOUR = "#444", "#b00"
WIDTH, HEIGHT = 300, 230  # one panel
LEFT, RIGHT, TOP, BOTTOM = 46, 10, 22, 34


def method_colour(method: str) -> str:
    if method in METHOD_ORDER:
        return PALETTE[METHOD_ORDER.index(method)]
    return PALETTE[len(METHOD_ORDER) + int(hashlib.sha256(method.encode()).hexdigest(), 16) % (len(PALETTE) -
                                                                                                 len(METHOD_ORDER))]


def majority_rate(table: Table) -> float | None:
    """The test set's majority-class rate, where the table's cells agree on one."""
    rates = {cell.majority_rate for cell in table.cells.values()} - {None}
    return rates.pop() if len(rates) == 1 else None


def _private_cells(table: Table) -> list[Cell]:
    return [cell for (_, column), cell in table.cells.items() if column.kind != "non-private"]


def y_limits(table: Table) -> tuple[float, float] | None:
    """The y-axis: from the private cells above trivial (means and interval ends; all private cells where none is),
    the reference and the non-private rows, padded by 6%; None without private cells."""
    cells = _private_cells(table)
    if not cells:
        return None
    shown = [cell for cell in cells if not cell.not_above_trivial] or cells
    values = [value for cell in shown for value in (cell.mean, *(cell.ci95 or ()))]
    values += [cell.mean for (_, column), cell in table.cells.items() if column.kind == "non-private"]
    if (found := reference.reference(table)) is not None:
        values.append(found[1].mean)
    low, high = min(values), max(values)
    pad = max((high - low) * 0.06, 0.005)
    return low - pad, high + pad


def _ticks(low: float, high: float) -> list[float]:
    raw = (high - low) / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9)
    return [round(k * step, 10) for k in range(first, math.floor(high / step + 1e-9) + 1)]


class _Panel:
    """Coordinates of one panel, at horizontal offset ``x0`` of the figure."""

    def __init__(self, x0: float, epsilons: list[float], ylim: tuple[float, float]):
        self.x0, self.ylim = x0, ylim
        self.lx = math.log10(min(epsilons)) - 0.15, math.log10(max(epsilons)) + 0.15

    def x(self, epsilon: float) -> float:
        share = (math.log10(epsilon) - self.lx[0]) / (self.lx[1] - self.lx[0])
        return round(self.x0 + LEFT + share * (WIDTH - LEFT - RIGHT), 1)

    def y(self, value: float) -> float:
        share = (value - self.ylim[0]) / (self.ylim[1] - self.ylim[0])
        return round(TOP + (1 - share) * (HEIGHT - TOP - BOTTOM), 1)

    def inside(self, value: float) -> bool:
        return self.ylim[0] <= value <= self.ylim[1]

    def edge(self, value: float, x: float, colour: str) -> str:
        """A triangle on the panel's edge for a point outside the axis."""
        if value < self.ylim[0]:
            y = HEIGHT - BOTTOM
            return f'<path class="outside" d="M{x - 4} {y - 7}h8l-4 7z" fill="{colour}"/>'
        y = TOP
        return f'<path class="outside" d="M{x - 4} {y + 7}h8l-4-7z" fill="{colour}"/>'


def _hline(panel: _Panel, value: float, colour: str, dash: str, cls: str) -> str:
    if not panel.inside(value):
        return ""
    y = panel.y(value)
    return (f'<path class="{cls}" d="M{panel.x0 + LEFT} {y}H{panel.x0 + WIDTH - RIGHT}" stroke="{colour}" '
            f'stroke-dasharray="{dash}" stroke-width="1.3"/>')


def _text(x: float, y: float, text: str, anchor: str = "middle", extra: str = "") -> str:
    return f'<text x="{x}" y="{y}" text-anchor="{anchor}"{extra}>{html.escape(text)}</text>'


def _panel_svg(table: Table, track: str, panel: _Panel, epsilons: list[float], index: int) -> str:
    x0, bottom = panel.x0, HEIGHT - BOTTOM
    parts = [f'<g class="panel" data-track="{html.escape(track)}">',
             f'<rect x="{x0 + LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{bottom - TOP}" fill="none" '
             f'stroke="#999"/>', _text(x0 + (LEFT + WIDTH - RIGHT) / 2, TOP - 7, tuning_label(track))]
    for tick in _ticks(*panel.ylim):
        y = panel.y(tick)
        parts.append(f'<path d="M{x0 + LEFT} {y}H{x0 + WIDTH - RIGHT}" stroke="#eee"/>')
        parts.append(_text(x0 + LEFT - 3, y + 3, f"{tick:g}", "end"))
    for epsilon in epsilons:
        parts.append(_text(panel.x(epsilon), bottom + 12, f"{epsilon:g}"))
    parts.append(_text(x0 + (LEFT + WIDTH - RIGHT) / 2, bottom + 26, "ε"))
    clip = f"clip-{index}-{html.escape(track)}"
    parts.append(f'<clipPath id="{clip}"><rect x="{x0 + LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
                 f'height="{bottom - TOP}"/></clipPath><g clip-path="url(#{clip})">')
    outside = []
    if (rate := majority_rate(table)) is not None:
        parts.append(_hline(panel, rate, MAJORITY_COLOUR, "6 3 1 3", "majority-line"))
    if (found := reference.reference(table)) is not None:
        parts.append(_hline(panel, found[1].mean, REFERENCE_COLOUR, "2 2", "reference-line"))
    for (row, column), cell in sorted(table.cells.items()):
        if column.kind == "non-private" and row.tuning == track:
            parts.append(_hline(panel, cell.mean, method_colour(row.method), "5 3", "nonprivate-line"))
    for row in table.rows(track):
        points = sorted((column.epsilon, cell) for (r, column), cell in table.cells.items()
                        if r == row and column.kind != "non-private")
        if not points:
            continue
        colour = method_colour(row.method)
        line = "M" + "L".join(f"{panel.x(e)} {panel.y(cell.mean)}" for e, cell in points)
        bars = "".join(f"M{panel.x(e)} {panel.y(cell.ci95[0])}V{panel.y(cell.ci95[1])}" for e, cell in points
                       if cell.ci95)
        filled = "".join(f"M{panel.x(e)} {panel.y(cell.mean)}h0" for e, cell in points
                         if not cell.not_above_trivial and panel.inside(cell.mean))
        hollow = "".join(f'<circle cx="{panel.x(e)}" cy="{panel.y(cell.mean)}" r="2.6"/>' for e, cell in points
                         if cell.not_above_trivial and panel.inside(cell.mean))
        parts.append(f'<g class="row" data-method="{html.escape(row.method)}" stroke="{colour}" fill="none">'
                     f'<path d="{line}" stroke-width="1.4"/>' + (f'<path d="{bars}"/>' if bars else "")
                     + (f'<path d="{filled}" stroke-width="5.5" stroke-linecap="round"/>' if filled else "")
                     + (f'<g fill="#fff">{hollow}</g>' if hollow else "") + "</g>")
        outside += [panel.edge(cell.mean, panel.x(e), colour) for e, cell in points if not panel.inside(cell.mean)]
    for _, by_column in _published_rows(table):
        entry = next(iter(by_column.values()))
        marks = "".join(f'<path d="M{panel.x(e.epsilon)} {panel.y(e.value) - 4}l4 4-4 4-4-4z"/>'
                        for e in by_column.values() if e.epsilon is not None and panel.inside(e.value))
        if marks:
            parts.append(f'<g class="published" stroke="{method_colour(entry.method)}" fill="#fff">{marks}</g>')
    parts.append("</g>")
    return "".join(parts + outside) + "</g>"


def _published_rows(table: Table):
    """The published figures measured on this table's own data (never drawn on axes of other data)."""
    return [(label, by_column) for label, by_column in published_rows(table)
            if next(iter(by_column.values())).paper_data_id == table.data_id]


def plot_svg(table: Table, index: int) -> str | None:
    """The table's plot (module docstring) as an ``<svg>`` element with ``data-ylim``; None without private runs."""
    epsilons = sorted({column.epsilon for (_, column) in table.cells if column.kind != "non-private"})
    tracks = [track for track in table.tracks if any(row.tuning == track for row, c in table.cells
                                                    if c.kind != "non-private")]
    ylim = y_limits(table)
    if not epsilons or not tracks or ylim is None:
        return None
    panels = [_Panel(i * WIDTH, epsilons, ylim) for i in range(len(tracks))]
    body = "".join(_panel_svg(table, track, panel, epsilons, index) for track, panel in zip(tracks, panels))
    label = f"{table.metric} ({table.direction or '?'} is better)"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH * len(tracks)} {HEIGHT}" '
            f'width="{WIDTH * len(tracks)}" height="{HEIGHT}" font-size="10" font-family="sans-serif" '
            f'data-ylim="{ylim[0]:.6g} {ylim[1]:.6g}">'
            f'<text transform="translate(10 {(HEIGHT - BOTTOM + TOP) / 2}) rotate(-90)" text-anchor="middle">'
            f"{html.escape(label)}</text>{body}</svg>")


def legend_html(table: Table, labels: dict[Row, str]) -> str:
    """The plot's legend: each method of the table (``labels``: its rows' labels), the reference, the majority-class
    rate and the non-private rows."""
    items: dict[str, str] = {}
    for row in table.rows():
        style = "dashed" if any(c.kind == "non-private" for (r, c) in table.cells if r == row) else "solid"
        text = reference.row_label(table, row, labels[row])
        items.setdefault(text, f'<li><span style="border-top:3px {style} {method_colour(row.method)}"></span>'
                               f"{html.escape(text)}</li>")
    if (found := reference.reference(table)) is not None:
        items[reference.LABEL] = (f'<li><span style="border-top:3px dotted {REFERENCE_COLOUR}"></span>'
                                  f"{html.escape(reference.LABEL)}: {found[1].mean:.4g}</li>")
    if (rate := majority_rate(table)) is not None:
        ylim = y_limits(table)
        where = "" if ylim is None or ylim[0] <= rate <= ylim[1] else " (outside the axis)"
        items["majority"] = (f'<li><span style="border-top:3px dashed {MAJORITY_COLOUR}"></span>'
                             f"majority-class rate: {rate:.4g}{where}</li>")
    items["hollow"] = ("<li>○ not above trivial; ▼/▲ on an edge: a point outside the axis (the axis is set by "
                       "the cells above trivial)</li>")
    return f'<ul class="legend">{"".join(items.values())}</ul>'
