"""The board's non-private reference (``dpbench reference``, the grid's ``"reference": true``): the converged
empirical-risk minimizer of a linear classification task's own loss and model, its L2 strength chosen on the
validation track's held-out split.

What is solved: the loss the methods train, the mean of the task's ``per_example_loss`` over the training rows (the
logistic loss on one output for 2 classes, the softmax cross-entropy on K outputs for more), of the task's model
(:class:`~dpbench.tasks.linear.LinearClassification`: a bias unless ``bias=false``, on the task's preprocessed rows,
dense only), plus (λ/2)·‖W‖² on the weights (not the bias). The solver is scikit-learn's ``LogisticRegression``
(L-BFGS, ``C = 1/(λ n)``, whose objective is then the same function), in float64 with gradient tolerance
:data:`TOLERANCE`. A fit counts as converged only when the gradient of the *task's* objective at its solution,
recomputed with the task's ``per_example_loss`` in float64 (PyTorch autograd), has no coordinate above
:data:`CONVERGED`: a solver minimizing another function fails this certificate. A fit that does not converge
refuses the whole reference (:class:`~dpbench.errors.TuningError`, nothing recorded).

Selection, as the validation track's (:mod:`dpbench.tuning.validation`): the same held-out part of the training data
(fraction and seed of :class:`~dpbench.tuning.validation.TrackSettings`, the coins of stream ``validation-split``);
each λ of :data:`L2_GRID` is fitted on the rest (strongest first, each fit starting from the previous solution) and
scored by its exact accuracy on the held-out part (ties: the lower held-out loss, then the stronger λ); the chosen λ
is refitted on all the training data and scored once on the test set, which nothing else reads.

Neither the data (a fixed split) nor the held-out part (the track's seed, not the run's) nor the solver depends on a
seed: the reference is one record (seed 0), whose value the board treats as a constant. Its ``tuning`` (mode
``reference``, not private) holds the grid, split, solver, tolerances and every fit's iterations, gradient, objective
and held-out score, and whether the chosen λ is an end of the grid (``at_grid_edge``: on the large tabular sets
the weakest λ often wins, i.e. the unregularized minimizer); ``dpbench verify`` rechecks the selection from them
(:mod:`dpbench.trust.record_checks`) and solves again with ``--rerun``.
"""
from __future__ import annotations

import hashlib
import math
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpbench import registry
from dpbench.choices import REFERENCE_MODE
from dpbench.errors import TuningError, UsageError
from dpbench.results import store
from dpbench.results.identity import identity
from dpbench.results.records import combined_sha256, file_sha256, provenance, seal
from dpbench.tasks.linear import LinearClassification
from dpbench.tuning.validation import TrackSettings, track_split

#: λ, strongest first (each fit warm-starts the next); the weakest is nearly the unregularized minimizer. Stopping at
#: 1e-6 cost adult 0.2, covertype 0.55 and kddcup99 0.5 points (docs/board.md).
L2_GRID = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8)
TOLERANCE = 1e-10  # L-BFGS's gradient tolerance (scikit-learn's ``tol``: max |projected gradient|)
MAX_ITER = 20_000
CONVERGED = 1e-6  # the largest |coordinate| of the task objective's gradient a converged fit may leave
SOLVER = "scikit-learn LogisticRegression, solver lbfgs (float64)"
OBJECTIVE = "mean of the task's per_example_loss + (l2/2)·||W||² (bias not penalized)"
SELECTED_BY = ("exact accuracy on the validation track's held-out training data (ties: lower held-out loss, then the "
               "stronger l2); not private")


class _Method:
    """Stands for the reference's code in :func:`dpbench.results.records.provenance`: this file, by its hash."""

    name = REFERENCE_MODE


def _code() -> dict[str, Any]:
    path = str(Path(__file__).resolve())
    return {"name": REFERENCE_MODE, "file": "dpbench/tuning/reference.py", "external": False,
            "sha256": combined_sha256({path: file_sha256(path)})}


def canonical_config() -> dict[str, Any]:
    """The configuration of the board's references: :data:`L2_GRID` and the tracks' split (``dpbench verify``
    refuses a reference of any other, which could have been chosen among several by its test accuracy)."""
    return _config(L2_GRID, TrackSettings())


