"""The privacy of tuning (dpbench/tuning/accounting.py): the distribution of K, per-trial RDP curves under either
relation, the totals of random stopping and adaptive composition against dp-accounting and Papernot & Steinke's
theorem by hand, the per-trial calibration, and the held-out split with its noisy score."""
import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import pld, rdp
from dp_accounting.rdp import rdp_privacy_accountant as rdp_impl

from dpbench.task import TaskData
from dpbench.tasks.linear import Digits
from dpbench.tuning import accounting as tp

# ---- K ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mean", [1.5, 4.0, 8.0, 30.0])
def test_logarithmic_gamma_has_the_mean_dp_accounting_assumes(mean):
    gamma = tp.tnb_gamma(0, mean)
    assert (1 - gamma) / (gamma * math.log(1 / gamma)) == pytest.approx(mean, rel=1e-9)  # Definition 1, η = 0
    assert rdp_impl._truncated_negative_binomial_mean(gamma, 0) == pytest.approx(mean, rel=1e-6)
    assert tp.tnb_gamma(1, mean) == 1 / mean


@pytest.mark.parametrize("distribution, p1", [
    ({"name": "truncated_negative_binomial", "eta": 1, "mean": 4.0}, 0.25),  # γ(1 − γ)^0 with γ = 1/4
    ({"name": "truncated_negative_binomial", "eta": 0, "mean": 4.0}, None),
    ({"name": "poisson", "mean": 4.0}, None)])
def test_k_draws_have_the_distribution_and_depend_only_on_the_seed(distribution, p1):
    draws = np.array([tp.draw_k(distribution, seed) for seed in range(20000)])
    assert draws.mean() == pytest.approx(4.0, rel=0.05)
    if distribution["name"] == "poisson":
        assert (draws == 0).mean() == pytest.approx(math.exp(-4), abs=0.005)
    else:
        assert draws.min() >= 1
        gamma = tp.tnb_gamma(distribution["eta"], 4.0)
        expected = p1 if p1 is not None else (1 - gamma) / math.log(1 / gamma)  # P[K = 1] by hand
        assert (draws == 1).mean() == pytest.approx(expected, abs=0.01)
    assert tp.draw_k(distribution, 7) == tp.draw_k(distribution, 7)


# ---- accounting --------------------------------------------------------------------------------------------------

TRIAL = tp.TrialMechanism(sample_rate=0.05, noise_multiplier=3.0, releases=400)


def hand_repeat_and_select(orders, curve, mean, eta):
    """Papernot & Steinke, Theorem 2: ρ'(λ) = ρ(λ) + (1 + η)(1 − 1/λ̂)ρ(λ̂) + (1 + η)log(1/γ)/λ̂ + log(E[K])/(λ − 1),
    minimised over λ̂, then monotonicity of RDP in λ (a bound at a higher order holds at a lower one)."""
    gamma = tp.tnb_gamma(eta, mean)
    constant = min((1 + eta) * ((1 - 1 / h) * r + math.log(1 / gamma) / h) for h, r in zip(orders, curve))
    bound = np.array([r + constant + math.log(mean) / (a - 1) for a, r in zip(orders, curve)])
    return np.array([bound[orders >= a].min() for a in orders])


@pytest.mark.parametrize("eta", [0, 1])
def test_random_stopping_total_is_theorem_2_on_the_training_curve(eta):
    distribution = {"name": "truncated_negative_binomial", "eta": eta, "mean": 8.0}
    delta = 1e-6
    orders, curve = tp.ORDERS, TRIAL.curve()
    by_hand = rdp.compute_epsilon(orders, hand_repeat_and_select(orders, curve, 8.0, eta), delta)[0]
    assert tp.total_epsilon("random-stopping", TRIAL, distribution, 0, delta) == pytest.approx(by_hand, rel=1e-6)
    # Repeating costs more than one trial, less than 8 adaptively composed ones at this σ.
    one = rdp.compute_epsilon(orders, curve, delta)[0]
    assert one < by_hand < tp.total_epsilon("adaptive", TRIAL, None, 8, delta)


def test_pld_accountant_cannot_do_repeat_and_select_so_rdp_is_used():
    event = dp_accounting.dp_event.RepeatAndSelectDpEvent(TRIAL.event(), 8.0, 1.0)
    assert not pld.PLDAccountant().supports(event)
    assert rdp.RdpAccountant().supports(event)


