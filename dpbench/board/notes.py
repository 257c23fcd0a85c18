"""Notes on cells, declared in the grid: what a reader must know beside a cell's value that its records do not say.

A grid (:mod:`dpbench.board.sweep`) may say::

    "notes": [{"mark": "†", "text": "studies created again with new secrets after ... (leaderboards/README.md)",
               "cells": [{"track": "random-stopping", "task": "digits", "method": "output_perturbation",
                          "epsilons": [0.1, 0.5]}]}]

Each note's mark follows the value of every cell it names (markdown, HTML, and the CSV's ``notes`` column, which
holds the text), and its text is printed under each table that holds one of them. A note is a disclosure, not an
exception: it changes no statistic, leader or check. Records are sealed when they are made, so what happened to a
cell afterwards (the committed board's 25 random-stopping cells whose studies were created again,
``leaderboards/rebuild/recreated.txt``) can only be said here. A note must name cells of its grid (tasks, methods,
ε and tracks; a typo would be a disclosure that shows nowhere); a board drawn before such a cell ran, or of other
tasks, shows the note nowhere (tests/test_committed_board.py checks the committed board for every cell it names).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from dpbench.board.model import Column, Row, Table
from dpbench.choices import TUNING_MODES
from dpbench.errors import UsageError

NOTE_KEYS, CELL_KEYS = {"mark", "text", "cells"}, {"track", "task", "method", "epsilons"}
TRACKS = (*TUNING_MODES, "validation", "none")


@dataclass(frozen=True)
class Note:
    mark: str
    text: str
    cells: tuple[tuple[str, str, str, float], ...]  # (track, task, method, ε)

    def names(self, table: Table, row: Row, column: Column) -> bool:
        return column.kind != "non-private" and any(
            (track, task, method) == (row.tuning, table.task, row.method) and math.isclose(column.epsilon, epsilon,
                                                                                           rel_tol=1e-9)
            for track, task, method, epsilon in self.cells)


def _short(value: Any) -> str:
    return json.dumps(value, default=str)[:80]


def parse(value: Any, where: str = "grid", grid: dict[str, Any] | None = None) -> tuple[Note, ...]:
    """The notes of a grid's ``notes`` value (None: none), their cells in ``grid`` (if given: its tasks, methods,
    epsilons and tracks); UsageError naming what is wrong."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise UsageError(f"{where}: notes must be a non-empty list of {{mark, text, cells}}, got {_short(value)}")
    notes = []
    for entry in value:
        if not isinstance(entry, dict) or set(entry) != NOTE_KEYS:
            raise UsageError(f"{where}: each note takes exactly mark, text and cells, got {_short(entry)}")
        mark, text, cells = entry["mark"], entry["text"], entry["cells"]
        if not (isinstance(mark, str) and 0 < len(mark) <= 3 and isinstance(text, str) and text.strip()):
            raise UsageError(f"{where}: a note's mark is 1 to 3 characters and its text is not empty: {_short(entry)}")
        if not isinstance(cells, list) or not cells or not all(
                isinstance(cell, dict) and set(cell) == CELL_KEYS and cell["track"] in TRACKS
                and all(isinstance(cell[key], str) for key in ("task", "method"))
                and isinstance(cell["epsilons"], list) and cell["epsilons"]
                and all(isinstance(e, (int, float)) and not isinstance(e, bool) and 0 < e < math.inf
                        for e in cell["epsilons"]) for cell in cells):
            raise UsageError(f"{where}: note {mark!r}: cells must be a non-empty list of {{track ({', '.join(TRACKS)}), "
                             f"task, method, epsilons (positive numbers)}}, got {_short(cells)}")
        notes.append(Note(mark, text.strip(), tuple((cell["track"], cell["task"], cell["method"], float(e))
                                                    for cell in cells for e in cell["epsilons"])))
    if len({note.mark for note in notes}) != len(notes):
        raise UsageError(f"{where}: two notes share a mark")
    if grid is not None:
        outside = [cell for note in notes for cell in note.cells if not _in_grid(cell, grid)]
        if outside:
            track, task, method, epsilon = outside[0]
            raise UsageError(f"{where}: notes name {len(outside)} cell(s) outside the grid, e.g. {method} on {task}, "
                             f"{track}, ε = {epsilon:g}")
    return tuple(notes)


def _in_grid(cell: tuple[str, str, str, float], grid: dict[str, Any]) -> bool:
    track, task, method, epsilon = cell
    return (task in (grid.get("tasks") or ()) and method in (grid.get("methods") or ())
            and track in (grid.get("tracks") or ["none"])
            and any(isinstance(e, (int, float)) and math.isclose(epsilon, e, rel_tol=1e-9)
                    for e in grid.get("epsilons") or ()))


def from_grid(grid: dict[str, Any], where: str) -> tuple[Note, ...]:
    """The notes of a grid, checked against its cells."""
    return parse(grid.get("notes"), where, grid)


def annotate(tables: list[Table], notes: tuple[Note, ...]) -> list[Table]:
    """Set each table's ``cell_notes`` (the marks of each noted cell) and ``notes`` (mark, text) it shows."""
    for table in tables:
        marks: dict[tuple[Row, Column], str] = {}
        used: list[Note] = []
        for (row, column) in table.cells:
            for note in notes:
                if note.names(table, row, column):
                    marks[row, column] = marks.get((row, column), "") + note.mark
                    used += [note] if note not in used else []
        table.cell_notes, table.notes = marks, [(note.mark, note.text) for note in used]
    return tables
