"""The plan of a ``dpbench tune`` study (:mod:`dpbench.tuning.tune`): the request checked, and everything decided before
any trial runs — the search space, the held-out split, and for the private modes the per-trial mechanism and its
noise multiplier, calibrated so that the whole tuning meets (ε, δ) (:mod:`dpbench.tuning.accounting`)."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import torch

from dpbench.checks import check_seed
from dpbench.choices import K_DISTRIBUTIONS, SEARCH_SAMPLERS, TUNING_MODES
from dpbench.data import rows
from dpbench.errors import UsageError
from dpbench.method import Method, ReleaseMethod
from dpbench.privacy import correlated
from dpbench.privacy.accounting import NEIGHBOURING
from dpbench.release.runner import resolve_hyperparameters as release_hyperparameters
from dpbench.run import planning, refusals
from dpbench.spec import RunSpec, resolve_hyperparameters
from dpbench.task import Task
from dpbench.tuning import search
from dpbench.tuning.accounting import (TrialMechanism, ValidationSplit, calibrate_trial_noise, k_distribution,
                                       score_noise_multiplier)

MODES, SAMPLERS = TUNING_MODES, SEARCH_SAMPLERS
#: The samplers each mode allows, its default first: random-stopping needs i.i.d. trials.
MODE_SAMPLERS = {"random-stopping": ("random",), "adaptive": ("tpe", "qmc", "random"), "oracle": ("random", "qmc")}
#: Fixed by the schedule, not by the search: every trial must run the same mechanism (one RDP curve for all).
MECHANISM_KEYS = ("epochs", "batch_size")
#: The most trials (or mean trials) a study runs: its K trials are enqueued when it is created.
MAX_TRIALS = 1000

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
    neighbouring: str = "add-remove"  # of the total ε (trials sample Poisson batches either way)
    seed: int = 0  # public: names the study and, without split_seed, draws the held-out part; the study's secret
    # draws the rest (K, the trials' seeds and search draws, the score noise: dpbench.tuning.tune)
    secret_seed: bool = False  # the seed too from the OS's entropy; the record says "secret" (tune --secret-seed)
    split_seed: int | None = None  # the held-out part's coins (None: the seed's)
    overrides: dict[str, Any] = field(default_factory=dict)
    search_space: dict[str, dict[str, Any]] | None = None  # None: the method's
    storage: str | None = None  # None: sqlite under DPBENCH_HOME
    study: str | None = None  # None: named after the settings
    heartbeat_interval: int = 10
    plugins: list[str] = field(default_factory=list)
    store_path: Path | None = None
    append_to_store: bool = True  # False: the caller stores the released record (dpbench sweep's client)
    wandb_project: str | None = None
    wandb_entity: str | None = None
    no_wandb: bool = False


# ---- the plan: everything decided before the study is opened ---------------------------------------------------

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


def _fixed_correlation(method: type[Method], hp: dict[str, Any], space: dict[str, Any]):
    """The noise correlation every trial runs (``Method.correlation`` at the method's hyperparameters, None for
    independent noise): UsageError where a value of the search space, each searched hyperparameter at each end of its
    range or at each of its choices, gives another (each trial would run its own mechanism; the total charges one)."""
    correlation = method.correlation(hp)
    for name, entry in space.items():
        for value in entry["choices"] if entry.get("type") == "categorical" else (entry["low"], entry["high"]):
            try:
                other = method.correlation({**hp, name: value})
            except (ValueError, TypeError) as error:
                raise UsageError(f"{method.name}: {name}={value!r} gives no noise correlation ({error})") from None
            if other != correlation:
                raise UsageError(f"{name} cannot be searched in a private mode: at {name}={value!r} {method.name}'s "
                                 f"noise correlation is {other!r}, not {correlation!r}, and every trial must run "
                                 f"the mechanism the tuning charges; set it with --set {name}=...")
    return correlation


def plan(spec: TuneSpec, calibrate: bool = True) -> Plan:
    """Check the request and fix the per-trial mechanism and the validation split (before any trial runs).

    ``calibrate=False`` stops before the per-trial σ is calibrated (seconds per cell): ``plan.trial`` is then the
    mechanism at σ = 1, enough for what decides a record's identity (:func:`dpbench.tuning.released.tuning_config`,
    the trials' kind and relation), which is what ``dpbench sweep`` plans every cell for."""
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
    check_seed(spec.seed)
    if spec.neighbouring not in NEIGHBOURING:
        raise UsageError(f"unknown neighbouring relation {spec.neighbouring!r}; choose one of {', '.join(NEIGHBOURING)}")
    if not 0 < spec.validation_fraction < 1:
        raise UsageError(f"validation fraction must lie in (0, 1), got {spec.validation_fraction}")
    if not 1 <= spec.heartbeat_interval <= 86_400:
        raise UsageError(f"heartbeat interval must lie in 1..86400 s, got {spec.heartbeat_interval}")

    method, task_class = planning.registered(spec.method, spec.task, spec.plugins)
    output_trials = isinstance(method, type) and issubclass(method, ReleaseMethod)
    if output_trials and not getattr(method, "tunable_privately", False) and spec.mode != "oracle":
        raise UsageError(f"{method.name}: {method.untunable_reason}")
    if output_trials and spec.neighbouring != "replace-one" and spec.mode != "oracle":
        raise UsageError(f"{method.name}'s analysis holds under replace-one neighbours only; pass --neighbouring "
                         f"replace-one")
    if not method.private and spec.mode != "oracle":
        raise UsageError(f"{method.name} is not private: only --mode oracle can tune it")
    space = dict(method.search_space if spec.search_space is None else spec.search_space)
    if not space:
        raise UsageError(f"{method.name} declares no search space; pass --search-space FILE")
    hp, options = (release_hyperparameters(method, task_class, spec.overrides) if output_trials else
                   resolve_hyperparameters(method, task_class, spec.overrides))
    fixed = set(MECHANISM_KEYS) if spec.mode != "oracle" and not output_trials else set()
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
    distributions = search.distributions(space)  # the space checked: _fixed_correlation reads its ends
    correlation = None
    if not output_trials and method.private and spec.mode != "oracle":
        correlation = _fixed_correlation(method, hp, space)
        if correlation is not None and spec.neighbouring != "replace-one":
            raise UsageError(f"{method.name} adds correlated noise on the cyclic sampler's fixed batches, accounted "
                             f"under replace-one neighbours only: pass --neighbouring replace-one")
        if correlation is not None:  # what the trials' engine would refuse, before any trial draws K's share
            refusals.check_correlation(RunSpec(method=spec.method, task=spec.task, sampler=correlated.SAMPLER,
                                               neighbouring=spec.neighbouring), method, hp, correlated.SAMPLER)

    task = task_class(**options)
    data = task.prepare(spec.seed)  # the model's initialisation does not matter here: shapes and the metric's name
    n = data.n_train
    with torch.no_grad():
        if "accuracy" not in task.per_example_metrics(task(rows.first(data.x_test, 2)), data.y_test[:2]):
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
              "secret_seed": spec.secret_seed,
              "search_space": space, "overrides": spec.overrides, "neighbouring": spec.neighbouring,
              "split_seed": spec.split_seed,
              "sampler": sampler}
    result = Plan(spec, method, task_class, space, distributions, delta, n, config)
    if spec.mode == "oracle":
        return result

    validation = ValidationSplit(spec.validation_fraction, spec.seed, 0.0, 0, split_seed=spec.split_seed)
    n_train = int((~validation.mask(n)).sum())
    if output_trials:  # one Gaussian output mechanism per classifier (one-vs-all)
        classes = getattr(task, "classes", 2)
        mechanism = TrialMechanism(1.0, 1.0, 1 if classes == 2 else classes, spec.neighbouring, "output")
    elif correlation is not None:  # the cyclic sampler's partition of the training part, as planning.plan draws it
        batches = n_train // hp["batch_size"]
        try:
            correlated.check_sampler(getattr(correlation, "bands", 1), batches)
        except ValueError as error:
            raise UsageError(f"{method.name}: {error}") from None
        bands, tree = planning.correlated_fields(correlation)
        mechanism = TrialMechanism(hp["batch_size"] / n_train, 1.0, hp["epochs"] * batches, spec.neighbouring,
                                   sampler=correlated.SAMPLER, releases_per_epoch=batches, bands=bands, tree=tree)
    else:
        sample_rate, releases = _planned_releases(method, hp, n_train)
        mechanism = TrialMechanism(sample_rate, 1.0, releases, spec.neighbouring)
    distribution = (k_distribution(spec.k_distribution, spec.eta, spec.trials) if spec.mode == "random-stopping"
                    else None)
    if not calibrate:
        result.trial = mechanism
        config["k_distribution"] = distribution
        return result
    trials = int(spec.trials)
    absl = logging.getLogger("absl")  # dp-accounting warns of RDP orders it drops (as infinite) at small σ
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        sigma = calibrate_trial_noise(spec.mode, spec.epsilon, delta, mechanism, distribution, trials)
    except ValueError as error:
        raise UsageError(str(error)) from None
    finally:
        absl.setLevel(level)
    result.trial = replace(mechanism, noise_multiplier=sigma)
    result.validation = {"fraction": spec.validation_fraction, "seed": "secret" if spec.secret_seed else spec.seed,
                         "split_seed": spec.split_seed,
                         "noise_multiplier": score_noise_multiplier(result.trial), "sensitivity": 1,
                         "n_train": n_train, "n_validation": n - n_train}
    config.update({"k_distribution": distribution, "validation_fraction": spec.validation_fraction,
                   "noise_multiplier": sigma})
    return result
