"""Approximate Minima Perturbation: the paper's calibration by hand, the solver, the sensitivities, and runs."""
import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from dpbench import registry
from dpbench.cli import main
from dpbench.privacy import streams
from dpbench.release import mechanisms
from dpbench.release.mechanisms import AMPCalibration

METHODS = registry.methods([])
AMP, AMPNT = METHODS["amp"], METHODS["amp_nt"]


def analytic_gaussian_delta(epsilon, sensitivity_over_sigma):
    """Exact δ(ε) of a Gaussian mechanism (Balle & Wang 2018, Theorem 8)."""
    mu = sensitivity_over_sigma
    return norm.cdf(mu / 2 - epsilon / mu) - math.exp(epsilon) * norm.cdf(-mu / 2 - epsilon / mu)


def test_calibration_matches_the_paper_computed_by_hand():
    # ε = 0.5, δ = 1e-6, n = 1000, L = 1, β = 1, r = 2, ε3/ε1 = 0.9, ε2/ε = δ2/δ = 0.01, γ = 1e-6:
    # ε2 = 0.005, ε1 = 0.495, ε3 = 0.4455, δ2 = 1e-8, δ1 = 9.9e-7, Λ = rβ/(ε1 − ε3) = 2/0.0495 = 40.4040...,
    # σ1 = (2L/n)(1 + √(2 ln(1/δ1)))/ε3 = 0.002·(1 + √(2·13.8255609))/0.4455 = 0.0280962...,
    # σ2 = (2nγ/Λ)(1 + √(2 ln(1/δ2)))/ε2 = (0.002/40.4040)(1 + √(2·18.4206807))/0.005 = 0.0699901...
    c = AMPCalibration.from_paper(0.5, 1e-6, 1000, 1.0, 1.0, 2, 0.9, 0.01, 1e-6)
    assert (c.epsilon_out, c.epsilon_objective, c.epsilon_noise) == pytest.approx((0.005, 0.495, 0.4455))
    assert (c.delta_out, c.delta_objective) == pytest.approx((1e-8, 9.9e-7))
    assert c.regularization == pytest.approx(40.4040404, rel=1e-8)
    assert c.objective_sensitivity == pytest.approx(0.002)
    assert c.sigma_objective == pytest.approx(0.0280962218, rel=1e-8)
    assert c.out_sensitivity == pytest.approx(4.95e-5)  # 2nγ/Λ = 0.002/40.4040...
    assert c.sigma_out == pytest.approx(0.0699901143, rel=1e-8)
    # The output part is charged the ε of a Gaussian mechanism with Δ/σ = ε2/(1 + √(2 ln(1/δ2))) at δ2 = 1e-8:
    # never below the exact (analytic) value, 0.0027185, and within PLD's discretization of it.
    ratio = 0.005 / (1 + math.sqrt(2 * math.log(1e8)))
    assert analytic_gaussian_delta(c.epsilon_out_spent, ratio) <= 1e-8
    assert c.epsilon_out_spent == pytest.approx(0.0027185, abs=1e-5)


@pytest.mark.parametrize("epsilon, delta, noise_fraction, out_fraction", [
    (0.1, 1e-9, 0.9, 0.01), (1.0, 1e-5, 0.99, 0.5), (0.3, 2e-7, 0.95, 0.001), (5.0, 1e-6, 0.9, 0.1)])
def test_budget_split_sums_to_the_target(epsilon, delta, noise_fraction, out_fraction):
    c = AMPCalibration.from_paper(epsilon, delta, 500, 1.0, 1.0, 2, noise_fraction, out_fraction, 1 / 500**2)
    assert c.epsilon_objective + c.epsilon_out == pytest.approx(epsilon, rel=1e-12)
    assert c.delta_objective + c.delta_out == pytest.approx(delta, rel=1e-12)
    assert 0 < c.epsilon_objective - c.epsilon_noise < 1 and c.epsilon_noise < c.epsilon_objective
    assert 0 < c.epsilon_out_spent <= c.epsilon_out  # what the run is charged for the output part


