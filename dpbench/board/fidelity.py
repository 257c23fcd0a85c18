"""``dpbench fidelity``: every published number of the seed papers (:mod:`dpbench.board.published`) beside the board
cell of the closest protocol, as ``leaderboards/FIDELITY.md``.

For each published entry, the closest cell is chosen among the records of the entry's dpbench task (of its
``profile``, if any record of the task has that profile; otherwise of every profile) that train the entry's method
and report its metric, grouped into cells as the board groups them (:func:`dpbench.board.model.build_tables`):

* a non-private entry: the task's converged reference (:mod:`dpbench.board.reference`) if the records hold one,
  else the non-private method's cell;
* a private entry: the cell whose ε is nearest (by ratio) to the published ε;
* then by track, nearest first to the papers' protocol, which tunes without charging the selection to ε:
  :data:`TRACKS`; then the cell of most seeds.

A cell is *comparable* only if the records' data id is the paper's (``paper_data_id``; an entry whose paper data
no dpbench loader reads is never comparable), its ε is the published one (its target ε; or both non-private) and
its method is the paper's. Only a comparable cell gets a difference (board − published, in points). Otherwise the
report says why: "data not in the offline mirror: the board's data is X, not Y" when the mirror lacks the paper's
data, "the board's data is X, not Y" when the mirror holds it (or the file it is drawn from) but the board trains on
other data, and the ε that differs. A comparable cell's reason is what the records measure: whether the published
value lies in the cell's 95% interval or within :data:`CLOSE` of it, whether the cell is above the majority-class
rate, and whether a tuned cell selected the top of its list of epochs or steps (a budget that may bind); never a
guess.

Figures and tables without an accuracy on a dpbench metric (:data:`dpbench.board.published.FIGURES`) are listed
with the numbers the text gives for them, and the board's records of their setting, if any.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpbench.board import reference
from dpbench.board.model import Cell, Column, Row, Table, build_tables, tuning_label
from dpbench.board.published import FIGURES, PAPERS, PUBLISHED, PublishedFigure, PublishedResult
from dpbench.errors import UsageError

COMMAND = ("dpbench fidelity --records leaderboards/results.jsonl --records leaderboards/deep/results.jsonl "
           "--records leaderboards/federated/records.jsonl --records leaderboards/dperm/results.jsonl "
           "--out leaderboards/FIDELITY.md")
#: The tracks, nearest first to the seed papers' protocol (hyperparameters chosen on a grid, the choice not
#: charged to ε): the validation track, then test-set selection, the defaults (for the deep tasks: the paper's
#: hyperparameters, ``--profile paper``), and last the track that charges the tuning.
TRACKS = ("validation", "oracle", "none", "random-stopping")
CLOSE = 0.015  # 1.5 points: issue 33's bar for Yu et al.'s adult and kddcup99 rows


@dataclass(frozen=True)
class Match:
    """A published entry and the board cell of the closest protocol (``cell`` None: no board cell)."""

    entry: PublishedResult
    table: Table | None = None
    row: Row | None = None
    column: Column | None = None
    cell: Cell | None = None
    comparable: bool = False
    reason: str = ""

    @property
    def difference(self) -> float | None:
        """Board − published, as a fraction; None unless comparable."""
        return self.cell.mean - self.entry.value if self.comparable and self.cell is not None else None


def _data_reason(entry: PublishedResult, table: Table) -> str:
    board = f"the board's data is {table.data_id}, not {entry.paper_data or entry.paper_dataset}"
    return f"data not in the offline mirror: {board}" if not entry.in_mirror else \
        f"{board} (the mirror holds its source; the board does not train on it)"


def _same_epsilon(entry: PublishedResult, column: Column) -> bool:
    if entry.epsilon is None or column.kind == "non-private":
        return entry.epsilon is None and column.kind == "non-private"
    if column.kind == "spent":  # the column holds the spent ε to 2 significant digits
        return float(f"{entry.epsilon:.2g}") == column.epsilon
    return math.isclose(column.epsilon, entry.epsilon, rel_tol=1e-9)


BUDGET = ("epochs", "steps")  # the settings that bound a run's compute


def _boundary(cell: Cell) -> list[str]:
    """The budget settings (:data:`BUDGET`) that a tuned cell selected at the top of their search list, measured
    from its records: there, a larger budget might have been selected."""
    found = []
    for run in cell.runs:
        tuning = run.get("tuning") or {}
        space = (tuning.get("config") or {}).get("search_space") or tuning.get("search_space") or {}
        selected = tuning.get("selected_params") or {}
        for name in BUDGET:
            spec, value = space.get(name), selected.get(name)
            if not isinstance(spec, dict) or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            choices = [c for c in spec.get("choices", []) if isinstance(c, (int, float))]
            top = max(choices) if len(choices) > 1 else spec.get("high")
            text = f"{name} = {value:g}, the top of {choices or [spec.get('low'), top]}"
            if isinstance(top, (int, float)) and value >= top and text not in found:
                found.append(text)
    return found


def _measured_reason(entry: PublishedResult, cell: Cell) -> str:
    parts = []
    interval = cell.ci95
    if interval is not None and interval[0] <= entry.value <= interval[1]:
        parts.append("published value inside the cell's 95% interval")
    gap = cell.mean - entry.value
    parts.append(f"within {CLOSE * 100:g} points" if abs(gap) <= CLOSE else
                 f"{'above' if gap > 0 else 'below'} the paper by more than {CLOSE * 100:g} points")
    if cell.not_above_trivial:
        parts.append("the cell is not above the majority-class rate (collapsed)")
    if cell.n_seeds < 2:
        parts.append("one seed: no interval")
    ends = _boundary(cell)
    if ends:
        parts.append("selected at the top of its budget list (a larger budget might win): " + ", ".join(ends))
    if abs(gap) > CLOSE and not ends and not cell.not_above_trivial:
        parts.append("no measured cause yet")
    return "; ".join(parts)


def _candidates(entry: PublishedResult, tables: list[Table]) -> list[tuple[tuple, Table, Row, Column, Cell]]:
    found = []
    for table in tables:
        if table.metric != entry.metric:
            continue
        if entry.epsilon is None:
            ref = reference.reference(table)
            if ref is not None and entry.method == "nonprivate":
                found.append(((0, -1, -ref[1].n_seeds), table, ref[0], reference.NON_PRIVATE, ref[1]))
        for (row, column), cell in table.cells.items():
            if row.method != entry.method or (column.kind == "non-private") != (entry.epsilon is None):
                continue
            distance = 0.0 if entry.epsilon is None else abs(math.log(column.epsilon / entry.epsilon))
            track = TRACKS.index(row.tuning) if row.tuning in TRACKS else len(TRACKS)
            found.append(((distance, track, -cell.n_seeds), table, row, column, cell))
    return sorted(found, key=lambda item: (item[0], item[1].data_id, item[2], item[3]))


class Board:
    """The records, grouped into tables per (task, profile) on demand."""

    def __init__(self, records: list[dict[str, Any]]):
        self.records = [r for r in records if r.get("kind", "run") == "run"]
        self.federated = [r for r in records if r.get("kind") == "federated"]
        self._tables: dict[tuple[str, str | None], list[Table]] = {}

    def tables(self, task: str, profile: str | None) -> tuple[list[Table], bool]:
        """The task's tables, of ``profile`` if some record of the task has it; and whether that filter applied."""
        of_task = [r for r in self.records if r.get("task") == task]
        applied = profile is not None and any(r.get("profile") == profile for r in of_task)
        key = (task, profile if applied else None)
        if key not in self._tables:
            chosen = [r for r in of_task if r.get("profile") == profile] if applied else of_task
            self._tables[key] = build_tables(chosen, published=[])
        return self._tables[key], applied

    def match(self, entry: PublishedResult) -> Match:
        if entry.task is None:
            return Match(entry, reason="no board cell: no dpbench task trains this model")
        tables, applied = self.tables(entry.task, entry.profile)
        if not tables:
            mirror = "" if entry.in_mirror else f"; data not in the offline mirror: {entry.paper_data}"
            return Match(entry, reason=f"no board cell: the records hold no runs of task {entry.task}{mirror}")
        candidates = _candidates(entry, tables)
        if not candidates:
            what = "non-private run or reference" if entry.epsilon is None else f"private {entry.method} run"
            data = sorted({table.data_id for table in tables})
            mirror = "" if entry.in_mirror else "; data not in the offline mirror: the board's data is " \
                f"{', '.join(data)}, not {entry.paper_data}"
            return Match(entry, reason=f"no board cell: no {what} of task {entry.task} in the records{mirror}")
        _, table, row, column, cell = candidates[0]
        same_data = entry.paper_data_id is not None and entry.paper_data_id == table.data_id
        same_epsilon = _same_epsilon(entry, column)
        reasons = []
        if not same_data:
            reasons.append(_data_reason(entry, table))
        if not same_epsilon:
            reasons.append(f"the nearest board ε is {column.label}, the paper's {entry.epsilon_label}")
        if entry.profile and not applied:
            reasons.append(f"the board's runs of {entry.task} do not use the paper's profile ({entry.profile})")
        comparable = same_data and same_epsilon
        reason = _measured_reason(entry, cell) if comparable else "not comparable: " + "; ".join(reasons)
        if comparable and reasons:  # the profile differs, the data and ε do not
            reason += "; " + "; ".join(reasons)
        return Match(entry, table, row, column, cell, comparable, reason)


