"""The board's statistics over seeds: intervals that stay in [0, 1], the test against the trivial classifier, and the
comparisons within an ε column (Welch's t-tests with Holm's correction).

Everything is conditional on the task's test set (every method is scored on the same one) and treats a cell's seeds
as independent draws of training randomness; where a cell's seeds are identical (no variation over seeds), a
comparison involving only such cells is exact: a difference in means is taken as it is.

Seeds are not paired across methods: seed 3 of one method and seed 3 of another share no randomness (each method
draws its own noise, batches and initialisation from it), so the comparisons are unpaired (Welch), not paired t-tests.
"""
from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Hashable, Sequence

from scipy import special, stats

ALPHA = 0.05
LEVEL = 0.95


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given (reject where below α: family-wise error at most α).
    Written here because scipy has only Benjamini–Hochberg/Yekutieli (``false_discovery_control``) and statsmodels is
    not a dependency."""
    m = len(pvalues)
    adjusted = [1.0] * m
    running = 0.0
    for step, index in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - step) * pvalues[index]))  # monotone: never below an earlier step
        adjusted[index] = running
    return adjusted


def _identical(values: Sequence[float]) -> bool:
    return max(values) == min(values)


def welch_greater(a: Sequence[float], b: Sequence[float]) -> float:
    """One-sided p-value of Welch's t-test that the mean of ``a`` exceeds that of ``b`` (each needs 2 values).
    Both without variation: exact, 0 if ``a``'s mean is larger, else 1."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's test needs at least two values per sample")
    if _identical(a) and _identical(b):
        return 0.0 if a[0] > b[0] else 1.0
    with warnings.catch_warnings():  # nearly equal values: scipy warns of lost precision
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)
    return 1.0 if math.isnan(p) else p


def above_rate_p(values: Sequence[float], rate: float) -> float | None:
    """One-sided p-value of a one-sample t-test over seeds that the mean exceeds ``rate`` (the majority-class rate);
    None for one seed. Identical seeds: exact, 0 if above the rate, else 1."""
    if len(values) < 2:
        return None
    if _identical(values):
        return 0.0 if values[0] > rate else 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_1samp(values, rate, alternative="greater").pvalue)
    return 1.0 if math.isnan(p) else p


def _t_interval(values: Sequence[float]) -> tuple[float, float]:
    half = float(stats.t.ppf((1 + LEVEL) / 2, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    centre = statistics.fmean(values)
    return centre - half, centre + half


def interval(values: Sequence[float], n_test: int | None = None, bounded: bool = False) -> tuple[float, float] | None:
    """The 95% interval of a cell (None for one seed). Unbounded metrics: Student's t over seeds. Accuracies
    (``bounded``) with the test set's size n = ``n_test``: Student's t over the seeds' empirical logits
    log((k + ½) / (n − k + ½)), k = accuracy · n (finite at 0 and 1), mapped back by that transform's inverse
    (monotone, so the interval keeps its coverage, of the logit-scale centre mapped back); the ends are clamped to
    [0, 1] where the logit-scale interval passes the transform's range ±log(2n + 1). Accuracies without ``n_test``:
    Student's t clamped to [0, 1]. Identical seeds give the point itself."""
    if len(values) < 2:
        return None
    if _identical(values):
        return values[0], values[0]
    if not bounded:
        return _t_interval(values)
    if n_test is None:
        low, high = _t_interval(values)
    else:
        n = n_test
        low, high = ((float(special.expit(z)) * (n + 1) - 0.5) / n for z in _t_interval(
            [math.log((v * n + 0.5) / (n - v * n + 0.5)) for v in values]))
    return min(max(low, 0.0), 1.0), min(max(high, 0.0), 1.0)


def compare_column(samples: dict[Hashable, Sequence[float]], eligible: set[Hashable], sign: int = 1
                   ) -> tuple[dict[Hashable, str], dict[Hashable, float]]:
    """The marks of one ε column of one track, and the Holm-adjusted p-values of the best against each other row.

    ``samples``: each row's values over seeds; ``sign`` −1 where lower is better; ``eligible``: the rows that may be
    marked. The best is the eligible row with the best mean among the rows of at least two seeds; it is tested
    against every other such row (eligible or not) with a one-sided Welch test, Holm's correction across them. It is
    the *winner* ("winner") only if every test rejects at α = 0.05 and no row of the column has a single seed (which
    it cannot be shown to beat); otherwise it and the eligible rows whose test does not reject are marked "tied".
    Rows of one seed are neither compared nor marked; a column with fewer than two comparable rows has no marks.
    The best is chosen from the same data as the tests: the tied set is the rows not shown below the observed best,
    not a confidence set for the true best."""
    tested = {key: [sign * v for v in values] for key, values in samples.items() if len(values) >= 2}
    candidates = sorted((key for key in tested if key in eligible), key=lambda key: -statistics.fmean(tested[key]))
    if len(tested) < 2 or not candidates:
        return {}, {}
    best = candidates[0]
    others = [key for key in tested if key != best]
    adjusted = dict(zip(others, holm([welch_greater(tested[best], tested[key]) for key in others])))
    if len(tested) == len(samples) and all(p < ALPHA for p in adjusted.values()):
        return {best: "winner"}, adjusted
    return {best: "tied"} | {key: "tied" for key in others if key in eligible and adjusted[key] >= ALPHA}, adjusted
