"""``dpbench leaderboard``: grouping, statistics, the three formats, published rows, and the page in Chromium."""
import csv
import io
import json
import math
import re
import shutil
import subprocess

import pytest

from dpbench import registry
from dpbench.board import leaderboard, model as board_model, text as board_text
from dpbench.board.published import PUBLISHED
from dpbench.cli import main
from dpbench.results import store
from dpbench.results.records import LEDGER_VERSION
from dpbench.trust.audit import CANARY_DESIGN

CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def add_run(accuracy=None, **fields):
    """Store a record shaped like the engine's (dpsgd on digits at target ε = 1 unless told otherwise)."""
    record = {
        "task": "digits", "method": "dpsgd", "data_id": "digits", "data_note": None, "n_train": 1000, "n_test": 200,
        "seed": 0, "hyperparameters": {"lr": 1.0, "epochs": 3}, "private": True, "epsilon": 0.99,
        "epsilon_target": 1.0, "delta": 1e-6, "noise_multiplier": 1.1, "sample_rate": 0.1, "steps": 30,
        "gradient_evaluations": 30, "accountant": "pld", "sampler": "poisson", "train_seconds": 1.0,
        "metrics": {"test_accuracy": 0.8 if accuracy is None else accuracy, "test_loss": 0.5},
        "versions": {}, "git_commit": "abc", "created_at": "2025-01-01T00:00:00+00:00",
        "neighbouring": "add-remove", "ledger_version": LEDGER_VERSION,
    } | fields
    record["run_id"] = store.content_id(record)
    store.append(record)
    return record


def nonprivate_fields():
    return {"method": "nonprivate", "private": False, "epsilon": None, "epsilon_target": None, "delta": None,
            "accountant": None, "sampler": "shuffle", "noise_multiplier": 0.0, "neighbouring": None}


def csv_rows(tmp_path, *args):
    out = tmp_path / "board.csv"
    assert main(["leaderboard", "--format", "csv", "--out", str(out), *args]) == 0
    with open(out, newline="") as handle:
        return list(csv.DictReader(handle))


def markdown(capsys, *args):
    assert main(["leaderboard", *args]) == 0
    return capsys.readouterr().out


def test_only_runs_sharing_delta_sampler_accountant_and_tuning_share_a_cell(tmp_path):
    same = [add_run(0.8, seed=0), add_run(0.9, seed=1), add_run(0.7, seed=2, tuning=None)]
    apart = {
        "delta": add_run(delta=1e-7),
        "sampler": add_run(sampler="shuffle"),
        "accountant": add_run(accountant="rdp"),
        "random-stopping": add_run(tuning={"mode": "random-stopping", "trials": 10}),
        "oracle": add_run(tuning={"mode": "oracle"}),
        "hyperparameters": add_run(hyperparameters={"lr": 0.5, "epochs": 3}),
    }
    # Tuned runs' hyperparameters are the tuning's output: they do not split a cell.
    tuned = [add_run(seed=0, tuning={"mode": "adaptive"}, hyperparameters={"lr": 0.1}),
             add_run(seed=1, tuning={"mode": "adaptive"}, hyperparameters={"lr": 2.0})]
    rows = csv_rows(tmp_path)
    by_runs = {frozenset(row["run_ids"].split()): row for row in rows}
    assert set(by_runs) == ({frozenset(r["run_id"] for r in same), frozenset(r["run_id"] for r in tuned)}
                            | {frozenset([r["run_id"]]) for r in apart.values()})
    assert by_runs[frozenset(r["run_id"] for r in same)]["n_seeds"] == "3"
    assert [by_runs[frozenset([apart[mode]["run_id"]])]["tuning"] for mode in ("random-stopping", "oracle")] == \
        ["random-stopping", "oracle"]
    assert by_runs[frozenset(r["run_id"] for r in tuned)]["tuning"] == "adaptive"
    # Different δ: a table of its own, not just a cell.
    tables = board_model.build_tables(store.load())
    assert sorted(table.delta for table in tables) == [1e-7, 1e-6]


def test_mean_standard_deviation_and_seed_count_over_seeds():
    runs = [add_run(0.8, seed=0), add_run(0.9, seed=1), add_run(0.7, seed=2)]
    [table] = board_model.build_tables(store.load())
    [cell] = table.cells.values()
    assert cell.mean == pytest.approx(0.8)
    assert cell.std == pytest.approx(math.sqrt((0.0**2 + 0.1**2 + 0.1**2) / 2))  # sample std, n − 1
    assert cell.n_seeds == 3 and sorted(cell.run_ids) == sorted(r["run_id"] for r in runs)


