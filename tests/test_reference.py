"""The converged non-private reference (issue 33, item 1): the solve, its selection, the board's row, privacy cost
and check, the sweep's key, the command and ``dpbench verify``."""
import csv
import io
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import optimize, special

from dpbench.board import check as board_check, leaderboard, model as board_model, reference as board_reference
from dpbench.board.sweep import run_grid
from dpbench.cli import main
from dpbench.data import tabular
from dpbench.privacy import streams
from dpbench.results import store
from dpbench.tasks.linear import BreastCancer
from dpbench.trust import record_checks
from dpbench.tuning import reference
from tests.test_leaderboard import add_run, nonprivate_fields


def independent_minimum(x: np.ndarray, y: np.ndarray, classes: int, l2: float) -> tuple[float, np.ndarray]:
    """(min, its parameters) of mean log-loss + (l2/2)·‖W‖² with an unpenalized bias, by SciPy's L-BFGS-B on a
    NumPy objective written here from the definition (neither scikit-learn nor the task's PyTorch loss)."""
    n, d = x.shape
    outputs = 1 if classes == 2 else classes

    def objective(theta):
        w, b = theta[:outputs * d].reshape(outputs, d), theta[outputs * d:]
        z = x @ w.T + b
        if classes == 2:
            z = z[:, 0]
            loss, residual = np.mean(np.logaddexp(0, z) - y * z), (special.expit(z) - y)[:, None]
        else:
            log_p = z - special.logsumexp(z, axis=1, keepdims=True)
            loss, residual = -np.mean(log_p[np.arange(n), y]), np.exp(log_p) - np.eye(classes)[y]
        value = loss + 0.5 * l2 * np.sum(w**2)
        gradient = np.concatenate([(residual.T @ x / n + l2 * w).ravel(), residual.mean(0)])
        return value, gradient

    found = optimize.minimize(objective, np.zeros(outputs * (d + 1)), jac=True, method="L-BFGS-B",
                              options={"maxiter": 100_000, "gtol": 1e-12, "ftol": 1e-15})
    return float(found.fun), found.x


@pytest.mark.parametrize("task, load", [("breast_cancer", tabular.load_breast_cancer),
                                        ("digits", tabular.load_digits)])
def test_the_reference_is_the_minimizer_of_the_tasks_own_loss(task, load):
    """Binary logistic (one output) and softmax (ten) with a bias: the recorded objective at the refit is SciPy's
    minimum of the loss written from its definition, and SciPy's minimizer scores the recorded test accuracy."""
    record = reference.run(task, append_to_store=False)
    tuning, data = record["tuning"], load()
    classes = 2 if task == "breast_cancer" else 10
    l2 = tuning["selected_params"]["l2"]
    assert l2 in reference.L2_GRID and tuning["refit"]["l2"] == l2 == record["hyperparameters"]["l2"]
    assert tuning["refit"]["max_gradient"] <= reference.CONVERGED
    minimum, theta = independent_minimum(data.x_train.double().numpy(), data.y_train.numpy(), classes, l2)
    assert tuning["refit"]["objective"] == pytest.approx(minimum, rel=1e-8)
    x_test, d = data.x_test.double().numpy(), data.x_train.shape[1]
    outputs = 1 if classes == 2 else classes
    z = x_test @ theta[:outputs * d].reshape(outputs, d).T + theta[outputs * d:]
    predicted = (z[:, 0] > 0).astype(int) if classes == 2 else z.argmax(1)
    assert record["metrics"]["test_accuracy"] == pytest.approx(float(np.mean(predicted == data.y_test.numpy())))
    assert (record["method"], record["private"], record["epsilon"], tuning["mode"]) == (
        "reference", False, None, "reference")
    assert {"data_id", "versions", "code", "git_commit", "ledger_version"} <= set(record)
    assert record["code"]["method"]["file"] == "dpbench/tuning/reference.py"
    assert tuning["config"]["l2_grid"] == list(reference.L2_GRID) and len(tuning["fits"]) == len(reference.L2_GRID)
    assert tuning["at_grid_edge"] == (l2 in (min(reference.L2_GRID), max(reference.L2_GRID)))


