"""``dpbench tune``: hyperparameter tuning whose privacy cost is part of the reported ε (or is labelled as not).

Modes:

* ``random-stopping`` (default): Papernot & Steinke, "Hyperparameter Tuning with Renyi Differential Privacy"
  (ICLR 2022). The number of trials K is random: truncated negative binomial with η ∈ {0, 1} (η = 0 the
  logarithmic distribution P[K = k] = (1 − γ)^k / (k·log(1/γ)), η = 1 the geometric γ(1 − γ)^(k−1); their
  Definition 1) or Poisson (their Theorem 6; K = 0 is possible and then nothing is released), with mean
  ``--trials``. Every trial draws its hyperparameters independently from the same distribution (Optuna's
  ``RandomSampler``, seeded per trial), trains, and releases a noisy validation score; only the best trial's
  model and score are released. The theorems bound K independent runs of *one* randomized mechanism, so the
  trials must be i.i.d.: Optuna's ``QMCSampler`` is refused here (its k-th point depends on k and on the other
  points, so trials are neither independent nor identically distributed; we found no result covering that) and
  offered in ``adaptive`` mode, whose accounting needs no independence. The total is dp-accounting's
  ``RepeatAndSelectDpEvent(per_trial, mean, shape)`` (shape = η, or ∞ for Poisson) under the RDP accountant
  (its PLD accountant does not support that event), and the per-trial noise multiplier σ is the smallest
  (bisection tolerance 1e-4) whose total meets the user's (ε, δ).
* ``adaptive``: Optuna's TPE sampler (or ``--search qmc|random``) over a fixed number of trials N = ``--trials``. Each trial's
  hyperparameters depend on the earlier trials' noisy scores, so every trial's training and score is charged:
  ``SelfComposed(per_trial, N)`` (adaptive composition), RDP accountant, σ calibrated to the total.
* ``oracle``: the seed papers' protocol, to reproduce their numbers: each of N trials trains on the whole
  training set at the full (ε, δ) and the trial with the best *test* accuracy is selected. The record's ε is one
  trial's; the selection is not private and the record and leaderboard say "tuning not private".

The per-trial mechanism (private modes). Before training, the training set is split by a fixed,
data-independent rule: each example goes to the validation part V with probability ``validation_fraction``, by a
coin drawn from a generator seeded with the tuning seed (the coins depend on nothing but the seed and the
example's position). A trial trains on the rest, T, exactly like ``dpbench run`` (Poisson sampling of T with
rate q = B/|T|, clipping, Gaussian noise σ), then releases its model and the noisy score
(#correct predictions on V + N(0, σ_v²)) / (fraction · n), with n the size of the whole training set. Adding or
removing one example changes #correct by at most 1: the score is a Gaussian mechanism of sensitivity 1 and
noise multiplier σ_v.

How training and score compose: in *parallel*, since they read disjoint parts of the data. Under add/remove-one
neighbours D' = D ∪ {z}, every other example keeps its coin, and z lands in V or in T. If z ∈ T, only the
training differs and the score is post-processing of the model with V fixed; if z ∈ V, only the score differs
(for any model). Both output distributions on D' are mixtures over z's coin of these two cases, and the Rényi
divergence of order α is quasi-convex in a mixture, so a trial is (α, max(ρ_train(α), ρ_score(α)))-RDP at every
α. σ_v is chosen as the smallest noise with ρ_score(α) = α/(2σ_v²) ≤ ρ_train(α) at every order α of the RDP
accountant, so the per-trial RDP curve is the training's exactly, and the per-trial event given to dp-accounting
is the training's event ``SelfComposed(PoissonSampled(q, Gaussian(σ)), T)``. (Sequential composition of the two
would be valid too, and larger; ``tests/test_tuning.py`` checks both claims on the accountant's orders.)
Sizes (n, |T|, |V|) are treated as public, as n is throughout dpbench (q = B/n).

Trials and the ledger. The study (Optuna storage: an SQLite file under ``DPBENCH_HOME`` by default, any
SQLAlchemy URL, e.g. PostgreSQL, for many workers) holds exactly K trials from the moment it exists: the worker
that creates it draws K once (from the tuning seed), stores it in the study's user attributes and enqueues K
``WAITING`` trials. A worker claims a trial by the storage's atomic WAITING → RUNNING transition, so no trial
runs twice and no worker can add a (K+1)-th. A running trial records a heartbeat; a trial whose worker died
(killed, machine lost) stops beating and is marked ``FAIL`` by Optuna's ``fail_stale_trials`` in any worker after
the grace period. It is never retried: a failed, interrupted or stale trial counts as one of the K (it outputs
nothing, i.e. it never wins the selection), so the ledger is always "K trials charged", whatever happened.
Failures are treated as part of the trial's output; this is valid for failures caused by the trial's private
outputs (e.g. divergence) or independent of the data (a killed process).

Release: when all K trials are finished, the best COMPLETE trial (highest noisy score; ties: lowest trial
number) is released exactly once: the first worker to insert it into the table ``dpbench_released`` (in the
study's own database; its primary key is the study name) appends it to the results store and logs it to W&B;
every worker returns the same record. Other trials' scores and models stay in the study storage, which belongs
to the data owner.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dp_accounting
import numpy as np
import optuna
import sqlalchemy
import torch
from dp_accounting import rdp

from dpbench import engine, records, store, streams, tracking
from dpbench.data import dpbench_home
from dpbench.engine import UsageError
from dpbench.method import Method, ReleaseMethod
from dpbench.privacy import GaussianReleases
from dpbench.task import Task, TaskData

MODES = ("random-stopping", "adaptive", "oracle")
K_DISTRIBUTIONS = ("negative-binomial", "poisson")
SAMPLERS = ("random", "tpe", "qmc")
#: The samplers each mode allows, its default first: random-stopping needs i.i.d. trials.
MODE_SAMPLERS = {"random-stopping": ("random",), "adaptive": ("tpe", "qmc", "random"), "oracle": ("random", "qmc")}
#: Fixed by the schedule, not by the search: every trial must run the same mechanism (one RDP curve for all).
MECHANISM_KEYS = ("epochs", "batch_size")
#: The most trials (or mean trials) a study runs: its K trials are enqueued when it is created.
MAX_TRIALS = 1000
_RELEASED = sqlalchemy.Table("dpbench_released", sqlalchemy.MetaData(),
                             sqlalchemy.Column("study_name", sqlalchemy.String(512), primary_key=True),
                             sqlalchemy.Column("record", sqlalchemy.Text, nullable=False))


class TuningError(Exception):
    """The study cannot release anything (e.g. all its trials failed, or K = 0 was drawn)."""


@dataclass
class TuneSpec:
    """What a user asked ``dpbench tune`` for. ``overrides`` fix hyperparameters outside the search."""

    method: str
    task: str
    epsilon: float
    delta: float | None = None
    mode: str = "random-stopping"
    trials: float = 8  # mean of K (random-stopping), number of trials (adaptive, oracle)
    k_distribution: str = "negative-binomial"
    eta: int = 0  # at mean 8 the cheapest (per-trial σ, digits, ε = 1: 18.3; η = 1: 21.7; Poisson: 21.5)
    sampler: str | None = None  # None: the mode's default (MODE_SAMPLERS)
    validation_fraction: float = 0.1
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    search_space: dict[str, dict[str, Any]] | None = None  # None: the method's
    storage: str | None = None  # None: sqlite under DPBENCH_HOME
    study: str | None = None  # None: named after the settings
    heartbeat_interval: int = 10
    plugins: list[str] = field(default_factory=list)
    store_path: Path | None = None
    wandb_project: str | None = None
    wandb_entity: str | None = None
    no_wandb: bool = False


# ---- the distribution of K (Papernot & Steinke, Definition 1 and Theorem 6) ------------------------------------

def k_distribution(spec: TuneSpec) -> dict[str, Any]:
    if spec.k_distribution == "poisson":
        return {"name": "poisson", "mean": float(spec.trials)}
    return {"name": "truncated_negative_binomial", "eta": spec.eta, "mean": float(spec.trials)}


def k_shape(distribution: dict[str, Any]) -> float:
    """dp-accounting's ``shape`` of ``RepeatAndSelectDpEvent``: η, or ∞ for Poisson."""
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


