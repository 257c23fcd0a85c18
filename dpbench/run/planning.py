"""Planning a gradient method's run, before any training step: the spec checked against the method, task and budget,
the data loaded under the seed, the sampler chosen, σ calibrated to the target ε (with a count release, the pair σ,
σ_b whose combined Gaussian meets it, checked as :func:`dpbench.run.engine.finish` will charge it), and the record's
fields known before training (:class:`PlannedRun`). :mod:`dpbench.run.engine` trains what this plans.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from dpbench import registry, threads
from dpbench.choices import CLIPPING, GAUSSIAN_SAMPLERS as NOISE
from dpbench.data import rows, stages
from dpbench.errors import RegistryError, UsageError
from dpbench.method import Method, ReleaseMethod
from dpbench.privacy import correlated, guards, streams
from dpbench.privacy.accounting import (COUNT_SENSITIVITY, SAMPLERS, GaussianReleases, calibrate_noise_multiplier,
                                        check_relation, combined_noise_multiplier, default_relation, event_fields,
                                        gradient_noise_multiplier)
from dpbench.privacy.clipping import VmapClipper, check_gamma
from dpbench.privacy.sampling import CyclicSampler, PoissonSampler, ShuffleSampler
from dpbench.release import runner
from dpbench.results import records
from dpbench.results.identity import identity
from dpbench.run import isolation, refusals
from dpbench.run.training import PrivateTraining
from dpbench.spec import BUDGET_KEYS, RunSpec, profile_settings, resolve_hyperparameters
from dpbench.task import Task, TaskData


def _takes_noise_multiplier(count_noise_std: Callable) -> bool:
    """Whether a method's ``count_noise_std`` takes the gradient's σ as a third argument."""
    parameters = list(inspect.signature(count_noise_std).parameters.values())
    return len(parameters) >= 3 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


def _count_calibrated(combined: float, count_extra) -> tuple[float, tuple[tuple[float, float], ...]]:
    """The gradient's σ and the count release that together make noise multiplier ``combined``, where the count's
    noise may depend on σ (``count_extra(σ)``): the fixed point of σ ← gradient_noise_multiplier(z, count_extra(σ)),
    from σ = z (one step where the count's noise is fixed), then raised by ulps (at most 64) until the pair is not
    below z; UsageError where that does not get there (a plugin's σ_b rule with no fixed point near z)."""
    sigma = combined
    for _ in range(200):
        new = gradient_noise_multiplier(combined, count_extra(sigma))
        if abs(new - sigma) <= 1e-15 * sigma:
            sigma = max(new, sigma)
            break
        sigma = new
    for _ in range(64):
        extra = count_extra(sigma)  # once: the pair checked is the pair returned
        if combined_noise_multiplier(sigma, extra) >= combined:
            return sigma, extra
        sigma = math.nextafter(sigma, math.inf)
    raise UsageError(f"the count release's noise rule has no fixed point near the noise multiplier {combined:.6g}: "
                     f"its σ_b must not jump with the gradient's σ")

def over_target(spent: float, target: float) -> bool:
    """Whether ``spent`` exceeds the ε ``target``, beyond a relative 1e-9 for floating-point noise: what
    :func:`finish` refuses a run for."""
    return spent > target * (1 + 1e-9)


def _meets_target(combined: float, count_extra, target: float, charged_epsilon: Callable[[float], float],
                  tries: int = 8) -> tuple[float, tuple[tuple[float, float], ...], float]:
    """The gradient's σ, the count release (``()`` where ``count_extra`` is None) and the noise multiplier they were
    solved for (the record's ``combined_noise_multiplier``): from the calibrated ``combined``, checked with the
    computation :func:`finish` charges, ``charged_epsilon`` of the pair's combined multiplier not
    :func:`over_target`. Where it is, ``combined`` rises by steps of 1e-4 relative. The pair combines
    to ``combined`` plus some ulps, and the PLD's ε is not monotone at that scale: quantile_clip on adult, ε = 0.1,
    80 epochs of batches of 256 (z = 81.76374109330388) spends 0.09999996 at z and 0.10000001 one ulp above, a run
    :func:`finish` refused after training. ValueError if ``tries`` steps do not meet the target."""
    calibrated = combined
    for _ in range(tries):
        sigma, extra = _count_calibrated(combined, count_extra) if count_extra else (combined, ())
        if not over_target(charged_epsilon(combined_noise_multiplier(sigma, extra) if extra else sigma), target):
            return sigma, extra, combined
        combined *= 1 + 1e-4
    raise ValueError(f"calibration failed: no noise multiplier within {tries} steps of 1e-4 above the calibrated "
                     f"{calibrated:.6g} meets ε = {target:g}")


def charged_noise_multiplier(record: dict[str, Any]) -> float:
    """The noise multiplier a gradient record's releases are charged at: its gradient's σ, combined with the extra
    releases each step makes on the same batch (:func:`dpbench.privacy.accounting.combined_noise_multiplier`)."""
    extra = tuple((part["sensitivity"], part["noise_std"]) for part in record.get("extra_releases") or ())
    return combined_noise_multiplier(record["noise_multiplier"], extra) if extra else record["noise_multiplier"]


@dataclass
class PlannedRun:
    """A gradient-method run decided and calibrated, before any training step: what :func:`plan` returns."""

    spec: RunSpec
    method: type[Method]
    task: Task
    data: TaskData
    hp: dict[str, Any]
    sampler: PoissonSampler | ShuffleSampler | CyclicSampler
    steps_per_epoch: int
    delta: float
    data_releases: tuple  # the events of the task's private data releases, charged with the training
    record: dict[str, Any]  # the record's fields known before training
    held_out: Any = None  # a tuning trial's validation part, as its ``spec.validation.split`` returned it
    correlation: Any = None  # the method's noise correlation (dpbench.privacy.correlated), None for independent noise

    def releases_charged(self, count: int) -> GaussianReleases:
        """The mechanism run after ``count`` noisy gradients (plus the task's data releases)."""
        return GaussianReleases(self.record["sample_rate"], charged_noise_multiplier(self.record), count,
                                self.record["sampler"], self.steps_per_epoch * self.method.releases_per_step,
                                self.data_releases, self.record["neighbouring"] or "add-remove",
                                *correlated_fields(self.correlation))

    def module(self, epsilon_so_far: Callable[[int], float] | None = None) -> PrivateTraining:
        clipper = VmapClipper() if self.spec.clipping == "reference" and self.method.private else None
        count = (self.record.get("extra_releases") or [{}])[0].get("noise_std")
        return PrivateTraining(self.task, self.method, self.hp, self.record["noise_multiplier"],
                               self.record["sample_rate"] * self.data.n_train, self.spec.seed, clipper=clipper,
                               steps_per_epoch=self.steps_per_epoch, epsilon_so_far=epsilon_so_far,
                               noise=self.spec.noise, isolate=self.spec.isolate, count_noise_std=count,
                               correlation=self.correlation)


def correlated_fields(correlation: Any) -> tuple[int, bool]:
    """(bands, tree) of :class:`~dpbench.privacy.accounting.GaussianReleases` for a noise correlation: (b, False)
    banded, (0, True) tree, (0, False) independent noise."""
    return getattr(correlation, "bands", 0), isinstance(correlation, correlated.Tree)


def registered(method: str, task: str, plugins: list[str], isolate: bool = False) -> tuple[type[Method], type[Task]]:
    """The method and task classes of these names (plugin folders included); unknown names are refused.

    ``isolate``: this process never imports the plugin folders: a plugin method is described by a spawned process
    (:func:`dpbench.run.isolation.describe`), and tasks come from dpbench only: installed packages' entry points are
    not loaded either, as their module code would run here."""
    plugin_dirs = registry.plugin_dirs(plugins)
    if isolate:
        methods, tasks = registry.methods([], installed=False), registry.tasks([], installed=False)
        if task not in tasks:
            raise UsageError(f"unknown task {task!r} with --isolate (plugin folders' and installed packages' tasks are "
                             f"not loaded: the training process never imports plugin code); available: "
                             f"{', '.join(tasks)}")
        if method in methods:
            return methods[method], tasks[task]
        return isolation.describe(method, plugin_dirs), tasks[task]
    methods, tasks = registry.methods(plugin_dirs), registry.tasks(plugin_dirs)
    if method not in methods:
        raise UsageError(f"unknown method {method!r}; available: {', '.join(methods)}")
    if task not in tasks:
        raise UsageError(f"unknown task {task!r}; available: {', '.join(tasks)}")
    return methods[method], tasks[task]


def describe_record(spec: RunSpec) -> dict[str, Any]:
    """The record's fields a run of ``spec`` would have before training, without training or calibrating."""
    method, task_class = registered(spec.method, spec.task, spec.plugins)
    if issubclass(method, ReleaseMethod):
        return runner.describe(spec, method, task_class)
    return plan(spec, calibrate=False).record


def describe(spec: RunSpec) -> str:
    """The :func:`~dpbench.results.identity.identity` a run of ``spec`` would record, without training or
    calibrating."""
    return identity(describe_record(spec))


def plan(spec: RunSpec, calibrate: bool = True,
         replace_rows: Callable[[Task], TaskData] | None = None) -> PlannedRun:
    """Check ``spec``, load the data, build the model under the seed, choose the sampler and calibrate σ (not with
    ``calibrate=False``: then the record's noise multiplier is None). ``replace_rows``: called with the prepared
    task before anything reads its data, returns the data to train on instead (``dpbench.trust.audit``: as many rows,
    some of them its canaries)."""
    refusals.check_isolation(spec)
    method, task_class = registered(spec.method, spec.task, spec.plugins, spec.isolate)
    if issubclass(method, ReleaseMethod):
        raise UsageError(f"{method.name} releases through dpbench.release, not by gradient steps")
    profiled = profile_settings(task_class, method.name, spec.profile)
    budget = {key: value for key, value in profiled.items() if key in BUDGET_KEYS}
    if method.private and spec.epsilon is None and spec.noise_multiplier is None:  # the profile's budget
        spec = replace(spec, epsilon=budget.get("epsilon"), noise_multiplier=budget.get("noise_multiplier"))
    if spec.delta is None and "delta" in budget:
        spec = replace(spec, delta=budget["delta"])
    if method.private and spec.neighbouring is None and "neighbouring" in profiled:  # a budget's relation
        spec = replace(spec, neighbouring=profiled["neighbouring"])
    refusals.check_run_budget(spec, method)
    if spec.secret_seed:
        refusals.check_secret_seed(spec)
        spec = replace(spec, seed=streams.secret_seed())
    if spec.clipping not in CLIPPING:
        raise UsageError(f"unknown clipping {spec.clipping!r}; choose one of {', '.join(CLIPPING)}")
    if spec.noise not in NOISE:
        raise UsageError(f"unknown noise sampler {spec.noise!r}; choose one of {', '.join(NOISE)}")
    sampler_name = spec.sampler or method.default_sampler
    refusals.check_devices(spec, method, sampler_name)
    refusals.check_adaptive(spec, method)
    if sampler_name not in SAMPLERS:
        raise UsageError(f"unknown sampler {sampler_name!r}; choose one of {', '.join(SAMPLERS)}")
    if method.full_batch and "batch_size" in spec.overrides:
        raise UsageError(f"{method.name} uses full batches: it takes no batch size")
    if method.clip_to_task_bound and "clip" in spec.overrides:
        raise UsageError(f"{method.name} scales its noise to the task's gradient norm bound: it takes no clip")
    hp, options = resolve_hyperparameters(method, task_class, spec.overrides, spec.profile)
    correlation = refusals.check_correlation(spec, method, hp, sampler_name)
    if isinstance(correlation, correlated.Tree) and spec.accountant != "rdp":
        # dp-accounting composes its tree-aggregation event with its RDP accountant only; the record says "rdp" (no
        # warning: a refusal later in planning must stay one line on stderr)
        spec = replace(spec, accountant="rdp")

    neighbouring = spec.neighbouring or default_relation(sampler_name)
    if method.private:
        try:
            check_relation(spec.accountant, sampler_name, neighbouring)
        except ValueError as error:
            raise UsageError(str(error)) from None
    elif spec.neighbouring is not None:
        raise UsageError(f"{method.name} is not private: it takes no --neighbouring")

    streams.seed_run(spec.seed)
    try:
        task = task_class(**options)
    except ValueError as error:
        raise UsageError(f"task {task_class.name}: {error}") from None
    threads.fit()  # one thread (or the user's count) before PyTorch does any work: dpbench/threads.py
    with stages.training_epochs(hp["epochs"]):  # the preparation's progress estimates the training too
        data = task.prepare(spec.seed)
    declared = [event_fields(event) for event in task_class.private_release_events(task.settings)]
    if [event_fields(release.event) for release in data.private_releases] != declared:
        raise guards.PrivacyCheckFailed(
            f"task {task_class.name} released {[release.description for release in data.private_releases]} from its "
            f"training data, but declares {declared} for its options (Task.private_release_events)")
    if replace_rows is not None:
        data = task.data = replace_rows(task)
    stated = task_class.min_train_examples
    if stated is not None and options == task_class.options and data.n_train < stated:
        raise RegistryError(f"task {task_class.name} states min_train_examples = {stated}, but its data has "
                            f"{data.n_train} training examples: the refusal of delta >= 1/n read a wrong bound")
    if data.x_train.is_sparse:
        refusals.check_sparse(task, method, spec)
    if method.private:
        guards.refuse_example_mixing(task, rows.first(data.x_test, 3))
    held_out = None
    if spec.validation is not None:  # a tuning trial trains on the training part only
        data, held_out = spec.validation.split(data)
        task.data = data
    n = data.n_train
    if method.full_batch:
        hp["batch_size"] = n
    elif "sample_rate" in profiled and "batch_size" not in spec.overrides:  # a profile's q (Yu et al.: 0.1)
        hp["batch_size"] = max(1, round(profiled["sample_rate"] * n))
    if method.clip_to_task_bound:
        bound = task.gradient_norm_bound()
        if bound is None:
            raise UsageError(f"{method.name} needs a proven bound on per-example gradient norms, "
                             f"which task {task_class.name} does not have")
        hp["clip"] = bound
    if method.private and method.fixed_clip is not None:
        if "clip" in spec.overrides:
            raise UsageError(f"{method.name} fixes its clip norm at C = {method.fixed_clip:g}: it takes no clip")
        hp["clip"] = float(method.fixed_clip)
    if method.private and method.clipping == "automatic":
        try:
            check_gamma(hp.get("gamma"))
        except ValueError as error:
            raise UsageError(f"{method.name}: {error}") from None
    batch_size, per_step = hp["batch_size"], method.releases_per_step
    threads.fit(sum(p.numel() for p in task.model.parameters() if p.requires_grad), batch_size)
    if batch_size * per_step > n:
        raise UsageError(f"batch size {batch_size} (x{per_step} batches per step) exceeds the {n} training examples")
    sample_rate = batch_size / n
    # Isolated, the method may know the public seed (it is on the command line): the batches, whose secrecy the
    # amplification by subsampling assumes, then come from a secret of this process's, never written.
    sampler_seed = streams.secret_seed() if spec.isolate and method.private else spec.seed
    if sampler_name == "poisson":
        steps_per_epoch = max(1, round(n / (batch_size * per_step)))
        sampler = PoissonSampler(n, sample_rate, steps_per_epoch, per_step, sampler_seed)
    elif sampler_name == correlated.SAMPLER:  # correlated noise (refusals.check_correlation: only with it)
        sampler = CyclicSampler(n, batch_size, sampler_seed)
        steps_per_epoch = len(sampler)
        try:
            correlated.check_sampler(getattr(correlation, "bands", 1), steps_per_epoch)
        except ValueError as error:
            raise UsageError(f"{method.name}: {error}") from None
    else:
        sampler = ShuffleSampler(n, batch_size, per_step, sampler_seed)
        steps_per_epoch = len(sampler)
    planned_releases = hp["epochs"] * steps_per_epoch * per_step

    delta = spec.delta if spec.delta is not None else task_class.defaults.get("delta", 1 / n**2)
    if method.private and delta >= 1 / n and not spec.force_delta:
        raise UsageError(f"delta={delta:g} is not below 1/n = {1 / n:g} for n={n}: such a delta allows releasing "
                         f"an example outright; pass --force-delta to run anyway")
    data_releases = tuple(release.event for release in data.private_releases) if method.private else ()
    bands, tree = correlated_fields(correlation)
    target_epsilon = spec.epsilon
    sigma = 0.0
    # A count release on each gradient release's batch (Method.count_release): (sensitivity ½, noise std σ_b),
    # charged with the gradient as one Gaussian of noise multiplier combined_noise_multiplier(σ, extra).
    # σ_b may depend on the gradient's σ (Method.count_noise_std): then σ is the fixed point below.
    extra: tuple[tuple[float, float], ...] = ()

    # a count_noise_std of two arguments (the contract before σ_b could depend on σ) is not given σ
    takes_sigma = method.private and method.count_release and _takes_noise_multiplier(method.count_noise_std)

    def count_extra(gradient_sigma: float | None) -> tuple[tuple[float, float], ...]:
        try:
            count_std = (method.count_noise_std(hp, sample_rate * n, gradient_sigma) if takes_sigma else
                         method.count_noise_std(hp, sample_rate * n))
        except ValueError as error:  # a bad ``--set count_noise=...``: one line, not a traceback
            raise UsageError(f"{method.name}: {error}") from None
        if isinstance(count_std, bool) or not isinstance(count_std, (int, float)) or not 0 < count_std < math.inf:
            raise UsageError(f"{method.name}: the count release's noise std must be finite and positive, got "
                             f"{count_std!r}")
        return ((COUNT_SENSITIVITY, float(count_std)),)

    def spent(z: float) -> float:  # the ε of the planned releases at noise multiplier z, as finish charges it
        return GaussianReleases(sample_rate, z, planned_releases, sampler_name, steps_per_epoch * per_step,
                                data_releases, neighbouring, bands, tree).epsilon(delta, spec.accountant)

    if method.private and method.count_release:
        extra = count_extra(spec.noise_multiplier)
    combined = None
    if method.private:
        if spec.noise_multiplier is not None:
            sigma = spec.noise_multiplier
            try:
                if spec.noise_is_combined and extra:
                    sigma, extra = _count_calibrated(spec.noise_multiplier, count_extra)
                combined = combined_noise_multiplier(sigma, extra) if extra else sigma
                if spec.noise_is_combined and combined < spec.noise_multiplier:  # the trial's Gaussian, at least
                    raise ValueError(f"the gradient and count noise combine to {combined!r}, below the noise "
                                     f"multiplier {spec.noise_multiplier!r} they were solved for")
                if calibrate:  # the ε the run will report, now rather than after training (the same, cached)
                    spent(combined)
            except ValueError as error:
                raise UsageError(f"task {task_class.name}: {error}") from None
        else:
            target_epsilon = target_epsilon if target_epsilon is not None else task_class.defaults.get("epsilon", 1.0)
            sigma = None
        if sigma is None and calibrate:
            try:
                combined = calibrate_noise_multiplier(target_epsilon, delta, sample_rate, planned_releases,
                                                      spec.accountant, sampler_name, steps_per_epoch * per_step,
                                                      data_releases, neighbouring, bands, tree)
                sigma, extra, combined = _meets_target(combined, count_extra if extra else None, target_epsilon,
                                                       spent)
            except ValueError as error:
                raise UsageError(f"task {task_class.name}: {error}") from None

    record = {  # known before training; W&B gets it as the run's configuration
        **records.provenance(task_class, method, data, "secret" if spec.secret_seed else spec.seed, hp | options,
                             spec.overrides),
        "profile": spec.profile,
        "private": method.private,
        "epsilon_target": target_epsilon if method.private else None,
        "delta": delta if method.private else None,
        **({"delta_forced": True} if method.private and delta >= 1 / n else {}),  # --force-delta (verify reads it)
        "neighbouring": neighbouring if method.private else None,
        "noise_multiplier": sigma,
        "sample_rate": sample_rate,
        "accountant": spec.accountant if method.private else None,
        "sampler": sampler_name,
        "data_releases": [release.description for release in data.private_releases],
        "data_release_events": [event_fields(release.event) for release in data.private_releases],
        **({"extra_releases": [{"what": "count Σ_i (1[‖g_i‖ ≤ C_t] − 1/2) of each gradient release's batch",
                                "sensitivity": s, "noise_std": std} for s, std in extra],
            "combined_noise_multiplier": combined} if extra else {}),
        # banded noise: what verify recomputes the sensitivity and ε from (dpbench.privacy.correlated)
        **({"noise_correlation": correlated.describe(correlation, hp["epochs"], steps_per_epoch)}
           if correlation is not None else {}),
        "isolation": "process" if spec.isolate else "in-process",  # dpbench.run.isolation; the board's plugin marks
        **({"noise_coins": "secret", "sampler_coins": "secret"} if spec.isolate and method.private else {}),
    }
    record["code"]["method"] = isolation.code_of(method)
    return PlannedRun(spec, method, task, data, hp, sampler, steps_per_epoch, delta, data_releases, record, held_out,
                      correlation)
