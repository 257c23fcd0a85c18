"""The accountant against independent implementations, and calibration."""
import dataclasses
import json
import math

import dp_accounting
import numpy as np
import pytest
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from scipy.stats import norm

from dpbench import privacy
from dpbench.cli import main
from dpbench.privacy import GaussianReleases, calibrate_noise_multiplier, epsilon

GRID = [(0.004, 1.1, 15000), (0.01, 0.8, 1000), (0.1, 2.0, 500), (0.001, 0.6, 10000), (0.05, 1.0, 200), (1.0, 5.0, 100)]
ORDERS = np.concatenate([np.linspace(1.01, 8, 100), np.arange(8, 256, 0.5)])


@pytest.mark.parametrize("q, sigma, steps", GRID)
def test_rdp_matches_opacus_and_pld_is_tighter(q, sigma, steps):
    opacus_eps, _ = get_privacy_spent(orders=ORDERS, rdp=compute_rdp(q=q, noise_multiplier=sigma, steps=steps,
                                                                    orders=ORDERS), delta=1e-5)
    rdp_eps = epsilon(q, sigma, steps, 1e-5, "rdp")
    pld_eps = epsilon(q, sigma, steps, 1e-5, "pld")
    assert rdp_eps == pytest.approx(opacus_eps, rel=0.01)
    # PLD accounting is tight; RDP's conversion to (ε, δ) is an upper bound, loose by at most ~30% here.
    assert 0.7 * opacus_eps < pld_eps <= opacus_eps * 1.001


def analytic_gaussian_delta(eps, sensitivity_over_sigma):
    """Exact δ(ε) of a Gaussian mechanism (Balle & Wang 2018, Theorem 8)."""
    mu = sensitivity_over_sigma
    return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)


@pytest.mark.parametrize("sigma, steps", [(5.0, 100), (20.0, 50), (2.0, 3)])
def test_full_batch_matches_the_exact_gaussian_mechanism(sigma, steps):
    # T full-batch releases at noise multiplier σ compose to one Gaussian mechanism with Δ/σ = √T / σ.
    eps = epsilon(1.0, sigma, steps, 1e-6, "pld")
    assert analytic_gaussian_delta(eps, math.sqrt(steps) / sigma) == pytest.approx(1e-6, rel=0.02)


def test_shuffled_batches_are_charged_a_gaussian_per_epoch_with_double_sensitivity():
    """Under replace-one neighbours (the only relation for fixed-size batches) the sum moves by up to 2C."""
    sigma, per_epoch, epochs = 4.0, 10, 3
    releases = GaussianReleases(0.1, sigma, per_epoch * epochs - 4, "shuffle", per_epoch,
                                neighbouring="replace-one")  # 3 epochs begun
    eps = releases.epsilon(1e-6)
    assert analytic_gaussian_delta(eps, 2 * math.sqrt(epochs) / sigma) == pytest.approx(1e-6, rel=0.02)
    # ... and never reported as cheap as the same steps with Poisson sampling.
    assert eps > GaussianReleases(0.1, sigma, per_epoch * epochs - 4, "poisson").epsilon(1e-6)
    with pytest.raises(ValueError, match="replace-one neighbours only"):
        GaussianReleases(0.1, sigma, 10, "shuffle", per_epoch).epsilon(1e-6)


@pytest.mark.parametrize("target", [0.1, 1.0, 8.0])
def test_calibration_meets_the_target_tightly(target):
    sigma = calibrate_noise_multiplier(target, 1e-5, 0.01, 2000)
    assert epsilon(0.01, sigma, 2000, 1e-5) <= target
    assert epsilon(0.01, sigma * 0.99, 2000, 1e-5) > target


def test_no_noise_is_infinite_epsilon():
    assert GaussianReleases(0.1, 0.0, 10).epsilon(1e-5) == math.inf