def draw_k(distribution: dict[str, Any], seed: int) -> int:
    """K from its distribution, on the tuning seed's ``tuning-k`` stream (never from the data)."""
    rng = streams.numpy_generator(seed, "tuning-k")
    mean = distribution["mean"]
    if distribution["name"] == "poisson":
        return int(rng.poisson(mean))
    gamma = tnb_gamma(distribution["eta"], mean)
    if gamma >= 1:
        return 1
    return int(rng.geometric(gamma) if distribution["eta"] == 1 else rng.logseries(1 - gamma))


# ---- accounting ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrialMechanism:
    """What one trial runs: ``releases`` Poisson-subsampled Gaussian gradient releases (rate q, noise σ) on T."""

    sample_rate: float
    noise_multiplier: float
    releases: int

    def event(self) -> dp_accounting.DpEvent:
        return GaussianReleases(self.sample_rate, self.noise_multiplier, self.releases).event()


def rdp_curve(event: dp_accounting.DpEvent) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP at each order) of ``event`` from dp-accounting's RDP accountant (its default orders)."""
    accountant = rdp.RdpAccountant()
    accountant.compose(event)
    return np.asarray(accountant.orders), np.asarray(accountant.rdp)


def score_noise_multiplier(trial: TrialMechanism) -> float:
    """σ_v: the smallest noise on the count (sensitivity 1) whose RDP α/(2σ_v²) is at most the training's at every
    order of the accountant, so that the trial's parallel composition max(ρ_train, ρ_score) is ρ_train."""
    orders, curve = rdp_curve(trial.event())
    return math.sqrt(float(np.max(orders / (2 * curve)))) * (1 + 1e-9)