def _percent(value: float, digits: int = 2) -> str:
    return f"{value * 100:.{digits}f}"


def _cell_text(match: Match) -> str:
    cell, row, column = match.cell, match.row, match.column
    if cell is None or row is None or column is None or match.table is None:
        return "—"
    interval = cell.ci95
    shown = f" [{_percent(interval[0])}, {_percent(interval[1])}]" if interval else ""
    track = reference.LABEL.split(":")[0] if row.tuning == "reference" else tuning_label(row.tuning)
    method = "" if row.method == match.entry.method else f"{row.method}, "
    return (f"{_percent(cell.mean)}{shown} (n = {cell.n_seeds}; {match.table.task} · {match.table.data_id} · "
            f"{method}{column.label} · {track})")


def _published_text(entry: PublishedResult) -> str:
    spread = f" ± {_percent(entry.spread)}" if entry.spread is not None else ""
    return f"{entry.value * 100:g}{spread}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _summary(matches: list[Match], board: Board) -> list[str]:
    comparable = [m for m in matches if m.comparable]
    close = [m for m in comparable if abs(m.difference) <= CLOSE]
    with_cell = [m for m in matches if m.cell is not None]
    counts = Counter(m.entry.source for m in matches)
    lines = [f"- {len(matches)} published numbers ({'; '.join(f'{source}: {n}' for source, n in counts.items())}).",
             f"- {len(with_cell)} have a board cell of the closest protocol; {len(comparable)} of those are "
             f"comparable (the same data and ε), {len(close)} of them within {CLOSE * 100:g} points.",
             f"- {len(matches) - len(with_cell)} have no board cell; {len(with_cell) - len(comparable)} have one "
             "on other data or at another ε: no difference is given for them.",
             f"- {len(FIGURES)} figures and tables print no accuracy on a board metric (listed last, with the numbers "
             "their text gives).",
             f"- Records read: {len(board.records)} runs"
             + (f" and {len(board.federated)} federated runs" if board.federated else "") + "."]
    return lines


