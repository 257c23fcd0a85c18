"""``dpbench sweep``: run a declared grid (tasks × methods × ε × seeds) resumably, skipping runs already stored.

A grid is a JSON file ``{"tasks": [...], "methods": [...], "epsilons": [...], "seeds": N}``; non-private methods
run once per seed, not once per ε. Runs execute in this process, each as ``dpbench run`` would (default
hyperparameters, default δ, sampler and accountant); the seeds of a cell train as one batched computation where
:mod:`dpbench.multiseed` applies, with the same results as separate runs. A (task, method) pair the
engine refuses (e.g. ``norm_bound`` on a task without a gradient bound) is reported and skipped.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from dpbench import engine, multiseed, registry, store
from dpbench.engine import RunSpec, UsageError


def _done(records: list[dict[str, Any]]) -> set[tuple]:
    """(task, method, target ε, seed) of the stored runs that used default settings (no tuning, no overrides)."""
    return {(r["task"], r["method"], r["epsilon_target"], r["seed"]) for r in records
            if r.get("tuning") is None and not r.get("overrides")}


def planned_runs(grid: dict[str, Any]) -> list[tuple[str, str, float | None, int]]:
    methods = registry.methods()
    runs = []
    for task in grid["tasks"]:
        for method in grid["methods"]:
            budgets = grid["epsilons"] if methods[method].private else [None]
            runs += [(task, method, epsilon, seed) for epsilon in budgets for seed in range(grid["seeds"])]
    return runs


def _pending_groups(runs, done):
    """The planned runs not yet stored, as {(task, method, ε): [seeds]} in plan order."""
    groups: dict[tuple[str, str, float | None], list[int]] = {}
    for task, method, epsilon, seed in runs:
        if (task, method, epsilon, seed) not in done:
            groups.setdefault((task, method, epsilon), []).append(seed)
    return groups


def run_grid(grid: dict[str, Any]) -> dict[str, int]:
    """Run every planned run not yet in the store; returns counts of runs done, skipped and refused.

    The seeds of one (task, method, ε) cell train together as one batched run where :mod:`dpbench.multiseed`
    applies (linear models, plain private methods), else one after the other.
    """
    known_methods, known_tasks = registry.methods(), registry.tasks()
    unknown = [m for m in grid["methods"] if m not in known_methods] + [t for t in grid["tasks"] if t not in known_tasks]
    if unknown:
        raise UsageError(f"unknown methods or tasks in the grid: {', '.join(unknown)}")
    runs = planned_runs(grid)
    groups = _pending_groups(runs, _done(store.load()))
    counts = {"ran": 0, "already stored": len(runs) - sum(map(len, groups.values())), "refused": 0}
    refused: set[tuple[str, str]] = set()
    started = time.perf_counter()
    for (task, method, epsilon), seeds in groups.items():
        if (task, method) in refused:
            counts["refused"] += len(seeds)
            continue
        spec = RunSpec(method=method, task=task, epsilon=epsilon, progress_bar=False)
        try:
            try:
                finished = multiseed.run_seeds(spec, seeds)
            except multiseed.NotBatchable:
                finished = [engine.run(replace(spec, seed=seed)) for seed in seeds]
        except UsageError as error:
            print(f"sweep: {method} on {task} refused: {error}", file=sys.stderr)
            refused.add((task, method))
            counts["refused"] += len(seeds)
            continue
        counts["ran"] += len(finished)
        for record in finished:
            metric = next(iter(record["metrics"].items()))
            print(f"[{counts['ran'] + counts['already stored']}/{len(runs)} {time.perf_counter() - started:.0f}s] "
                  f"{task} {method} eps={epsilon} seed={record['seed']}: {metric[0]}={metric[1]:.4f} "
                  f"({record['train_seconds']:.1f}s)", file=sys.stderr, flush=True)
    return counts


def load_grid(path: str) -> dict[str, Any]:
    try:
        grid = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(f"cannot read grid {path}: {error}") from None
    missing = {"tasks", "methods", "epsilons", "seeds"} - set(grid)
    if missing:
        raise UsageError(f"grid {path} lacks {', '.join(sorted(missing))}")
    return grid