def total_event(mode: str, trial: TrialMechanism, distribution: dict[str, Any] | None,
                trials: int) -> dp_accounting.DpEvent:
    """The whole tuning's event: repeat-and-select (random-stopping) or N-fold adaptive composition."""
    if mode == "random-stopping":
        return dp_accounting.dp_event.RepeatAndSelectDpEvent(trial.event(), distribution["mean"], k_shape(distribution))
    return dp_accounting.SelfComposedDpEvent(trial.event(), trials)


def total_epsilon(mode: str, trial: TrialMechanism, distribution: dict[str, Any] | None, trials: int,
                  delta: float) -> float:
    accountant = rdp.RdpAccountant()
    accountant.compose(total_event(mode, trial, distribution, trials))
    return float(accountant.get_epsilon(delta))


def calibrate_trial_noise(mode: str, epsilon: float, delta: float, sample_rate: float, releases: int,
                          distribution: dict[str, Any] | None, trials: int) -> float:
    """The smallest per-trial σ (to 1e-4) whose total ε over the whole tuning is ≤ ``epsilon``."""
    return float(dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant,
        lambda sigma: total_event(mode, TrialMechanism(sample_rate, sigma, releases), distribution, trials),
        epsilon, delta, bracket_interval=dp_accounting.LowerEndpointAndGuess(0.0, 1.0), tol=1e-4))


# ---- the validation split and the noisy score ------------------------------------------------------------------

@dataclass(frozen=True)
class ValidationSplit:
    """Hold out a fixed, data-independent part of the training data and score a trained model on it (see the
    module docstring): passed to the engine as ``RunSpec.validation``."""

    fraction: float
    seed: int  # the tuning seed
    noise_multiplier: float  # σ_v, the standard deviation of the noise on the count of correct predictions
    trial: int  # the trial's number: its score noise is stream ``score-noise`` of the tuning seed at this index

    def mask(self, n: int) -> torch.Tensor:
        """True for the examples in V: one coin per position, from the tuning seed's ``tuning-split`` stream."""
        return torch.rand(n, generator=streams.generator(self.seed, "tuning-split")) < self.fraction

    def split(self, data: TaskData) -> tuple[TaskData, tuple[torch.Tensor, torch.Tensor, int]]:
        held = self.mask(data.n_train)
        training = replace(data, x_train=data.x_train[~held], y_train=data.y_train[~held])
        return training, (data.x_train[held], data.y_train[held], data.n_train)

    def score(self, task: Task, held_out: tuple[torch.Tensor, torch.Tensor, int]) -> dict[str, float]:
        """(#correct on V + N(0, σ_v²)) / (fraction · n): only this noisy value leaves the trial."""
        x, y, n = held_out
        was_training = task.training
        task.eval()
        with torch.no_grad():
            correct = sum(float(task.per_example_metrics(task(xs), ys)["accuracy"].sum())
                          for xs, ys in zip(x.split(4096), y.split(4096)))
        task.train(was_training)
        noise = self.noise_multiplier * float(torch.randn((), generator=streams.generator(self.seed, "score-noise",
                                                                                          self.trial)))
        return {"noisy_accuracy": (correct + noise) / (self.fraction * n)}


# ---- the plan: everything decided before the study is opened ---------------------------------------------------