def test_the_l2_is_chosen_on_the_validation_tracks_split_never_on_the_test_set(monkeypatch):
    """With the test labels flipped, every held-out score and the choice stay the same and only the test accuracy
    changes (to its complement): a selection that read the test set would differ. The held-out part is the
    validation track's (stream ``validation-split`` of seed 0, 10%)."""
    honest = reference.run("breast_cancer", append_to_store=False)

    def flipped():
        data = tabular.load_breast_cancer()
        return replace(data, y_test=1 - data.y_test)

    monkeypatch.setattr(BreastCancer, "load_data", staticmethod(flipped))
    poisoned = reference.run("breast_cancer", append_to_store=False)
    assert poisoned["tuning"]["fits"] == honest["tuning"]["fits"]
    assert poisoned["tuning"]["selected_params"] == honest["tuning"]["selected_params"]
    assert poisoned["metrics"]["test_accuracy"] == pytest.approx(1 - honest["metrics"]["test_accuracy"])
    held = torch.rand(455, generator=streams.generator(0, "validation-split")) < 0.1
    assert honest["tuning"]["validation_rows"] == int(held.sum())
    fits = honest["tuning"]["fits"]
    assert honest["tuning"]["selected_score"] == max(fit["validation_accuracy"] for fit in fits)


def reference_fields(accuracy, task="digits", **fields):
    return {**nonprivate_fields(), "method": "reference", "sampler": "exact", "noise_multiplier": None,
            "task": task, "data_id": task, "hyperparameters": {"bias": True, "l2": 1e-4},
            "tuning": {"mode": "reference", "private": False, "selected_params": {"l2": 1e-4}},
            "metrics": {"test_accuracy": accuracy, "test_loss": 0.3}, **fields}


def test_the_reference_row_is_in_every_track_never_ranked_and_every_private_cell_has_its_privacy_cost(capsys):
    for seed, value in enumerate([0.80, 0.82, 0.81]):
        add_run(value, seed=seed)
        add_run(value - 0.1, method="dpgd", seed=seed)
        add_run(value + 0.02, seed=seed, tuning={"mode": "validation"})
        add_run(0.85, seed=seed, tuning={"mode": "validation"}, **nonprivate_fields())
    add_run(**reference_fields(0.90))
    text = leaderboard.render(store.load(), "md")
    for section in ("### none", "### validation"):
        lines = text.splitlines()
        start = lines.index(section)
        rows = [line for line in lines[start:lines.index("", start + 4)] if line.startswith("| ")][2:]
        assert rows[-1].startswith("| reference: converged non-private ERM (not ranked) | exact | — |")
        assert "0.9 (l2 = 0.0001, n = 1)" in rows[-1] and "▲" not in rows[-1] and "≈" not in rows[-1]
    assert "\n| nonprivate (non-private, same budget) | shuffle | — |" in text
    rows = list(csv.DictReader(io.StringIO(leaderboard.render(store.load(), "csv"))))
    ref = next(row for row in rows if row["method"] == "reference")
    assert (ref["tuning"], ref["epsilon"], ref["leader"], ref["privacy_cost"], float(ref["mean"])) == (
        "reference", "inf", "", "", 0.9)
    dpsgd = next(row for row in rows if (row["method"], row["tuning"]) == ("dpsgd", "none"))
    assert float(dpsgd["privacy_cost"]) == pytest.approx(0.09)  # 0.90 − 0.81
    assert float(dpsgd["privacy_cost_low"]) == pytest.approx(0.9 - float(dpsgd["ci95_high"]))
    assert float(dpsgd["privacy_cost_high"]) == pytest.approx(0.9 - float(dpsgd["ci95_low"]))
    assert all(row["privacy_cost"] for row in rows if row["epsilon_kind"] == "target")
    assert not any(row["privacy_cost"] for row in rows if row["epsilon_kind"] == "non-private")
    table = board_model.build_tables(store.load())[0]
    assert all(row.method != "reference" for row in table.rows()) and all(
        row.method != "reference" for marks, _ in table.comparisons().values() for row in marks)
    page = leaderboard.render(store.load(), "html")
    assert page.count('<tr class="reference"') == 2
    assert "privacy cost +0.0900 [" in page


def test_references_of_other_settings_are_never_pooled():
    """Two references (another l2 chosen, say from another grid) were averaged into one "constant" (second hostile
    review): each is a row of its own, and the table's reference is the newest."""
    for seed in range(2):
        add_run(0.80, seed=seed)
    add_run(**reference_fields(0.975, created_at="2026-01-01T00:00:00+00:00"))
    add_run(**reference_fields(0.9806, hyperparameters={"bias": True, "l2": 1e-7},
                                created_at="2026-01-02T00:00:00+00:00"))
    table = board_model.build_tables(store.load())[0]
    assert sorted(cell.mean for cell in table.references.values()) == [0.975, 0.9806]
    assert board_reference.reference(table)[1].mean == 0.9806


