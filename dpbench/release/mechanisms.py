"""Release mechanisms for the methods outside the gradient mould: output and objective perturbation.

The division of labour is the same as for the gradient methods: a method (a :class:`OutputPerturbationMethod` or
:class:`ObjectivePerturbationMethod` plugin) does only non-private computation and *declares* the sensitivity or
the constants its privacy rests on; this module clips the inputs, draws every noise vector and charges the
privacy. The reported ε and δ are the sums, by basic composition, of the parts in the run's ``privacy_ledger``:

* ``output`` (bolt-on SGD, Wu et al. 2017): one Gaussian mechanism θ + N(0, s²I) per classifier, with s = σΔ and
  σ the smallest noise multiplier whose ε at δ, computed by ``dp-accounting`` (PLD, which for one Gaussian
  mechanism is Balle & Wang's exact analytic bound), is at most the target; the ledger charges the ε that
  ``dp-accounting`` reports for σ (≤ the target).
* ``objective`` (AMP, Iyengar et al. 2019, Algorithm 1): per classifier the objective-perturbation part (ε1, δ1)
  and the output part (ε2, δ2) of the paper's privacy theorem, with the paper's noise scales σ1 and σ2, except
  that σ2 is computed for the sensitivity 2nγ/Λ instead of the paper's nγ/Λ (see :class:`AMPCalibration`).

Both analyses are for *replace-one* neighbouring datasets of a public size n (as in the papers and the DP-ERM
benchmark), unlike the add/remove-one accounting of the Poisson-sampled gradient methods; every ledger entry
says so. Tasks with K > 2 classes are trained one-vs-all, K binary classifiers each given (ε/K, δ/K), as the
DP-ERM benchmark does (``gridsearch.py``: ``eps/num_classes``, ``delta/num_classes``); every training example
is in all K problems, so the K parts add up.

Inputs are clipped to the method's ``input_norm`` L, x ← x·min(1, L/‖x‖) (the benchmark's ``clip_rows``), so
the logistic loss is L-Lipschitz in the weights. Where the task's model has a bias, it is fitted as the weight of a
constant feature 1 appended to every row before clipping (so the clipped rows, constant feature included, have norm
≤ L and every analysis holds unchanged); the task's ``nn.Linear`` gets the released weights and bias. Test metrics
are computed on the test rows as they are: a positive rescaling of (x, 1) never changes the sign of the score, so
the evaluated classifier is the trained one.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from dpbench.method import ReleaseMethod
from dpbench.privacy import streams
from dpbench.privacy.accounting import GaussianReleases, calibrate_noise_multiplier

NEIGHBOURS = "replace-one"


@dataclass(frozen=True)
class Release:
    """One entry of a run's privacy ledger: a noisy release and the (ε, δ) it is charged."""

    what: str
    epsilon: float
    delta: float
    noise_std: float
    sensitivity: float
    neighbours: str = NEIGHBOURS


def clip_rows(x: torch.Tensor, norm: float, in_place: bool = False) -> torch.Tensor:
    """Each row scaled to L2 norm at most ``norm``: x·min(1, norm/‖x‖) (the DP-ERM benchmark's ``clip_rows``)."""
    factors = torch.clamp(norm / x.norm(dim=1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny), max=1.0)
    return x.mul_(factors) if in_place else x * factors


def design(x: torch.Tensor, with_bias: bool) -> torch.Tensor:
    """The training inputs in float64, with a constant column for the bias (module docstring), written into one new
    tensor (on kddcup99 a converted copy, a concatenated one and a clipped one took 0.4 s a run)."""
    n, features = x.shape
    design = torch.empty(n, features + with_bias, dtype=torch.float64)
    design[:, :features] = x
    if with_bias:
        design[:, features] = 1.0
    return design


@functools.lru_cache(maxsize=64)
def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """Smallest σ (to the bisection tolerance) for which one Gaussian mechanism N(0, σ²Δ²) is (ε, δ)-DP.

    ``calibrate_noise_multiplier`` with sample rate 1 and one release: dp-accounting's PLD of a single Gaussian
    mechanism, i.e. the exact analytic Gaussian mechanism (Balle & Wang 2018, Theorem 8), not the classic
    √(2 ln(1.25/δ))/ε, which holds only for ε < 1.
    """
    return calibrate_noise_multiplier(epsilon, delta, sample_rate=1.0, releases=1)


