"""benchmarks/federated_figures.py's two-stage tuning of SGD's learning rate: which runs it plans as seed-0 records
arrive, and which η the table calls tuned."""
import importlib.util
import math
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "federated_figures", Path(__file__).resolve().parents[1] / "benchmarks" / "federated_figures.py")
figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figures)

ROUNDS, SIZE = 50, 8000


def record(method, fraction, exponent, seed, accuracy):
    return {"client_method": method, "hyperparameters": {"lr": 10**exponent}, "seed": seed,
            "split": {"random_fraction_text": fraction}, "settings": {"rounds": ROUNDS, "client_size": SIZE},
            "metrics": {"test_accuracy": accuracy}}


def test_later_sgd_seeds_wait_for_every_seed_0_run_then_take_the_two_best():
    accuracies = {-3.5: 0.53, -2.5: 0.60, -2.0: 0.57, -1.5: 0.59, -0.5: math.nan}  # 10^-0.5 diverged
    records = [record("sgd", "0", e, 0, a) for e, a in accuracies.items() if e != -1.5]
    plan = figures.planned(3, 2, records, ROUNDS, SIZE)
    assert not [run for run in plan if run[0] == "sgd" and run[3] > 0]  # 10^-1.5 has not run yet
    assert [run for run in plan if run[0] == "ada_dp" and run[1] == "0"] == [("ada_dp", "0", -2.0, s) for s in range(3)]
    assert sorted(run for run in plan if run[0] == "adam") == [("adam", "1/3", e, 0) for e in (-5.5, -5.0, -4.5)]
    plan = figures.planned(3, 2, records + [record("sgd", "0", -1.5, 0, 0.59)], ROUNDS, SIZE)
    later = sorted(run for run in plan if run[0] == "sgd" and run[3] > 0)
    assert later == [("sgd", "0", e, s) for e in (-2.5, -1.5) for s in (1, 2)]
    assert not [run for run in plan if run[1] != "0" and run[0] == "sgd" and run[3] > 0]  # other fractions wait


def test_tuned_sgd_is_the_best_mean_among_the_etas_with_most_seeds():
    records = [record("sgd", "1/3", -3.5, 0, 0.80),  # lucky single seed: not a candidate
               *[record("sgd", "1/3", -2.0, s, a) for s, a in enumerate((0.70, 0.71, 0.72))],
               *[record("sgd", "1/3", -1.5, s, a) for s, a in enumerate((0.72, 0.69, 0.69))]]
    assert figures.best_sgd(figures.groups(records), "1/3") == -2.0
    assert figures.best_sgd(figures.groups(records), "0") is None


def test_one_setting_shortfall_is_against_the_sgd_tuned_per_share():
    means = {("sgd", -2.5): (0.60, 0.70, 0.71), ("sgd", -1.5): (0.55, 0.71, 0.72), ("ada_dp", -2.0): (0.59, 0.70, 0.71)}
    records = [record(m, f, e, 0, a) for (m, e), row in means.items() for f, a in zip(figures.FRACTIONS, row)]
    grouped = figures.groups(records)
    best = {f: figures.best_sgd(grouped, f) for f in figures.FRACTIONS}
    assert best == {"0": -2.5, "1/3": -1.5, "1": -1.5}
    gaps = dict(figures.robustness(grouped, best))
    assert gaps == {("ada_dp", -2.0): pytest.approx(0.01), ("sgd", -2.5): pytest.approx(0.01),
                    ("sgd", -1.5): pytest.approx(0.05)}
