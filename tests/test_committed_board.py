"""The committed leaderboard (``leaderboards/``), as a reader gets it: every track of the grid is there for every
task, method and ε with five seeds, the board passes its own checks (``dpbench leaderboard --check``; the
exceptions that remain are explained), and every record verifies (``dpbench verify``: ε recomputed with
dp-accounting, content hashes, ledger version)."""
import contextlib
import csv
import io
import json
from pathlib import Path

import pytest

from dpbench import registry
from dpbench.board import notes
from dpbench.board.grid import seeds_for
from dpbench.cli import main
from tests.test_benchmarks import _script

BOARD = Path(__file__).resolve().parents[1] / "leaderboards"
BENCHMARKS = BOARD.parent / "benchmarks"


def test_the_csv_holds_every_track_task_method_and_epsilon():
    grid = json.loads((BOARD / "grid.json").read_text())
    with open(BOARD / "leaderboard.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    cells = {(row["tuning"], row["task"], row["method"], row["epsilon"]): row for row in rows}
    methods = registry.methods([])
    not_tunable_privately = {name for name in grid["methods"]  # AMP's analysis is not a trial mechanism here
                             if not methods[name].private or name in ("amp", "amp_nt")}
    for track in grid["tracks"]:
        for task in grid["tasks"]:
            for method in grid["methods"]:
                if track == "random-stopping" and method in not_tunable_privately:
                    continue
                budgets = [str(float(e)) for e in grid["epsilons"]] if methods[method].private else ["inf"]
                for epsilon in budgets:
                    row = cells.get((track, task, method, epsilon))
                    assert row is not None, (track, task, method, epsilon)
                    assert int(row["n_seeds"]) == seeds_for(grid, task), (track, task, method, epsilon, row["n_seeds"])
                    if methods[method].private:
                        assert row["neighbouring"] == grid["neighbouring"]
    noted = {(row["tuning"], row["task"], row["method"], float(row["epsilon"])) for row in rows if row["notes"]}
    assert noted == {cell for note in notes.from_grid(grid, "grid") for cell in note.cells}


@pytest.mark.xfail(strict=True, reason="the rebuilt board (27 November 2026) leaves 49 violations no tested cause "
                   "explains (leaderboards/causes.txt, leaderboards/README.md): 7 untuned cells of quantile "
                   "clipping, DP-Adam and AdaCliP on breast_cancer with most seeds exactly at the majority rate, 3 "
                   "budgets binding in the validation track, 24 wide intervals (20 on breast_cancer), 7 violations "
                   "(5 cells) of random stopping where half the studies or more released a majority-class model, 3 "
                   "decreasing and 3 collapsed or below-majority validation cells, 1 above-non-private, 1 "
                   "infeasible-above-trivial (issue 33, items 2, 4 and 7)")
def test_the_committed_board_passes_its_checks(capsys):
    assert main(["leaderboard", "--check", "--records", str(BOARD / "results.jsonl")]) == 0, capsys.readouterr().out


def test_the_committed_check_lists_exactly_the_violations_no_cause_explains(capsys):
    """The check of the committed board reports exactly the violations leaderboards/causes.txt (the causes' output,
    committed beside it) leaves unexplained: an exceptions.json edited to silence one more cell, or a cause's list
    gone stale, fails here without the dataset mirror the byte comparison below needs."""
    causes = (BOARD / "causes.txt").read_text().split("\nunexplained: ", 1)[1].splitlines()
    listed = {line[2:] for line in causes[1:] if line.startswith("  ")}
    assert len(listed) == int(causes[0]) > 0
    assert main(["leaderboard", "--check", "--records", str(BOARD / "results.jsonl")]) == 1
    reported = capsys.readouterr().out.splitlines()
    assert set(reported) == listed and len(reported) == len(listed)


def test_the_committed_exceptions_are_what_their_tests_find(tmp_path, mirror):
    """exceptions.json is benchmarks/violation_causes.py's output on the committed records, byte for byte: an entry
    edited by hand (a cell added to silence it) fails here; the causes are measured per cell, not asserted. The
    release-noise cause reads each task's input width, adult's and kddcup99's from the mirror."""
    module = _script("violation_causes")
    written = tmp_path / "exceptions.json"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert module.main([str(BOARD / "results.jsonl"), "--grid", str(BOARD / "grid.json"),
                            "--write", str(written)]) == 0
    assert written.read_text() == (BOARD / "exceptions.json").read_text()
    assert printed.getvalue() == (BOARD / "causes.txt").read_text()


def test_every_committed_record_verifies(capsys):
    assert main(["verify", str(BOARD / "results.jsonl")]) == 0, capsys.readouterr().out


def test_the_page_of_the_committed_records_is_under_600_kb_with_its_run_ids_beside_it(tmp_path):
    """The page was 3.5 MB, 59% of it run ids (issue 33, item 6): they are in ``index.runs.json`` beside it."""
    page = tmp_path / "index.html"
    assert main(["leaderboard", "--records", str(BOARD / "results.jsonl"), "--format", "html", "--out",
                 str(page)]) == 0
    assert page.stat().st_size < 600_000
    records = [json.loads(line) for line in (BOARD / "results.jsonl").read_text().splitlines() if line.strip()]
    written = json.loads((tmp_path / "index.runs.json").read_text())
    assert {run["run_id"] for run in written["runs"]} == {r["run_id"] for r in records if r.get("kind", "run") == "run"}
    assert 'href="index.runs.json"' in page.read_text()


@pytest.mark.parametrize("method, task", [("adaclip", "adult"), ("adaclip", "breast_cancer"),
                                          ("adaclip", "kddcup99"), ("quantile_clip", "adult"),
                                          ("quantile_clip", "breast_cancer"), ("quantile_clip", "kddcup99"),
                                          ("dpadam", "breast_cancer")])
def test_a_committed_transcription_reruns_to_its_lines(method, task, mirror):
    """The exceptions' transcription causes read benchmarks/results/<method>_transcription_<task>.txt (and README
    quotes the DP-Adam file): any edited run would silence or unsilence a cell (a review's edit of one breast_cancer
    run, 28 November, explained a cell while a one-line rerun passed). Every block of the file is rerun by the
    command heading it, and its runs' lines must come out byte for byte."""
    lines = (BENCHMARKS / "results" / f"{method}_transcription_{task}.txt").read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if "python benchmarks/root_causes.py" in line]
    assert starts and starts[0] <= 1, "a transcription file starts with the command that made it"
    for start, end in zip(starts, [*starts[1:], len(lines)]):
        command = lines[start].split("python benchmarks/root_causes.py", 1)[1].split()
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            _script("root_causes").main(command)
        def runs(block):  # the runs' lines: no comments, no column headers (a control block omits its own)
            return [line for line in block if not line.startswith(("#", "sigma "))]

        assert runs(printed.getvalue().splitlines()) == runs(lines[start + 1:end]), lines[start]


