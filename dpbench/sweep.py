"""``dpbench sweep``: run a declared grid (tasks × methods × ε × seeds) resumably, skipping runs already stored.

A grid is a JSON file ``{"tasks": [...], "methods": [...], "epsilons": [...], "seeds": N}``; non-private methods
run once per seed, not once per ε. Runs execute in this process (or in ``--workers`` processes), each as
``dpbench run`` would (default hyperparameters, default δ, sampler and accountant); the seeds of a cell train as
one batched computation where :mod:`dpbench.multiseed` applies, with the same results as separate runs. The
full-data methods, the grid's longest jobs, start first (:func:`jobs`), so that the workers end together. A
(task, method) pair the engine refuses (e.g. ``norm_bound`` on a task without a gradient bound) is reported and
skipped.
"""
from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dpbench import allocator, engine, multiseed, registry, store
from dpbench.engine import RunSpec, UsageError
from dpbench.method import ReleaseMethod
from dpbench.records import check_stored

Cell = tuple[tuple[str, str, float | None], list[int]]  # ((task, method, ε), seeds)


def _stored(records: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """(identity, seed) of the stored untuned runs (:func:`dpbench.engine.identity`: settings, code, ledger)."""
    for record in records:
        try:
            check_stored(record)
        except ValueError as error:
            raise UsageError(f"{store.default_path()}: {error}") from None
    return {(engine.identity(r), r["seed"]) for r in records if r.get("tuning") is None}


def planned_runs(grid: dict[str, Any]) -> list[tuple[str, str, float | None, int]]:
    methods = registry.methods()
    runs = []
    for task in grid["tasks"]:
        for method in grid["methods"]:
            budgets = grid["epsilons"] if methods[method].private else [None]
            runs += [(task, method, epsilon, seed) for epsilon in budgets for seed in range(grid["seeds"])]
    return runs


def _pending_groups(runs, stored) -> tuple[dict[tuple[str, str, float | None], list[int]], dict[tuple, str]]:
    """The planned runs without a stored record of the same identity and seed, as {(task, method, ε): [seeds]} in
    plan order, and the cells the engine refuses, {(task, method, ε): reason}. A stored record counts only if it
    ran the settings and code a run would run now, under the current ledger version."""
    groups: dict[tuple[str, str, float | None], list[int]] = {}
    identities: dict[tuple[str, str, float | None], str] = {}
    refused: dict[tuple[str, str, float | None], str] = {}
    for task, method, epsilon, seed in runs:
        key = (task, method, epsilon)
        if key not in identities and key not in refused:
            try:
                identities[key] = engine.describe(RunSpec(method=method, task=task, epsilon=epsilon))
            except UsageError as error:
                refused[key] = str(error)
        if key in identities and (identities[key], seed) not in stored:
            groups.setdefault(key, []).append(seed)
    return groups, refused


def jobs(cells: list[Cell], methods: dict[str, type]) -> list[Cell]:
    """The pending cells as units of work, full-data methods first: output and objective perturbation (never
    batched) one seed per job, then the cells of full-batch gradient methods, then the rest, each group in plan
    order. Full-data methods are the longest jobs on the largest tasks; started last, they would leave one worker
    running alone (kddcup99's AMP did, for minutes)."""
    def rank(job: Cell) -> int:
        method = methods[job[0][1]]
        return 0 if issubclass(method, ReleaseMethod) else 1 if method.full_batch else 2

    split: list[Cell] = []
    for key, seeds in cells:
        if issubclass(methods[key[1]], ReleaseMethod):
            split += [(key, [seed]) for seed in seeds]
        else:
            split.append((key, seeds))
    return sorted(split, key=rank)


def _run_cell(cell: Cell) -> tuple[Cell, list[dict[str, Any]], str | None]:
    """Train one (task, method, ε) cell's seeds, as one batched run where :mod:`dpbench.multiseed` applies (linear
    models, plain private methods), else one after the other; returns (the cell, records, the refusal if refused)."""
    (task, method, epsilon), seeds = cell
    spec = RunSpec(method=method, task=task, epsilon=epsilon, progress_bar=False)
    try:
        try:
            return cell, multiseed.run_seeds(spec, seeds), None
        except multiseed.NotBatchable:
            return cell, [engine.run(replace(spec, seed=seed)) for seed in seeds], None
    except UsageError as error:
        return cell, [], str(error)


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)
    allocator.keep_freed_memory()  # as the ``dpbench`` command does in its own process


