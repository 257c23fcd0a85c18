"""The leaderboard as one self-contained HTML page: a sticky table of contents; the summary matrix (who wins where,
:mod:`dpbench.board.summary`); per table one sub-table per track with 95% intervals, marks and each column's winner
or tied set, a plot (:mod:`dpbench.board.plot`) and the published figures; the methods (description, file, paper).
Inline CSS and SVG; no scripts.

The run ids are not on the page (they were 59% of it): :func:`runs_json` writes them, per cell and per run, to a file
beside the page (``index.html`` → ``index.runs.json``), which the page links to.
"""
from __future__ import annotations

import html
import json
from typing import Any

from dpbench.board import reference
from dpbench.board.model import TRACK_NOTES, Cell, Row, Table, metric_name, tuning_label, tuning_mode
from dpbench.board.plot import METHOD_ORDER, legend_html, method_colour, plot_svg
from dpbench.board.summary import Comparisons, summary_html, table_names
from dpbench.board.text import (LEGEND, TRIVIAL, anchor, best_text, explanation, published_notes,
                                published_rows, published_text, reference_text, unmatched_lines, value_text)
from dpbench.board.published import PublishedResult

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
tr.published td { background: #f6f3e8; font-style: italic; color: #555; }
tr.reference td { background: #eef2fa; color: #333; }
tr.published .detail { font-size: 12px; }
td.value small.n { display: block; font-size: 11px; color: #777; font-weight: normal; }
figure.plot svg { max-width: 100%; height: auto; }
figure.plot text { fill: #333; }
ul.legend { list-style: none; padding: 0; margin: 4px 0; font-size: 12px; columns: 3 16em; }
ul.legend span { display: inline-block; width: 22px; margin-right: 5px; vertical-align: middle; }
p.explain, ul.notes { font-size: 13px; color: #444; }
span.plugin { color: #a60; font-size: 12px; }
nav.contents { position: sticky; top: 0; z-index: 5; background: #fff; border-bottom: 1px solid #ccc;
  padding: 5px 0; margin: 0 0 1em; }
nav.contents ul { display: flex; flex-wrap: wrap; gap: 2px 14px; list-style: none; margin: 0; padding: 0;
  font-size: 14px; }
nav.contents strong { margin-right: 6px; }
section { scroll-margin-top: 4em; }
table.summary td.summary { font-size: 12px; }
table.summary td.winner { background: #e3f6e9; }
table.summary td.tied { background: #f1f9f3; }
table.summary td.none { color: #999; }
table.summary small.cost { color: #666; }
table.summary th.task { vertical-align: middle; }
table.summary td.eps { white-space: nowrap; }
"""


def _cell_html(cell: Cell, mark: str | None, cost: str = "", text: str | None = None, note: str = "") -> str:
    """A cell: its value (or ``text``), marks, the marks of the grid's notes on it (``note``), its number of seeds,
    and in its tooltip the interval and the privacy ``cost``. Its run ids are in the runs file (:func:`runs_json`)."""
    interval = cell.ci95
    title = "; ".join(part for part in [f"95% interval [{interval[0]:.4f}, {interval[1]:.4f}], sd {cell.std:.4f}"
                                        if interval else "one seed", cost] if part)
    if cell.trivial_p is not None:
        title += f"; one-sided p above the majority-class rate {cell.majority_rate:.4f}: {cell.trivial_p:.3g}"
    trivial = cell.not_above_trivial
    classes = " ".join(["value", *([mark] if mark and not trivial else []), *(["trivial"] if trivial else [])])
    return (f'<td class="{classes}" title="{html.escape(title)}">{html.escape(text or value_text(cell, mark))}'
            + (f'<sup class="note">{html.escape(note)}</sup>' if note else "")
            + (f"<small>{TRIVIAL}</small>" if trivial else "")
            + f'<small class="n">n = {cell.n_seeds}</small></td>')


def _track_table(table: Table, track: str, comparisons: Comparisons, labels: dict[Row, str]) -> str:
    columns = reference.columns(table)
    marks = {column: comparisons.get((track, column), ({}, {}))[0] for column in columns}
    head = "".join(f"<th>{html.escape(text)}</th>" for text in
                   ["method", "sampler", "accountant", *(table.column_label(c, track) for c in columns)])
    body = []
    for row in table.rows(track):
        label = html.escape(reference.row_label(table, row, labels[row]))
        if row.external:
            label += ' <span class="plugin">external plugin</span>'
        cells = "".join(_cell_html(table.cells[row, c], marks[c].get(row),
                                   reference.cost_text(reference.privacy_cost(table, table.cells[row, c]))
                                   if c.kind != "non-private" else "", note=table.cell_notes.get((row, c), ""))
                        if (row, c) in table.cells else "<td></td>" for c in columns)
        body.append(f'<tr class="measured" data-track="{html.escape(track)}" data-method="{html.escape(row.method)}">'
                    f"<td>{label}</td><td>{html.escape(row.sampler)}</td>"
                    f"<td>{html.escape(row.accountant or '—')}</td>{cells}</tr>")
    if table.direction is not None:
        body.append('<tr class="best"><td colspan="3">winner (▲) or not significantly below the best (≈)</td>'
                    + "".join(f'<td data-column="{html.escape(c.label)}">{html.escape(best_text(marks[c], labels))}'
                              f"</td>" for c in columns) + "</tr>")
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
                                                                 *(table.column_label(c) for c in columns)])
    return (f'<div class="scroll"><table class="published"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


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


def _run_summary(run: dict[str, Any]) -> dict[str, Any]:
    metric = metric_name(run)
    return {"run_id": run["run_id"], "task": run["task"], "data_id": run["data_id"], "method": run["method"],
            "track": tuning_mode(run), "seed": run["seed"], "epsilon_target": run["epsilon_target"],
            "epsilon": run["epsilon"], "delta": run["delta"], "neighbouring": run.get("neighbouring"),
            "sampler": run["sampler"], "accountant": run["accountant"], "metric": metric,
            "value": run["metrics"][metric], "hyperparameters": run["hyperparameters"],
            "git_commit": run.get("git_commit"), "created_at": run["created_at"]}


def runs_json(tables: list[Table]) -> str:
    """The page's run ids: ``cells``, one entry per cell of the page (its table's anchor, track, row, column and run
    ids; a cell shown in several tables once per table) and ``runs``, one entry per run (its settings and result).
    One entry a line."""
    cells = []
    for table in tables:
        labels = table.row_labels()
        found = [("reference", reference.LABEL, "reference", reference.NON_PRIVATE, cell)
                 for cell in table.references.values()]
        found += [(row.tuning, reference.row_label(table, row, labels[row]), row.method, column, cell)
                  for (row, column), cell in sorted(table.cells.items())]
        cells += [{"table": anchor(table), "task": table.task, "track": track, "row": label, "method": method,
                   "column": column.label, "run_ids": cell.run_ids} for track, label, method, column, cell in found]
    runs = {run["run_id"]: run for table in tables for run in table.runs}
    ordered = sorted(runs.values(), key=lambda r: (r["task"], r["data_id"], r["method"], r["created_at"], r["run_id"]))
    lines = [json.dumps(entry, sort_keys=True, ensure_ascii=False) for entry in cells]
    runs_lines = [json.dumps(_run_summary(run), sort_keys=True, ensure_ascii=False) for run in ordered]
    return ('{"cells": [\n' + ",\n".join(lines) + '\n],\n"runs": [\n' + ",\n".join(runs_lines) + "\n]}\n")


def runs_file_name(page_name: str) -> str:
    """The runs file beside a page: ``index.html`` → ``index.runs.json``."""
    stem = page_name[:-5] if page_name.endswith(".html") else page_name
    return f"{stem}.runs.json"


def to_html(tables: list[Table], unmatched: list[PublishedResult], methods: dict[str, Any],
            runs_file: str | None = None) -> str:
    """The page; ``runs_file``: the name of the runs file written beside it (None: none is, the page says so)."""
    comparisons = [table.comparisons() for table in tables]  # once per table: the summary and the tables share them
    labels = [table.row_labels() for table in tables]  # likewise
    names = table_names(tables)
    runs_link = (f'<a href="{html.escape(runs_file)}">{html.escape(runs_file)}</a>' if runs_file else None)
    contents = ['<li><a href="#summary">Summary</a></li>'] + [
        f'<li><a href="#{anchor(table)}">{html.escape(names[id(table)])}</a></li>'
        for table in tables] + ['<li><a href="#methods">Methods</a></li>']
    if unmatched:
        contents.append('<li><a href="#published-unmatched">Published elsewhere</a></li>')
    contents.append(f"<li>run ids: {runs_link}</li>" if runs_link else "")
    runs_note = (f"Every cell's run ids, and every run's settings and result: {runs_link} (beside this page)."
                 if runs_link else "Run ids: not written (the page went to standard output; write it with --out to "
                 "get the runs file beside it).")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>dpbench leaderboard</title>", f"<style>{_STYLE}</style></head><body>",
             f'<nav class="contents"><ul><li><strong>dpbench leaderboard</strong></li>{"".join(contents)}</ul></nav>',
             "<h1>dpbench leaderboard</h1>", summary_html(tables, comparisons, labels),
             f'<p class="explain">{html.escape(LEGEND)} Rows marked <em>published</em> are the seed papers\' own '
             "figures on their own data and settings: shown for reference, never averaged with or ranked against "
             "runs measured here. Each table is one task, data id, δ and neighbouring relation: ε under add/remove "
             f"and under replace-one neighbours never share a table. {runs_note}</p>"]
    for index, table in enumerate(tables):
        parts.append(f'<section class="task" id="{anchor(table)}"><h2>{html.escape(table.title())}</h2>')
        parts.append(f'<p class="explain">{html.escape(explanation(table))}</p>')
        parts += [f'<p class="explain">Data: {html.escape(note)}</p>' for note in table.data_notes]
        parts += [_track_table(table, track, comparisons[index], labels[index])
                  for track in reference.tracks(table)]
        parts += [f'<p class="explain"><sup class="note">{html.escape(mark)}</sup> {html.escape(text)}</p>'
                  for mark, text in table.notes]
        if table.published:
            parts.append(_published_table(table))
            parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(note)}</li>"
                                                       for note in published_notes(table.published)) + "</ul>")
        svg = plot_svg(table, index)
        parts.append(f'<figure class="plot">{svg}{legend_html(table, labels[index])}<figcaption>{html.escape(table.metric)} versus '
                     "ε, one panel per track; error bars: 95% intervals over seeds; the y-axis is set by the cells "
                     "above trivial, the reference and the non-private rows.</figcaption></figure>" if svg else
                     '<p class="explain">No private runs: no plot.</p>')
        parts.append("</section>")
    parts.append(_methods_section(tables, methods))
    if unmatched:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in unmatched_lines(unmatched))
        notes = "".join(f"<li>{html.escape(note)}</li>" for note in published_notes(unmatched))
        parts.append(f'<section id="published-unmatched"><h2>Published figures without runs here</h2>'
                     f'<ul class="notes">{items}</ul><ul class="notes">{notes}</ul></section>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
