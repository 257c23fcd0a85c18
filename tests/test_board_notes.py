"""The grid's notes on cells (dpbench/board/notes.py): each named cell carries its mark in markdown, HTML and CSV, the
text is printed once under its table, nothing else changes; a note that is malformed in one respect, or names a
cell the board does not have, is refused in one line."""
import csv
import difflib
import io
import json

import pytest

from dpbench.board import grid, notes
from dpbench.board.leaderboard import render, render_page
from dpbench.cli import main
from dpbench.errors import UsageError
from dpbench.results import store
from tests.test_board_check import CLEAN, board

TEXT = "study created again with new secrets (a test)"
NOTE = {"mark": "†", "text": TEXT, "cells": [{"track": "none", "task": "digits", "method": "dpsgd", "epsilons": [2]}]}


def grid_file(tmp_path, noted):
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"tasks": ["digits"], "methods": sorted(CLEAN), "epsilons": [1, 2, 8], "seeds": 5,
                                "tracks": ["none"], "notes": noted}))
    return str(path)


def test_a_noted_cell_carries_its_mark_everywhere_and_nothing_else_changes(tmp_path):
    board()
    records, grid = store.load(), grid_file(tmp_path, [NOTE])
    plain, noted = render(records, "md"), render(records, "md", grid_path=grid)
    diff = [line for line in difflib.ndiff(plain.splitlines(), noted.splitlines()) if line[:2] in ("- ", "+ ")]
    assert sorted(line[:2] for line in diff) == ["+ ", "+ ", "+ ", "- "], diff  # one row changed, the note and a blank
    assert diff[0].startswith("- | dpsgd") and sorted(diff[2:]) == ["+ ", f"+ † {TEXT}"]
    row = diff[1][2:].split(" | ")
    assert sum("†" in cell for cell in row) == 1 and "†" in row[4]  # method, sampler, accountant, ε = 1, ε = 2
    assert row[4].replace("†", "") == diff[0][2:].split(" | ")[4]
    lines = list(csv.DictReader(io.StringIO(render(records, "csv", grid_path=grid))))
    assert [(r["method"], r["epsilon"]) for r in lines if r["notes"]] == [("dpsgd", "2.0")]
    assert {r["notes"] for r in lines} == {"", TEXT}
    page = render_page(records, None, "index.html", grid)[0]
    assert page.count('<sup class="note">†</sup>') == 2  # the cell and the note under its table


@pytest.mark.parametrize("bad, message", [
    ([], "non-empty list"),
    ([{**NOTE, "extra": 1}], "exactly mark, text and cells"),
    ([{**NOTE, "mark": ""}], "mark is 1 to 3 characters"),
    ([{**NOTE, "text": " "}], "text is not empty"),
    ([{**NOTE, "cells": []}], "cells must be a non-empty list"),
    ([{**NOTE, "cells": [{**NOTE["cells"][0], "track": "tuned"}]}], "cells must be a non-empty list"),
    ([{**NOTE, "cells": [{**NOTE["cells"][0], "epsilons": [0]}]}], "cells must be a non-empty list"),
    ([{**NOTE, "cells": [{**NOTE["cells"][0], "epsilons": [True]}]}], "cells must be a non-empty list"),
    ([NOTE, {**NOTE, "text": "another"}], "two notes share a mark"),
])
def test_a_note_wrong_in_one_respect_is_refused(bad, message):
    notes.parse([NOTE])  # the note each case departs from is accepted
    with pytest.raises(UsageError, match=message):
        notes.parse(bad)


@pytest.mark.parametrize("change", [{"method": "dpgd2"}, {"track": "validation"}, {"epsilons": [4]},
                                    {"task": "adult"}])
def test_a_note_on_a_cell_outside_its_grid_is_refused_in_one_line(capsys, tmp_path, change):
    board()
    grid = grid_file(tmp_path, [{**NOTE, "cells": [{**NOTE["cells"][0], **change}]}])
    assert main(["leaderboard", "--grid", grid]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dpbench: error: grid ") and "notes name 1 cell(s) outside the grid" in err and "\n" not in err


def test_a_board_without_the_noted_cell_draws_no_mark(tmp_path):
    board({"dpgd": CLEAN["dpgd"]})  # dpsgd's cells are not run yet
    noted = render(store.load(), "md", grid_path=grid_file(tmp_path, [NOTE]))
    assert "†" not in noted and noted == render(store.load(), "md")


def test_the_committed_grid_notes_the_recreated_cells():
    """leaderboards/rebuild/recreated.txt and the grid's note name the same 25 cells."""
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "leaderboards"
    listed = {tuple(line.split()[:3]) + (float(line.split()[3].split("=")[1]),)
              for line in (folder / "rebuild" / "recreated.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    [note] = [note for note in notes.from_grid(grid.read(folder / "grid.json"), "grid") if note.mark == "†"]
    assert set(note.cells) == listed and len(listed) == 25