def test_split_without_room_for_the_curvature_term_is_refused():
    with pytest.raises(ValueError, match="0 < ε1 − ε3 < 1"):
        AMPCalibration.from_paper(20.0, 1e-6, 500, 1.0, 1.0, 2, 0.9, 0.01, 1e-6)  # ε1 − ε3 = 1.98


def test_output_split_where_the_papers_gaussian_formula_fails_is_refused():
    # ε2 = 20, δ2 = 0.01: σ/Δ = (1 + √(2 ln 100))/20 = 0.2017 is below the exact mechanism's 0.2207 (ε1 = 2.2,
    # ε3 = 2.2, δ1 = 0.0011: b1's formula holds).
    with pytest.raises(ValueError, match="output noise is not \\(20, 0.01\\)-DP"):
        AMPCalibration.from_paper(200 / 9, 1 / 90, 500, 1.0, 1.0, 2, 0.99, 0.9, 1e-6)


@pytest.mark.parametrize("epsilon", [1.0, 8.0, 16.0, 18.0, 18.5, 20.0, 40.0, 60.0])
def test_objective_noise_is_refused_exactly_where_the_papers_formula_fails_its_tail_bound(epsilon):
    """b1 ~ N(0, σ1²I) with σ1 = (2L/n)(1 + √(2 ln(1/δ1)))/ε3 must keep the linear term's privacy loss, N(μ²/2, μ²)
    with μ = (2L/n)/σ1, under ε3 but with probability δ1 (Kifer et al. 2012, Theorem 2); at large ε3 the formula
    does not. breast_cancer's n = 455, δ = 1/n², ε3/ε1 = 0.99, ε2/ε = 0.01: accepted iff that tail is at most δ1.
    (The tail is stricter than b1's (ε3, δ1)-DP as a Gaussian mechanism, which still holds at ε = 20.)"""
    n, delta = 455, 1 / 455**2
    epsilon3, delta1 = 0.99 * 0.99 * epsilon, 0.99 * delta
    mu = epsilon3 / (1 + math.sqrt(2 * math.log(1 / delta1)))
    holds = norm.sf(epsilon3 / mu - mu / 2) <= delta1
    assert holds == (epsilon <= 18)  # the tail: 1.8e-6 at ε = 16, 8.4e-6 > δ1 = 4.8e-6 at 20, 4.0e-3 at 40
    assert (analytic_gaussian_delta(epsilon3, mu) <= delta1) == (epsilon <= 20)  # the weaker reading
    if holds:
        c = AMPCalibration.from_paper(epsilon, delta, n, 1.0, 1.0, 2, 0.99, 0.01, 1 / n**2)
        assert c.epsilon_noise == pytest.approx(epsilon3) and c.epsilon_objective == pytest.approx(0.99 * epsilon)
    else:
        with pytest.raises(ValueError, match="objective noise b1 does not keep"):
            AMPCalibration.from_paper(epsilon, delta, n, 1.0, 1.0, 2, 0.99, 0.01, 1 / n**2)


def test_hyperparameter_free_split_is_the_benchmarks_fit():
    nt = AMPNT({})
    # ε = 0.1: 0.88671 + 0.0186607/0.1^0.372906 = 0.88671 + 0.0186607·2.36004 = 0.930749 (> 1 − 1/0.1 + 0.001).
    assert nt.budget_fractions(0.1) == pytest.approx((0.9307486, 0.01), rel=1e-6)
    # ε = 10: the fit gives 0.894617 but ε1 − ε3 < 1 needs more: 1 − 1/10 + 0.001 = 0.901.
    assert nt.budget_fractions(10.0) == pytest.approx((0.901, 0.01))
    assert nt.budget_fractions(0.001) == (0.99, 0.01)  # capped
    assert nt.input_norm == 1.0 and nt.gamma(300) == 1 / 300**2 and nt.smoothness == 1.0