def test_privacy_command_agrees_with_dp_accounting(capsys):
    assert main(["privacy", "--sample-rate", "0.004", "--noise-multiplier", "1.1", "--steps", "15000",
                 "--delta", "1e-5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.004, dp_accounting.GaussianDpEvent(1.1)), 15000)
    direct = dp_accounting.pld.PLDAccountant().compose(event).get_epsilon(1e-5)
    assert out["epsilon"] == pytest.approx(direct, rel=0.01)
    assert out["noise_multiplier"] == 1.1

    assert main(["privacy", "--sample-rate", "0.004", "--epsilon", "2", "--steps", "15000",
                 "--delta", "1e-5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.004, dp_accounting.GaussianDpEvent(out["noise_multiplier"])), 15000)
    assert dp_accounting.pld.PLDAccountant().compose(event).get_epsilon(1e-5) == pytest.approx(2.0, rel=0.01)
    assert out["epsilon"] <= 2.0


@pytest.mark.parametrize("args", [
    ["--sample-rate", "0", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"],
    ["--sample-rate", "0.1", "--epsilon", "-1", "--steps", "10", "--delta", "1e-5"],
    ["--sample-rate", "0.1", "--epsilon", "nan", "--steps", "10", "--delta", "1e-5"],
    ["--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "1"],
])
def test_privacy_command_refuses_bad_input(args, capsys):
    assert main(["privacy", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpbench: error:") and err.count("\n") == 1


def test_data_releases_are_composed_with_training_and_leave_it_the_rest_of_the_budget():
    pca = dp_accounting.GaussianDpEvent(7.0)
    q, steps, delta = 0.01, 500, 1e-5
    sigma_alone = calibrate_noise_multiplier(1.0, delta, q, steps)
    sigma_after_pca = calibrate_noise_multiplier(1.0, delta, q, steps, preceded_by=(pca,))
    assert sigma_after_pca > sigma_alone
    training = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma_after_pca)), steps)
    independent = dp_accounting.pld.PLDAccountant().compose(pca).compose(training).get_epsilon(delta)
    assert GaussianReleases(q, sigma_after_pca, steps, preceded_by=(pca,)).epsilon(delta) == pytest.approx(independent)
    assert 0.99 < independent <= 1.0
    with pytest.raises(ValueError, match="data releases alone spend"):
        calibrate_noise_multiplier(1.0, delta, q, steps, preceded_by=(dp_accounting.GaussianDpEvent(1.0),))


@pytest.mark.parametrize("sampler, neighbouring, preceded", [("poisson", "add-remove", False),
                                                             ("poisson", "replace-one", False),
                                                             ("poisson", "add-remove", True),
                                                             ("shuffle", "replace-one", False)])
def test_the_per_epoch_log_composes_incrementally_to_the_whole_runs_rdp_figure(sampler, neighbouring, preceded):
    """The training log's ε after k releases, from curves computed once, equals the RDP ε of the whole k-release
    mechanism computed from scratch (dp-accounting's RDP accountant; under replace-one through rdp_curve)."""
    orders = np.asarray(dp_accounting.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)
    data_release = (dp_accounting.GaussianDpEvent(30.0),) if preceded else ()
    template = privacy.GaussianReleases(0.02 if sampler == "poisson" else 1.0, 1.3, 0, sampler, 50, data_release,
                                        neighbouring)
    log = privacy.epsilon_log(template, 1e-6)
    for count in (1, 49, 50, 51, 500):
        releases = dataclasses.replace(template, releases=count)
        if neighbouring == "add-remove":
            expected = dp_accounting.rdp.RdpAccountant(list(orders)).compose(releases.event()).get_epsilon(1e-6)
        else:
            curve = privacy.rdp_curve(releases.event(), orders, neighbouring)
            expected = dp_accounting.rdp.compute_epsilon(orders, curve, 1e-6)[0]
        assert log(count) == pytest.approx(expected, rel=1e-9), count
    assert privacy.epsilon_log(dataclasses.replace(template, preceded_by=()), 1e-6)(0) == 0.0
