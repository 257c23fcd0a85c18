"""The privacy of hyperparameter tuning: the distribution of K, a trial's mechanism and its RDP curve, the totals of
random stopping and adaptive composition, the per-trial calibration, and the held-out split with its noisy score.

The per-trial mechanism (private modes). Before training, the training set is split by a fixed,
data-independent rule: each example goes to the validation part V with probability ``fraction``, by a coin from the
``tuning-split`` stream of the study's split seed (the coins depend on nothing but that seed and the example's
position; the seed may be public: the bound below holds for every value of the coins). A trial trains on the
rest, T, exactly like ``dpbench run`` (gradient methods: Poisson sampling of T with rate q = B/|T|, clipping,
Gaussian noise σ; output perturbation: one Gaussian mechanism of noise multiplier σ per classifier), then
releases its model and the noisy score (#correct predictions on V + N(0, σ_v²)) / (fraction · n), with n the size
of the whole training set. One example changes #correct by at most 1 (added, removed or replaced):
the score is a Gaussian mechanism of sensitivity 1 and noise multiplier σ_v.

How training and score compose: in *parallel*, since they read disjoint parts of the data. Under add/remove-one
neighbours D' = D ∪ {z}, every other example keeps its coin, and z lands in V or in T; under replace-one, z and its
replacement sit at the same position and share its coin. If z ∈ T, only the training differs and the score is
post-processing of the model with V fixed; if z ∈ V, only the score differs (for any model). The output
distribution on D' is a mixture over z's coin of these two cases, and the Rényi divergence of order α is
quasi-convex in a mixture, so a trial is (α, max(ρ_train(α), ρ_score(α)))-RDP at every α. σ_v is the smallest noise
with ρ_score(α) = α/(2σ_v²) ≤ ρ_train(α) at every order, so the per-trial RDP curve is the training's. Sizes
(n, |T|, |V|) are treated as public, as n is throughout dpbench (q = B/n).

The training's RDP curve under the tuning's neighbouring relation:

* add/remove-one: dp-accounting's RDP of ``SelfComposed(PoissonSampled(q, Gaussian(σ)), T)`` (Mironov et al. 2019);
* replace-one, q = 1: the Gaussian mechanism of sensitivity 2, α·2/σ², exactly;
* replace-one, q < 1: dp-accounting has no replace-one RDP of Poisson subsampling, so the curve is bounded with
  the weak triangle inequality of Rényi divergence (Mironov 2017, Proposition 11): replacing z by z' is removing z
  then adding z', so ρ_rep(α) ≤ (α − ½)/(α − 1)·ρ(2α) + ρ(2α − 1), where ρ is the add/remove curve (valid in both
  directions). It is looser than the exact PLD figure a single run reports under replace-one, never smaller
  (tests/test_tuning_privacy.py compares them);
* correlated noise on the cyclic sampler's batches (replace-one only, as a single run; no amplification):
  banded, one Gaussian of multiplier σ/(√k·‖c‖) and sensitivity 2, α·2/(σ/(√k·‖c‖))², exactly; tree aggregation,
  dp-accounting's RDP of one ``SingleEpochTreeAggregationDpEvent`` per epoch under ``REPLACE_SPECIAL`` at σ/2
  (:func:`dpbench.privacy.accounting.rdp_curve`);
* output perturbation: K classifiers, each a Gaussian mechanism θ + N(0, σ²Δ²) whose Δ is already the replace-one
  sensitivity: K·α/(2σ²).

Totals, from the curve: random stopping (Papernot & Steinke, "Hyperparameter Tuning with Rényi Differential
Privacy", ICLR 2022, Theorems 2 and 6) through dp-accounting's ``_compute_rdp_repeat_and_select`` — the function
its RDP accountant applies to a ``RepeatAndSelectDpEvent``, used here on our own curve so that the replace-one
bound can enter it — and adaptive composition (N times the curve); ε from dp-accounting's ``compute_epsilon``.
For add/remove gradient trials this is exactly dp-accounting's ``RepeatAndSelectDpEvent`` / ``SelfComposedDpEvent``
(a test checks it).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import dp_accounting
import numpy as np
import torch
from dp_accounting import rdp
from dp_accounting.rdp import rdp_privacy_accountant

from dpbench.data import rows
from dpbench.privacy import cache, correlated, streams
from dpbench.privacy.accounting import GaussianReleases, rdp_curve
from dpbench.task import Task, TaskData

ORDERS = np.asarray(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)


# ---- the distribution of K (Papernot & Steinke, Definition 1 and Theorem 6) ------------------------------------

def k_distribution(name: str, eta: int, mean: float) -> dict[str, Any]:
    if name == "poisson":
        return {"name": "poisson", "mean": float(mean)}
    return {"name": "truncated_negative_binomial", "eta": eta, "mean": float(mean)}


def k_shape(distribution: dict[str, Any]) -> float:
    """dp-accounting's ``shape`` of repeat-and-select: η, or ∞ for Poisson."""
    return math.inf if distribution["name"] == "poisson" else float(distribution["eta"])