def problem(n=200, p=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=generator, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True)
    y = ((x @ torch.arange(1.0, p + 1, dtype=torch.float64) + 0.5 * torch.randn(n, generator=generator,
                                                                                 dtype=torch.float64)) > 0).double()
    b = 0.01 * torch.randn(p, generator=generator, dtype=torch.float64)
    return x, y, b


def perturbed_objective(theta, x, y, regularization, b):
    """L_priv written independently: binary cross-entropy with logits + (Λ/2n)‖θ‖² + bᵀθ (Algorithm 1, line 4)."""
    n = len(x)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ theta, y)
    return loss + regularization / (2 * n) * theta @ theta + b @ theta


def test_gradient_is_that_of_the_papers_objective():
    x, y, b = problem()
    theta = torch.randn(6, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    (expected,) = torch.autograd.grad(perturbed_objective(theta, x, y, 7.0, b), theta)
    got = AMP(AMP.defaults).objective_gradient(theta.detach(), x, y, 7.0, b)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gamma", [1e-3, 1 / 200**2, 1e-12])
def test_solver_reaches_the_gradient_tolerance_and_the_minimizer(gamma):
    x, y, b = problem()
    amp = AMP(AMP.defaults)
    theta, iterations = amp.solve(x, y, 7.0, b, gamma)
    assert amp.objective_gradient(theta, x, y, 7.0, b).norm() < gamma and iterations >= 1
    exact, _ = amp.solve(x, y, 7.0, b, 1e-13)
    # L_priv is (Λ/n)-strongly convex, so ‖θ − θ*‖ ≤ ‖∇L_priv(θ)‖/(Λ/n) < nγ/Λ.
    assert (theta - exact).norm() <= 200 * gamma / 7.0


def test_objective_sensitivity_holds_on_neighbouring_datasets():
    # The data term's gradient changes by at most 2L/n when one row is replaced (each row's gradient has norm ≤ L).
    # Flipping a label changes it by exactly ‖x‖/n = L/n, whatever θ; another row, by something in between.
    x, y, b = problem(n=50, p=4, seed=2)
    amp = AMP(AMP.defaults)
    bound = AMPCalibration.from_paper(1.0, 1e-6, 50, 1.0, 1.0, 2, 0.9, 0.01, 1e-6).objective_sensitivity
    assert bound == pytest.approx(2 / 50)
    for replaced, seed in [(0, 3), (17, 4), (49, 5)]:
        theta = 3 * torch.randn(4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        flipped = y.clone()
        flipped[replaced] = 1 - y[replaced]
        change = amp.objective_gradient(theta, x, y, 7.0, b) - amp.objective_gradient(theta, x, flipped, 7.0, b)
        assert change.norm().item() == pytest.approx(bound / 2)
        other = x.clone()
        other[replaced] = x[(replaced + 1) % 50]
        change = amp.objective_gradient(theta, x, y, 7.0, b) - amp.objective_gradient(theta, other, flipped, 7.0, b)
        assert change.norm() <= bound


def test_output_sensitivity_holds_for_neighbours_sharing_the_exact_minimizer():
    # The coupling of the privacy argument: D' gets b1' = b1 + ∇f_D(θ*) − ∇f_D'(θ*), so θ* minimizes both
    # objectives; the two approximate minimizers then lie within nγ/Λ of θ* each, within 2nγ/Λ of each other.
    n, regularization, gamma = 200, 7.0, 1e-3
    x, y, b = problem(n=n)
    amp = AMP(AMP.defaults)
    exact, _ = amp.solve(x, y, regularization, b, 1e-13)
    x2, y2 = x.clone(), y.clone()
    x2[5], y2[5] = x[6], 1 - y[6]
    zero = torch.zeros_like(b)
    b_neighbour = b + amp.objective_gradient(exact, x, y, 0.0, zero) - amp.objective_gradient(exact, x2, y2, 0.0, zero)
    exact2, _ = amp.solve(x2, y2, regularization, b_neighbour, 1e-13)
    torch.testing.assert_close(exact2, exact, rtol=0, atol=1e-10)
    theta, _ = amp.solve(x, y, regularization, b, gamma)
    theta2, _ = amp.solve(x2, y2, regularization, b_neighbour, gamma)
    calibration = AMPCalibration.from_paper(1.0, 1e-6, n, 1.0, 1.0, 2, 0.9, 0.01, gamma)
    assert calibration.out_sensitivity == pytest.approx(2 * n * gamma / calibration.regularization)
    scaled = 2 * n * gamma / regularization  # the same bound at this test's Λ
    assert (theta - theta2).norm() <= scaled and (theta - exact).norm() <= scaled / 2


class Unconverged(AMP):
    name = "unconverged_for_tests"
    description = "returns its starting point"

    def solve(self, x, y, regularization, linear_term, gamma):
        return torch.zeros(x.shape[1], dtype=x.dtype), 0


def test_a_solver_that_misses_gamma_is_not_released():
    x, y, _ = problem()
    with pytest.raises(RuntimeError, match="gradient norm"):
        mechanisms.approximate_minima_perturbation(Unconverged(AMP.defaults), x, y[:, None], 1.0, 1e-6, 0)


def test_noise_is_drawn_by_the_release_module_with_the_calibrated_scales():
    x, y, _ = problem(n=300, p=5)
    seen = []

    class Recording(AMP):
        name = "recording_for_tests"
        description = "records the linear term it is handed"

        def solve(self, x, y, regularization, linear_term, gamma):
            seen.append((regularization, linear_term.clone()))
            return super().solve(x, y, regularization, linear_term, gamma)

    theta, ledger, _, c = mechanisms.approximate_minima_perturbation(Recording(AMP.defaults), x, y[:, None], 1.0, 1e-6, 4)
    b1 = c.sigma_objective * torch.randn(5, generator=streams.generator(4, "objective-noise"), dtype=torch.float64)
    [(regularization, linear_term)] = seen
    assert regularization == c.regularization
    torch.testing.assert_close(linear_term, b1)
    approx, _ = AMP(AMP.defaults).solve(x, y, c.regularization, b1, c.gamma)
    b2 = c.sigma_out * torch.randn(5, generator=streams.generator(4, "output-noise"), dtype=torch.float64)
    torch.testing.assert_close(theta[:, 0], approx + b2)
    assert [(e.epsilon, e.delta) for e in ledger] == [(c.epsilon_objective, c.delta_objective),
                                                       (c.epsilon_out_spent, c.delta_out)]


def run_json(capsys, *args):
    assert main(["run", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["amp", "amp_nt"])
def test_breast_cancer_run_records_both_parts(capsys, name):
    record = run_json(capsys, "--method", name, "--task", "breast_cancer", "--epsilon", "1")
    n = record["n_train"]
    objective, output = record["privacy_ledger"]
    assert objective["epsilon"] == pytest.approx(0.99) and 0 < output["epsilon"] <= 0.01
    assert 0.99 < record["epsilon"] <= 1
    assert record["delta"] == pytest.approx(1 / n**2, rel=1e-12)
    assert objective["epsilon"] + output["epsilon"] == record["epsilon"]
    assert objective["sensitivity"] == pytest.approx(2 / n)  # L = 1
    assert record["noise_multiplier"] == pytest.approx(objective["noise_std"] / objective["sensitivity"])
    # The paper's σ1/(2L/n) = (1 + √(2 ln(1/δ1)))/ε3.
    epsilon3 = objective["epsilon"] * (0.95 if name == "amp" else AMPNT({}).budget_fractions(1.0)[0])
    assert record["noise_multiplier"] == pytest.approx((1 + math.sqrt(2 * math.log(1 / objective["delta"]))) / epsilon3)
    assert output["delta"] == pytest.approx(0.01 / n**2)
    assert record["sampler"] == "none (full data)" and record["gradient_evaluations"] == 0
    # The solver's iteration count and the wall time depend on the data and no analysis covers them: not released.
    assert record["steps"] is None and record["train_seconds"] is None
    assert record["sample_rate"] == 1.0 and record["metrics"]["test_accuracy"] > 0.5


def test_digits_one_vs_all_charges_ten_classifiers(capsys):
    record = run_json(capsys, "--method", "amp", "--task", "digits", "--epsilon", "2")
    ledger = record["privacy_ledger"]
    assert len(ledger) == 20 and record["epsilon"] == pytest.approx(sum(e["epsilon"] for e in ledger))
    assert all(e["epsilon"] == pytest.approx(0.198) for e in ledger[0::2])  # ε1 of each classifier's 0.2
    assert all(0 < e["epsilon"] <= 0.002 for e in ledger[1::2]) and 1.98 < record["epsilon"] <= 2
    assert sum(e["delta"] for e in ledger) == pytest.approx(record["delta"]) == pytest.approx(1 / 1437**2)


@pytest.mark.parametrize("args, message", [
    (["--noise-multiplier", "2"], "no --noise-multiplier"),
    (["--sampler", "shuffle"], "no --sampler"),
    (["--epochs", "3"], "no hyperparameter 'epochs'"),
    (["--set", "noise_fraction=1.5"], "must lie in (0, 1)"),
    (["--epsilon", "30"], "0 < ε1 − ε3 < 1"),
    (["--epsilon", "40", "--set", "noise_fraction=0.99"], "objective noise b1 does not keep its privacy loss under ε3 = 39.204"),
])
def test_options_that_do_not_apply_are_refused(refused, args, message):
    assert message in refused("run", "--method", "amp", "--task", "breast_cancer", *args)


def test_amp_nt_takes_no_hyperparameters(capsys):
    assert main(["run", "--method", "amp_nt", "--task", "breast_cancer", "--set", "input_norm=2"]) == 2
    assert "valid: bias" in capsys.readouterr().err  # only the task's option


def test_listed_with_one_line_descriptions(capsys):
    assert main(["list", "methods"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    for name in ("amp", "amp_nt", "output_perturbation"):
        assert "Iyengar" in lines[name] or "Wu et al." in lines[name]


def test_the_solver_groups_repeated_rows_into_the_same_objective(monkeypatch):
    """The solver's objective over distinct rows weighted by their counts equals the objective over every row (its
    value, gradient and Hessian), also for identical rows with different labels and when the hash collides."""
    from dpbench.data import rows
    from methods import amp as module

    rng = np.random.default_rng(3)
    pool = rng.normal(size=(6, 4))
    x = pool[rng.integers(0, 6, size=40)]
    y = rng.integers(0, 2, size=40).astype(float)
    theta, b = rng.normal(size=4), rng.normal(size=4)
    full = module._perturbed_logistic(x, np.ones(40), y, 40, 3.0, b)
    for collide in (False, True):
        if collide:  # every row in one hash group: the check finds the collision and the rows are grouped exactly
            monkeypatch.setattr(rows.pd, "factorize", lambda keys: (np.zeros(len(keys), dtype=np.int64), None))
        distinct, counts, label_sums = module._distinct_rows(x, y)
        assert len(distinct) == len({row.tobytes() for row in x}) and counts.sum() == 40 and label_sums.sum() == y.sum()
        grouped = module._perturbed_logistic(distinct, counts, label_sums, 40, 3.0, b)
        assert grouped[0](theta) == pytest.approx(full[0](theta), rel=1e-12)
        np.testing.assert_allclose(grouped[1](theta), full[1](theta), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(grouped[3](theta), full[3](theta), rtol=1e-12, atol=1e-15)