def _config(grid: tuple[float, ...], settings: TrackSettings) -> dict[str, Any]:
    """What decides the reference: part of its record's identity."""
    return {"mode": REFERENCE_MODE, "l2_grid": list(grid), "validation_fraction": settings.fraction,
            "split_seed": settings.seed, "split_stream": "validation-split", "solver": SOLVER,
            "objective": OBJECTIVE, "tolerance": TOLERANCE, "max_iter": MAX_ITER, "converged_gradient": CONVERGED}


def _prepared(task: str, plugins: list[str] | None):
    """The task (prepared under seed 0: its data loaded, its model built), refused unless a linear classifier."""
    tasks = registry.tasks(registry.plugin_dirs(plugins or []))
    if task not in tasks:
        raise UsageError(f"unknown task {task!r}; available: {', '.join(tasks)}")
    if not issubclass(tasks[task], LinearClassification):
        raise UsageError(f"task {task} is not a linear classification task: the reference is defined for those only")
    prepared = tasks[task]()
    if prepared.prepare(0).x_train.layout != torch.strided:
        raise UsageError(f"task {task} has sparse rows: the reference solves dense rows only")
    return prepared


def _certificate(task, x: torch.Tensor, y: torch.Tensor, weight: np.ndarray, bias: np.ndarray | None,
                 l2: float) -> tuple[float, float]:
    """(objective, largest |gradient coordinate|) of the task's objective at (weight, bias) on float64 rows ``x``,
    by autograd."""
    w = torch.tensor(weight, dtype=torch.float64, requires_grad=True)
    b = None if bias is None else torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    outputs = x @ w.T + (0 if b is None else b)
    objective = task.per_example_loss(outputs, y).mean() + 0.5 * l2 * w.pow(2).sum()
    grads = torch.autograd.grad(objective, [w] if b is None else [w, b])
    return float(objective.detach()), max(float(g.abs().max()) for g in grads)


def _scores(task, weight: np.ndarray, bias: np.ndarray | None, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Accuracy and mean loss of the task's own model holding these parameters (the engine's evaluation)."""
    model = task.model
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(weight))
        if model.bias is not None:
            model.bias.copy_(torch.from_numpy(bias))
        metrics = task.per_example_metrics(task(x), y)
    return {name: float(values.double().mean()) for name, values in metrics.items()}


def _fit(task, x: torch.Tensor, y: torch.Tensor, l2: float, start=None) -> tuple[Any, dict[str, Any]]:
    """One L-BFGS solve at ``l2`` on float64 rows ``x`` (from ``start``'s solution, if given); refused unless
    converged."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    estimator = LogisticRegression(C=1 / (l2 * len(y)), tol=TOLERANCE, max_iter=MAX_ITER,
                                   fit_intercept=task.settings["bias"], warm_start=True)
    if start is not None:
        estimator.coef_, estimator.intercept_ = start.coef_.copy(), start.intercept_.copy()
    with warnings.catch_warnings(), threadpool_limits(torch.get_num_threads()):
        warnings.simplefilter("ignore", ConvergenceWarning)  # judged below, by the task's own gradient
        estimator.fit(x.numpy(), y.numpy())
    if not np.array_equal(estimator.classes_, np.arange(task.classes)):
        raise TuningError(f"reference on {task.name}: the training rows hold classes {estimator.classes_.tolist()}, "
                          f"not 0..{task.classes - 1}")
    bias = estimator.intercept_ if task.settings["bias"] else None
    objective, gradient = _certificate(task, x, y, estimator.coef_, bias, l2)
    iterations = int(np.max(estimator.n_iter_))
    if not (gradient <= CONVERGED and iterations < MAX_ITER and math.isfinite(objective)):
        raise TuningError(f"reference on {task.name}: L-BFGS did not converge at l2 = {l2:g} (largest gradient "
                          f"coordinate {gradient:.3g} > {CONVERGED:g} after {iterations} iterations); nothing recorded")
    return estimator, {"l2": l2, "iterations": iterations, "objective": objective, "max_gradient": gradient}


def _parameters(task, estimator) -> tuple[np.ndarray, np.ndarray | None]:
    return estimator.coef_, estimator.intercept_ if task.settings["bias"] else None


def describe(task: str, plugins: list[str] | None = None, grid: tuple[float, ...] = L2_GRID,
             settings: TrackSettings = TrackSettings()) -> str:
    """The :func:`~dpbench.results.identity.identity` the task's reference record would have (loads the data)."""
    prepared = _prepared(task, plugins)
    return identity(_record_fields(prepared, prepared.data, grid, settings))


