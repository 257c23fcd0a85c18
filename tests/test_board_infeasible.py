"""Infeasible cells declared up front (dpbench/board/infeasible.py): a grid's declaration removes ``collapsed`` and
``below-majority`` from exactly the cells it covers (n·ε_train below its threshold, per track, or listed), and a
declared cell that learns is reported (``infeasible-above-trivial``)."""
import json

import pytest

from dpbench.board import infeasible
from dpbench.board.model import Column, build_tables
from dpbench.cli import main
from dpbench.results import store
from tests.test_board_check import CLEAN, OFFSETS, board
from tests.test_leaderboard import add_run

#: n_train is 1000 in every record (tests.test_leaderboard.add_run): n·ε = 1000 at ε = 1. Nothing learns at ε = 1.
DEAD = {"dpsgd": {1: 0.60, 2: 0.82, 8: 0.84}, "dpgd": {1: 0.58, 2: 0.80, 8: 0.82}}
DEAD_LINES = ["below-majority: digits (add-remove) · none · dpgd · ε = 1: mean 0.5800 below the majority-class rate "
              "0.6000",
              "collapsed: digits (add-remove) · none · dpsgd · ε = 1: mean 0.6000 not significantly above the "
              "majority-class rate 0.6000 (one-sided t-test p = 0.5)"]


def grid_file(tmp_path, declaration, name="grid.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"tasks": ["digits"], "methods": ["dpsgd", "dpgd"], "epsilons": [1, 2, 8],
                                "seeds": 5, **({"infeasible": declaration} if declaration is not None else {})}))
    return str(path)


def check(capsys, *args):
    code = main(["leaderboard", "--check", *args])
    return code, capsys.readouterr().out.splitlines()


def test_without_a_declaration_dead_cells_are_violations(capsys, tmp_path):
    board(DEAD)
    assert check(capsys) == (1, DEAD_LINES)
    assert check(capsys, "--grid", grid_file(tmp_path, None)) == (1, DEAD_LINES)


@pytest.mark.parametrize("declaration", [{"n_epsilon_below": 1001}, {"cells": {"digits": [1]}}])
def test_declared_cells_are_neither_collapsed_nor_below_majority(capsys, tmp_path, declaration):
    board(DEAD)
    assert check(capsys, "--grid", grid_file(tmp_path, declaration)) == (0, [])


def test_the_rule_is_strict_at_its_threshold(capsys, tmp_path):
    board(DEAD)  # n·ε = 1000 is not below 1000
    assert check(capsys, "--grid", grid_file(tmp_path, {"n_epsilon_below": 1000})) == (1, DEAD_LINES)


def test_a_declared_cell_that_learns_is_reported_until_explained(capsys, tmp_path):
    board({**DEAD, "dpsgd": {1: 0.65, 2: 0.82, 8: 0.84}})  # 0.65 ± 0.003: significantly above 0.6
    grid = grid_file(tmp_path, {"n_epsilon_below": 1001})
    code, lines = check(capsys, "--grid", grid)
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("infeasible-above-trivial: digits (add-remove) · none · dpsgd · ε = 1: declared "
                               "infeasible, but its mean 0.6500 is significantly above the majority-class rate 0.6000")
    exceptions = tmp_path / "exceptions.json"
    exceptions.write_text(json.dumps([{"kind": "infeasible-above-trivial", "task": "digits", "method": "dpsgd",
                                       "track": "none", "epsilons": [1], "reason": "a test of the check",
                                       "tested_by": "pytest"}]))
    assert check(capsys, "--grid", grid, "--exceptions", str(exceptions)) == (0, [])


def test_the_grid_beside_the_records_file_applies(capsys, tmp_path):
    board(DEAD)
    records = tmp_path / "results.jsonl"
    assert main(["leaderboard", "--format", "jsonl", "--out", str(records)]) == 0
    assert check(capsys, "--records", str(records)) == (1, DEAD_LINES)
    grid_file(tmp_path, {"n_epsilon_below": 1001})
    assert check(capsys, "--records", str(records)) == (0, [])


def test_declare_marks_the_tables_for_the_renderers():
    board(CLEAN)
    tables = infeasible.declare(build_tables(store.load()), infeasible.Declaration(n_epsilon_below=2001))
    private = [table for table in tables if table.delta is not None]
    # n·ε = 1000, 2000 < 2001; 8000 not; the validation track holds only the non-private row: nothing declared there
    assert [table.infeasible for table in private] == [frozenset({("none", 1.0), ("none", 2.0)})]
    assert private[0].declared_infeasible(Column(2.0, "target"), "none")
    assert private[0].declared_infeasible(Column(2.0, "target"))  # in every track that has runs at ε = 2
    assert not private[0].declared_infeasible(Column(2.0, "target"), "validation")
    assert not private[0].declared_infeasible(Column(8.0, "target"), "none")


def _random_stopping(means, per_trial):
    """The ``none`` track's cells of ``means`` again under random stopping, each trial at ``per_trial`` of ε."""
    for seed, offset in enumerate(OFFSETS):
        for method, by_epsilon in means.items():
            for epsilon, mean in by_epsilon.items():
                add_run(mean + offset, method=method, seed=seed, epsilon_target=epsilon, epsilon=epsilon,
                        test_majority_rate=0.6, tuning={"mode": "random-stopping", "private": True,
                                                        "per_trial_epsilon": per_trial * epsilon})