def tnb_gamma(eta: int, mean: float) -> float:
    """γ of the truncated negative binomial with η ∈ {0, 1} and the given mean (Definition 1):
    η = 1: mean 1/γ; η = 0: mean (1 − γ)/(γ·log(1/γ)), solved by bisection (decreasing in γ)."""
    if eta == 1:
        return 1 / mean
    if mean == 1:
        return 1.0
    low, high = 1e-300, 1.0
    for _ in range(200):
        gamma = math.sqrt(low * high) if high / low > 4 else (low + high) / 2
        if (1 - gamma) / (gamma * math.log(1 / gamma)) > mean:
            low = gamma
        else:
            high = gamma
    return high


def draw_k(distribution: dict[str, Any], secret: int) -> int:
    """K from its distribution, on the ``tuning-k`` stream of the study's secret
    (:func:`dpbench.privacy.streams.secret_seed`: never from the data, nor from anything released; Papernot & Steinke's
    bound holds only while K is hidden)."""
    rng = streams.numpy_generator(secret, "tuning-k")
    mean = distribution["mean"]
    if distribution["name"] == "poisson":
        return int(rng.poisson(mean))
    gamma = tnb_gamma(distribution["eta"], mean)
    if gamma >= 1:
        return 1
    return int(rng.geometric(gamma) if distribution["eta"] == 1 else rng.logseries(1 - gamma))


# ---- a trial's mechanism and its RDP curve -----------------------------------------------------------------------