def _record_fields(task, data, grid: tuple[float, ...], settings: TrackSettings) -> dict[str, Any]:
    fields = provenance(type(task), _Method, data, 0, dict(task.settings), {})
    fields["code"]["method"] = _code()
    fields.update(private=False, epsilon=None, epsilon_target=None, delta=None, neighbouring=None, accountant=None,
                  sampler="exact", noise_multiplier=None, profile=None,
                  tuning={"mode": REFERENCE_MODE, "private": False, "config": _config(grid, settings)})
    return fields


def run(task: str, plugins: list[str] | None = None, grid: tuple[float, ...] = L2_GRID,
        settings: TrackSettings = TrackSettings(), append_to_store: bool = True) -> dict[str, Any]:
    """Solve the task's reference (module docstring) and return its sealed record (stored unless told not to)."""
    if not grid or any(isinstance(l2, bool) or not (isinstance(l2, (int, float)) and math.isfinite(l2) and l2 > 0)
                       for l2 in grid):
        raise UsageError(f"the l2 grid must hold positive finite numbers, got {list(grid)}")
    prepared = _prepared(task, plugins)
    started = time.perf_counter()
    data = prepared.data
    record = _record_fields(prepared, data, tuple(grid), settings)
    held = track_split(settings).mask(data.n_train)
    x_fit, y_fit = data.x_train[~held].double(), data.y_train[~held]
    x_held, y_held = data.x_train[held], data.y_train[held]
    fits, previous, estimators = [], None, {}
    for l2 in sorted(grid, reverse=True):
        previous, fit = _fit(prepared, x_fit, y_fit, l2, previous)
        held_out = _scores(prepared, *_parameters(prepared, previous), x_held, y_held)
        fits.append({**fit, "validation_accuracy": held_out["accuracy"], "validation_loss": held_out["loss"]})
        estimators[l2] = previous
    best = max(fits, key=lambda fit: (fit["validation_accuracy"], -fit["validation_loss"], fit["l2"]))
    del x_fit
    final, refit = _fit(prepared, data.x_train.double(), data.y_train, best["l2"], estimators[best["l2"]])
    test = _scores(prepared, *_parameters(prepared, final), data.x_test, data.y_test)
    record["hyperparameters"] = {**record["hyperparameters"], "l2": best["l2"]}
    record["tuning"].update(selected_by=SELECTED_BY, selected_params={"l2": best["l2"]},
                            selected_score=best["validation_accuracy"], fits=fits, refit=refit,
                            validation_rows=int(held.sum()), at_grid_edge=best["l2"] in (min(grid), max(grid)))
    record.update(metrics={"test_accuracy": test["accuracy"], "test_loss": test["loss"]},
                  train_seconds=time.perf_counter() - started, threads=torch.get_num_threads(),
                  weights_sha256=_weights_hash(final))
    seal(record)
    if append_to_store:
        store.append(record)
    return record


def _weights_hash(estimator) -> str:
    """sha256 of the solution's float64 bytes (weights, then bias): which minimizer, to compare reruns on one
    machine (another BLAS may move the last bits)."""
    return hashlib.sha256(np.ascontiguousarray(estimator.coef_).tobytes()
                          + np.ascontiguousarray(estimator.intercept_).tobytes()).hexdigest()


def summary(record: dict[str, Any]) -> str:
    """What ``dpbench reference`` prints."""
    tuning = record["tuning"]
    fits = ", ".join(f"{fit['l2']:g}: {fit['validation_accuracy']:.4f} ({fit['iterations']} it.)"
                     for fit in tuning["fits"])
    edge = " (an end of the grid: a wider grid may choose otherwise)" if tuning["at_grid_edge"] else ""
    return (f"reference on {record['task']} (data {record['data_id']}, n = {record['n_train']:,}): "
            f"{SOLVER}, l2 chosen {tuning['selected_params']['l2']:g}{edge}\n"
            f"  held-out accuracy by l2 ({tuning['validation_rows']:,} rows): {fits}\n"
            f"  refit on all training rows: {tuning['refit']['iterations']} iterations, largest gradient coordinate "
            f"{tuning['refit']['max_gradient']:.2g}\n"
            f"  test accuracy {record['metrics']['test_accuracy']:.4f}, test loss {record['metrics']['test_loss']:.4f}"
            f" in {record['train_seconds']:.1f} s\n  run {record['run_id']}")