def _data_lines(group: list[Match]) -> list[str]:
    """Per paper dataset: the paper's data, whether the mirror holds it, and the board's data of the matched cells."""
    seen: dict[tuple[str, str], list[Match]] = {}
    for match in group:
        seen.setdefault((match.entry.paper_dataset, match.entry.paper_data), []).append(match)
    lines = []
    for (dataset, paper_data), matches in seen.items():
        tables = {id(m.table): m.table for m in matches if m.table is not None}.values()
        board = "; ".join(f"`{t.data_id}`" + (f" ({'; '.join(t.data_notes)})" if t.data_notes else "")
                          for t in tables) or "no records"
        mirror = {True: "holds it, or the file it is drawn from", False: "does not hold it",
                  None: "not known to hold it"}[matches[0].entry.in_mirror]
        lines.append(f"- {dataset}: the paper's data is {paper_data or 'not described'} (the offline mirror "
                     f"{mirror}); the board's: {board}.")
    return lines


def _figure_line(figure: PublishedFigure) -> str:
    printed = figure.printed or "none: the figure has no printed numbers"
    board = figure.board or "no board cell"
    return (f"| {_md(figure.source)} | {_md(figure.figure)} | {_md(figure.shows)} | {_md(printed)} | {_md(board)} "
            f"| {_md(figure.where)} |")