@dataclass(frozen=True)
class TrialMechanism:
    """What one trial runs. ``kind`` "gradient": ``releases`` Gaussian gradient releases of noise multiplier σ on T,
    σ being the combined multiplier of the gradient and the extra releases on its batch where the method makes any
    (a count: ``dpbench.privacy.accounting.combined_noise_multiplier``, one Gaussian exactly); their batches
    Poisson-subsampled at rate q (``sampler`` "poisson"), or the cyclic sampler's fixed partition of T into
    ``releases_per_epoch`` batches with correlated noise (``bands`` > 0: banded; ``tree``: tree aggregation restarted
    every epoch; :mod:`dpbench.privacy.correlated`). "output": ``releases`` Gaussian output mechanisms (one per
    classifier) of noise multiplier σ."""

    sample_rate: float
    noise_multiplier: float
    releases: int
    neighbouring: str = "add-remove"
    kind: str = "gradient"
    sampler: str = "poisson"
    releases_per_epoch: int = 1
    bands: int = 0
    tree: bool = False

    def event(self) -> dp_accounting.DpEvent:
        """The trial's event as dp-accounting would take it under add/remove neighbours (gradient trials)."""
        if self.sampler == correlated.SAMPLER:
            return GaussianReleases(self.sample_rate, self.noise_multiplier, self.releases, self.sampler,
                                    self.releases_per_epoch, (), self.neighbouring, self.bands, self.tree).event()
        once = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.kind == "gradient" and self.sample_rate < 1:
            once = dp_accounting.PoissonSampledDpEvent(self.sample_rate, once)
        return dp_accounting.SelfComposedDpEvent(once, self.releases)

    def curve(self, orders: np.ndarray = ORDERS) -> np.ndarray:
        """The trial's RDP at ``orders`` under its relation (module docstring); at :data:`ORDERS` computed once per
        process (read-only): a cell's studies plan, score and release the same trial mechanism."""
        return _curve(self) if orders is ORDERS else self._curve(orders)

    def _curve(self, orders: np.ndarray) -> np.ndarray:
        if self.noise_multiplier == 0:
            return np.full_like(orders, np.inf)
        if self.kind == "output":
            return self.releases * orders / (2 * self.noise_multiplier**2)
        if self.neighbouring == "replace-one" and self.sampler == "poisson" and self.sample_rate >= 1:
            return self.releases * orders * 2 / self.noise_multiplier**2  # Gaussian of sensitivity 2, exactly
        event = self.event()
        if isinstance(event, dp_accounting.GaussianDpEvent):  # banded: one Gaussian of multiplier σ/Δ, exactly
            sensitivity = 2 if self.neighbouring == "replace-one" else 1
            return orders * sensitivity**2 / (2 * event.noise_multiplier**2)
        return rdp_curve(event, orders, self.neighbouring)

    def description(self) -> str:
        if self.kind == "output":
            return (f"{self.releases} Gaussian output mechanism(s) of noise multiplier noise_multiplier (replace-one "
                    f"sensitivity); training and score in parallel (disjoint data)")
        if self.tree:
            return ("SelfComposed(SingleEpochTreeAggregation(noise_multiplier, P), epochs) with P = "
                    "gradient_evaluations / epochs cyclic batches, replace-one (REPLACE_SPECIAL); training and score "
                    "in parallel (disjoint data)")
        if self.bands:
            return (f"Gaussian(noise_multiplier / (sqrt(epochs) * column norm of the {self.bands}-banded strategy)), "
                    f"sensitivity 2 (replace-one), cyclic batches, no amplification; training and score in parallel "
                    f"(disjoint data)")
        relation = ("" if self.neighbouring == "add-remove" else
                    ", replace-one by the weak triangle inequality of the add/remove curve")
        return ("SelfComposed(PoissonSampled(sample_rate, Gaussian(noise_multiplier)), gradient_evaluations)"
                f"{relation}, noise_multiplier combining the gradient's and any count's (combined_noise_multiplier); "
                f"training and score in parallel (disjoint data)")


@functools.lru_cache(maxsize=256)
def _curve(trial: TrialMechanism) -> np.ndarray:
    curve = trial._curve(ORDERS)
    curve.setflags(write=False)
    return curve


def score_noise_multiplier(trial: TrialMechanism) -> float:
    """σ_v: the smallest noise on the count (sensitivity 1) whose RDP α/(2σ_v²) is at most the training's at every
    order, so that the trial's parallel composition max(ρ_train, ρ_score) is ρ_train."""
    return math.sqrt(float(np.max(ORDERS / (2 * trial.curve())))) * (1 + 1e-9)


def total_curve(mode: str, trial: TrialMechanism, distribution: dict[str, Any] | None, trials: int) -> np.ndarray:
    """The whole tuning's RDP: repeat-and-select (random-stopping) or N-fold adaptive composition."""
    if mode == "random-stopping":
        return np.asarray(rdp_privacy_accountant._compute_rdp_repeat_and_select(
            ORDERS, trial.curve(), distribution["mean"], k_shape(distribution)))
    return trials * trial.curve()


def total_epsilon(mode: str, trial: TrialMechanism, distribution: dict[str, Any] | None, trials: int,
                  delta: float) -> float:
    return float(rdp.compute_epsilon(ORDERS, total_curve(mode, trial, distribution, trials), delta)[0])


def trial_epsilon(trial: TrialMechanism, delta: float) -> float:
    """One trial's ε under the tuning's accountant (RDP), as the released record states it."""
    return float(rdp.compute_epsilon(ORDERS, trial.curve(), delta)[0])


