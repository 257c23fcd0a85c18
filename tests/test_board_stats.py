"""The board's statistics (dpbench/board/stats.py) and what they mark: Holm's correction against hand-computed
values, Welch's and the one-sample test against their formulas, intervals inside [0, 1], and boards wrong in exactly
one respect getting exactly that mark."""
import math
import statistics

import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats as scipy_stats

from dpbench.board import model as board_model, stats
from dpbench.cli import main
from dpbench.results import store
from tests.test_leaderboard import add_run, row_of


@pytest.mark.parametrize("pvalues, adjusted", [
    ([0.01, 0.04, 0.03, 0.005], [0.03, 0.06, 0.06, 0.02]),  # 0.005·4, 0.01·3, 0.03·2, max(0.04·1, 0.06)
    ([0.01, 0.02, 0.03], [0.03, 0.04, 0.04]),  # all below 0.05 (Bonferroni would keep 0.03·3 = 0.09)
    ([0.5, 0.6, 0.001], [1.0, 1.0, 0.003]),  # capped at 1, never below an earlier step
    ([0.02, 0.02], [0.04, 0.04]),
    ([0.2], [0.2]),
    ([], []),
])
def test_holm_adjusted_p_values_match_hand_computed_ones(pvalues, adjusted):
    assert stats.holm(pvalues) == pytest.approx(adjusted)


def test_welch_and_one_sample_tests_follow_their_formulas():
    # a: mean 2, variance 1; b: mean 1/3, variance 1/3 (3 values each): t = (5/3) / √(1/3 + 1/9) = 2.5,
    # Welch–Satterthwaite df = (4/9)² / ((1/3)²/2 + (1/9)²/2) = 3.2
    assert stats.welch_greater([1, 2, 3], [0, 0, 1]) == pytest.approx(scipy_stats.t.sf(2.5, 3.2))
    assert stats.welch_greater([0, 0, 1], [1, 2, 3]) == pytest.approx(scipy_stats.t.sf(-2.5, 3.2))
    assert (stats.welch_greater([0.7] * 3, [0.6] * 4), stats.welch_greater([0.6] * 3, [0.6] * 4)) == (0.0, 1.0)
    # mean 0.77, sd 0.01 over 3 seeds against 0.75: t = 0.02 / (0.01 / √3), 2 degrees of freedom
    assert stats.above_rate_p([0.76, 0.77, 0.78], 0.75) == pytest.approx(scipy_stats.t.sf(0.02 / (0.01 / 3**0.5), 2))
    assert [stats.above_rate_p(values, 0.75) for values in ([0.75] * 5, [0.7501] * 5, [0.74] * 2, [0.9])] == \
        [1.0, 0.0, 1.0, None]  # identical seeds: exact; one seed: untested
    # Identical values whose float mean is an ulp off: scipy alone finds them "significant" (p = 0.038, 0.025).
    assert stats.above_rate_p([1 / 2999] * 6, 1 / 2999) == 1.0
    assert stats.welch_greater([9 / 2999] * 5, [9 / 2999] * 7) == 1.0


NEAR_ONE = [1.0, 1.0, 0.99, 0.97, 1.0]  # mean 0.992, Student's t: [0.9800, 1.0040]
NEAR_ZERO = [0.0, 0.01, 0.0, 0.03, 0.0]  # mean 0.008, Student's t: [-0.0080, 0.0240]


def test_accuracy_intervals_stay_inside_0_1_where_students_t_does_not():
    for values in (NEAR_ONE, NEAR_ZERO, [0.26, 0.99, 0.98, 0.97, 0.99]):
        mean = statistics.fmean(values)
        half = scipy_stats.t.ppf(0.975, 4) * statistics.stdev(values) / math.sqrt(5)
        assert not 0 <= mean - half <= mean + half <= 1  # the former construction leaves [0, 1]
        low, high = stats.interval(values, n_test=100, bounded=True)
        assert 0 <= low < mean < high <= 1
        assert stats.interval(values, bounded=True)[0] >= 0 and stats.interval(values, bounded=True)[1] <= 1
    # Far from the boundary the logit-scale interval is close to Student's t.
    values = [0.80, 0.82, 0.81, 0.80, 0.82]
    half = scipy_stats.t.ppf(0.975, 4) * statistics.stdev(values) / math.sqrt(5)
    assert stats.interval(values, n_test=10_000, bounded=True) == pytest.approx((0.81 - half, 0.81 + half), abs=1e-3)


def test_identical_seeds_and_single_seeds():
    for value in (0.0, 0.7533, 1.0):
        assert stats.interval([value] * 5, n_test=16281, bounded=True) == (value, value)
    assert stats.interval([0.9], n_test=100, bounded=True) is None
    assert stats.interval([2.0, 2.0], bounded=False) == (2.0, 2.0)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 100_000), data=st.data())
def test_every_accuracy_interval_lies_in_0_1(n, data):
    counts = data.draw(st.lists(st.integers(0, n), min_size=2, max_size=12))
    values = [k / n for k in counts]
    low, high = stats.interval(values, n_test=n, bounded=True)
    assert 0 <= low <= high <= 1