def test_a_seed_run_twice_counts_once_with_the_mean_of_its_runs():
    add_run(0.6, seed=0)
    add_run(0.8, seed=1)
    add_run(1.0, seed=1, created_at="2025-01-02T00:00:00+00:00")
    [table] = board_model.build_tables(store.load())
    [cell] = table.cells.values()
    assert cell.n_seeds == 2 and len(cell.run_ids) == 3
    assert cell.mean == pytest.approx((0.6 + 0.9) / 2)
    assert cell.std == pytest.approx(0.3 / math.sqrt(2))


def test_csv_columns_and_values(tmp_path):
    first, second = add_run(0.8, seed=0), add_run(0.9, seed=1)
    given_sigma = add_run(0.6, epsilon_target=None, epsilon=0.5312, noise_multiplier=2.0)
    baseline = add_run(0.95, **nonprivate_fields())
    single = add_run(0.7, method="dpgd", seed=4)
    rows = csv_rows(tmp_path)
    assert set(board_text.CSV_COLUMNS) >= {"task", "data_id", "method", "epsilon", "delta", "tuning", "metric",
                                            "mean", "std", "n_seeds", "accountant", "sampler", "run_ids"}
    assert list(rows[0]) == board_text.CSV_COLUMNS
    by_id = {row["run_ids"]: row for row in rows}
    pair = by_id[f"{first['run_id']} {second['run_id']}"]
    assert {key: pair[key] for key in ("task", "data_id", "method", "epsilon", "epsilon_kind", "delta", "tuning",
                                       "accountant", "sampler", "metric", "n_seeds")} == {
        "task": "digits", "data_id": "digits", "method": "dpsgd", "epsilon": "1.0", "epsilon_kind": "target",
        "delta": "1e-06", "tuning": "none", "accountant": "pld", "sampler": "poisson", "metric": "test_accuracy",
        "n_seeds": "2"}
    assert float(pair["mean"]) == pytest.approx(0.85) and float(pair["std"]) == pytest.approx(0.1 / math.sqrt(2))
    spent = by_id[given_sigma["run_id"]]
    assert (spent["epsilon"], spent["epsilon_kind"]) == ("0.53", "spent")  # spent ε to 2 significant digits
    private_free = by_id[baseline["run_id"]]
    assert (private_free["epsilon"], private_free["epsilon_kind"], private_free["delta"], private_free["accountant"],
            private_free["sampler"]) == ("inf", "non-private", "", "", "shuffle")
    one_seed = by_id[single["run_id"]]
    assert (one_seed["std"], one_seed["n_seeds"], float(one_seed["mean"])) == ("", "1", 0.7)


def test_nonprivate_runs_join_every_delta_table_of_their_task_and_are_written_once(tmp_path, capsys):
    add_run(delta=1e-6)
    add_run(delta=1e-7)
    baseline = add_run(0.95, **nonprivate_fields())
    add_run(0.5, task="breast_cancer", data_id="breast_cancer", **nonprivate_fields())
    text = markdown(capsys)
    assert text.count("## digits · data digits · δ = ") == 2
    assert text.count(f"`{baseline['run_id']}`") == 2
    assert "## breast_cancer · data breast_cancer · no δ (non-private runs only)" in text
    assert [row["run_ids"] for row in csv_rows(tmp_path)].count(baseline["run_id"]) == 1


def row_of(text, method, section):
    """The markdown row of ``method`` in the track section ``section`` ("### none", ...)."""
    lines = text.splitlines()
    start = lines.index(section)
    return next(line for line in lines[start:] if line.startswith(f"| {method} |"))