def test_check_lists_private_cells_above_the_reference_by_more_than_two_se_in_every_track(tmp_path, capsys):
    for seed, (far, near) in enumerate([(0.900, 0.86), (0.901, 0.85), (0.902, 0.87)]):
        add_run(far, seed=seed)  # 0.901 ± 0.0006: far above 0.85
        add_run(far, seed=seed, tuning={"mode": "random-stopping"})
        add_run(near, method="dpgd", seed=seed, tuning={"mode": "validation"})  # 0.86, 2 SE = 0.012: not flagged
        add_run(0.80, method="adaclip", seed=seed)  # below
    add_run(**reference_fields(0.85))
    found = [v for v in board_check.violations(board_model.build_tables(store.load())) if v.kind == "above-reference"]
    assert [(v.track, v.method, v.epsilon) for v in found] == [("none", "dpsgd", 1.0),
                                                             ("random-stopping", "dpsgd", 1.0)]
    records = tmp_path / "results.jsonl"
    assert main(["leaderboard", "--format", "jsonl", "--out", str(records)]) == 0
    assert main(["leaderboard", "--check", "--records", str(records)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("above-reference")] == [
        "above-reference: digits (add-remove) · none · dpsgd · ε = 1: 0.9010 vs the converged reference 0.8500 "
        "(2 SE = 0.0012)",
        "above-reference: digits (add-remove) · random-stopping · dpsgd · ε = 1: 0.9010 vs the converged reference "
        "0.8500 (2 SE = 0.0012)"]
    (tmp_path / "exceptions.json").write_text(json.dumps([
        {"kind": "above-reference", "task": "digits", "method": "dpsgd", "track": track, "epsilons": [1],
         "reason": "a test of the check", "tested_by": "pytest"} for track in ("none", "random-stopping")]))
    assert main(["leaderboard", "--check", "--records", str(records)]) == 0, capsys.readouterr()


def test_the_sweep_runs_the_references_once_per_task_and_resumes_them():
    grid = {"tasks": ["breast_cancer"], "methods": ["nonprivate"], "epsilons": [1.0], "seeds": 1, "reference": True}
    assert run_grid(grid) == {"ran": 2, "already stored": 0, "refused": 0}
    assert sorted(r["method"] for r in store.load()) == ["nonprivate", "reference"]
    assert run_grid(grid) == {"ran": 0, "already stored": 2, "refused": 0}


def test_the_command_records_a_reference_and_refuses_bad_tasks_at_once(capsys, refused):
    from tests.test_cli import test_help_listing_refusals_and_privacy_load_no_training_stack as loads_nothing

    for argv in (["reference", "--task", "nope"], ["reference", "--task", "adaclip_regression"]):
        loads_nothing(argv, 2)
    assert "not a linear classification task" in refused("reference", "--task", "adaclip_regression")
    assert main(["reference", "--task", "breast_cancer", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert store.load() == [record] and record_checks.check(record) == []
    assert main(["leaderboard", "--format", "csv"]) == 0
    assert "reference" in capsys.readouterr().out


def test_verify_checks_a_references_selection_and_reruns_its_solve(tmp_path, capsys):
    record = reference.run("breast_cancer", append_to_store=False)
    assert record_checks.check(record) == []

    def edited(change):
        tampered = json.loads(json.dumps(record))
        change(tampered)
        tampered["run_id"] = store.content_id(tampered)
        return tampered

    chosen = record["tuning"]["selected_params"]["l2"]
    other = next(fit["l2"] for fit in record["tuning"]["fits"] if fit["l2"] != chosen)
    chosen_other = edited(lambda r: r["tuning"]["selected_params"].update(l2=other))
    assert any("the held-out scores choose" in p for p in record_checks.check(chosen_other))
    unconverged = edited(lambda r: r["tuning"]["fits"][0].update(max_gradient=1e-3))
    assert any("did not converge" in p for p in record_checks.check(unconverged))
    majority = edited(lambda r: r.update(test_majority_rate=0.95))  # the board's collapsed checks read it
    assert record_checks.check(majority) == [f"test_majority_rate is 0.95, but task breast_cancer's test set on "
                                             f"{record['data_id']} gives {record['test_majority_rate']!r}"]
    claims = edited(lambda r: r.update(epsilon=1.0))
    assert any("claims privacy" in p for p in record_checks.check(claims))
    # a reference of another grid, honestly solved, could be one of several kept for its test accuracy
    single = reference.run("breast_cancer", grid=(1e-3,), append_to_store=False)
    assert any("differs from the board's in l2_grid" in p for p in record_checks.check(single))
    better = edited(lambda r: r["metrics"].update(test_accuracy=0.99))
    for found, mismatches in ((record, 0), (better, 1)):
        path = tmp_path / "records.jsonl"
        path.write_text(json.dumps(found) + "\n")
        assert main(["verify", str(path), "--rerun", "1"]) == (1 if mismatches else 0)
        out = capsys.readouterr().out
        assert out.count("the rerun differs") == mismatches and "test_accuracy" in out if mismatches else out == ""