@pytest.mark.parametrize("mode, distribution", [
    ("random-stopping", {"name": "truncated_negative_binomial", "eta": 0, "mean": 8.0}),
    ("random-stopping", {"name": "poisson", "mean": 8.0}),
    ("adaptive", None)])
def test_per_trial_noise_is_the_smallest_meeting_the_total(mode, distribution):
    sigma = tp.calibrate_trial_noise(mode, 1.0, 1e-6, tp.TrialMechanism(0.05, 1.0, 400), distribution, 8)
    at = lambda s: tp.total_epsilon(mode, tp.TrialMechanism(0.05, s, 400), distribution, 8, 1e-6)
    assert at(sigma) <= 1.0 and at(sigma - 2e-4) > 1.0


@pytest.mark.parametrize("mode, shape", [("random-stopping", 0.0), ("random-stopping", 1.0),
                                         ("random-stopping", math.inf), ("adaptive", None)])
def test_add_remove_totals_are_dp_accountings_own_events(mode, shape):
    """On our own curve, the totals equal what dp-accounting's RDP accountant gives for RepeatAndSelectDpEvent /
    SelfComposedDpEvent of the trial's event."""
    if mode == "adaptive":
        event, distribution = dp_accounting.SelfComposedDpEvent(TRIAL.event(), 8), None
    else:
        event = dp_accounting.dp_event.RepeatAndSelectDpEvent(TRIAL.event(), 8.0, shape)
        distribution = ({"name": "poisson", "mean": 8.0} if shape == math.inf else
                        {"name": "truncated_negative_binomial", "eta": int(shape), "mean": 8.0})
    expected = rdp.RdpAccountant().compose(event).get_epsilon(1e-6)
    assert tp.total_epsilon(mode, TRIAL, distribution, 8, 1e-6) == pytest.approx(expected, rel=1e-12)


def test_replace_one_curve_is_exact_for_full_batches_and_above_the_exact_figures_when_subsampled():
    """q = 1: the Gaussian mechanism of sensitivity 2 (α·2/σ² per release). q < 1: the weak triangle inequality
    of the add/remove curve, which must stay above the add/remove curve and give an ε above the PLD's exact
    replace-one figure for the same mechanism (never an ε smaller than what ran)."""
    full = tp.TrialMechanism(1.0, 4.0, 10, "replace-one")
    np.testing.assert_allclose(full.curve(), 10 * tp.ORDERS * 2 / 16.0)
    add_remove = tp.TrialMechanism(1.0, 2.0, 10).curve()  # Gaussian(σ/2), sensitivity 1: the same mechanism
    np.testing.assert_allclose(full.curve(), add_remove)
    for q, sigma, steps in [(0.05, 3.0, 400), (0.01, 1.2, 2000), (0.2, 8.0, 100)]:
        replaced = tp.TrialMechanism(q, sigma, steps, "replace-one")
        rdp_eps = rdp.compute_epsilon(tp.ORDERS, replaced.curve(), 1e-6)[0]
        assert rdp_eps > rdp.compute_epsilon(tp.ORDERS, tp.TrialMechanism(q, sigma, steps).curve(), 1e-6)[0]
        exact = pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE).compose(
            replaced.event()).get_epsilon(1e-6)
        assert rdp_eps >= exact


def test_output_perturbation_trials_are_k_gaussian_mechanisms():
    trial = tp.TrialMechanism(1.0, 3.0, 7, "replace-one", "output")
    np.testing.assert_allclose(trial.curve(), 7 * tp.ORDERS / 18.0)
    gaussian = rdp.RdpAccountant().compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(3.0), 7))
    assert tp.total_epsilon("adaptive", trial, None, 1, 1e-6) == pytest.approx(gaussian.get_epsilon(1e-6), rel=1e-9)


