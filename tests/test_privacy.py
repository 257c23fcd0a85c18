"""The accountant against independent implementations, and calibration."""
import dataclasses
import json
import math

import dp_accounting
import numpy as np
import pytest
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from scipy.fft import irfft, next_fast_len, rfft
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp
from scipy.stats import norm

from dpbench.cli import main
from dpbench.privacy import accounting
from dpbench.privacy.accounting import GaussianReleases, calibrate_noise_multiplier, epsilon

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


@pytest.mark.parametrize("target, releases, sampler, neighbouring", [
    (0.1, 100, "poisson", "replace-one"), (1.0, 25, "poisson", "add-remove"), (8.0, 200, "poisson", "replace-one"),
    (1.0, 40, "shuffle", "replace-one")])
def test_unsampled_calibration_starts_from_the_exact_gaussian_and_finds_the_same_sigma(
        target, releases, sampler, neighbouring, monkeypatch):
    """Full batches (and shuffled epochs) start from the analytic Gaussian; the bisection still decides σ, and it is
    the σ the generic search from σ = 1 finds (within its tolerance), in a fraction of the time."""
    args = (target, 1e-9, 1.0, releases, "pld", sampler, 4 if sampler == "shuffle" else 1, (), neighbouring)
    guess, step = accounting._sigma_guess(target, 1e-9, 1.0, releases, sampler, args[6], neighbouring)
    found = accounting._calibrate(*args)
    assert step == 0.01 and guess * 0.9999 < found < guess * 1.01
    monkeypatch.setattr(accounting, "_sigma_guess", lambda *_: None)
    assert found == pytest.approx(accounting._calibrate(*args), rel=2e-4)
    k = releases if sampler == "poisson" else releases // 4
    sensitivity = 2 if neighbouring == "replace-one" else 1
    # the σ found meets δ for the exact mechanism too (the PLD is pessimistic), and 1% less noise does not
    assert analytic_gaussian_delta(target, sensitivity * math.sqrt(k) / found) <= 1e-9
    assert analytic_gaussian_delta(target, sensitivity * math.sqrt(k) / (0.99 * found)) > 1e-9


@pytest.mark.parametrize("target, sample_rate, releases", [
    (1.0, 256 / 1617, 240), (0.1, 64 / 1617, 1000), (8.0, 1024 / 1617, 40), (0.5, 4096 / 36000, 90),
    (8.0, 64 / 36000, 1680)])  # validation trials of digits and adult; the last is the CLT's worst guess (σ × 1.8)
def test_subsampled_calibration_starts_near_the_answer_and_finds_the_searchs_sigma(
        target, sample_rate, releases, monkeypatch):
    """Poisson-subsampled releases start from the central limit theorem's σ: the σ found is the one the search from
    σ = 1 finds, within its tolerance, and no PLD is composed at less than half of it (the search from σ = 1 composed
    σ = 0 and 1 first: wide PLDs, most of its time)."""
    composed = []

    class Recorded(GaussianReleases):
        def event(self):
            composed.append(self.noise_multiplier)
            return super().event()

    args = (target, 1e-5, sample_rate, releases, "pld", "poisson", 1, (), "replace-one")
    monkeypatch.setattr(accounting, "GaussianReleases", Recorded)
    found = accounting._calibrate(*args)
    assert min(composed) >= found / 2
    composed.clear()
    monkeypatch.setattr(accounting, "_sigma_guess", lambda *_: None)
    assert min(composed + [accounting._calibrate(*args)]) < found / 2
    assert abs(found - accounting._calibrate(*args)) <= 2e-4
    assert epsilon(sample_rate, found, releases, 1e-5, neighbouring="replace-one") <= target


@pytest.mark.parametrize("guess", [(5.0, 0.01), (1e4, 0.2), (1e30, 1e-4)])  # the answer is 18.3: below, far above,
def test_a_wrong_guess_still_calibrates(guess, monkeypatch):                    # and not bracketed in 30 steps
    monkeypatch.setattr(accounting, "_sigma_guess", lambda *_: guess)
    sigma = accounting._calibrate(1.0, 1e-5, 256 / 1617, 240, "pld", "poisson", 1, (), "replace-one")
    assert epsilon(256 / 1617, sigma, 240, 1e-5, neighbouring="replace-one") <= 1.0
    assert epsilon(256 / 1617, 0.999 * sigma, 240, 1e-5, neighbouring="replace-one") > 1.0