def render(records: list[dict[str, Any]], sources: list[str], command: str = COMMAND,
           published: list[PublishedResult] | None = None, figures: list[PublishedFigure] | None = None) -> str:
    """FIDELITY.md for ``records`` (read from ``sources``)."""
    board = Board(records)
    entries = PUBLISHED if published is None else published
    matches = [board.match(entry) for entry in entries]
    lines = ["# Fidelity: the seed papers' published numbers beside the board", "",
             f"Generated by `{command}` from {', '.join(f'`{s}`' for s in sources)}; do not edit by hand. The "
             "numbers and their sources are `dpbench/board/published.py` (one place; every number is cited by the "
             f"file and line of the plain-text copy of its paper in `{PAPERS}`); how a board cell is chosen and when "
             "it is comparable: `dpbench/board/fidelity.py`.", "",
             "A difference (board − published, in points) is given only where the board's records are on the "
             "paper's data (the same data id) at the paper's ε; everywhere else the row says why not. Nothing here is "
             "drawn on axes: a published number stands beside a board cell as text only. Tracks, nearest first "
             "to the papers' "
             f"protocol (grid-tuned, the selection not charged to ε): {', '.join(TRACKS)}; for a non-private "
             "number, the converged reference where the records hold one.", "", "## Summary", "",
             *_summary(matches, board), ""]
    by_source: dict[str, list[Match]] = {}
    for match in matches:
        by_source.setdefault(match.entry.source, []).append(match)
    for source, group in by_source.items():
        entry = group[0].entry
        lines += [f"## {source}", "", f"{entry.citation}. Setting: {entry.setting}. Notes: {entry.note}.", ""]
        lines += _data_lines(group) + [""]
        lines += ["| dataset | paper's method → dpbench | ε | published (%) | board cell (%) [95% interval] | "
                  "board − published (points) | reason | where printed |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for match in group:
            e = match.entry
            difference = "—" if match.difference is None else f"{match.difference * 100:+.2f}"
            lines.append(f"| {_md(e.paper_dataset)} | {_md(e.paper_method)} → {e.method} | {_md(e.epsilon_label)} "
                         f"| {_published_text(e)} | {_md(_cell_text(match))} | {difference} | {_md(match.reason)} "
                         f"| {_md(e.where)} |")
        settings = sorted({m.entry.setting for m in group} - {entry.setting})
        notes = sorted({m.entry.note for m in group} - {entry.note})
        lines += [""] + [f"Also: {s}." for s in settings] + [f"Also: {n}." for n in notes]
        if settings or notes:
            lines.append("")
    lines += ["## Figures and tables without a published accuracy", "",
              "| paper | figure | what it shows | numbers the text gives | the board | where printed |",
              "| --- | --- | --- | --- | --- | --- |"]
    lines += [_figure_line(figure) for figure in (FIGURES if figures is None else figures)]
    return "\n".join(lines) + "\n"


def read(paths: list[str]) -> list[dict[str, Any]]:
    """The records of ``paths``: training runs (of the current ledger version, checked as the board checks them, or
    older records that carry no ledger version: the deep tasks' single runs) and federated runs."""
    from dpbench.board.leaderboard import read_records
    from dpbench.results.records import LEDGER_VERSION, check_stored

    found = []
    for path in paths:
        for record in read_records(path):
            version = record.get("ledger_version")
            if record.get("kind", "run") == "run" and version is not None:
                if version != LEDGER_VERSION:
                    continue
                try:
                    check_stored(record)
                except ValueError as error:
                    raise UsageError(f"{path}: {error}") from None
            found.append(record)
    return found


def write(paths: list[str], out: str | None) -> str:
    """``dpbench fidelity``: FIDELITY.md from the records files, to ``out`` (or returned for stdout)."""
    if not paths:
        raise UsageError("dpbench fidelity needs at least one --records file")
    command = "dpbench fidelity " + " ".join(f"--records {path}" for path in paths) + (f" --out {out}" if out else "")
    text = render(read(paths), paths, command)
    if out is not None:
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(text, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {out}: {error.strerror or error}") from None
    return text