def test_holm_not_the_runner_up_decides_the_winner():
    """Three challengers each significantly below the best alone (p < 0.05) but not all after Holm's correction:
    no winner (the former rule compared the best with the runner-up only, uncorrected: a winner)."""
    samples = {"best": BEST, "a": CHALLENGER_A, "b": CHALLENGER_B, "c": CHALLENGER_C}
    raw = {key: stats.welch_greater(BEST, values) for key, values in samples.items() if key != "best"}
    assert max(raw.values()) < 0.05 < max(stats.holm(list(raw.values())))
    marks, adjusted = stats.compare_column(samples, set(samples))
    assert marks["best"] == "tied" and "winner" not in marks.values()
    assert {key for key, p in adjusted.items() if p >= 0.05} == {key for key in marks if key != "best"}


BEST = [0.830, 0.836, 0.842, 0.834, 0.838]
CHALLENGER_A = [0.826, 0.830, 0.834, 0.828, 0.832]
CHALLENGER_B = [0.824, 0.832, 0.836, 0.826, 0.832]
CHALLENGER_C = [0.827, 0.829, 0.835, 0.829, 0.830]


def test_a_winner_beats_every_row_and_rows_that_cannot_be_compared_block_it():
    clear = {"best": [0.90, 0.91, 0.92], "b": [0.80, 0.81, 0.82], "c": [0.70, 0.71, 0.72]}
    assert stats.compare_column(clear, set(clear))[0] == {"best": "winner"}
    # A row of one seed is neither compared nor marked, but the best cannot be shown to beat it.
    assert stats.compare_column(clear | {"d": [0.99]}, set(clear) | {"d"})[0] == {"best": "tied"}
    # A noisy row that may not be marked (not above trivial), even with the highest mean: not the best, no mark,
    # and no winner (the best is not shown above it).
    for noisy in ([0.5, 1.0, 0.6, 1.0], [0.6, 1.0, 1.0, 1.0, 1.0, 1.0]):
        assert stats.compare_column(clear | {"trivial": noisy}, set(clear))[0] == {"best": "tied"}
    # Lower is better: the same with the sign turned.
    assert stats.compare_column({"x": [0.1, 0.11, 0.12], "y": [0.3, 0.31, 0.3]}, {"x", "y"}, sign=-1)[0] == \
        {"x": "winner"}
    assert stats.compare_column({"x": [0.1, 0.11]}, {"x"}) == ({}, {})  # nothing to compare


def trivial_board(capsys):
    """Column ε = 1 of the `none` track: dpsgd clearly best; dpgd a little below it, not significantly; adaclip with a
    mean above the majority-class rate 0.75 but not significantly (noisy seeds), and not significantly below dpsgd."""
    for seed, (a, b, c) in enumerate([(0.80, 0.79, 0.70), (0.81, 0.80, 0.86), (0.79, 0.80, 0.74),
                                      (0.80, 0.79, 0.82), (0.80, 0.80, 0.78)]):
        add_run(a, seed=seed, test_majority_rate=0.75)
        add_run(b, method="dpgd", seed=seed, test_majority_rate=0.75)
        add_run(c, method="adaclip", seed=seed, test_majority_rate=0.75)
    assert main(["leaderboard"]) == 0
    return capsys.readouterr().out


def test_a_cell_not_above_trivial_is_greyed_and_never_marked_even_when_tied_with_the_best(capsys):
    text = trivial_board(capsys)
    adaclip = row_of(text, "adaclip", "### none")
    assert "not above trivial" in adaclip and "≈" not in adaclip and "▲" not in adaclip
    assert "≈ 0.8" in row_of(text, "dpsgd", "### none") and "≈ 0.796" in row_of(text, "dpgd", "### none")
    assert "| ≈ dpgd, dpsgd |" in text
    [table] = board_model.build_tables(store.load())
    cells = {row.method: cell for (row, _), cell in table.cells.items()}
    assert cells["adaclip"].trivial_p > 0.05 and cells["dpgd"].trivial_p < 0.05
    assert stats.welch_greater(cells["dpsgd"].values, cells["adaclip"].values) > 0.05  # the former rule: tied


def test_a_cell_of_identical_seeds_is_compared_exactly(capsys):
    """Seeds that do not change the outcome (a deterministic method): the interval is the point, and a difference
    to another such cell is exact."""
    for seed in range(3):
        add_run(0.85, seed=seed, test_majority_rate=0.75)
        add_run(0.84, method="output_perturbation", seed=seed, test_majority_rate=0.75)
    assert main(["leaderboard"]) == 0
    text = capsys.readouterr().out
    assert "▲ 0.85 [0.85, 0.85] (n = 3)" in row_of(text, "dpsgd", "### none")
    assert "| 0.84 [0.84, 0.84] (n = 3) |" in row_of(text, "output_perturbation", "### none")
