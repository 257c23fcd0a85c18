"""The page a researcher reads in a minute (issue 33, item 6): the summary matrix names what the tables name, the run
ids live in a file beside the page, the plots' y-axis ignores collapsed cells, and the CSV carries the track of every
row and the hyperparameters the tuning selected."""
import csv
import io
import json
import re
from html.parser import HTMLParser

import pytest

from dpbench.board import leaderboard
from dpbench.cli import main
from dpbench.results import store
from tests.test_leaderboard import add_run, nonprivate_fields
from tests.test_reference import reference_fields


class Cells(HTMLParser):
    """Every ``<td>`` of a page: its attributes, text, the ids of the ``<span class="name">`` in it, and where it is
    (the enclosing section's id, table's track and row's class)."""

    def __init__(self):
        super().__init__()
        self.cells, self.section, self.track, self.row, self.open = [], None, None, None, None
        self.in_name = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section = attrs.get("id")
        elif tag == "table":
            self.track = attrs.get("data-track")
        elif tag == "tr":
            self.row = attrs.get("class")
        elif tag == "td":
            self.open = {"attrs": attrs, "text": "", "names": [], "section": self.section, "track": self.track,
                         "row": self.row}
        elif tag == "span" and attrs.get("class") == "name" and self.open is not None:
            self.in_name = True
            self.open["names"].append("")

    def handle_endtag(self, tag):
        if tag == "td" and self.open is not None:
            self.cells.append(self.open)
            self.open = None
        elif tag == "span":
            self.in_name = False

    def handle_data(self, data):
        if self.open is not None:
            self.open["text"] += data
            if self.in_name:
                self.open["names"][-1] += data


def page_cells(page: str) -> list[dict]:
    parser = Cells()
    parser.feed(page)
    return parser.cells


def add_summary_grid():
    """digits, majority-class rate 0.5, reference 0.90. none, ε = 1: dpsgd beats dpgd, and adaclip's mean is higher
    than both but not above trivial (one seed at the majority rate, p ≈ 0.07): never named. none, ε = 0.5: all at the
    majority rate. validation, ε = 1: dpsgd and dpgd tied. breast_cancer: a second table, one winner."""
    trivial = {"test_majority_rate": 0.5}
    validation = {"tuning": {"mode": "validation", "selected_params": {"lr": 1.0}}, **trivial}
    for seed, (a, b, c) in enumerate([(0.80, 0.70, 0.55), (0.81, 0.71, 0.99), (0.82, 0.69, 0.99)]):
        add_run(a, seed=seed, **trivial)
        add_run(b, method="dpgd", seed=seed, **trivial)
        add_run(c, method="adaclip", seed=seed, **trivial)
        for method in ("dpsgd", "dpgd", "adaclip"):
            add_run(0.5, method=method, seed=seed, epsilon_target=0.5, epsilon=0.5, **trivial)
        add_run((0.85, 0.86, 0.84)[seed], seed=seed, **validation)
        add_run((0.845, 0.855, 0.85)[seed], method="dpgd", seed=seed, **validation)
        add_run((0.95, 0.96, 0.94)[seed], seed=seed, task="breast_cancer", data_id="breast_cancer", **trivial)
        add_run((0.75, 0.76, 0.74)[seed], method="dpgd", seed=seed, task="breast_cancer", data_id="breast_cancer",
                **trivial)
    add_run(**reference_fields(0.90))


def test_the_summary_matrix_names_the_same_winners_and_tied_sets_as_the_tables(tmp_path):
    add_summary_grid()
    page = tmp_path / "index.html"
    assert main(["leaderboard", "--format", "html", "--out", str(page)]) == 0
    source = page.read_text()
    assert source.index('<section id="summary">') < source.index('<section class="task"')  # at the top
    cells = page_cells(source)
    summary = [cell for cell in cells if cell["attrs"].get("class", "").startswith("summary")]
    best = {(cell["section"], cell["track"], cell["attrs"]["data-column"]): cell["text"].strip()
            for cell in cells if cell["row"] == "best" and "data-column" in cell["attrs"]}
    assert summary and best
    named = {}
    for cell in summary:
        key = (cell["attrs"]["data-table"], cell["attrs"]["data-track"], cell["attrs"]["data-column"])
        marks = cell["attrs"]["class"].split()[1:]
        if marks in (["winner"], ["tied"]):
            text = {"winner": "▲", "tied": "≈"}[marks[0]] + " " + ", ".join(cell["names"])
            named[key] = text
            assert best[key] == text, key  # the same names as the track's sub-table
        else:
            assert best.get(key, "") == "", key  # the table names nobody there either
    # Every private column's answer in the tables is in the summary.
    assert {key for key, text in best.items() if text and key[2] != "non-private"} == set(named)
    digits = "digits-digits-add-remove-1e-06"
    assert named[digits, "none", "ε = 1"] == "≈ dpsgd"  # adaclip's higher mean is not above trivial
    assert named[digits, "validation", "ε = 1"] == "≈ dpgd, dpsgd"
    assert named["breast_cancer-breast_cancer-add-remove-1e-06", "none", "ε = 1"] == "▲ dpsgd"
    at_trivial = next(cell for cell in summary if (cell["attrs"]["data-table"], cell["attrs"]["data-track"],
                                                   cell["attrs"]["data-column"]) == (digits, "none", "ε = 0.5"))
    assert at_trivial["text"] == "no cell above trivial"
    # The privacy cost after each name: reference 0.90 − dpsgd's 0.81.
    cell = next(c for c in summary if c["attrs"]["data-table"] == digits and c["attrs"]["data-track"] == "none"
                and c["attrs"]["data-column"] == "ε = 1")
    assert "+0.090" in cell["text"]
    assert '<nav class="contents">' in source and "position: sticky" in source