def test_markdown_lists_rows_within_each_track_with_intervals_and_each_columns_winner(capsys):
    for seed, (a, b) in enumerate([(0.80, 0.70), (0.82, 0.71), (0.81, 0.69), (0.80, 0.70), (0.82, 0.72)]):
        add_run(a, seed=seed)
        add_run(b, method="dpgd", seed=seed)
    add_run(0.6, method="dpgd", epsilon_target=0.5, epsilon=0.5)
    add_run(0.99, method="adaclip", tuning={"mode": "oracle"})  # another track: compared on its own
    text = markdown(capsys)
    assert "## digits · data digits · δ = 1e-06 (1/n², n = 1,000) · ε under add-remove neighbours" in text
    assert "Contents:" in text and "### none" in text and "### oracle (tuning not private)" in text
    assert "| method | sampler | accountant | ε = 0.5 | ε = 1 |" in text.splitlines()
    assert "Welch t-tests" in text and "Holm-corrected" in text and "empirical-logit" in text  # the caption
    dpsgd = row_of(text, "dpsgd", "### none")
    # mean 0.81 over 5 seeds on 200 test examples: Student's t on the empirical logits, mapped back; beats DP-GD
    # (one-sided Welch, Holm over the one comparison): ▲
    assert "▲ 0.81 [0.7974, 0.8223] (n = 5)" in dpsgd
    dpgd = row_of(text, "dpgd", "### none")
    assert "| 0.6 (n = 1) |" in dpgd and "▲" not in dpgd.split("|")[5]
    lines = text.splitlines()
    assert lines[lines.index(dpsgd) - 1] == dpgd  # rows by method, not ranked; then each column's answer
    assert lines[lines.index(dpsgd) + 1] == "| *winner (▲) or not significantly below the best (≈)* |  |  |  | ▲ dpsgd |"
    assert "0.99 (n = 1)" in row_of(text, "adaclip", "### oracle (tuning not private)")


def test_leaders_not_significantly_apart_are_marked_tied_and_trivial_cells_greyed(capsys):
    for seed, (a, b) in enumerate([(0.80, 0.79), (0.82, 0.83), (0.81, 0.80)]):
        add_run(a, seed=seed, test_majority_rate=0.6)
        add_run(b, method="dpgd", seed=seed, test_majority_rate=0.6)
        add_run(0.6, method="adaclip", seed=seed, test_majority_rate=0.6)
    text = markdown(capsys)
    assert "≈ 0.81" in row_of(text, "dpsgd", "### none") and "≈ 0.8067" in row_of(text, "dpgd", "### none")
    adaclip = row_of(text, "adaclip", "### none")
    assert "*0.6 [0.6, 0.6] (n = 3, not above trivial)*" in adaclip and "≈" not in adaclip and "▲" not in adaclip
    assert "| ≈ dpgd, dpsgd |" in text
    rows = {row["method"]: row for row in csv.DictReader(io.StringIO(leaderboard.render(store.load(), "csv")))}
    assert rows["adaclip"]["not_above_trivial"] == "True" and rows["adaclip"]["p_above_trivial"] == "1.0"
    assert rows["dpsgd"]["leader"] == "tied" and float(rows["dpgd"]["p_below_best_holm"]) > 0.05
    assert float(rows["dpsgd"]["ci95_low"]) < 0.81 < float(rows["dpsgd"]["ci95_high"])


def test_lower_is_better_for_an_error_metric_and_rows_split_by_hyperparameters(capsys):
    common = {"task": "adaclip_regression", "data_id": "adaclip-regression-d10", "epsilon_target": None,
              "epsilon": 3.14e6, "hyperparameters": {"lr": 0.01}}
    add_run(**common | {"metrics": {"test_squared_error": 0.3}})
    add_run(**common | {"method": "adaclip", "metrics": {"test_squared_error": 0.01}})
    add_run(**common | {"method": "adaclip", "hyperparameters": {"lr": 0.1}, "metrics": {"test_squared_error": 0.2}})
    text = markdown(capsys)
    assert "Metric: test_squared_error (lower is better)" in text
    assert "ε ≈ 3.1e+06 (spent)" in text
    lines = text.splitlines()
    start = lines.index("| adaclip (lr=0.01) | poisson | pld | 0.01 (n = 1) |")
    assert lines[start + 1:start + 3] == ["| adaclip (lr=0.1) | poisson | pld | 0.2 (n = 1) |",
                                          "| dpsgd | poisson | pld | 0.3 (n = 1) |"]