def gaussian_output(theta: torch.Tensor, sensitivity: float, epsilon: float | None, delta: float,
                    generator: torch.Generator, what: str = "output noise",
                    noise_multiplier: float | None = None) -> tuple[torch.Tensor, Release]:
    """θ + N(0, s²I) with s = σ·Δ calibrated for one Gaussian mechanism at (ε, δ), or for a given σ (a tuning
    trial's); the ledger entry it costs (the ε of σ at δ)."""
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be a finite positive number, got {sensitivity}")
    sigma = gaussian_noise_multiplier(epsilon, delta) if noise_multiplier is None else noise_multiplier
    std = sigma * sensitivity
    noise = torch.randn(theta.shape, generator=generator, dtype=theta.dtype) * std
    spent = GaussianReleases(1.0, sigma, 1).epsilon(delta)
    return theta + noise, Release(what, spent, delta, std, sensitivity)


@dataclass(frozen=True)
class AMPCalibration:
    """Approximate Minima Perturbation's parameters for one classifier (Iyengar et al. 2019, Algorithm 1).

    Lines 1–3 and 6 with the benchmark's parametrization (``approximate_minima_perturbation.py``): ε2 = f_out·ε,
    δ2 = f_out·δ (output part); ε1 = ε − ε2, δ1 = δ − δ2 (objective part); ε3 = f_noise·ε1 (what the linear
    term's noise pays for; ε1 − ε3 pays for the curvature, and must lie in (0, 1));
    Λ = rβ/(ε1 − ε3) (the paper's lower bound, taken with equality);
    σ1 = (2L/n)·(1 + √(2 ln(1/δ1)))/ε3, the noise of the linear term b1ᵀθ, whose data term has sensitivity 2L/n;
    σ2 = Δ2·(1 + √(2 ln(1/δ2)))/ε2, the output noise for the approximation error.

    Δ2 departs from the paper, which takes Δ2 = nγ/Λ: the objective is (Λ/n)-strongly convex, so the approximate
    minimizer lies within nγ/Λ of the exact one. But the composition argument couples neighbouring datasets
    through the same exact minimizer, and each dataset's approximate minimizer may lie nγ/Λ from it on opposite
    sides, so the released points can be 2nγ/Λ apart; with Δ2 = nγ/Λ the argument only gives about ε1 + 2ε2.
    This module takes Δ2 = 2nγ/Λ. With the default γ = 1/n² the output noise is ~1e-3 per coordinate either way.

    The output part is a plain Gaussian mechanism, so it is charged exactly: ``epsilon_out_spent`` is
    dp-accounting's ε at δ2 for the noise multiplier σ2/Δ2 (Balle & Wang's analytic bound). It is below ε2 for the
    usual parameters; where the paper's tail-bound formula fails to give (ε2, δ2) (ε2 ≳ 10) the split is refused.
    The objective part is charged (ε1, δ1) as the paper's theorem states. Its proof (Kifer et al. 2012, Theorem 2,
    which AMP's Theorem 1 follows) needs b1's privacy loss, N(μ²/2, μ²) with μ = (2L/n)/σ1, to stay under ε3 but
    with probability δ1: a tail bound, stricter than (ε3, δ1)-DP of b1 as a Gaussian mechanism. The paper's σ1
    gives it only while μ ≲ 2; the split is refused where the exact tail P[loss > ε3] exceeds δ1 (breast_cancer,
    ε3/ε1 = 0.99: accepted up to ε = 18, refused from 18.5; at ε = 40 the tail is 4.0e-3 against δ1 = 4.8e-6).
    """

    epsilon_objective: float  # ε1
    epsilon_noise: float  # ε3
    epsilon_out: float  # ε2
    delta_objective: float  # δ1
    delta_out: float  # δ2
    regularization: float  # Λ
    objective_sensitivity: float  # 2L/n
    sigma_objective: float  # σ1
    out_sensitivity: float  # Δ2 = 2nγ/Λ
    sigma_out: float  # σ2
    epsilon_out_spent: float  # exact ε of the output Gaussian mechanism at δ2, ≤ ε2
    gamma: float  # γ

    @classmethod
    def from_paper(cls, epsilon: float, delta: float, n: int, lipschitz: float, smoothness: float,
                   hessian_rank: int, noise_fraction: float, out_fraction: float, gamma: float) -> AMPCalibration:
        epsilon_out, delta_out = out_fraction * epsilon, out_fraction * delta
        epsilon_objective, delta_objective = epsilon - epsilon_out, delta - delta_out
        epsilon_noise = noise_fraction * epsilon_objective
        curvature = epsilon_objective - epsilon_noise
        if not 0 < curvature < 1:
            raise ValueError(f"AMP needs 0 < ε1 − ε3 < 1; the split gives ε1 − ε3 = {curvature:g} at ε = {epsilon:g} "
                             f"(raise the noise fraction ε3/ε1)")
        regularization = hessian_rank * smoothness / curvature
        objective_sensitivity = 2 * lipschitz / n
        sigma_objective = objective_sensitivity * (1 + math.sqrt(2 * math.log(1 / delta_objective))) / epsilon_noise
        mu = objective_sensitivity / sigma_objective  # the privacy loss of b1 is N(μ²/2, μ²)
        tail = 0.5 * math.erfc((epsilon_noise / mu - mu / 2) / math.sqrt(2))  # P[loss > ε3]
        if tail > delta_objective * (1 + 1e-9):
            raise ValueError(f"the paper's objective noise b1 does not keep its privacy loss under ε3 = "
                             f"{epsilon_noise:g} but with probability {tail:.3g} > δ1 = {delta_objective:g}; lower "
                             f"ε or the noise fraction")
        out_sensitivity = 2 * n * gamma / regularization
        sigma_out = out_sensitivity * (1 + math.sqrt(2 * math.log(1 / delta_out))) / epsilon_out
        epsilon_out_spent = GaussianReleases(1.0, sigma_out / out_sensitivity, 1).epsilon(delta_out)
        if epsilon_out_spent > epsilon_out * (1 + 1e-9):
            raise ValueError(f"the paper's output noise is not ({epsilon_out:g}, {delta_out:g})-DP (exact ε "
                             f"{epsilon_out_spent:g}); lower the output fraction")
        return cls(epsilon_objective, epsilon_noise, epsilon_out, delta_objective, delta_out, regularization,
                   objective_sensitivity, sigma_objective, out_sensitivity, sigma_out, epsilon_out_spent, gamma)