def test_a_bracket_not_found_in_thirty_steps_is_none():
    assert accounting._bracket(lambda s: 1.0, 1.0, 0.01) is None  # ε above the target at every σ
    bracket = accounting._bracket(lambda s: 10.0 - s, 1.0, 0.2)  # steps ×1.2, ×1.44, ×2, ×2, ×2
    assert (bracket.endpoint_1, bracket.endpoint_2) == pytest.approx((1.2 * 1.44 * 4, 1.2 * 1.44 * 8))


def test_a_delta_covering_every_participation_is_refused_before_any_search():
    """With 1 − (1 − q)^T ≤ δ every σ > 0 meets any ε: the search walked σ down until memory ran out (3 GB after
    238 s, found by review); it is refused at once."""
    with pytest.raises(ValueError, match="chance that an example is sampled at all"):
        accounting._calibrate(1.0, 0.5, 0.01, 1, "pld", "poisson", 1, (), "add-remove")
    assert accounting._calibrate(1.0, 0.005, 0.01, 1, "pld", "poisson", 1, (), "add-remove") > 0  # δ below 1%


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
    template = accounting.GaussianReleases(0.02 if sampler == "poisson" else 1.0, 1.3, 0, sampler, 50, data_release,
                                        neighbouring)
    log = accounting.epsilon_log(template, 1e-6)
    for count in (1, 49, 50, 51, 500):
        releases = dataclasses.replace(template, releases=count)
        if neighbouring == "add-remove":
            expected = dp_accounting.rdp.RdpAccountant(list(orders)).compose(releases.event()).get_epsilon(1e-6)
        else:
            curve = accounting.rdp_curve(releases.event(), orders, neighbouring)
            expected = dp_accounting.rdp.compute_epsilon(orders, curve, 1e-6)[0]
        assert log(count) == pytest.approx(expected, rel=1e-9), count
    assert accounting.epsilon_log(dataclasses.replace(template, preceded_by=()), 1e-6)(0) == 0.0


# ---- every (sampler, relation, accountant) the CLI accepts, against computations written out here ----------------

def rdp_to_epsilon(orders, rdp, delta):
    """RDP → (ε, δ) by the conversion dp-accounting uses (Canonne et al. 2020, Proposition 12; Asoodeh et al. 2020,
    Eq. 20): min over α of ρ(α) + log(1 − 1/α) − log(δα)/(α − 1)."""
    orders, rdp = np.asarray(orders, dtype=np.float64), np.asarray(rdp, dtype=np.float64)
    return float(np.min(rdp + np.log1p(-1 / orders) - np.log(delta * orders) / (orders - 1)))


def poisson_gaussian_rdp(q, sigma, order):
    """RDP at integer order α of the Poisson-subsampled Gaussian under add/remove (Mironov, Talwar & Zhang 2019,
    the binomial expansion of A_α for integer α): log Σ_k C(α, k)(1 − q)^(α−k) q^k exp((k² − k)/(2σ²)) / (α − 1)."""
    k = np.arange(order + 1)
    terms = (gammaln(order + 1) - gammaln(k + 1) - gammaln(order - k + 1) + (order - k) * np.log1p(-q)
             + k * np.log(q) + (k * k - k) / (2 * sigma**2))
    return logsumexp(terms) / (order - 1)