def _distribution(name: str, spec: dict[str, Any]) -> optuna.distributions.BaseDistribution:
    kind = spec.get("type")
    try:
        if kind == "float":
            return optuna.distributions.FloatDistribution(spec["low"], spec["high"], log=spec.get("log", False))
        if kind == "int":
            return optuna.distributions.IntDistribution(spec["low"], spec["high"], log=spec.get("log", False))
        if kind == "categorical":
            return optuna.distributions.CategoricalDistribution(spec["choices"])
    except (KeyError, ValueError, TypeError) as error:
        raise UsageError(f"search space entry {name!r}: {error}") from None
    raise UsageError(f"search space entry {name!r}: type must be float, int or categorical, got {kind!r}")


def load_search_space(path: str) -> dict[str, dict[str, Any]]:
    try:
        space = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read the search space {path}: {error}") from None
    if not isinstance(space, dict) or not all(isinstance(v, dict) for v in space.values()):
        raise UsageError(f"{path}: a search space is a JSON object of name -> {{type, low, high[, log]}} or "
                         f"{{type: categorical, choices}}")
    return space


@dataclass
class Plan:
    spec: TuneSpec
    method: type[Method]
    task: type[Task]
    space: dict[str, dict[str, Any]]
    distributions: dict[str, optuna.distributions.BaseDistribution]
    delta: float
    n: int
    config: dict[str, Any]  # stored in the study; a study opened with another config is refused
    trial: TrialMechanism | None = None  # private modes
    validation: dict[str, Any] | None = None  # private modes: fraction, seed, σ_v, sizes


def _planned_releases(method: type[Method], hp: dict[str, Any], n: int) -> tuple[float, int]:
    """(q, planned releases) as ``engine.run`` computes them for n training examples (Poisson sampler)."""
    batch_size = n if method.full_batch else hp["batch_size"]
    if batch_size * method.releases_per_step > n:
        raise UsageError(f"batch size {batch_size} (x{method.releases_per_step} batches per step) exceeds the {n} "
                         f"examples of the training part")
    steps_per_epoch = max(1, round(n / (batch_size * method.releases_per_step)))
    return batch_size / n, hp["epochs"] * steps_per_epoch * method.releases_per_step