def test_published_figures_are_separate_rows_never_ranked(capsys):
    add_run(0.5, task="mnist_logreg", data_id="mnist-5k-train", n_train=4000, delta=1 / 4000**2)
    text = markdown(capsys)
    lines = text.splitlines()
    assert "| dpsgd | poisson | pld |  |  |  | 0.5 (n = 1) |  |  |" in lines
    published = [line for line in lines if line.startswith("| *published:")]
    yu_dpsgd = next(line for line in published if "DP-SGD → dpsgd (Yu et al., Table 2" in line)
    assert "not this table's data (mnist-5k-train)" in yu_dpsgd and "δ = 1/n²" in yu_dpsgd
    assert "*0.875*" in yu_dpsgd and "▲" not in "".join(published)
    adaclip = next(line for line in published if "AdaCliP → adaclip (AdaCliP, Table 1" in line)
    assert "*0.8537 ± 0.0019*" in adaclip and "δ = 1e-5" in adaclip
    header = "| method | sampler | accountant | ε = 0.1 | ε = 0.25 | ε = 0.5 | ε = 1 | ε = 2 | non-private |"
    assert header in lines
    assert "## Published figures without runs here" in text and "CIFAR-10 · DP-Adam → dpadam_bc" in text


def test_published_figures_name_real_methods_and_tasks():
    methods, tasks = registry.methods([]), registry.tasks([])
    for entry in PUBLISHED:
        assert entry.method in methods and (entry.task is None or entry.task in tasks)
        assert 0 < entry.value < 1 and entry.citation and entry.metric == "test_accuracy"
    yu_adult = {e.method: e.value for e in PUBLISHED if e.source == "Yu et al., Table 2" and e.paper_dataset == "Adult"}
    assert yu_adult == {"nonprivate": 0.848, "amp": 0.793, "output_perturbation": 0.774, "dpsgd": 0.804,
                        "dpgd": 0.809}


def test_no_runs_or_a_malformed_tuning_field_is_a_usage_error(capsys):
    assert main(["leaderboard", "--task", "digits"]) == 2
    assert "no runs of task 'digits'" in capsys.readouterr().err
    run = add_run(tuning="random-stopping")
    assert main(["leaderboard"]) == 2
    assert f"run {run['run_id']}: 'tuning' must be a dict with a 'mode'" in capsys.readouterr().err


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_html_page_renders_tables_and_plots_in_chromium(tmp_path):
    for seed, accuracy in enumerate([0.8, 0.84, 0.82]):
        add_run(accuracy, seed=seed)
        add_run(accuracy - 0.1, seed=seed, epsilon_target=0.5, epsilon=0.5)
        add_run(accuracy - 0.05, method="dpgd", seed=seed)
        add_run(0.5, method="adaclip", seed=seed, test_majority_rate=0.5)
        add_run(accuracy + 0.05, seed=seed, tuning={"mode": "validation"})
        add_run(accuracy + 0.1, seed=seed, **nonprivate_fields())
    add_run(0.88, task="mnist_logreg", data_id="mnist-5k-train", n_train=4000, delta=1 / 4000**2)
    page = tmp_path / "site" / "index.html"
    assert main(["leaderboard", "--format", "html", "--out", str(page)]) == 0
    source = page.read_text()
    assert "<script" not in source and "<link" not in source and " src=" not in source  # self-contained

    profile = ["--user-data-dir=" + str(tmp_path / "chromium-profile")]
    dom = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, *profile, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=180, check=True).stdout
    # Contents linking every table, one sub-table per track, intervals, marks, methods, plots.
    assert '<nav class="contents">' in dom and dom.count('<a href="#digits-digits-add-remove-1e-06">') == 1
    assert '<table class="leaderboard" data-track="none">' in dom and 'data-track="validation"' in dom
    assert len(re.findall(r'<figure class="plot"><svg', dom)) == 2
    assert "<h2>digits · data digits · δ = 1e-06 (1/n², n = 1,000) · ε under add-remove neighbours</h2>" in dom
    assert 'class="published"' in dom and "95% interval [" in dom
    rows = re.findall(r'<tr class="measured" data-track="none" data-method="(\w+)">', dom)
    assert rows == ["adaclip", "dpgd", "dpsgd", "nonprivate", "dpsgd"]  # by method, not ranked; then mnist_logreg
    assert 'class="value winner"' in dom and '<tr class="best">' in dom
    assert 'class="value trivial"' in dom and "<small>not above trivial</small>" in dom  # adaclip at the majority rate
    assert '<section id="methods">' in dom and 'href="https://arxiv.org/abs/1607.00133"' in dom
    assert '<table class="summary">' in dom and '<a href="index.runs.json">' in dom  # the summary, the run ids' file

    screenshot = tmp_path / "page.png"
    subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, *profile, f"--screenshot={screenshot}", "--window-size=1200,2000",
                    page.as_uri()], capture_output=True, timeout=180, check=True)
    image = pytest.importorskip("PIL.Image").open(screenshot).convert("RGB")
    data = image.tobytes()
    pixels = list(zip(data[0::3], data[1::3], data[2::3]))
    non_white = sum(1 for pixel in pixels if min(pixel) < 200)
    coloured = sum(1 for r, g, b in pixels if max(r, g, b) - min(r, g, b) > 80)  # plot lines, best cells
    assert non_white > 0.02 * len(pixels) and coloured > 500