def calibrate_trial_noise(mode: str, epsilon: float, delta: float, trial: TrialMechanism,
                          distribution: dict[str, Any] | None, trials: int, tolerance: float = 1e-4) -> float:
    """The smallest per-trial σ (to ``tolerance``) whose total ε over the whole tuning is ≤ ``epsilon``: the total
    decreases in σ, so bisection between a σ that is too small and one that meets the target. Kept on disk
    (:mod:`dpbench.privacy.cache`, a pure function of its arguments): a sweep plans every cell's tuning before it runs
    any."""
    spent = lambda sigma: total_epsilon(mode, replace(trial, noise_multiplier=sigma), distribution, trials, delta)

    def compute() -> float:
        low, high = 0.0, 1.0
        while spent(high) > epsilon:
            low, high = high, 2 * high
            if high > 1e6:
                return math.inf
        while high - low > tolerance:
            middle = (low + high) / 2
            low, high = (low, middle) if spent(middle) <= epsilon else (middle, high)
        return high

    key = (mode, epsilon, delta, trial, sorted((distribution or {}).items()), trials, tolerance)
    sigma = cache.memoized("trial-calibration", key, compute)
    if math.isinf(sigma):
        raise ValueError(f"no noise multiplier below 1e6 meets ε = {epsilon:g} for this tuning")
    return sigma


# ---- the validation split and the noisy score ------------------------------------------------------------------

_SPLITS: dict = {}  # the last split made (ValidationSplit.split)


@dataclass(frozen=True)
class ValidationSplit:
    """Hold out a fixed, data-independent part of the training data and score a trained model on it (see the
    module docstring): passed to the engine as ``RunSpec.validation``. ``noise_multiplier`` 0 scores exactly (the
    leaderboard's validation track, whose selection is not charged)."""

    fraction: float
    seed: int  # whose ``score-noise`` stream noises the score (a study's secret) and, without split_seed, the coins
    noise_multiplier: float  # σ_v, the standard deviation of the noise on the count of correct predictions
    trial: int  # the trial's number: its score noise is stream ``score-noise`` of ``seed`` at this index
    purpose: str = "tuning-split"  # the stream of the coins
    split_seed: int | None = None  # whose stream the coins come from (None: the tuning seed); studies sharing it
    # hold out the same examples (the leaderboard's tuning seeds, so that their trials train as one batch)

    def mask(self, n: int) -> torch.Tensor:
        """True for the examples in V: one coin per position, from stream ``purpose`` of the split seed."""
        seed = self.seed if self.split_seed is None else self.split_seed
        return torch.rand(n, generator=streams.generator(seed, self.purpose)) < self.fraction

    def split(self, data: TaskData) -> tuple[TaskData, tuple[torch.Tensor, torch.Tensor, int]]:
        """(the training part, the held-out part); the same tensors for every trial of one data set and split (the
        trials of a cell, planned together: 80 copies of kddcup99's training part took 13 GB)."""
        seed = self.seed if self.split_seed is None else self.split_seed
        key = (id(data.x_train), id(data.y_train), data.n_train, self.fraction, seed, self.purpose)
        if _SPLITS.get("key") != key:
            held = self.mask(data.n_train)
            _SPLITS.update(key=key, source=(data.x_train, data.y_train),  # the source kept alive: ids stay valid
                           parts=((rows.take(data.x_train, ~held), data.y_train[~held]),
                                  (rows.take(data.x_train, held), data.y_train[held])))
        (x_train, y_train), (x_held, y_held) = _SPLITS["parts"]
        return replace(data, x_train=x_train, y_train=y_train), (x_held, y_held, data.n_train)

    def score(self, task: Task, held_out: tuple[torch.Tensor, torch.Tensor, int]) -> dict[str, float]:
        """(#correct on V + N(0, σ_v²)) / (fraction · n): only this noisy value leaves the trial."""
        x, y, n = held_out
        was_training = task.training
        task.eval()
        with torch.no_grad():
            correct = sum(float(task.per_example_metrics(task(xs), ys)["accuracy"].sum())
                          for xs, ys in zip(rows.chunks(x, 4096), y.split(4096)))
        task.train(was_training)
        if self.noise_multiplier == 0:
            return {"accuracy": correct / len(y)}
        noise = self.noise_multiplier * float(torch.randn((), generator=streams.generator(self.seed, "score-noise",
                                                                                          self.trial)))
        return {"noisy_accuracy": (correct + noise) / (self.fraction * n)}