def plan(spec: TuneSpec) -> Plan:
    """Check the request and fix the per-trial mechanism and the validation split (before any trial runs)."""
    if spec.mode not in MODES:
        raise UsageError(f"unknown mode {spec.mode!r}; choose one of {', '.join(MODES)}")
    if not (math.isfinite(spec.epsilon) and spec.epsilon > 0):
        raise UsageError(f"epsilon must be a finite number > 0, got {spec.epsilon}")
    if spec.delta is not None and not 0 < spec.delta < 1:
        raise UsageError(f"delta must lie in (0, 1), got {spec.delta}")
    if not 1 <= spec.trials <= MAX_TRIALS:  # also refuses NaN
        raise UsageError(f"--trials must lie in [1, {MAX_TRIALS}], got {spec.trials}")
    if spec.mode == "random-stopping":
        if spec.k_distribution not in K_DISTRIBUTIONS:
            raise UsageError(f"unknown K distribution {spec.k_distribution!r}; choose {', '.join(K_DISTRIBUTIONS)}")
        if spec.eta not in (0, 1):
            raise UsageError(f"eta must be 0 or 1, got {spec.eta}")
    elif spec.trials != int(spec.trials):
        raise UsageError(f"--trials must be a whole number in mode {spec.mode}, got {spec.trials}")
    sampler = spec.sampler or MODE_SAMPLERS[spec.mode][0]
    if sampler not in MODE_SAMPLERS[spec.mode]:
        raise UsageError(f"--search {sampler} is not allowed in mode {spec.mode}: choose "
                         f"{', '.join(MODE_SAMPLERS[spec.mode])}" + (" (Papernot & Steinke's bound needs i.i.d. "
                                                                     "trials)" if spec.mode == "random-stopping" else ""))
    engine.check_seed(spec.seed)
    if not 0 < spec.validation_fraction < 1:
        raise UsageError(f"validation fraction must lie in (0, 1), got {spec.validation_fraction}")
    if not 1 <= spec.heartbeat_interval <= 86_400:
        raise UsageError(f"heartbeat interval must lie in 1..86400 s, got {spec.heartbeat_interval}")

    method, task_class = engine.registered(spec.method, spec.task, spec.plugins)
    if issubclass(method, ReleaseMethod):
        raise UsageError(f"{method.name} releases through output/objective perturbation: dpbench tune does not "
                         f"tune it (its search_space holds its benchmark's grids)")
    if not method.private and spec.mode != "oracle":
        raise UsageError(f"{method.name} is not private: only --mode oracle can tune it")
    space = dict(method.search_space if spec.search_space is None else spec.search_space)
    if not space:
        raise UsageError(f"{method.name} declares no search space; pass --search-space FILE")
    hp, options = engine.resolve_hyperparameters(method, task_class, spec.overrides)
    fixed = set(MECHANISM_KEYS) if spec.mode != "oracle" else set()
    if method.clip_to_task_bound:
        fixed.add("clip")
    for name in space:
        if name not in hp:
            raise UsageError(f"{method.name} on {task_class.name} has no hyperparameter {name!r} to tune; "
                             f"valid: {', '.join(sorted(set(hp) - fixed))}")
        if name in fixed:
            raise UsageError(f"{name} cannot be tuned here: it fixes each trial's mechanism, which must be the same "
                             f"for every trial; set it with --set {name}=...")
        if name in spec.overrides:
            raise UsageError(f"{name} is both fixed on the command line and in the search space")
    distributions = {name: _distribution(name, entry) for name, entry in space.items()}

    torch.manual_seed(0)  # the model's initialisation does not matter here: only shapes and the metric's name
    task = task_class(**options)
    data = task.prepare()
    n = data.n_train
    with torch.no_grad():
        if "accuracy" not in task.per_example_metrics(task(data.x_test[:2]), data.y_test[:2]):
            raise UsageError(f"task {task_class.name} has no accuracy metric to select trials by")
    if method.private and data.private_releases:  # e.g. a private PCA: each trial would repeat it
        raise UsageError(f"task {task_class.name} releases statistics of its private data before training "
                         f"({'; '.join(r.description for r in data.private_releases)}): dpbench tune does not "
                         f"account them")
    delta = spec.delta if spec.delta is not None else task_class.defaults.get("delta", 1 / n**2)
    if method.private and delta >= 1 / n:
        raise UsageError(f"delta={delta:g} is not below 1/n = {1 / n:g} for n={n}")
    config = {"method": method.name, "task": task_class.name, "data_id": data.data_id, "mode": spec.mode,
              "epsilon": spec.epsilon, "delta": delta, "trials": spec.trials, "seed": spec.seed,
              "search_space": space, "overrides": spec.overrides,
              "sampler": sampler}
    result = Plan(spec, method, task_class, space, distributions, delta, n, config)
    if spec.mode == "oracle":
        return result

    validation = ValidationSplit(spec.validation_fraction, spec.seed, 0.0, 0)
    n_train = int((~validation.mask(n)).sum())
    sample_rate, releases = _planned_releases(method, hp, n_train)
    distribution = k_distribution(spec) if spec.mode == "random-stopping" else None
    trials = int(spec.trials)
    absl = logging.getLogger("absl")  # dp-accounting warns of RDP orders it drops (as infinite) at small σ
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        sigma = calibrate_trial_noise(spec.mode, spec.epsilon, delta, sample_rate, releases, distribution, trials)
    finally:
        absl.setLevel(level)
    result.trial = TrialMechanism(sample_rate, sigma, releases)
    result.validation = {"fraction": spec.validation_fraction, "seed": spec.seed,
                         "noise_multiplier": score_noise_multiplier(result.trial), "sensitivity": 1,
                         "n_train": n_train, "n_validation": n - n_train}
    config.update({"k_distribution": distribution, "validation_fraction": spec.validation_fraction,
                   "noise_multiplier": sigma})
    return result


# ---- the study -----------------------------------------------------------------------------------------------

def default_storage() -> str:
    return f"sqlite:///{dpbench_home() / 'tuning.sqlite'}"


def default_study_name(spec: TuneSpec) -> str:
    return f"{spec.task}-{spec.method}-{spec.mode}-eps{spec.epsilon:g}-seed{spec.seed}"


