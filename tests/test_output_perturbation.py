"""Bolt-on output perturbation: the SGD it runs, its declared sensitivity, the Gaussian calibration, and runs."""
import json
import math

import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from dpbench import registry
from dpbench.cli import main
from dpbench.release import mechanisms

OutputPerturbation = registry.methods([])["output_perturbation"]


def method(**hp):
    return OutputPerturbation(OutputPerturbation.defaults | hp)


def unit_rows(n, p, seed):
    x = torch.randn(n, p, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x / x.norm(dim=1, keepdim=True)


def labels(n, seed):
    return (torch.rand(n, 1, generator=torch.Generator().manual_seed(seed)) < 0.5).double()


def sigmoid(z):
    return 1 / (1 + math.exp(-z))


def test_convex_fit_is_permutation_sgd_unrolled_by_hand():
    # 5 rows, b = 2: batches of 2, 2 and 1 row(s), each gradient sum divided by b = 2; 2 passes, η = 0.7.
    x, y = unit_rows(5, 2, seed=1), labels(5, seed=2)
    theta, steps = method(epochs=2, batch_size=2, lr=0.7).fit(x, y, torch.Generator().manual_seed(3))
    order = torch.randperm(5, generator=torch.Generator().manual_seed(3)).tolist()
    w = [0.0, 0.0]
    for _ in range(2):
        for batch in (order[0:2], order[2:4], order[4:5]):
            g = [0.0, 0.0]
            for i in batch:
                r = sigmoid(w[0] * x[i, 0].item() + w[1] * x[i, 1].item()) - y[i, 0].item()
                g = [g[0] + r * x[i, 0].item(), g[1] + r * x[i, 1].item()]
            w = [w[0] - 0.7 * g[0] / 2, w[1] - 0.7 * g[1] / 2]
    assert steps == 6
    torch.testing.assert_close(theta[:, 0], torch.tensor(w, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_strongly_convex_fit_has_decaying_steps_and_projection_unrolled_by_hand():
    # λ = 0.5, L = 1: β = L² + λ = 1.5, η_t = min(1/1.5, 1/(0.5 t)) = 2/3, 2/3, 2/3, 1/2, 2/5, 1/3; R = 0.3 binds.
    x, y = unit_rows(4, 2, seed=4), labels(4, seed=5)
    theta, steps = method(variant="strongly_convex", epochs=3, batch_size=2, regularization=0.5, radius=0.3).fit(
        x, y, torch.Generator().manual_seed(6))
    order = torch.randperm(4, generator=torch.Generator().manual_seed(6)).tolist()
    w, t = [0.0, 0.0], 0
    for _ in range(3):
        for batch in (order[0:2], order[2:4]):
            t += 1
            g = [0.5 * w[0], 0.5 * w[1]]
            for i in batch:
                r = sigmoid(w[0] * x[i, 0].item() + w[1] * x[i, 1].item()) - y[i, 0].item()
                g = [g[0] + r * x[i, 0].item() / 2, g[1] + r * x[i, 1].item() / 2]
            lr = min(1 / 1.5, 1 / (0.5 * t))
            w = [w[0] - lr * g[0], w[1] - lr * g[1]]
            length = math.hypot(*w)
            if length > 0.3:
                w = [0.3 * w[0] / length, 0.3 * w[1] / length]
    assert steps == 6 and math.hypot(*w) == pytest.approx(0.3)
    torch.testing.assert_close(theta[:, 0], torch.tensor(w, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def neighbours(m, p, replaced, seed):
    """A dataset and its replace-one neighbour: row ``replaced`` gets the other label, so the two gradients of that
    row differ by the full row, ‖(σ(z) − y)x − (σ(z) − (1 − y))x‖ = ‖x‖ (the opposite row (−x, 1 − y) would give
    the same gradient as (x, y))."""
    x, y = unit_rows(m, p, seed), labels(m, seed + 1)
    y2 = y.clone()
    y2[replaced] = 1 - y[replaced]
    return (x, y), (x, y2)


@pytest.mark.parametrize("replaced", [0, 17, 39])
@pytest.mark.parametrize("hp", [dict(epochs=3, batch_size=4, lr=0.5), dict(epochs=1, batch_size=8, lr=2.0),
                                dict(epochs=5, batch_size=7, lr=0.3, input_norm=2.0)])
def test_convex_sensitivity_holds_on_neighbouring_datasets(hp, replaced):
    trained = method(**hp)
    (x, y), (x2, y2) = neighbours(40, 5, replaced, seed=7)
    scale = trained.input_norm
    theta, _ = trained.fit(x * scale, y, torch.Generator().manual_seed(8))
    theta2, _ = trained.fit(x2 * scale, y2, torch.Generator().manual_seed(8))  # same permutation
    bound = trained.sensitivity(40)
    assert bound == pytest.approx(2 * hp["epochs"] * scale * hp["lr"] / hp["batch_size"])
    distance = (theta - theta2).norm().item()
    assert 0.1 * bound < distance <= bound  # holds, and is not vacuous


def test_default_step_is_r_over_l_root_t_and_its_sensitivity_holds():
    # lr None: η = R/(L√T), T = k·⌈n/b⌉ = 3·⌈40/7⌉ = 18 updates; R = 2, L = 1: η = 2/√18
    trained = method(epochs=3, batch_size=7, radius=2.0)
    assert trained.step_size(40) == pytest.approx(2 / math.sqrt(18))
    (x, y), (x2, y2) = neighbours(40, 5, 3, seed=7)
    theta, steps = trained.fit(x, y, torch.Generator().manual_seed(8))
    theta2, _ = trained.fit(x2, y2, torch.Generator().manual_seed(8))
    assert steps == 18
    bound = trained.sensitivity(40)
    assert bound == pytest.approx(2 * 3 * (2 / math.sqrt(18)) / 7)
    assert 0.1 * bound < (theta - theta2).norm().item() <= bound
    explicit, _ = method(epochs=3, batch_size=7, lr=2 / math.sqrt(18)).fit(x, y, torch.Generator().manual_seed(8))
    torch.testing.assert_close(theta, explicit)


@pytest.mark.parametrize("replaced", [0, 25])
@pytest.mark.parametrize("hp", [dict(regularization=0.5, radius=1.0, epochs=20, batch_size=4),
                                dict(regularization=0.2, radius=5.0, epochs=10, batch_size=1)])
def test_strongly_convex_sensitivity_holds_on_neighbouring_datasets(hp, replaced):
    trained = method(variant="strongly_convex", **hp)
    (x, y), (x2, y2) = neighbours(30, 4, replaced, seed=9)
    theta, _ = trained.fit(x, y, torch.Generator().manual_seed(10))
    theta2, _ = trained.fit(x2, y2, torch.Generator().manual_seed(10))
    bound = trained.sensitivity(30)
    assert bound == pytest.approx(2 * (1 + hp["regularization"] * hp["radius"]) / (hp["regularization"] * 30))
    distance = (theta - theta2).norm().item()
    assert 0.02 * bound < distance <= bound


def test_one_vs_all_columns_are_independent_binary_problems():
    x, y = unit_rows(30, 3, seed=11), labels(30, seed=12)
    targets = torch.cat([y, 1 - y, torch.ones_like(y)], dim=1)
    together, _ = method(epochs=2, batch_size=4, lr=0.5).fit(x, targets, torch.Generator().manual_seed(13))
    for k in range(3):
        alone, _ = method(epochs=2, batch_size=4, lr=0.5).fit(x, targets[:, k:k + 1], torch.Generator().manual_seed(13))
        torch.testing.assert_close(together[:, k], alone[:, 0], rtol=1e-12, atol=1e-12)


def exact_gaussian_std(epsilon, delta):
    """σ/Δ of the analytic Gaussian mechanism (Balle & Wang 2018, Theorem 8), solved by bisection."""
    def delta_of(s):
        return norm.cdf(1 / (2 * s) - epsilon * s) - math.exp(epsilon) * norm.cdf(-1 / (2 * s) - epsilon * s)
    return brentq(lambda s: delta_of(s) - delta, 1e-3, 1e5, xtol=1e-12, rtol=1e-14)


@pytest.mark.parametrize("epsilon, delta", [(0.1, 1 / 36177**2), (1.0, 1e-5), (4.0, 1e-6), (0.02, 1e-9)])
def test_noise_is_the_exact_analytic_gaussian_mechanism(epsilon, delta):
    sigma = mechanisms.gaussian_noise_multiplier(epsilon, delta)
    exact = exact_gaussian_std(epsilon, delta)
    assert exact <= sigma <= exact * (1 + 1e-4)  # never less noise than the exact mechanism needs
    if epsilon < 1:  # the classic bound, valid only there, asks for more
        assert sigma < math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def test_gaussian_output_adds_sigma_times_sensitivity_and_charges_at_most_epsilon():
    theta = torch.zeros(20000, dtype=torch.float64)
    noisy, entry = mechanisms.gaussian_output(theta, 0.03, 1.0, 1e-5, torch.Generator().manual_seed(0))
    s = exact_gaussian_std(1.0, 1e-5) * 0.03
    assert entry.noise_std == pytest.approx(s, rel=1e-4) and entry.sensitivity == 0.03
    assert noisy.std().item() == pytest.approx(s, rel=0.02) and noisy.mean().abs() < 0.03 * s
    assert 1.0 - 1e-4 < entry.epsilon <= 1.0 and entry.delta == 1e-5 and entry.neighbours == "replace-one"


def run_json(capsys, *args):
    assert main(["run", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_breast_cancer_run_records_the_release(capsys):
    record = run_json(capsys, "--method", "output_perturbation", "--task", "breast_cancer", "--epsilon", "2",
                      "--epochs", "10", "--batch-size", "50")
    n = record["n_train"]
    assert n == 455 and record["delta"] == pytest.approx(1 / n**2)
    assert 2 - 1e-3 < record["epsilon"] <= 2 and record["epsilon_target"] == 2
    assert record["sampler"] == "permutation" and record["gradient_evaluations"] == 0
    assert record["sample_rate"] == pytest.approx(50 / n)
    assert record["steps"] == 10 * math.ceil(n / 50)  # epochs · batches per pass
    assert record["train_seconds"] is None  # the wall time depends on the data, outside the analysis: not released
    [entry] = record["privacy_ledger"]
    assert record["hyperparameters"]["lr"] is None  # the default step R/(L√T) = 10/√100 = 1
    assert entry["sensitivity"] == pytest.approx(2 * 10 * 1.0 * (10 / math.sqrt(record["steps"])) / 50)
    assert record["noise_multiplier"] == pytest.approx(exact_gaussian_std(2.0, 1 / n**2), rel=1e-4)
    assert entry["noise_std"] == pytest.approx(record["noise_multiplier"] * entry["sensitivity"])
    assert record["epsilon"] == entry["epsilon"] and record["metrics"]["test_accuracy"] > 0.5


def test_digits_one_vs_all_splits_the_budget_over_ten_classifiers(capsys):
    record = run_json(capsys, "--method", "output_perturbation", "--task", "digits", "--epsilon", "3",
                      "--epochs", "2")
    ledger = record["privacy_ledger"]
    n = record["n_train"]
    assert len(ledger) == 10 and all(e["delta"] == pytest.approx(1 / n**2 / 10) for e in ledger)
    assert all(0.3 - 1e-4 < e["epsilon"] <= 0.3 for e in ledger)
    assert record["epsilon"] == pytest.approx(sum(e["epsilon"] for e in ledger)) and record["epsilon"] <= 3
    assert record["noise_multiplier"] == pytest.approx(exact_gaussian_std(0.3, 1 / n**2 / 10), rel=1e-4)


def test_strongly_convex_variant_runs_end_to_end(capsys):
    record = run_json(capsys, "--method", "output_perturbation", "--task", "breast_cancer", "--epsilon", "1",
                      "--set", "variant=strongly_convex", "--set", "regularization=0.001", "--epochs", "3",
                      "--batch-size", "50")
    [entry] = record["privacy_ledger"]
    assert entry["sensitivity"] == pytest.approx(2 * (1 + 0.001 * 10) / (0.001 * 455))
    assert record["epsilon"] <= 1 and record["steps"] == 3 * math.ceil(455 / 50)


def test_a_given_noise_multiplier_is_charged_its_exact_epsilon(capsys):
    """Tuning trials fix σ (tuning_privacy.py); a run given --noise-multiplier reports the ε of that σ."""
    record = run_json(capsys, "--method", "output_perturbation", "--task", "breast_cancer", "--noise-multiplier", "2")
    assert record["noise_multiplier"] == 2 and record["epsilon"] > 1
    assert exact_gaussian_std(record["epsilon"], record["delta"]) == pytest.approx(2, rel=1e-3)


@pytest.mark.parametrize("args, message", [
    (["--noise-multiplier", "2", "--epsilon", "1"], "not allowed with argument --noise-multiplier"),
    (["--sampler", "poisson"], "no --sampler"),
    (["--clip", "1"], "no hyperparameter 'clip'"),
    (["--accountant", "rdp"], "no --accountant"),
    (["--lr", "9"], "lr ≤ 2/β = 8"),
    (["--set", "variant=other"], "variant must be one of"),
])
def test_options_that_do_not_apply_are_refused(refused, args, message):
    assert message in refused("run", "--method", "output_perturbation", "--task", "breast_cancer", *args)
