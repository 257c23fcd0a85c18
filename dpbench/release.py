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
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

import torch

from dpbench import records, rows, store, streams, tracking
from dpbench.engine import RunSpec, UsageError, apply_overrides, check_seed, profile_settings
from dpbench.method import ReleaseMethod
from dpbench.privacy import GaussianReleases, calibrate_noise_multiplier
from dpbench.task import Task

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


def _design(x: torch.Tensor, with_bias: bool) -> torch.Tensor:
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


def resolve_hyperparameters(method: type[ReleaseMethod], task: type[Task], overrides: dict[str, Any],
                            profile: str | None = None):
    """Method defaults < the task's defaults (its epochs and batch size, the same for every method, where the method
    has them: output perturbation's passes and batch) < the task's defaults for this method < the profile < command
    line; returns (hyperparameters, options)."""
    hp = dict(method.defaults)
    options = dict(task.options)
    profiled = profile_settings(task, method.name, profile)
    for source in (task.defaults, task.method_defaults.get(method.name, {}), profiled):
        hp.update({key: value for key, value in source.items() if key in hp})
    options.update({key: value for key, value in profiled.items() if key in options})
    return apply_overrides(hp, task, method.name, overrides, options)


def _refuse_gradient_options(spec: RunSpec, method: type[ReleaseMethod]) -> None:
    name = method.name
    check_seed(spec.seed)
    if spec.neighbouring not in (None, NEIGHBOURS):
        raise UsageError(f"{name}'s analysis holds under {NEIGHBOURS} neighbours only; it takes no "
                         f"--neighbouring {spec.neighbouring}")
    if spec.noise_multiplier is not None and not method.tunable_privately:
        raise UsageError(f"{name} calibrates its noise to --epsilon; it takes no --noise-multiplier")
    if spec.noise_multiplier is not None and not (math.isfinite(spec.noise_multiplier) and spec.noise_multiplier > 0):
        raise UsageError(f"noise multiplier must be a finite number > 0, got {spec.noise_multiplier}")
    if spec.noise_multiplier is not None and spec.epsilon is not None:
        raise UsageError("give either --epsilon or --noise-multiplier, not both")
    if spec.sampler is not None:
        raise UsageError(f"{name} draws no batches from the engine's samplers; it takes no --sampler")
    if spec.accountant != "pld":
        raise UsageError(f"{name} is accounted by its release mechanism (see dpbench/release.py); "
                         f"it takes no --accountant {spec.accountant}")
    if spec.checkpoint_dir:
        raise UsageError(f"{name} does not train under Lightning; it takes no --checkpoint-dir")
    if spec.accelerator != "cpu":
        raise UsageError(f"{name} runs on the CPU (SciPy/PyTorch float64); it takes no --accelerator")
    if spec.epsilon is not None and not (math.isfinite(spec.epsilon) and spec.epsilon > 0):
        raise UsageError(f"epsilon must be a finite number > 0, got {spec.epsilon}")
    if spec.delta is not None and not 0 < spec.delta < 1:
        raise UsageError(f"delta must lie in (0, 1), got {spec.delta}")


def _prepare(spec: RunSpec, method_class: type[ReleaseMethod], task_class: type[Task]):
    """Check ``spec`` and load the data: (method, hyperparameters, task options, task, data, δ, ε)."""
    _refuse_gradient_options(spec, method_class)
    hp, options = resolve_hyperparameters(method_class, task_class, spec.overrides, spec.profile)
    budget = profile_settings(task_class, method_class.name, spec.profile)
    if spec.epsilon is None and spec.noise_multiplier is None and "epsilon" in budget:
        spec = replace(spec, epsilon=budget["epsilon"])
    try:
        method = method_class(hp)
    except ValueError as error:
        raise UsageError(f"{method_class.name}: {error}") from None
    streams.seed_run(spec.seed)
    task = task_class(**options)
    data = task.prepare(spec.seed)
    if data.x_train.is_sparse:
        raise UsageError(f"{method_class.name} solves on dense rows; task {task_class.name}'s are sparse")
    if not isinstance(task.model, torch.nn.Linear) or not hasattr(task, "classes"):
        raise UsageError(f"{method_class.name} trains linear classifiers; task {task_class.name} is not one")
    n = data.n_train
    delta = spec.delta if spec.delta is not None else task_class.defaults.get("delta", 1 / n**2)
    if delta >= 1 / n and not spec.force_delta:
        raise UsageError(f"delta={delta:g} is not below 1/n = {1 / n:g} for n={n}: such a delta allows releasing "
                         f"an example outright; pass --force-delta to run anyway")
    epsilon = None if spec.noise_multiplier is not None else (
        spec.epsilon if spec.epsilon is not None else task_class.defaults.get("epsilon", 1.0))
    if isinstance(method, OutputPerturbationMethod) and method.hp["batch_size"] > n:
        raise UsageError(f"batch size {method.hp['batch_size']} exceeds the {n} training examples")
    return method, hp, options, task, data, delta, epsilon


def _accounting(method: ReleaseMethod) -> tuple[str, str]:
    """(accountant, sampler) as the record names them."""
    if isinstance(method, OutputPerturbationMethod):
        return "gaussian-pld (dp-accounting) + basic composition over classifiers", method.sampler
    return "AMP theorem (Iyengar et al. 2019) + basic composition", "none (full data)"