def test_score_noise_makes_the_trial_cost_its_training_and_sequential_would_cost_more():
    """Parallel composition: the score's RDP α/(2σ_v²) is at most the training's at every order, with equality at
    one (σ_v is the smallest such), so max(training, score) is the training's curve."""
    sigma_v = tp.score_noise_multiplier(TRIAL)
    orders, training = tp.ORDERS, TRIAL.curve()
    score = orders / (2 * sigma_v**2)
    np.testing.assert_allclose(score, orders / (2 * sigma_v**2))  # the Gaussian mechanism, sensitivity 1
    assert np.all(score <= training) and np.max(score / training) == pytest.approx(1.0, rel=1e-6)
    distribution = {"name": "truncated_negative_binomial", "eta": 0, "mean": 8.0}
    parallel = tp.total_epsilon("random-stopping", TRIAL, distribution, 0, 1e-6)
    sequential = rdp.RdpAccountant().compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(
        dp_accounting.ComposedDpEvent([TRIAL.event(), dp_accounting.GaussianDpEvent(sigma_v)]), 8.0, 0.0))
    assert sequential.get_epsilon(1e-6) > parallel * 1.01


@pytest.mark.parametrize("alpha", [2.0, 5.0])
def test_a_random_split_between_two_gaussian_mechanisms_costs_at_most_the_larger(alpha):
    """The parallel-composition argument, numerically: outputs (A, B) = (N(a, s_a²), N(b, s_b²)); the added example
    moves A by 1 (it fell in T, probability 1 − p) or B by 1 (it fell in V). The Rényi divergence of the mixture,
    by quadrature on a grid, is at most max(α/(2s_a²), α/(2s_b²)) in both directions."""
    s_a, s_b, p = 1.5, 0.8, 0.3
    grid = np.linspace(-12, 13, 1001)
    step = grid[1] - grid[0]
    a, b = np.meshgrid(grid, grid, indexing="ij")
    normal = lambda x, mu, s: np.exp(-(x - mu) ** 2 / (2 * s**2)) / (s * math.sqrt(2 * math.pi))
    without = normal(a, 0, s_a) * normal(b, 0, s_b)
    added = (1 - p) * normal(a, 1, s_a) * normal(b, 0, s_b) + p * normal(a, 0, s_a) * normal(b, 1, s_b)
    renyi = lambda f, g: math.log(np.sum(f**alpha * g ** (1 - alpha)) * step**2) / (alpha - 1)
    bound = max(alpha / (2 * s_a**2), alpha / (2 * s_b**2))
    assert renyi(added, without) <= bound and renyi(without, added) <= bound
    assert renyi(added, without) > 0.5 * alpha / (2 * s_a**2)  # not vacuous


# ---- split and score ---------------------------------------------------------------------------------------------

def test_split_is_data_independent_disjoint_and_complete():
    split = tp.ValidationSplit(0.2, seed=3, noise_multiplier=0.0, trial=0)
    x = torch.arange(1000.0).unsqueeze(1)
    data = TaskData(x, torch.zeros(1000, dtype=torch.long), x[:5], torch.zeros(5, dtype=torch.long), "d", "p")
    other = TaskData(-x, torch.ones(1000, dtype=torch.long), x[:5], torch.zeros(5, dtype=torch.long), "d", "p")
    train, (x_v, _, n) = split.split(data)
    train_other, (x_v_other, _, _) = split.split(other)
    assert n == 1000 and torch.equal(x_v_other, -x_v) and torch.equal(train_other.x_train, -train.x_train)
    assert sorted(train.x_train.squeeze(1).tolist() + x_v.squeeze(1).tolist()) == x.squeeze(1).tolist()
    assert 150 < len(x_v) < 250


def test_score_is_the_noisy_count_over_the_expected_size():
    task = Digits()
    task.classes = 3
    task.model = torch.nn.Linear(2, 3)
    with torch.no_grad():
        task.model.weight.copy_(torch.eye(3, 2))
        task.model.bias.zero_()
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 1, 1, 2])  # predictions 0, 1, 0, 1: two correct
    exact = tp.ValidationSplit(0.1, 0, noise_multiplier=0.0, trial=0).score(task, (x, y, 40))
    assert exact == {"accuracy": 0.5}  # σ_v = 0: the validation track's exact score
    scores = [tp.ValidationSplit(0.1, 0, 5.0, trial).score(task, (x, y, 40))["noisy_accuracy"] * 4
              for trial in range(4000)]
    assert np.mean(scores) == pytest.approx(2, abs=0.3) and np.std(scores) == pytest.approx(5.0, rel=0.05)