def test_end_to_end_two_quick_runs_then_csv(tmp_path, capsys):
    for seed in ("0", "1"):
        assert main(["run", "--method", "dpsgd", "--task", "breast_cancer", "--epsilon", "1", "--epochs", "2",
                     "--seed", seed]) == 0
    capsys.readouterr()
    records = store.load()
    [row] = csv_rows(tmp_path, "--task", "breast_cancer")
    assert (row["task"], row["method"], row["epsilon"], row["n_seeds"]) == ("breast_cancer", "dpsgd", "1.0", "2")
    assert set(row["run_ids"].split()) == {r["run_id"] for r in records}
    assert float(row["delta"]) == pytest.approx(records[0]["delta"])
    accuracies = [r["metrics"]["test_accuracy"] for r in records]
    assert float(row["mean"]) == pytest.approx(sum(accuracies) / 2)
    assert float(row["std"]) == pytest.approx(abs(accuracies[0] - accuracies[1]) / math.sqrt(2))
    jsonl = tmp_path / "results.jsonl"
    assert main(["leaderboard", "--format", "jsonl", "--out", str(jsonl)]) == 0
    assert [json.loads(line) for line in jsonl.read_text().splitlines()] == records


def test_records_of_older_ledger_versions_are_left_out(capsys):
    """Records made before a privacy fix of the engine (ledger version 1: no field) never reach a board."""
    old = add_run(0.99, ledger_version=None)
    add_run(0.7, seed=1)
    text = markdown(capsys)
    row = row_of(text, "dpsgd", "### none")
    assert "0.7" in row and "0.99" not in row and old["run_id"] not in text
    store.default_path().unlink()
    add_run(0.99, ledger_version=None)
    assert main(["leaderboard"]) == 2 and "ledger version" in capsys.readouterr().err


def test_relations_never_share_a_table_and_are_named(capsys):
    add_run(0.8)
    add_run(0.75, method="output_perturbation", neighbouring="replace-one", accountant="gaussian-pld")
    text = markdown(capsys)
    assert text.count("## digits · data digits") == 2
    assert "ε under add-remove neighbours" in text and "ε under replace-one neighbours" in text
    rows = {row["method"]: row["neighbouring"] for row in
            csv.DictReader(io.StringIO(leaderboard.render(store.load(), "csv")))}
    assert rows == {"dpsgd": "add-remove", "output_perturbation": "replace-one"}


def test_runs_of_different_code_never_share_a_cell_and_plugins_are_marked(capsys):
    """An edited plugin's runs were averaged with the old code's in one cell (0.5153 ± 0.58)."""
    plugin = lambda sha: {"method": {"name": "mine", "file": "/p/mine.py", "external": True, "sha256": sha}}
    add_run(0.9, method="mine", code=plugin("a" * 64))
    add_run(0.1, method="mine", code=plugin("b" * 64), seed=1)
    text = markdown(capsys)
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| mine ")}
    first, second = ("mine [external plugin, unverified: in-process plugin, unaudited] (code aaaaaaaa)",
                     "mine [external plugin, unverified: in-process plugin, unaudited] (code bbbbbbbb)")
    assert set(rows) == {first, second}
    assert "0.9" in rows[first] and "0.1 (n = 1)" in rows[second]
    # A passing white-box audit of one version marks that version only, as evidence: it stays unverified; and only
    # at the settings it ran with (a plugin can branch on its hyperparameters, its σ, ...).
    audit = {"kind": "audit", "run_id": "audit1", "task": "digits", "method": "mine", "passed": True,
             "threat_model": "white-box", "ledger_version": LEDGER_VERSION,
             "canary_design": CANARY_DESIGN, "hyperparameters": {"lr": 1.0, "epochs": 3}, "canaries": 100,
             "epsilon_target": 1.0, "delta": 1e-6, "neighbouring": "add-remove", "sampler": "poisson",
             "data_id": "digits+100-audit-canaries", "created_at": "2025-01-01T00:00:00+00:00",
             "code": plugin("a" * 64)}
    store.append({**audit, "run_id": "audit0", "hyperparameters": {"lr": 2.0, "epochs": 3}})
    store.append({**audit, "run_id": "audit2", "epsilon_target": 8.0})
    store.append({**audit, "run_id": "audit3", "delta": 1e-4})  # a larger δ lowers an audit's bound
    text = markdown(capsys)
    assert " mine [external plugin, unverified: in-process plugin, audit passed at other settings] (code " \
           "aaaaaaaa) " in text
    store.append(audit)
    text = markdown(capsys)
    assert " mine [external plugin, unverified: in-process plugin, audit passed] (code aaaaaaaa) " in text
    assert " mine [external plugin, unverified: in-process plugin, unaudited] (code bbbbbbbb) " in text