def test_the_board_marks_every_random_stopping_cell_whose_release_times_are_in_the_history(capsys, tmp_path):
    """Released tuned records carry only their day (a study's time is a function of its secret K), but checkpoints
    committed before that stamp hold the same studies' times to the second: the grid's ‡ note must name exactly the
    cells whose studies the history exposes (benchmarks/history_timing.py), so that the board says where the stamp
    hides nothing."""
    import subprocess

    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], capture_output=True, text=True,
                             cwd=BOARD.parent)
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("needs the repository's full git history")
    history = _script("history_timing")
    assert history.main([str(BOARD / "results.jsonl"), "--grid", str(BOARD / "grid.json"), "--mark", "‡",
                         "--check"]) == 0, capsys.readouterr()
    assert capsys.readouterr().out.startswith("1575 of 2100 random-stopping releases, in 270 of 360 cells")
    grid = json.loads((BOARD / "grid.json").read_text())
    [note] = [note for note in grid["notes"] if note["mark"] == "‡"]
    for wrong in ({**note, "cells": note["cells"][1:]},  # one exposed cell not marked
                  {**note, "cells": [*note["cells"], {**note["cells"][0], "method": "bandmf"}]}):  # one too many
        (tmp_path / "grid.json").write_text(json.dumps({**grid, "notes": [n for n in grid["notes"] if n is not note]
                                                        + [wrong]}))
        assert history.main([str(BOARD / "results.jsonl"), "--grid", str(tmp_path / "grid.json"), "--mark", "‡",
                             "--check"]) == 1