def test_random_stopping_is_declared_by_the_epsilon_each_trial_trains_at(capsys, tmp_path):
    """n·ε = 2000 at ε = 2 is not below 600, but each random-stopping trial trains at a quarter of it: n·ε_train =
    500. Dead cells there are declared in random stopping only; with the per-trial ε ignored (the rule on ε alone, as
    before 27 November 2026) they are violations."""
    board(CLEAN)
    _random_stopping({"dpsgd": {2: 0.60, 8: 0.84}, "dpgd": {2: 0.58, 8: 0.82}}, 0.25)
    tables = infeasible.declare(build_tables(store.load()), infeasible.Declaration(n_epsilon_below=600))
    [table] = [table for table in tables if table.delta is not None]
    assert table.infeasible == {("random-stopping", 2.0)}
    assert not table.declared_infeasible(Column(2.0, "target"))  # not in every track
    grid = grid_file(tmp_path, {"n_epsilon_below": 600})
    assert check(capsys, "--grid", grid) == (0, [])
    stopping = {"mode": "random-stopping", "private": True}
    column = Column(2.0, "target")
    both = [{"tuning": {**stopping, "per_trial_epsilon": 1.0}}, {"tuning": {**stopping, "per_trial_epsilon": 1.2}}]
    assert infeasible.training_epsilon(column, "random-stopping", both) == 1.2
    # Only a private random-stopping record's per-trial ε (verify checks it), and only in that track: a validation
    # record stating one (unchecked) declared its whole column (review of 27 November).
    for track, runs in [("validation", [{"tuning": {"mode": "validation", "per_trial_epsilon": 0.01}}]),
                        ("random-stopping", [{"tuning": {**stopping, "per_trial_epsilon": 1.0}},
                                             {"tuning": {"mode": "validation", "per_trial_epsilon": 0.01}}]),
                        ("random-stopping", [{"tuning": {"mode": "random-stopping", "per_trial_epsilon": 0.01}}]),
                        ("none", [{"tuning": {**stopping, "per_trial_epsilon": 0.01}}])]:
        assert infeasible.training_epsilon(column, track, runs) == 2.0, (track, runs)
    records = tmp_path / "results.jsonl"
    assert main(["leaderboard", "--format", "jsonl", "--out", str(records)]) == 0
    capsys.readouterr()
    assert main(["leaderboard", "--records", str(records), "--format", "md", "--grid", grid]) == 0
    page = capsys.readouterr().out
    tracks = page.split("### ")
    [untuned] = [part for part in tracks if part.startswith("untuned") or part.startswith("none")]
    [stopping] = [part for part in tracks if "random stopping" in part.split("\n")[0]
                  or "random-stopping" in part.split("\n")[0]]
    assert "ε = 2 · infeasible (declared)" in stopping and "ε = 8 · infeasible" not in stopping
    assert "infeasible" not in untuned.split("\n\n#")[0]


def test_the_renderers_head_a_declared_column_as_infeasible(capsys, tmp_path):
    board(DEAD)
    records = tmp_path / "results.jsonl"
    assert main(["leaderboard", "--format", "jsonl", "--out", str(records)]) == 0
    capsys.readouterr()
    grid_file(tmp_path, {"n_epsilon_below": 1001})  # grid.json beside the records: it applies
    for fmt in ("md", "html"):
        assert main(["leaderboard", "--records", str(records), "--format", fmt, "--out", str(tmp_path / fmt)]) == 0
        page = (tmp_path / fmt).read_text()
        assert "ε = 1 · infeasible (declared)" in page and "ε = 2 · infeasible" not in page, fmt
    (tmp_path / "grid.json").unlink()  # no grid beside the records, none given: nothing declared
    assert main(["leaderboard", "--records", str(records), "--format", "md", "--out", str(tmp_path / "md")]) == 0
    assert "infeasible (declared)" not in (tmp_path / "md").read_text()
    elsewhere = grid_file(tmp_path, {"n_epsilon_below": 1001}, "other.json")
    capsys.readouterr()
    assert main(["leaderboard", "--records", str(records), "--format", "md", "--grid", elsewhere]) == 0
    assert "ε = 1 · infeasible (declared)" in capsys.readouterr().out


@pytest.mark.parametrize("declaration, message", [
    ({"n_epsilon": 50}, "infeasible must be an object"),
    ({}, "infeasible must be an object"),
    ({"n_epsilon_below": 0}, "infeasible.n_epsilon_below must be a positive number, got 0"),
    ({"n_epsilon_below": True}, "infeasible.n_epsilon_below must be a positive number, got true"),
    ({"cells": {"digits": []}}, "infeasible.cells must map task names to non-empty lists of positive ε"),
    ({"cells": {"adult": [1]}}, "infeasible.cells names cells not in the grid: adult"),
    ({"cells": {"digits": [0.5]}}, "infeasible.cells names cells not in the grid: digits at ε = 0.5"),
])
def test_bad_declarations_are_refused(refused, tmp_path, declaration, message):
    assert message in refused("sweep", grid_file(tmp_path, declaration))