def test_check_lists_every_violation_until_each_is_explained(tmp_path, capsys):
    """--check exits 1 with one line per violation: a private cell above the tuned non-private one, a validation-
    tuned method getting worse as ε grows, a collapsed cell; an exceptions file with reasons silences exactly those,
    and an explanation that matches nothing is itself reported."""
    validation = {"tuning": {"mode": "validation"}, "test_majority_rate": 0.5}
    for seed in range(3):
        add_run(0.80 + seed * 0.001, seed=seed, **nonprivate_fields(), **validation)
        add_run(0.90 + seed * 0.001, seed=seed, **validation)  # above the non-private reference
        add_run(0.70 + seed * 0.001, method="dpgd", seed=seed, epsilon_target=0.5, epsilon=0.5, **validation)
        add_run(0.60 + seed * 0.001, method="dpgd", seed=seed, **validation)  # worse at ε = 1 than at ε = 0.5
        add_run(0.5, method="adaclip", seed=seed, test_majority_rate=0.5)  # collapsed
    records = tmp_path / "results.jsonl"
    assert main(["leaderboard", "--format", "jsonl", "--out", str(records)]) == 0
    assert main(["leaderboard", "--check", "--records", str(records)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("above-non-private: digits (add-remove) · validation · dpsgd · ε = 1") for line in lines)
    assert any(line.startswith("decreasing: digits (add-remove) · validation · dpgd · ε = 1") for line in lines)
    assert any(line.startswith("collapsed: digits (add-remove) · none · adaclip · ε = 1") for line in lines)
    assert len(lines) == 3
    explained = [{"kind": "collapsed", "task": "digits", "method": "adaclip", "track": "none", "epsilons": "all",
                  "reason": "a test of the check", "tested_by": "pytest"},
                 {"kind": "decreasing", "task": "digits", "method": "dpgd", "track": "validation", "epsilons": [1],
                  "reason": "a test of the check", "tested_by": "pytest"}]
    (tmp_path / "exceptions.json").write_text(json.dumps(explained))
    assert main(["leaderboard", "--check", "--records", str(records)]) == 1
    assert capsys.readouterr().out.splitlines() == [line for line in lines if line.startswith("above-non-private")]
    stale = explained + [{"kind": "collapsed", "task": "adult", "method": "dpsgd", "track": "none", "epsilons": "all",
                          "reason": "nothing like it", "tested_by": "pytest"},
                         {"kind": "above-non-private", "task": "digits", "method": "dpsgd", "track": "validation",
                          "epsilons": [1], "reason": "a test of the check", "tested_by": "pytest"}]
    (tmp_path / "exceptions.json").write_text(json.dumps(stale))
    assert main(["leaderboard", "--check", "--records", str(records)]) == 1
    assert [line[:15] for line in capsys.readouterr().out.splitlines()] == ["stale exception"]
    (tmp_path / "exceptions.json").write_text(json.dumps(stale[:2] + stale[3:]))
    assert main(["leaderboard", "--check", "--records", str(records)]) == 0
    # An entry listing an ε that no longer violates (a rebuilt cell recovered) is stale for that ε.
    (tmp_path / "exceptions.json").write_text(json.dumps([stale[0], {**stale[1], "epsilons": [0.5, 1]}, stale[3]]))
    assert main(["leaderboard", "--check", "--records", str(records)]) == 1
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == [
        "stale exception (digits · dpgd · validation · ε = 0.5 matches no violation)"]
    (tmp_path / "exceptions.json").write_text(json.dumps([{**stale[0], "reason": " "}]))
    assert main(["leaderboard", "--check", "--records", str(records)]) == 2  # no reason: refused