class OutputPerturbationMethod(ReleaseMethod):
    """Contract of an output-perturbation method: non-private training with a declared L2 sensitivity.

    ``fit(x, targets, generator)`` trains K binary classifiers at once (rows of ``x`` have norm ≤ ``input_norm``;
    ``targets`` is n×K in {0, 1}) and returns the p×K weights and the number of parameter updates; its
    randomness must come from ``generator``. ``sensitivity(n)`` bounds ‖fit(D) − fit(D')‖ for each column over
    replace-one neighbours D, D' of size n, for every draw of that randomness.
    """

    sampler: ClassVar[str]
    #: One Gaussian mechanism per classifier: its RDP curve is known, so ``dpbench tune`` can charge it.
    tunable_privately: ClassVar[bool] = True

    @property
    def input_norm(self) -> float:
        return self.hp["input_norm"]

    def sensitivity(self, n: int) -> float:
        raise NotImplementedError

    def fit(self, x: torch.Tensor, targets: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        raise NotImplementedError


class ObjectivePerturbationMethod(ReleaseMethod):
    """Contract of an AMP method: the constants of the paper's theorem and a solver for the perturbed objective.

    L_priv(θ) = (1/n) Σ_i ℓ(θ; x_i, y_i) + (Λ/2n)‖θ‖² + bᵀθ (Iyengar et al. 2019, Algorithm 1, line 4), for one
    binary classifier. The method declares the loss's Lipschitz constant L (``input_norm``: rows are clipped to
    it), an upper bound β on its smoothness, r (``hessian_rank``: 2 for a generalized linear model, whose ∇²ℓ
    has rank 1, as the benchmark sets it), its budget split and γ;
    ``objective_gradient`` computes ∇L_priv and ``solve`` returns θ with ‖∇L_priv(θ)‖ ≤ γ and its iteration count
    (data-dependent: never released in a record).
    The release module draws b, checks the gradient norm of the solver's answer and adds the output noise.
    """

    hessian_rank: ClassVar[int]
    tunable_privately: ClassVar[bool] = False
    untunable_reason: ClassVar[str] = (
        "AMP's privacy is an (ε, δ) theorem for objective perturbation (Iyengar et al. 2019, Theorem 1), with no "
        "Rényi-DP curve: random stopping (Papernot & Steinke 2022) and adaptive composition, as dpbench tune "
        "accounts them, need one; only --mode oracle (not private) can tune it")

    @property
    def input_norm(self) -> float:
        return self.hp["input_norm"]

    @property
    def smoothness(self) -> float:
        raise NotImplementedError

    def budget_fractions(self, epsilon: float) -> tuple[float, float]:
        """(ε3/ε1, ε2/ε) for one classifier's budget ε; the same fraction of δ goes to the output part."""
        raise NotImplementedError

    def gamma(self, n: int) -> float:
        raise NotImplementedError

    def objective_gradient(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, regularization: float,
                           linear_term: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def solve(self, x: torch.Tensor, y: torch.Tensor, regularization: float, linear_term: torch.Tensor,
              gamma: float) -> tuple[torch.Tensor, int]:
        raise NotImplementedError


def output_perturbation(method: OutputPerturbationMethod, x: torch.Tensor, targets: torch.Tensor,
                        epsilon: float | None, delta: float, seed: int,
                        noise_multiplier: float | None = None) -> tuple[torch.Tensor, list[Release], int]:
    """Train K one-vs-all classifiers non-privately, then one Gaussian mechanism per classifier at (ε/K, δ/K) (or
    of noise multiplier σ, given). The permutation and the noise come from the seed's ``release-permutation`` and
    ``output-noise`` streams."""
    classes = targets.shape[1]
    theta, updates = method.fit(x, targets, streams.generator(seed, "release-permutation"))
    sensitivity = method.sensitivity(len(x))
    noise = streams.generator(seed, "output-noise")
    columns, ledger = [], []
    for k in range(classes):
        what = "output noise" if classes == 1 else f"output noise, classifier {k} (one-vs-all)"
        column, entry = gaussian_output(theta[:, k], sensitivity, None if epsilon is None else epsilon / classes,
                                        delta / classes, noise, what, noise_multiplier)
        columns.append(column)
        ledger.append(entry)
    return torch.stack(columns, dim=1), ledger, updates


def approximate_minima_perturbation(method: ObjectivePerturbationMethod, x: torch.Tensor, targets: torch.Tensor,
                                    epsilon: float, delta: float, seed: int
                                    ) -> tuple[torch.Tensor, list[Release], int, AMPCalibration]:
    """Algorithm 1 of Iyengar et al. (2019) for each of K one-vs-all classifiers at (ε/K, δ/K); b1 and b2 come from
    the seed's ``objective-noise`` and ``output-noise`` streams."""
    n, p = x.shape
    classes = targets.shape[1]
    epsilon_k, delta_k = epsilon / classes, delta / classes
    noise_fraction, out_fraction = method.budget_fractions(epsilon_k)
    calibration = AMPCalibration.from_paper(epsilon_k, delta_k, n, method.input_norm, method.smoothness,
                                            method.hessian_rank, noise_fraction, out_fraction, method.gamma(n))
    objective_noise, output_noise = streams.generator(seed, "objective-noise"), streams.generator(seed, "output-noise")
    columns, ledger, iterations = [], [], 0
    for k in range(classes):
        suffix = "" if classes == 1 else f", classifier {k} (one-vs-all)"
        linear_term = calibration.sigma_objective * torch.randn(p, generator=objective_noise, dtype=x.dtype)
        theta, steps = method.solve(x, targets[:, k], calibration.regularization, linear_term, calibration.gamma)
        residual = float(method.objective_gradient(theta, x, targets[:, k], calibration.regularization,
                                                   linear_term).norm())
        if not residual <= calibration.gamma:
            raise RuntimeError(f"{method.name}: the solver stopped at gradient norm {residual:.3g} > γ = "
                               f"{calibration.gamma:.3g}; the output noise would not cover the error")
        noise = calibration.sigma_out * torch.randn(p, generator=output_noise, dtype=x.dtype)
        columns.append(theta + noise)
        iterations += steps
        ledger += [
            Release("objective perturbation b1" + suffix, calibration.epsilon_objective, calibration.delta_objective,
                    calibration.sigma_objective, calibration.objective_sensitivity),
            Release("output noise b2" + suffix, calibration.epsilon_out_spent, calibration.delta_out,
                    calibration.sigma_out, calibration.out_sensitivity),
        ]
    return torch.stack(columns, dim=1), ledger, iterations, calibration