def test_run_ids_are_in_a_file_beside_the_page_and_not_on_it(tmp_path):
    add_summary_grid()
    records = store.load()
    page = tmp_path / "site" / "board.html"
    assert main(["leaderboard", "--format", "html", "--out", str(page)]) == 0
    runs_file = tmp_path / "site" / "board.runs.json"
    source, written = page.read_text(), json.loads(runs_file.read_text())
    assert 'href="board.runs.json"' in source
    assert not [record["run_id"] for record in records if record["run_id"] in source]
    assert sorted(run["run_id"] for run in written["runs"]) == sorted(record["run_id"] for record in records)
    by_run = {run["run_id"]: run for run in written["runs"]}
    record = records[0]
    assert by_run[record["run_id"]]["value"] == record["metrics"]["test_accuracy"]
    assert {run_id for cell in written["cells"] for run_id in cell["run_ids"]} == set(by_run)
    dpsgd = next(cell for cell in written["cells"] if (cell["table"], cell["track"], cell["method"],
                                                       cell["column"]) == ("digits-digits-add-remove-1e-06", "none",
                                                                           "dpsgd", "ε = 1"))
    assert sorted(dpsgd["run_ids"]) == sorted(r["run_id"] for r in records if r["method"] == "dpsgd"
                                              and r["task"] == "digits" and r["epsilon_target"] == 1.0
                                              and r.get("tuning") is None)


def test_the_plots_y_axis_is_set_by_cells_above_trivial_with_reference_and_majority_lines():
    """A collapsed method at 0.1 set the axis of every panel to [0.1, 0.9]: the other methods were one line."""
    for seed in range(3):
        add_run(0.80 + 0.01 * seed, seed=seed, test_majority_rate=0.79)
        add_run(0.83 + 0.01 * seed, seed=seed, epsilon_target=2.0, epsilon=2.0, test_majority_rate=0.79)
        add_run(0.1, method="dpgd", seed=seed, test_majority_rate=0.79)  # collapsed
        add_run(0.1, method="dpgd", seed=seed, epsilon_target=2.0, epsilon=2.0, test_majority_rate=0.79)
    add_run(**reference_fields(0.90))
    page = leaderboard.render(store.load(), "html")
    [svg] = re.findall(r"<svg.*?</svg>", page, re.S)
    low, high = map(float, re.search(r'data-ylim="([^"]+)"', svg).group(1).split())
    assert 0.7 < low < 0.79 < 0.90 < high < 1.0  # the interval of dpsgd at ε = 1 reaches near the majority rate
    assert 'class="reference-line"' in svg and 'class="majority-line"' in svg
    assert svg.count('class="outside"') == 2  # the collapsed cells: triangles on the lower edge


def test_csv_track_filled_for_every_row_and_selected_hyperparameters_of_tuned_cells(tmp_path):
    for seed in range(2):
        add_run(0.8, seed=seed, tuning={"mode": "validation", "selected_params": {"lr": 0.5, "clip": 1.0}},
                hyperparameters={"lr": 0.5, "clip": 1.0, "epochs": 3})
        add_run(0.7, seed=seed, tuning={"mode": "random-stopping", "selected_params": {"lr": 0.1 * (seed + 1)}},
                hyperparameters={"lr": 0.1 * (seed + 1), "epochs": 3})
        add_run(0.75, seed=seed)
        add_run(0.9, seed=seed, tuning={"mode": "validation", "selected_params": {"lr": 2.0}},
                **nonprivate_fields())
    add_run(**reference_fields(0.95))
    rows = list(csv.DictReader(io.StringIO(leaderboard.render(store.load(), "csv"))))
    assert all(row["track"] for row in rows)
    by = {(row["method"], row["track"]): row for row in rows}
    assert sorted(row["track"] for row in rows if row["method"] == "reference") == ["none", "random-stopping",
                                                                                      "validation"]
    assert {row["tuning"] for row in rows if row["method"] == "reference"} == {"reference"}
    assert by["nonprivate", "validation"]["track"] == "validation"
    assert json.loads(by["dpsgd", "validation"]["selected_hyperparameters"]) == {"clip": 1.0, "lr": 0.5}
    assert json.loads(by["dpsgd", "random-stopping"]["selected_hyperparameters"]) == [{"lr": 0.1}, {"lr": 0.2}]
    assert json.loads(by["nonprivate", "validation"]["selected_hyperparameters"]) == {"lr": 2.0}
    assert json.loads(by["reference", "none"]["selected_hyperparameters"]) == {"l2": 1e-4}
    assert by["dpsgd", "none"]["selected_hyperparameters"] == ""
    with pytest.raises(KeyError):
        by["dpsgd", "reference"]
