"""A run of a one-shot release method (output or objective perturbation): the spec resolved, the data loaded and
clipped, the mechanism of :mod:`dpbench.release.mechanisms` applied, and the record written with its ledger.
"""
from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import Any

import torch

from dpbench import threads
from dpbench.checks import check_seed
from dpbench.data import rows
from dpbench.errors import UsageError
from dpbench.method import ReleaseMethod
from dpbench.privacy import streams
from dpbench.release.mechanisms import (NEIGHBOURS, OutputPerturbationMethod, approximate_minima_perturbation, clip_rows,
                                        design, output_perturbation)
from dpbench.results import records, store, tracking
from dpbench.spec import RunSpec, apply_overrides, profile_settings
from dpbench.task import Task


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
        raise UsageError(f"{name} is accounted by its release mechanism (see dpbench/release/mechanisms.py); "
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
    threads.fit()  # one thread (or the user's count): linear models (dpbench/threads.py)
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
    """The identity fields (``identity.IDENTITY_FIELDS``) a run of ``spec`` would record, without training."""
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
    x = clip_rows(design(data.x_train, with_bias), method.input_norm, in_place=True)
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
        **({"delta_forced": True} if spent_delta >= 1 / n else {}),  # --force-delta (verify reads it)
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