def describe(spec: RunSpec, method_class: type[ReleaseMethod], task_class: type[Task]) -> dict[str, Any]:
    """The identity fields (``engine.IDENTITY_FIELDS``) a run of ``spec`` would record, without training."""
    method, hp, options, task, data, delta, epsilon = _prepare(spec, method_class, task_class)
    accountant, sampler = _accounting(method)
    return {**records.provenance(task_class, method_class, data, spec.seed, hp | options, spec.overrides),
            "delta": delta, "epsilon_target": epsilon, "neighbouring": NEIGHBOURS, "accountant": accountant,
            "sampler": sampler}


@torch.no_grad()
def _test_metrics(task: Task, x_test: torch.Tensor, y_test: torch.Tensor) -> dict[str, float]:
    sums: dict[str, float] = {}
    for x, y in zip(rows.chunks(x_test, 4096), y_test.split(4096)):
        for name, values in task.per_example_metrics(task(x), y).items():
            sums[name] = sums.get(name, 0.0) + float(values.sum())
    return {f"test_{name}": total / len(y_test) for name, total in sums.items()}


def run(spec: RunSpec, method_class: type[ReleaseMethod], task_class: type[Task]) -> dict[str, Any]:
    """``dpbench run`` for an output- or objective-perturbation method: train, release, record.

    Record fields as for the gradient methods, with these meanings: ``noise_multiplier`` is the noise standard
    deviation over its sensitivity for the main release (output perturbation: s/Δ; AMP: σ1/(2L/n), the linear
    term's); ``sampler`` is ``permutation`` (output perturbation: one random permutation, fixed-size batches,
    no amplification claimed) or ``none (full data)`` (AMP); ``sample_rate`` is b/n or 1; ``steps`` counts
    output perturbation's SGD steps (k passes of ⌈n/b⌉ batches, public) and is None for AMP, whose solver's
    iteration count depends on the data and is covered by no analysis; ``train_seconds`` is None (the wall time
    depends on the data too; a tuning's record leaves it out likewise); ``gradient_evaluations`` is 0, as no noisy
    gradient is released; ``privacy_ledger`` lists every release with its (ε, δ), noise and sensitivity, and
    ``epsilon``/``delta`` are their sums.
    """
    method, hp, options, task, data, delta, epsilon = _prepare(spec, method_class, task_class)
    held_out = None
    if spec.validation is not None:  # a tuning trial trains on the training part only
        data, held_out = spec.validation.split(data)
        task.data = data
    n = data.n_train
    with_bias = task.model.bias is not None
    x = clip_rows(_design(data.x_train, with_bias), method.input_norm, in_place=True)
    labels = data.y_train
    if task.classes == 2:
        targets = labels.double()[:, None]
    else:
        targets = torch.nn.functional.one_hot(labels, task.classes).double()
    try:
        if isinstance(method, OutputPerturbationMethod):
            theta, ledger, steps = output_perturbation(method, x, targets, epsilon, delta, spec.seed,
                                                       spec.noise_multiplier)
            sample_rate = method.hp["batch_size"] / n
            noise_multiplier = ledger[0].noise_std / ledger[0].sensitivity
        else:
            theta, ledger, iterations, calibration = approximate_minima_perturbation(method, x, targets, epsilon,
                                                                                     delta, spec.seed)
            steps = None  # the solver's `iterations` depend on the data, outside AMP's theorem: not released
            sample_rate = 1.0
            noise_multiplier = calibration.sigma_objective / calibration.objective_sensitivity
    except ValueError as error:
        raise UsageError(f"{method_class.name}: {error}") from None
    accountant, sampler = _accounting(method)

    spent_epsilon = sum(entry.epsilon for entry in ledger)
    spent_delta = sum(entry.delta for entry in ledger)
    if (epsilon is not None and spent_epsilon > epsilon * (1 + 1e-9)) or spent_delta > delta * (1 + 1e-9):
        raise RuntimeError(f"spent (ε, δ) = ({spent_epsilon}, {spent_delta}) exceeds the target ({epsilon}, {delta})")
    with torch.no_grad():
        weights = theta.T.to(task.model.weight.dtype)
        if with_bias:
            task.model.weight.copy_(weights[:, :-1])
            task.model.bias.copy_(weights[:, -1])
        else:
            task.model.weight.copy_(weights)
    metrics = _test_metrics(task, data.x_test, data.y_test)
    record = {
        **records.provenance(task_class, method_class, data, spec.seed, hp | options, spec.overrides),
        "private": True,
        "epsilon": spent_epsilon,
        "epsilon_target": epsilon,
        "delta": spent_delta,
        "neighbouring": NEIGHBOURS,
        "noise_multiplier": noise_multiplier,
        "sample_rate": sample_rate,
        "steps": steps,
        "gradient_evaluations": 0,
        "accountant": accountant,
        "sampler": sampler,
        "privacy_ledger": [asdict(entry) for entry in ledger],
        "train_seconds": None,
        "metrics": metrics,
    }
    if held_out is not None:
        record["validation"] = spec.validation.score(task, held_out)
    if spec.tuning is not None:
        record["tuning"] = spec.tuning
    wandb = tracking.wandb_settings(spec.wandb_project, spec.wandb_entity, spec.no_wandb)
    wandb_run = tracking.start_run(wandb, {k: v for k, v in record.items() if k != "metrics"}) if wandb else None
    record["wandb_run"] = wandb_run.path if wandb_run else None
    records.seal(record)
    if wandb_run:
        tracking.finish(wandb_run, record)
    if spec.append_to_store:
        store.append(record, spec.store_path)
    return record
