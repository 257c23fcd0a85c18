"""The leaderboard as one self-contained HTML page: a table of contents, per table one sub-table per track with 95%
intervals, marks and each column's winner or tied set, the methods (description, file, paper), one plot per table
with a panel per track in fixed colours per method, the published figures, and every run. Inline CSS and SVG; no
scripts."""
from __future__ import annotations

import hashlib
import html
import io
from typing import Any

from dpbench.board import reference
from dpbench.board.model import TRACK_NOTES, Cell, Table, metric_name, tuning_label, tuning_mode
from dpbench.board.text import (LEGEND, TRIVIAL, anchor, best_text, explanation, fmt_or_dash, published_notes,
                                published_rows, published_text, reference_text, unmatched_lines, value_text)
from dpbench.board.published import PublishedResult

#: One colour per method on every plot: the built-in methods in a fixed order, others by a hash of their name.
METHOD_ORDER = ["nonprivate", "dpsgd", "dpgd", "norm_bound", "adaclip", "ada_dp", "dpadam", "dpadam_bc",
                "output_perturbation", "amp", "amp_nt"]
PALETTE = ["#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5"]
_PUBLISHED_MARKERS = ["D", "s", "^", "v", "P"]
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1500px; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.value { white-space: nowrap; }
td.winner { background: #e3f6e9; font-weight: 600; }
td.tied { background: #f1f9f3; }
td.trivial { color: #999; background: #f4f4f4; }
td.trivial small { display: block; font-size: 11px; }
tr.best td { background: #fafafa; font-size: 12px; }
span.mark { color: #0a5; }
div.scroll { overflow-x: auto; }
table.runs { font-size: 12px; }
tr.published td { background: #f6f3e8; font-style: italic; color: #555; }
tr.reference td { background: #eef2fa; color: #333; }
tr.published .detail { font-size: 12px; }
details.runs summary { color: #36c; cursor: pointer; font-size: 12px; }
details.runs a { font-family: monospace; font-size: 12px; display: block; }
figure.plot svg { max-width: 100%; height: auto; }
p.explain, ul.notes { font-size: 13px; color: #444; }
span.plugin { color: #a60; font-size: 12px; }
nav.contents li { font-size: 14px; }
"""


def method_colour(method: str) -> str:
    if method in METHOD_ORDER:
        return PALETTE[METHOD_ORDER.index(method)]
    return PALETTE[len(METHOD_ORDER) + int(hashlib.sha256(method.encode()).hexdigest(), 16) % (len(PALETTE) -
                                                                                                 len(METHOD_ORDER))]


def _cell_html(cell: Cell, mark: str | None, cost: str = "", text: str | None = None) -> str:
    """A cell: its value (or ``text``), marks, runs, and in its tooltip the interval and the privacy ``cost``."""
    links = "".join(f'<a href="#run-{html.escape(run_id)}">{html.escape(run_id)}</a>' for run_id in cell.run_ids)
    interval = cell.ci95
    title = "; ".join(part for part in [f"95% interval [{interval[0]:.4f}, {interval[1]:.4f}], sd {cell.std:.4f}"
                                        if interval else "one seed", cost] if part)
    if cell.trivial_p is not None:
        title += f"; one-sided p above the majority-class rate {cell.majority_rate:.4f}: {cell.trivial_p:.3g}"
    trivial = cell.not_above_trivial
    classes = " ".join(["value", *([mark] if mark and not trivial else []), *(["trivial"] if trivial else [])])
    return (f'<td class="{classes}" title="{html.escape(title)}">{html.escape(text or value_text(cell, mark))}'
            + (f"<small>{TRIVIAL}</small>" if trivial else "")
            + f'<details class="runs"><summary>n = {cell.n_seeds}</summary>{links}</details></td>')


def _track_table(table: Table, track: str) -> str:
    columns, comparisons, labels = reference.columns(table), table.comparisons(), table.row_labels()
    marks = {column: comparisons.get((track, column), ({}, {}))[0] for column in columns}
    head = "".join(f"<th>{html.escape(text)}</th>" for text in
                   ["method", "sampler", "accountant", *(c.label for c in columns)])
    body = []
    for row in table.rows(track):
        label = html.escape(reference.row_label(table, row, labels[row]))
        if row.external:
            label += ' <span class="plugin">external plugin</span>'
        cells = "".join(_cell_html(table.cells[row, c], marks[c].get(row),
                                   reference.cost_text(reference.privacy_cost(table, table.cells[row, c]))
                                   if c.kind != "non-private" else "")
                        if (row, c) in table.cells else "<td></td>" for c in columns)
        body.append(f'<tr class="measured" data-track="{html.escape(track)}" data-method="{html.escape(row.method)}">'
                    f"<td>{label}</td><td>{html.escape(row.sampler)}</td>"
                    f"<td>{html.escape(row.accountant or '—')}</td>{cells}</tr>")
    if table.direction is not None:
        body.append('<tr class="best"><td colspan="3">winner (▲) or not significantly below the best (≈)</td>'
                    + "".join(f"<td>{html.escape(best_text(marks[c], labels))}</td>" for c in columns) + "</tr>")
    if (found := reference.reference(table)) is not None:
        cells = "".join(_cell_html(found[1], None, text=reference_text(found[1])) if c == reference.NON_PRIVATE
                        else "<td></td>" for c in columns)
        body.append(f'<tr class="reference" data-track="{html.escape(track)}" data-method="reference">'
                    f"<td>{html.escape(reference.LABEL)}</td><td>{html.escape(found[0].sampler)}</td><td>—</td>"
                    f"{cells}</tr>")
    return (f'<h3>{html.escape(tuning_label(track))}</h3><p class="explain">{html.escape(TRACK_NOTES.get(track, ""))}'
            f'</p><div class="scroll"><table class="leaderboard" data-track="{html.escape(track)}"><thead><tr>{head}'
            f'</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def _published_table(table: Table) -> str:
    columns = table.columns
    body = []
    for (label, detail), by_column in published_rows(table):
        cells = "".join(f'<td class="value">{html.escape(published_text(by_column[c]))}</td>' if c in by_column
                        else "<td></td>" for c in columns)
        body.append(f'<tr class="published"><td>{html.escape(label)}<br>'
                    f'<span class="detail">{html.escape(detail)}</span></td>{cells}</tr>')
    head = "".join(f"<th>{html.escape(text)}</th>" for text in ["published (not measured here)",
                                                                 *(c.label for c in columns)])
    return (f'<div class="scroll"><table class="published"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _plot_svg(table: Table, salt: str) -> str | None:
    """Metric versus ε, one panel per track, one line per row with 95% intervals, log ε axis, fixed
    colours per method; non-private rows are horizontal lines, published figures hollow markers. None without private
    runs. matplotlib is imported here: only the page needs it."""
    import matplotlib
    from matplotlib.figure import Figure

    private_columns = [c for c in table.columns if c.kind != "non-private"]
    tracks = [track for track in table.tracks if any(row.tuning == track for row, c in table.cells
                                                    if c.kind != "non-private")]
    if not private_columns or not tracks:
        return None
    labels = table.row_labels()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "path"}):
        figure = Figure(figsize=(4.2 * len(tracks) + 2.5, 4.0), layout="constrained")
        axes_list = figure.subplots(1, len(tracks), sharey=True, squeeze=False)[0]
        for axes, track in zip(axes_list, tracks):
            for row in table.rows(track):
                points = sorted((column.epsilon, cell) for (r, column), cell in table.cells.items()
                                if r == row and column.kind != "non-private")
                colour = method_colour(row.method)
                if points:
                    errors = [[max(0.0, cell.mean - cell.ci95[0]) if cell.ci95 else 0.0 for _, cell in points],
                              [max(0.0, cell.ci95[1] - cell.mean) if cell.ci95 else 0.0 for _, cell in points]]
                    axes.errorbar([eps for eps, _ in points], [cell.mean for _, cell in points], yerr=errors,
                                  color=colour, marker="o", markersize=4, capsize=3, label=labels[row])
            baselines = [(row, cell) for (row, column), cell in table.cells.items()
                         if column.kind == "non-private" and row.tuning == track]
            for row, cell in baselines:
                axes.axhline(cell.mean, color=method_colour(row.method), linestyle="--", linewidth=1,
                             label=f"{labels[row]} (non-private, same budget)")
            if (converged := reference.reference(table)) is not None:
                axes.axhline(converged[1].mean, color="#555555", linestyle=":", linewidth=1.5,
                             label=reference.LABEL)
            sources = sorted({entry.source for entry in table.published})
            for _, by_column in published_rows(table):
                entries = list(by_column.values())
                private = sorted((e.epsilon, e.value) for e in entries if e.epsilon is not None)
                if private:
                    axes.plot(*zip(*private), linestyle="none", markersize=6, markerfacecolor="none",
                              marker=_PUBLISHED_MARKERS[sources.index(entries[0].source) % 5],
                              color=method_colour(entries[0].method),
                              label=f"published: {entries[0].paper_method} ({entries[0].source})")
            axes.set_xscale("log")
            ticks = sorted({column.epsilon for column in private_columns})
            axes.set_xticks(ticks, labels=[f"{tick:g}" for tick in ticks])
            axes.minorticks_off()
            axes.set_xlabel("ε")
            axes.set_title(tuning_label(track), fontsize=9)
            axes.grid(True, which="both", alpha=0.3)
        axes_list[0].set_ylabel(f"{table.metric} ({table.direction or '?'} is better)")
        handles = {}
        for axes in axes_list:
            for handle, label in zip(*axes.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        figure.legend(list(handles.values()), list(handles.keys()), loc="outside right upper", fontsize=7,
                      frameon=False)
        figure.suptitle(table.title(), fontsize=10)
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    return svg[svg.index("<svg"):]


def _methods_section(tables: list[Table], methods: dict[str, Any]) -> str:
    """Each method of the page: its colour, one-line description, file and paper."""
    shown = sorted({row.method for table in tables for row, _ in table.cells}, key=lambda m: (
        METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m))
    files: dict[str, tuple[str | None, bool]] = {}
    for table in tables:
        for run in table.runs:
            code = (run.get("code") or {}).get("method") or {}
            files[run["method"]] = (code.get("file"), bool(code.get("external")))
    items = []
    for method in shown:
        cls = methods.get(method)
        description = getattr(cls, "description", "") if cls else ""
        paper = getattr(cls, "paper", None) if cls else None
        file, external = files.get(method) or (None, False)
        links = []
        if file:
            links.append(f'<a href="../{html.escape(file)}">{html.escape(file)}</a>' if not external
                         else f"{html.escape(file)} (external plugin)")
        if paper:
            links.append(f'<a href="{html.escape(paper)}">paper</a>')
        items.append(f'<li data-method="{html.escape(method)}"><span style="color:{method_colour(method)}">■</span> '
                     f'<strong>{html.escape(method)}</strong>: {html.escape(description)}'
                     f'{" · " + " · ".join(links) if links else ""}</li>')
    return f'<section id="methods"><h2>Methods</h2><ul class="notes">{"".join(items)}</ul></section>'


def _runs_table(tables: list[Table]) -> str:
    runs = {run["run_id"]: run for table in tables for run in table.runs}
    rows = []
    for run in sorted(runs.values(), key=lambda r: (r["task"], r["data_id"], r["method"], r["created_at"])):
        metric = metric_name(run)
        values = [run["run_id"], run["task"], run["data_id"], run["method"], tuning_label(tuning_mode(run)),
                  run["seed"], run["epsilon_target"], fmt_or_dash(run["epsilon"], ".4g"),
                  fmt_or_dash(run["delta"], ".3g"), run.get("neighbouring"), run["sampler"], run["accountant"],
                  f"{metric} = {run['metrics'][metric]:.6g}",
                  ", ".join(f"{key}={value}" for key, value in sorted(run["hyperparameters"].items())),
                  run.get("git_commit"), run["created_at"]]
        cells = "".join(f"<td>{html.escape('—' if v is None else str(v))}</td>" for v in values)
        rows.append(f'<tr id="run-{html.escape(run["run_id"])}">{cells}</tr>')
    head = "".join(f"<th>{name}</th>" for name in ["run", "task", "data", "method", "track", "seed", "ε target",
                                                     "ε spent", "δ", "neighbours", "sampler", "accountant", "metric",
                                                     "hyperparameters", "git commit", "created"])
    return (f'<div class="scroll"><table class="runs"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def to_html(tables: list[Table], unmatched: list[PublishedResult], methods: dict[str, Any]) -> str:
    contents = "".join(f'<li><a href="#{anchor(table)}">{html.escape(table.title())}</a></li>' for table in tables)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>dpbench leaderboard</title>", f"<style>{_STYLE}</style></head><body>",
             "<h1>dpbench leaderboard</h1>",
             f'<p class="explain">{html.escape(LEGEND)} Rows marked <em>published</em> are the seed papers\' own '
             "figures on their own data and settings: shown for reference, never averaged with or ranked against "
             "runs measured here. Each table is one task, data id, δ and neighbouring relation: ε under add/remove "
             "and under replace-one neighbours never share a table.</p>",
             f'<nav class="contents"><h2>Contents</h2><ul>{contents}<li><a href="#methods">Methods</a></li>'
             f'<li><a href="#runs">Runs</a></li></ul></nav>']
    for index, table in enumerate(tables):
        parts.append(f'<section class="task" id="{anchor(table)}"><h2>{html.escape(table.title())}</h2>')
        parts.append(f'<p class="explain">{html.escape(explanation(table))}</p>')
        parts += [f'<p class="explain">Data: {html.escape(note)}</p>' for note in table.data_notes]
        parts += [_track_table(table, track) for track in reference.tracks(table)]
        if table.published:
            parts.append(_published_table(table))
            parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(note)}</li>"
                                                       for note in published_notes(table.published)) + "</ul>")
        svg = _plot_svg(table, salt=f"dpbench-leaderboard-{index}")
        parts.append(f'<figure class="plot">{svg}<figcaption>{html.escape(table.metric)} versus ε, one panel per '
                     f"track; error bars: 95% intervals over seeds.</figcaption></figure>" if svg else
                     '<p class="explain">No private runs: no plot.</p>')
        parts.append("</section>")
    parts.append(_methods_section(tables, methods))
    if unmatched:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in unmatched_lines(unmatched))
        notes = "".join(f"<li>{html.escape(note)}</li>" for note in published_notes(unmatched))
        parts.append(f'<section id="published-unmatched"><h2>Published figures without runs here</h2>'
                     f'<ul class="notes">{items}</ul><ul class="notes">{notes}</ul></section>')
    parts.append(f'<section id="runs"><h2>Runs</h2>{_runs_table(tables)}</section></body></html>')
    return "\n".join(parts) + "\n"