def redacted(url: str) -> str:
    """The storage URL without its password (the record must not carry credentials)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _storage(url: str, heartbeat_interval: int, attempts: int = 5) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats, and the release table. Workers starting together on an empty database
    can collide creating the tables (PostgreSQL's CREATE TABLE IF NOT EXISTS is not atomic): retried."""
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_interval,
                                                     grace_period=3 * heartbeat_interval)
            _RELEASED.metadata.create_all(storage.engine, checkfirst=True)
            return storage
        except (ImportError, sqlalchemy.exc.ArgumentError, sqlalchemy.exc.OperationalError) as error:
            raise UsageError(f"cannot open the study storage {redacted(url)}: {str(error).splitlines()[0]}") from None
        except sqlalchemy.exc.SQLAlchemyError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def _sampler(plan_: Plan, trial_number: int) -> optuna.samplers.BaseSampler:
    """Trial k's sampler, on the tuning seed's ``tuning-search`` stream at k, so that workers do not repeat each
    other's draws (QMC: one scrambled sequence for the whole study, indexed by Optuna across workers)."""
    seed = streams.derive(plan_.spec.seed, "tuning-search", trial_number) % 2**32
    if plan_.config["sampler"] == "qmc":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(scramble=True, seed=streams.derive(plan_.spec.seed, "tuning-search") % 2**32,
                                              warn_independent_sampling=False,
                                              warn_asynchronous_seeding=False)
    if plan_.config["sampler"] == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def open_study(plan_: Plan, storage: optuna.storages.RDBStorage, name: str, wait: float = 120.0) -> optuna.Study:
    """Create the study with its K WAITING trials, or load it (waiting for its creator to finish setting it up)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            study = optuna.create_study(storage=storage, study_name=name, direction="maximize")
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=name, storage=storage)
            created = False
    if created:
        spec = plan_.spec
        k = draw_k(k_distribution(spec), spec.seed) if spec.mode == "random-stopping" else int(spec.trials)
        study.set_user_attr("dpbench_config", plan_.config)
        study.set_user_attr("k", k)
        for _ in range(k):
            study.enqueue_trial({})
        for trial_id in _trial_ids(study, storage):  # a claimed trial is never without a heartbeat
            storage.record_heartbeat(trial_id)
        study.set_user_attr("ready", True)
        return study
    deadline = time.monotonic() + wait
    while not study.user_attrs.get("ready"):
        if time.monotonic() > deadline:
            raise UsageError(f"study {name} exists but was never set up (its creator died?); use another --study")
        time.sleep(0.5)
    if study.user_attrs["dpbench_config"] != json.loads(json.dumps(plan_.config)):
        raise UsageError(f"study {name} was created with other settings; use another --study")
    return study


def _trial_ids(study: optuna.Study, storage: optuna.storages.RDBStorage, states=None) -> list[int]:
    study_id = storage.get_study_id_from_name(study.study_name)
    return [storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            for trial in study.get_trials(deepcopy=False, states=states)]


def _claim(study: optuna.Study, storage: optuna.storages.RDBStorage) -> int | None:
    """Atomically take a WAITING trial (WAITING → RUNNING in one locked update); None when none is left."""
    for trial_id in _trial_ids(study, storage, (optuna.trial.TrialState.WAITING,)):
        try:
            if storage.set_trial_state_values(trial_id, optuna.trial.TrialState.RUNNING):
                storage.record_heartbeat(trial_id)
                return trial_id
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


class _Heartbeat:
    """Record the trial's heartbeat every ``interval`` seconds while its worker lives."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int, interval: int):
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self):
        while not self.stop.wait(self.interval):
            self.storage.record_heartbeat(self.trial_id)

    def __enter__(self):
        self.thread.start()

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _trial_run_spec(plan_: Plan, params: dict[str, Any], number: int) -> engine.RunSpec:
    """Trial ``number``'s run: its seed from the tuning seed's ``tuning-trial`` stream; in the private modes Poisson
    sampling (what the per-trial event assumes, whatever the method's default sampler) at the planned σ."""
    spec = plan_.spec
    common = dict(method=spec.method, task=spec.task, delta=plan_.delta,
                  seed=streams.child_seed(spec.seed, "tuning-trial", number),
                  overrides={**spec.overrides, **params}, plugins=spec.plugins, progress_bar=False, no_wandb=True,
                  append_to_store=False)
    if spec.mode == "oracle":
        return engine.RunSpec(epsilon=spec.epsilon if plan_.method.private else None, **common)
    validation = ValidationSplit(plan_.validation["fraction"], plan_.validation["seed"],
                                 plan_.validation["noise_multiplier"], number)
    return engine.RunSpec(noise_multiplier=plan_.trial.noise_multiplier, accountant="rdp", sampler="poisson",
                          neighbouring="add-remove", validation=validation, **common)