def numeric_pld_epsilon(q, sigma, count, delta, relation, interval=1e-4):
    """ε at δ of ``count`` compositions of the Poisson-subsampled Gaussian, brute force: the privacy loss
    L = log P(x)/Q(x) on a fine grid of x ~ P, rounded up to multiples of ``interval`` (pessimistic), composed by
    one FFT, δ(ε) = E[(1 − e^(ε − L))₊], solved for ε. Add/remove: both directions, P = (1 − q)N(0, σ²) + qN(1, σ²)
    against Q = N(0, σ²) and back; replace-one: P = (1 − q)N(0, σ²) + qN(1, σ²) against (1 − q)N(0, σ²) + qN(−1, σ²)
    (symmetric: one direction)."""
    edges = np.linspace(-1 - 12 * sigma, 1 + 12 * sigma, 200_001)
    x = (edges[1:] + edges[:-1]) / 2

    def mixture(shift):
        return (1 - q) * np.diff(norm.cdf(edges / sigma)) + q * np.diff(norm.cdf((edges - shift) / sigma))

    def log_ratio(shift):  # log of the mixture's density over N(0, σ²)'s
        return np.logaddexp(np.log1p(-q), np.log(q) + (2 * shift * x - 1) / (2 * sigma**2))

    if relation == "replace-one":
        directions = [(mixture(1.0), log_ratio(1.0) - log_ratio(-1.0))]
    else:
        directions = [(mixture(1.0), log_ratio(1.0)), (np.diff(norm.cdf(edges / sigma)), -log_ratio(1.0))]
    epsilons = []
    for mass, loss in directions:
        index = np.ceil(loss / interval).astype(np.int64)
        low = index.min()
        pmf = np.bincount(index - low, weights=mass)
        size = count * (len(pmf) - 1) + 1
        length = next_fast_len(size, real=True)
        composed = np.clip(irfft(rfft(pmf, length) ** count, length)[:size], 0, None)
        losses = (count * low + np.arange(size)) * interval
        missing = max(0.0, 1 - mass.sum()) * count  # outside the grid: counted as infinite loss

        def delta_at(eps):
            above = losses > eps
            return float(composed[above] @ -np.expm1(eps - losses[above])) + missing

        epsilons.append(brentq(lambda eps: delta_at(eps) - delta, 0, losses[-1]))
    return max(epsilons)


def exact_gaussian_epsilon(mu, delta):
    """ε at δ of the Gaussian mechanism with Δ/σ = μ (Balle & Wang 2018, Theorem 8)."""
    return brentq(lambda eps: analytic_gaussian_delta(eps, mu) - delta, 0, 100)


COMBINATIONS = [(sampler, relation, accountant) for sampler in ("poisson", "shuffle")
                for relation in ("add-remove", "replace-one") for accountant in ("pld", "rdp")]
REFUSED = {("poisson", "replace-one", "rdp"): "no replace-one analysis of Poisson subsampling",
           ("shuffle", "add-remove", "pld"): "replace-one neighbours only",
           ("shuffle", "add-remove", "rdp"): "replace-one neighbours only"}


@pytest.mark.parametrize("sampler, relation, accountant", COMBINATIONS)
def test_every_sampler_relation_and_accountant_the_cli_accepts_matches_an_independent_computation(
        capsys, refused, sampler, relation, accountant):
    """A DP-SGD run calibrated to ε = 1 over 3 epochs of breast_cancer: its σ, q and noisy-gradient count, put
    through a computation written here (not dpbench.privacy.accounting, not dp-accounting's accountants), must give the
    record's ε and at most the target. Shuffled batches: one Gaussian of sensitivity 2C per epoch under replace-one,
    i.e. RDP 3·α·2²/(2σ²) and, exactly, a Gaussian with μ = 2√3/σ; Poisson: Mironov et al.'s integer-order RDP and a
    brute-force PLD. The combinations without an analysis here are refused."""
    args = ["run", "--method", "dpsgd", "--task", "breast_cancer", "--epsilon", "1", "--epochs", "3",
            "--sampler", sampler, "--neighbouring", relation, "--accountant", accountant]
    if (sampler, relation, accountant) in REFUSED:
        assert REFUSED[sampler, relation, accountant] in refused(*args)
        return
    assert main([*args, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["sampler"], record["neighbouring"], record["accountant"]) == (sampler, relation, accountant)
    sigma, q, count, delta = (record["noise_multiplier"], record["sample_rate"], record["gradient_evaluations"],
                              record["delta"])
    orders = np.asarray(dp_accounting.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)
    if sampler == "shuffle" and accountant == "rdp":
        independent, tolerance = rdp_to_epsilon(orders, 3 * orders * 2**2 / (2 * sigma**2), delta), 1e-9
    elif sampler == "shuffle":  # PLD: pessimistic, within its discretization of the exact value
        independent, tolerance = exact_gaussian_epsilon(2 * math.sqrt(3) / sigma, delta), 1e-3
    elif accountant == "rdp":  # integer orders only: the record's fractional orders can only do better, a little
        integers = orders[orders == np.round(orders)].astype(int)
        independent = rdp_to_epsilon(integers, [count * poisson_gaussian_rdp(q, sigma, a) for a in integers], delta)
        tolerance = 0.02
        assert record["epsilon"] <= independent * (1 + 1e-9)
    else:
        independent, tolerance = numeric_pld_epsilon(q, sigma, count, delta, relation), 5e-3
    assert record["epsilon"] == pytest.approx(independent, rel=tolerance)
    assert record["epsilon"] <= 1 and independent <= 1 + tolerance
