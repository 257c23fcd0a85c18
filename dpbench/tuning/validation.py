"""The leaderboard's ``validation`` track: every method tuned alike, selected on held-out training data.

For one cell (task, method, ε): ``trials`` configurations (16 on the board) are drawn from the method's ``search_space``
plus the task's ``search_lists`` (epochs and batch size for minibatch methods, full-batch steps for full-batch ones; the
same lists for every method of a task), spread evenly over the space (a scrambled Sobol sequence,
:func:`dpbench.tuning.search.spread_draws`: random draws left most of DP-GD's adult space unvisited). Each configuration
trains ``trial_seeds`` times (2; other seeds) at the cell's ε on the training part of a fixed split of the *training*
data (10% held out by coins from stream ``validation-split`` of the track seed) and is scored by the mean of its exact
accuracies on the held-out part (one seed's score let an unstable configuration win on one lucky run and lose on the
final seeds); the test set is never looked at. The best configuration (ties: the first drawn) is then trained on the
whole training set with each of the cell's seeds and evaluated on the test set. Every run's ε is accounted as always;
the selection is not charged (the papers' protocol, made equal for every method), and each record's ``tuning`` says so.
Trials that share a schedule train as one batched computation where :mod:`dpbench.run.multiseed` applies, with the
records of separate runs.

A trial the method refuses (e.g. output perturbation's convex bound with a learning rate above 2/β) is charged
nothing, never wins, and counts as one of the ``trials``: the budget is the same for every method.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from dpbench.errors import UsageError
from dpbench.method import Method, ReleaseMethod
from dpbench.privacy import streams
from dpbench.results.identity import identity
from dpbench.run import multiseed, planning
from dpbench.spec import RunSpec
from dpbench.task import Task
from dpbench.tuning import search
from dpbench.tuning.accounting import ValidationSplit

NOT_CHARGED = "exact accuracy on held-out training data; the selection is not charged to ε"


@dataclass(frozen=True)
class TrackSettings:
    trials: int = 16
    fraction: float = 0.1  # of the training data held out for selection
    seed: int = 0  # the split, the draws of the configurations and the trials' seeds
    trial_seeds: int = 2  # runs of each configuration, their held-out accuracies averaged


def track_split(settings: TrackSettings) -> ValidationSplit:
    """The held-out part the track selects on (and :mod:`dpbench.tuning.reference` too): exact scores."""
    return ValidationSplit(settings.fraction, settings.seed, 0.0, 0, purpose="validation-split")


def search_space(method: type[Method], task: type[Task]) -> dict[str, dict[str, Any]]:
    """The method's own search space plus the task's shared lists (see the module docstring)."""
    space = dict(method.search_space)
    lists = task.search_lists
    if method.full_batch:
        keys = {"epochs": "steps"}
    elif issubclass(method, ReleaseMethod) and "epochs" not in method.defaults:
        keys = {}  # objective perturbation: no epochs, no batches
    else:
        keys = {"epochs": "epochs", "batch_size": "batch_size"}
    for name, list_name in keys.items():
        if list_name in lists:
            space[name] = {"type": "categorical", "choices": list(lists[list_name])}
    return space


def _config(space: dict[str, dict[str, Any]], settings: TrackSettings) -> dict[str, Any]:
    """What decides the track's selection: part of its records' identity."""
    return {"mode": "validation", "trials": settings.trials if space else 0, "search_space": space,
            "search": "sobol", "trial_seeds": settings.trial_seeds, "validation_fraction": settings.fraction,
            "seed": settings.seed}


def run_cell(task: str, method: str, epsilon: float | None, seeds: list[int], settings: TrackSettings = TrackSettings(),
             neighbouring: str | None = None, plugins: list[str] | None = None,
             on_done: Callable[[int], None] | None = None,
             fixed: dict[str, Any] | None = None, append_to_store: bool = True) -> list[dict[str, Any]]:
    """The validation track of one cell: its trials, then the selected configuration with every seed (stored unless
    ``append_to_store`` is False). ``fixed``: hyperparameters set for every trial and run, outside the search (e.g.
    ADADP's ``variant``)."""
    [found] = run_cells(task, method, [(epsilon, seeds)], settings, neighbouring, plugins, on_done, fixed,
                        append_to_store)
    if isinstance(found, UsageError):
        raise found
    return found


def run_cells(task: str, method: str, budgets: list[tuple[float | None, list[int]]],
              settings: TrackSettings = TrackSettings(), neighbouring: str | None = None,
              plugins: list[str] | None = None, on_done: Callable[[int], None] | None = None,
              fixed: dict[str, Any] | None = None,
              append_to_store: bool = True) -> list[list[dict[str, Any]] | UsageError]:
    """:func:`run_cell` for the cells of one method on one task at several ε (``budgets``: each ε with its seeds),
    their runs trained together: every ε tries the same configurations with the same trial seeds, so the trials of
    all ε train as one batch, then the selected configurations' final runs as another (on digits, DP-SGD's 160
    trials of five ε took 38 s together and 101 s cell by cell; records identical). Per ε, its records or the
    refusal that stopped it."""
    plugins, fixed = plugins or [], fixed or {}
    method_class, task_class = planning.registered(method, task, plugins)
    space = {name: value for name, value in search_space(method_class, task_class).items() if name not in fixed}
    drawn = search.spread_draws(space, settings.trials, settings.seed, "validation-search") if space else [{}]
    config = {**_config(space, settings), **({"fixed": fixed} if fixed else {})}
    common = dict(method=method, task=task, neighbouring=neighbouring, plugins=plugins, progress_bar=False,
                  no_wandb=True)
    outcomes: list[list[dict[str, Any]] | UsageError] = [[] for _ in budgets]
    selections: list[tuple[dict[str, Any], float | None]] = [({}, None)] * len(budgets)
    if space:
        split = track_split(settings)
        repeats = settings.trial_seeds
        per_budget = len(drawn) * repeats
        trials = [RunSpec(**common, epsilon=epsilon, seed=streams.child_seed(settings.seed, "validation-trial", index,
                                                                             repeat),
                          overrides={**fixed, **params}, validation=split, append_to_store=False)
                  for epsilon, _ in budgets for index, params in enumerate(drawn) for repeat in range(repeats)]
        found = multiseed.run_many(trials, on_done)
        for at in range(len(budgets)):
            scored = []
            for index in range(len(drawn)):
                runs = found[at * per_budget + index * repeats:at * per_budget + (index + 1) * repeats]
                score = (-math.inf if any(record is None for record in runs)
                         else sum(record["validation"]["accuracy"] for record in runs) / repeats)
                scored.append((score, -index, index))
            best = max(scored)
            if best[0] == -math.inf:
                outcomes[at] = UsageError(f"every one of the {settings.trials} trials of {method} on {task} was "
                                          f"refused")
            else:
                selections[at] = drawn[best[2]], best[0]
    finals, owners = [], []
    for at, (epsilon, seeds) in enumerate(budgets):
        if isinstance(outcomes[at], UsageError):
            continue
        selected, score = selections[at]
        tuning = {"mode": "validation", "private": False, "selected_by": NOT_CHARGED, "selected_params": selected,
                  "selected_score": score, "config": config}
        finals += [RunSpec(**common, epsilon=epsilon, seed=seed, overrides={**fixed, **selected}, tuning=tuning,
                           append_to_store=append_to_store) for seed in seeds]
        owners += [at] * len(seeds)
    for at, record in zip(owners, multiseed.run_many(finals)):
        if isinstance(outcomes[at], UsageError):
            continue
        if record is None:
            outcomes[at] = UsageError(f"{method} on {task} refused its selected configuration {selections[at][0]}")
        else:
            outcomes[at].append(record)
    if on_done:
        on_done(len(finals))
    return outcomes


def describe(task: str, method: str, epsilon: float | None, settings: TrackSettings = TrackSettings(),
             neighbouring: str | None = None, plugins: list[str] | None = None) -> str:
    """The :func:`dpbench.results.identity.identity` the cell's records would have, without running anything."""
    plugins = plugins or []
    method_class, task_class = planning.registered(method, task, plugins)
    config = _config(search_space(method_class, task_class), settings)
    spec = RunSpec(method=method, task=task, epsilon=epsilon, neighbouring=neighbouring, plugins=plugins,
                   tuning={"config": config})
    planned = planning.describe_record(spec)
    return identity({**planned, "tuning": {"config": config}})