def _suggest(trial: optuna.Trial, name: str, distribution: optuna.distributions.BaseDistribution) -> Any:
    if isinstance(distribution, optuna.distributions.FloatDistribution):
        return trial.suggest_float(name, distribution.low, distribution.high, log=distribution.log)
    if isinstance(distribution, optuna.distributions.IntDistribution):
        return trial.suggest_int(name, distribution.low, distribution.high, log=distribution.log)
    return trial.suggest_categorical(name, distribution.choices)


def _run_trial(plan_: Plan, study: optuna.Study, storage: optuna.storages.RDBStorage, trial_id: int) -> None:
    """Sample, train and score one claimed trial and tell the study; any failure is told as FAIL (it counts)."""
    number = storage.get_trial_number_from_id(trial_id)
    study.sampler = _sampler(plan_, number)
    trial = optuna.Trial(study, trial_id)
    trial.set_user_attr("worker", f"{os.uname().nodename}:{os.getpid()}")
    state, value = optuna.trial.TrialState.FAIL, None
    try:
        with _Heartbeat(storage, trial_id, plan_.spec.heartbeat_interval):
            if storage.get_trial(trial_id).state != optuna.trial.TrialState.RUNNING:
                return  # failed as stale before it started: it counts, and it never touches the data
            params = {name: _suggest(trial, name, distribution) for name, distribution in plan_.distributions.items()}
            record = engine.run(_trial_run_spec(plan_, params, number))
            if plan_.trial is not None and (record["sample_rate"] != plan_.trial.sample_rate or
                                            record["gradient_evaluations"] != plan_.trial.releases or
                                            record["sampler"] != "poisson" or record["neighbouring"] != "add-remove"):
                raise RuntimeError(f"trial {number} ran {record['sampler']} q={record['sample_rate']}, "
                                   f"{record['gradient_evaluations']} releases ({record['neighbouring']}); planned "
                                   f"poisson q={plan_.trial.sample_rate}, {plan_.trial.releases} (add-remove)")
            trial.set_user_attr("record", record)
            value = (record["validation"]["noisy_accuracy"] if plan_.trial is not None
                     else record["metrics"]["test_accuracy"])
            state = optuna.trial.TrialState.COMPLETE if math.isfinite(value) else optuna.trial.TrialState.FAIL
    except Exception as error:  # the trial failed: it counts, and the next one runs
        trial.set_user_attr("error", f"{type(error).__name__}: {error}")
        print(f"dpbench: trial {number} failed (it still counts): {type(error).__name__}: {error}", file=sys.stderr)
    finally:  # also on KeyboardInterrupt: the trial is told FAIL and still counts
        try:
            study.tell(trial, value if state == optuna.trial.TrialState.COMPLETE else None, state=state)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # failed as stale by another worker meanwhile: it counts, once


def work(plan_: Plan, study: optuna.Study, storage: optuna.storages.RDBStorage) -> None:
    """Run trials until none is left to claim, then wait for the other workers' trials (failing stale ones)."""
    while (trial_id := _claim(study, storage)) is not None:
        _run_trial(plan_, study, storage, trial_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        while True:
            optuna.storages.fail_stale_trials(study)
            if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,
                                                            optuna.trial.TrialState.WAITING)):
                return
            time.sleep(min(plan_.spec.heartbeat_interval, 2))


def ledger(study: optuna.Study) -> dict[str, Any]:
    """The study's trials by state: every one of them is charged."""
    trials = study.get_trials(deepcopy=False)
    states = {}
    for trial in trials:
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    return {"k": study.user_attrs["k"], "trials": len(trials), "states": states}


# ---- the release ---------------------------------------------------------------------------------------------

#: The keys of a released record's ``tuning``: nothing that depends on K or on the trials not selected.
PUBLIC_TUNING_FIELDS = frozenset({
    "mode", "sampler", "search_space", "selected_params", "study", "storage", "private", "selected_by", "trials",
    "note", "per_trial_epsilon", "selected_score", "accountant", "noise_multiplier", "sample_rate",
    "gradient_evaluations", "per_trial_delta", "per_trial_event", "validation", "k_distribution", "total_event"})