def run_grid(grid: dict[str, Any], workers: int = 1) -> dict[str, int]:
    """Run every planned run not yet in the store; returns counts of runs done, skipped and refused.

    ``workers`` > 1 trains that many cells at once in worker processes (the store is SQLite: safe to append from
    several), each with an equal share of the CPU cores as torch threads; results are as with one worker.
    """
    known_methods, known_tasks = registry.methods(), registry.tasks()
    unknown = [m for m in grid["methods"] if m not in known_methods] + [t for t in grid["tasks"] if t not in known_tasks]
    if unknown:
        raise UsageError(f"unknown methods or tasks in the grid: {', '.join(unknown)}")
    if not 1 <= workers <= max(2, os.cpu_count() or 1):  # each worker process holds its own PyTorch
        raise UsageError(f"workers must lie in 1..{max(2, os.cpu_count() or 1)} (the CPU cores), got {workers}")
    runs = planned_runs(grid)
    pending, refused_cells = _pending_groups(runs, _stored(store.load()))
    cells = jobs(list(pending.items()), known_methods)
    counts = {"ran": 0, "already stored": len(runs) - sum(len(seeds) for _, seeds in cells), "refused": 0}
    refused: set[tuple[str, str]] = set()
    for (task, method, epsilon), reason in refused_cells.items():
        if (task, method) not in refused:
            print(f"sweep: {method} on {task} refused: {reason}", file=sys.stderr)
        refused.add((task, method))
        count = sum(1 for run in runs if run[:3] == (task, method, epsilon))
        counts["refused"] += count
        counts["already stored"] -= count
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if workers == 1:
            results = map(_run_cell, cells)
        else:
            threads = max(1, (os.cpu_count() or 1) // workers)
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(
                workers, initializer=_init_worker, initargs=(threads,)))
            results = pool.imap_unordered(_run_cell, cells)
        for ((task, method, epsilon), seeds), finished, refusal in results:
            if refusal is not None:
                if (task, method) not in refused:
                    print(f"sweep: {method} on {task} refused: {refusal}", file=sys.stderr)
                refused.add((task, method))
                counts["refused"] += len(seeds)
                continue
            for record in finished:
                counts["ran"] += 1
                metric = next(iter(record["metrics"].items()))
                print(f"[{counts['ran'] + counts['already stored']}/{len(runs)} {time.perf_counter() - started:.0f}s] "
                      f"{task} {method} eps={epsilon} seed={record['seed']}: {metric[0]}={metric[1]:.4f} "
                      f"({record['train_seconds']:.1f}s)", file=sys.stderr, flush=True)
    return counts


#: At most this many seeds per cell (a grid's cells times seeds are planned as one list before anything runs).
MAX_SEEDS = 10_000


def load_grid(path: str) -> dict[str, Any]:
    """The grid in the JSON file ``path``, checked: ``tasks`` and ``methods`` lists of names, ``epsilons`` a list of
    finite numbers > 0, ``seeds`` a whole number from 1 to :data:`MAX_SEEDS`. Other keys are left to the code that
    reads them."""
    try:
        grid = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: bad JSON, or not UTF-8
        raise UsageError(f"cannot read grid {path}: {error}") from None
    if not isinstance(grid, dict):
        raise UsageError(f"grid {path} is not a JSON object")
    missing = {"tasks", "methods", "epsilons", "seeds"} - set(grid)
    if missing:
        raise UsageError(f"grid {path} lacks {', '.join(sorted(missing))}")
    for key in ("tasks", "methods"):
        if not isinstance(grid[key], list) or not all(isinstance(name, str) for name in grid[key]):
            raise UsageError(f"grid {path}: {key} must be a list of names, got {grid[key]!r:.80}")
    epsilons = grid["epsilons"]
    if not isinstance(epsilons, list) or not all(
            isinstance(e, (int, float)) and not isinstance(e, bool) and math.isfinite(e) and e > 0 for e in epsilons):
        raise UsageError(f"grid {path}: epsilons must be a list of finite numbers > 0, got {epsilons!r:.80}")
    seeds = grid["seeds"]
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
        raise UsageError(f"grid {path}: seeds must be a whole number from 1 to {MAX_SEEDS}, got {seeds!r:.80}")
    return grid