def released_record(plan_: Plan, study: optuna.Study, storage_url: str) -> dict[str, Any]:
    """The selected trial's record with the tuning's totals (the only thing that leaves the study)."""
    spec, config = plan_.spec, plan_.config
    trials = study.get_trials(deepcopy=False)
    k = study.user_attrs["k"]
    if len(trials) != k or any(not t.state.is_finished() for t in trials):
        raise RuntimeError(f"study {study.study_name}: {len(trials)} trials for K = {k}, or some not finished")
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if k == 0:
        raise TuningError(f"study {study.study_name} drew K = 0 trials (Poisson): nothing trained, nothing released")
    if not complete:
        raise TuningError(f"all {k} trials of study {study.study_name} failed: nothing released; the budget is spent")
    best = max(complete, key=lambda t: (t.value, -t.number))
    record = dict(best.user_attrs["record"])
    for key in ("run_id", "created_at", "validation"):  # no validation in oracle mode
        record.pop(key, None)
    # Only what is public leaves the study: for random stopping, K and the other trials (how many ran or failed,
    # which one won, its seed) must stay hidden, or the release is best-of-k for a known k (PUBLIC_TUNING_FIELDS).
    tuning = {"mode": spec.mode, "sampler": config["sampler"], "search_space": plan_.space,
              "selected_params": best.params, "study": study.study_name, "storage": redacted(storage_url)}
    if spec.mode == "oracle":
        tuning.update({"private": False, "selected_by": "test accuracy (not private)", "trials": int(spec.trials),
                       "note": "tuning not private: trials were selected on the test set; epsilon covers one "
                               "trial's training only", "per_trial_epsilon": record["epsilon"]})
    else:
        distribution = config["k_distribution"]
        total = total_epsilon(spec.mode, plan_.trial, distribution, k, plan_.delta)
        if total > spec.epsilon * (1 + 1e-9):
            raise RuntimeError(f"total epsilon {total} exceeds the target {spec.epsilon}: calibration failed")
        tuning.update({"private": True, "selected_by": "noisy validation accuracy",
                       "selected_score": best.value, "accountant": "rdp",
                       "noise_multiplier": plan_.trial.noise_multiplier, "sample_rate": plan_.trial.sample_rate,
                       "gradient_evaluations": plan_.trial.releases,
                       "per_trial_epsilon": record["epsilon"], "per_trial_delta": plan_.delta,
                       "per_trial_event": "SelfComposed(PoissonSampled(sample_rate, Gaussian(noise_multiplier)), "
                                          "gradient_evaluations); training and score in parallel (disjoint data)",
                       "validation": plan_.validation})
        if spec.mode == "random-stopping":
            tuning["k_distribution"] = distribution
            tuning["total_event"] = "RepeatAndSelect(per_trial_event, k_distribution.mean, shape)"
        else:  # adaptive: the number of trials is the user's, public, and every trial is charged
            tuning["trials"] = int(spec.trials)
            tuning["total_event"] = "SelfComposed(per_trial_event, trials)"
        record.update({"epsilon": total, "accountant": "rdp"})
    record.update({"seed": spec.seed, "epsilon_target": spec.epsilon, "delta": plan_.delta if
                   plan_.method.private else None, "tuning": tuning})
    if not set(tuning) <= PUBLIC_TUNING_FIELDS:
        raise RuntimeError(f"the released tuning record would carry {sorted(set(tuning) - PUBLIC_TUNING_FIELDS)}")
    return records.seal(record)


def _release_once(url: str, name: str, record: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Insert the study's released record unless another worker did first: (the stored record, whether we did)."""
    db = sqlalchemy.create_engine(url)
    try:
        try:
            with db.begin() as connection:
                connection.execute(_RELEASED.insert().values(study_name=name, record=json.dumps(record)))
            return record, True
        except sqlalchemy.exc.IntegrityError:
            with db.connect() as connection:
                stored = connection.execute(sqlalchemy.select(_RELEASED.c.record)
                                            .where(_RELEASED.c.study_name == name)).scalar_one()
            return json.loads(stored), False
    finally:
        db.dispose()


def tune(spec: TuneSpec) -> dict[str, Any]:
    """Run (or join, or resume) the study and return its released record (see the module docstring)."""
    plan_ = plan(spec)
    url = spec.storage or default_storage()
    if url.startswith("sqlite:///"):
        try:
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"cannot create the folder of the study storage {url}: {error.strerror}") from None
    storage = _storage(url, spec.heartbeat_interval)
    name = spec.study or default_study_name(spec)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(plan_, storage, name)
    work(plan_, study, storage)
    record, ours = _release_once(url, name, released_record(plan_, study, url))
    if ours:
        settings = tracking.wandb_settings(spec.wandb_project, spec.wandb_entity, spec.no_wandb)
        if settings:
            tracking.finish(tracking.start_run(settings, {k: v for k, v in record.items() if k != "metrics"}), record)
        store.append(record, spec.store_path)
    return record
