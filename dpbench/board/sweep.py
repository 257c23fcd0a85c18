"""``dpbench sweep``: run a declared grid of cells (track × task × method × ε), resumably, skipping what is stored.

A grid is a JSON file::

    {"tasks": [...], "methods": [...], "epsilons": [...], "seeds": 5,
     "tracks": ["none", "validation", "random-stopping"], "trials": 16, "neighbouring": "replace-one",
     "reference": true}

``tracks`` (default ``["none"]``), ``trials`` (default 16), ``neighbouring`` (default: each method's own),
``reference`` (default false: each task's converged non-private reference, :mod:`dpbench.tuning.reference`, one
record per task) and ``infeasible`` (the (task, ε) cells declared infeasible, :mod:`dpbench.board.infeasible`: the
sweep runs them all the same, so that the board can test the declaration) and ``notes`` (disclosures the board prints
beside the cells they name, :mod:`dpbench.board.notes`) are optional. ``seeds`` is a count for
every task or a mapping of task to count with an optional ``"default"`` for the tasks it does not name (``{"default":
5, "breast_cancer": 10}``: a task whose cells' intervals are wide gets more seeds; seeds 0, 1, ... run). The tracks,
every method treated alike:

* ``none``: the method's defaults with the task's epochs and batch size, one run per seed, as ``dpbench run``;
* ``validation``: ``trials`` configurations drawn from the method's search space, selected on held-out training
  data, then the seeds (:mod:`dpbench.tuning.validation`; the selection is not charged, and the records say so);
* ``random-stopping``: ``dpbench tune``'s private mode per seed (the tuning seed), K with mean ``trials``, the total
  ε including the tuning (:mod:`dpbench.tuning.tune`); methods whose mechanism the tuning accountant cannot express
  (AMP's (ε, δ) theorem) and non-private ones are reported and skipped.

Non-private methods run once per seed, not once per ε. The tuned cells of one track, task and method at every ε are
one job, whose runs train as one batched computation where :mod:`dpbench.run.multiseed` applies (the trials of every
ε, which share their configurations and seeds, then the final runs; the studies of every ε and tuning seed); an
untuned cell's seeds train as one batch of their own (``dpbench verify --rerun`` trains them again so). The records
are those of separate runs. A stored record counts only if it has the identity a run would have now (settings, code, ledger version:
:func:`dpbench.results.identity.identity`). Cells run in this process, on a Dask ``LocalCluster`` of ``--workers``
processes, or on an existing Dask cluster (``--scheduler tcp://host:port``: dask-jobqueue on Slurm/PBS, dask-kubernetes,
or ``dask scheduler`` and ``dask worker`` started by hand); the full-data methods, the longest jobs, start first.
Workers send records back and this process stores them. One progress bar with an ETA runs over all cells.

Dask distributed, not Ray: the workload is many short CPU jobs whose results are small records, Dask's scheduler is
pure Python and costs little on a laptop, and dask-jobqueue reaches the batch clusters research groups have.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dpbench import registry
from dpbench import threads as dpbench_threads
from dpbench.choices import REFERENCE_MODE
from dpbench.board import grid as grid_file
from dpbench.board.grid import TRACKS
from dpbench.data import stages
from dpbench.errors import TuningError, UsageError
from dpbench.method import ReleaseMethod
from dpbench.results import store
from dpbench.results.identity import identity as record_identity
from dpbench.results.records import check_stored
from dpbench.run import allocator, multiseed, planning
from dpbench.spec import RunSpec
from dpbench.tuning import claims, reference, released, tune, validation

@dataclass(frozen=True)
class Cell:
    track: str
    task: str
    method: str
    epsilon: float | None
    seeds: tuple[int, ...]
    trials: int
    neighbouring: str | None

    def label(self) -> str:
        budget = "non-private" if self.epsilon is None else f"eps={self.epsilon:g}"
        return f"{self.track} {self.task} {self.method} {budget}"


def load_grid(path: str) -> dict[str, Any]:
    """The grid file at ``path``, checked (:func:`dpbench.board.grid.load`)."""
    return grid_file.load(path)


def cells(grid: dict[str, Any]) -> list[Cell]:
    grid = {**grid_file.DEFAULTS, **grid}
    methods = registry.methods()
    found = [Cell(REFERENCE_MODE, task, REFERENCE_MODE, None, (0,), 0, None)
             for task in grid["tasks"] if grid["reference"]]
    for track in grid["tracks"]:
        for task in grid["tasks"]:
            for method in grid["methods"]:
                private = methods[method].private
                budgets = grid["epsilons"] if private else [None]
                found += [Cell(track, task, method, None if epsilon is None else float(epsilon),
                               tuple(range(grid_file.seeds_for(grid, task))), grid["trials"],
                               grid["neighbouring"] if private else None)
                          for epsilon in budgets]
    return found


# ---- one cell: what it would record, and running it ------------------------------------------------------------

def _tune_specs(cell: Cell, seeds: tuple[int, ...]) -> list[tune.TuneSpec]:
    """The random-stopping cell's studies, one per seed; they share the held-out split (split seed 0) so that their
    trials train as one batch, and their names carry the settings (a changed grid never reuses them). The seed is
    the study's public index (its record's ``seed``, by which a rerun skips released studies); each study draws K
    and its trials' coins from its own secret (:mod:`dpbench.tuning.tune`); "study secret" in the names' digest keeps
    the studies made before (their coins from the seed) from being reused."""
    settings = json.dumps([cell.task, cell.method, cell.epsilon, cell.trials, cell.neighbouring, "study secret"],
                          sort_keys=True)
    digest = hashlib.sha256(settings.encode()).hexdigest()[:10]
    return [tune.TuneSpec(method=cell.method, task=cell.task, epsilon=cell.epsilon, mode="random-stopping",
                            trials=cell.trials, neighbouring=cell.neighbouring or "add-remove", seed=seed,
                            split_seed=0, study=f"sweep-{cell.task}-{cell.method}-eps{cell.epsilon:g}-seed{seed}-{digest}",
                            no_wandb=True, append_to_store=False)
            for seed in seeds]


def identity(cell: Cell) -> str:
    """The identity (:func:`dpbench.results.identity.identity`) the cell's records would have; UsageError if refused."""
    spec = RunSpec(method=cell.method, task=cell.task, epsilon=cell.epsilon, neighbouring=cell.neighbouring,
                   progress_bar=False)
    if cell.track == REFERENCE_MODE:
        return reference.describe(cell.task)
    if cell.track == "none":
        return planning.describe(spec)
    if cell.track == "validation":
        return validation.describe(cell.task, cell.method, cell.epsilon, validation.TrackSettings(cell.trials),
                                   cell.neighbouring)
    method = registry.methods()[cell.method]
    if not method.private:
        raise UsageError(f"{cell.method} is not private: the random-stopping track does not apply")
    plan_ = tune.plan(_tune_specs(cell, (0,))[0], calibrate=False)  # σ is calibrated when the cell runs
    planned = planning.describe_record(replace(spec, neighbouring=plan_.trial.neighbouring, epsilon=None,
                                             noise_multiplier=1.0, sampler=None if plan_.trial.kind == "output"
                                             else plan_.trial.sampler))
    return record_identity({**planned, "epsilon_target": cell.epsilon, "neighbouring": plan_.trial.neighbouring,
                            "profile": None, "tuning": {"config": released.tuning_config(plan_)}})


def run_cell(cell: Cell) -> tuple[Cell, list[dict[str, Any]], str | None]:
    """Run one cell's pending seeds; returns (the cell, its records, the refusal if refused). Nothing is stored
    here: the caller (the sweep's client) stores the records, so that workers on other machines need no shared
    disk and a cell run twice (its worker died) is stored once."""
    return run_job((cell,))[0]


def run_job(job: tuple[Cell, ...]) -> list[tuple[Cell, list[dict[str, Any]], str | None]]:
    """:func:`run_cell` for each cell of a job (:func:`jobs`: one track, task and method at several ε), their runs
    trained together: the trials and then the final runs of every ε (``validation``: the same configurations and
    trial seeds at each ε), the studies of every ε and seed (``random-stopping``); an untuned cell's seeds train
    together, each cell apart. Records as cell by cell; a refusal that cannot be told apart by ε (raised while they
    train together) runs the job's cells one by one."""
    first = job[0]
    try:
        if first.track == REFERENCE_MODE:
            return [(first, [reference.run(first.task, append_to_store=False)], None)]
        if first.track == "none":
            outcomes = []
            for cell in job:
                specs = [RunSpec(method=cell.method, task=cell.task, epsilon=cell.epsilon, seed=seed,
                                 neighbouring=cell.neighbouring, progress_bar=False, no_wandb=True,
                                 append_to_store=False) for seed in cell.seeds]
                refusals: dict[int, UsageError] = {}
                found = multiseed.run_many(specs, refusals=refusals)
                outcomes.append((cell, [], str(next(iter(refusals.values())))) if refusals else (cell, found, None))
            return outcomes
        if first.track == "validation":
            found = validation.run_cells(first.task, first.method, [(cell.epsilon, list(cell.seeds)) for cell in job],
                                         validation.TrackSettings(first.trials), first.neighbouring,
                                         append_to_store=False)
            return [(cell, [], str(records)) if isinstance(records, UsageError) else (cell, records, None)
                    for cell, records in zip(job, found)]
        released = tune.tune_together([spec for cell in job for spec in _tune_specs(cell, cell.seeds)])
        outcomes, at = [], 0
        for cell in job:
            outcomes.append((cell, released[at:at + len(cell.seeds)], None))
            at += len(cell.seeds)
        return outcomes
    except (UsageError, TuningError) as error:
        if len(job) > 1:
            return [outcome for cell in job for outcome in run_job((cell,))]
        return [(first, [], str(error))]


# ---- the grid --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Failure:
    """A job that raised what no refusal explains (a bug, a guard, a worker's error): its traceback."""
    trace: str


def _outcomes(job: tuple[Cell, ...], result) -> list[tuple[Cell, list[dict[str, Any]], str | Failure | None]]:
    """The job's outcomes from ``result()`` (the job's run, or its future's result); if it raises, each of the job's
    cells failed, with the traceback, and nothing of them is stored: the sweep goes on with the other jobs and exits
    non-zero at the end (a 20-hour grid lost every cell still running to one cell's error, and a rerun resumes the
    failed cells alone)."""
    try:
        return result()
    except Exception as error:  # noqa: BLE001 — reported with its traceback and counted; the sweep exits 1
        trace = "".join(traceback.format_exception(error)).rstrip()
        return [(cell, [], Failure(trace)) for cell in job]


def _cost(cell: Cell, methods: dict[str, type]) -> tuple[int, int]:
    """Order of the jobs: references and full-data methods (the longest) first, tuned cells before untuned ones, so
    that the workers end together."""
    if cell.track == REFERENCE_MODE:
        return (0, -len(TRACKS))
    method = methods[cell.method]
    return (0 if issubclass(method, ReleaseMethod) or method.full_batch else 1, -TRACKS.index(cell.track))


def _stored() -> set[tuple[str, int]]:
    """(identity, seed) of the stored runs (:func:`dpbench.results.identity.identity`: settings, code, ledger), each
    checked first: the store is a file anyone can edit."""
    stored = store.load()
    for record in stored:
        try:
            check_stored(record)
        except ValueError as error:
            raise UsageError(f"{store.describe()}: {error}") from None
    return {(record_identity(r), r["seed"]) for r in stored}


def pending(grid: dict[str, Any]) -> tuple[list[Cell], int, dict[Cell, str]]:
    """The cells with seeds to run (only those seeds), the number of runs already stored, and refused cells."""
    stored = _stored()
    todo, done, refused = [], 0, {}
    for cell in cells(grid):
        try:
            key = identity(cell)
        except (UsageError, TuningError) as error:
            refused[cell] = str(error)
            continue
        missing = tuple(seed for seed in cell.seeds if (key, seed) not in stored)
        done += len(cell.seeds) - len(missing)
        if missing:
            todo.append(replace(cell, seeds=missing))
    methods = registry.methods()
    ordered = []
    for cell in sorted(todo, key=lambda c: _cost(c, methods)):
        if cell.track == "none" and issubclass(methods[cell.method], ReleaseMethod):
            ordered += [replace(cell, seeds=(seed,)) for seed in cell.seeds]  # never batched: one seed per job
        else:
            ordered.append(cell)
    return ordered, done, refused


def jobs(cells_: list[Cell]) -> list[tuple[Cell, ...]]:
    """The pending cells as the sweep's jobs, in their order: the tuned cells of one track, task and method (at every
    ε) form one job, whose runs train together (:func:`run_job`); a reference and an untuned cell (whose records
    ``dpbench verify --rerun`` trains again with their own cell's seeds) are jobs of their own."""
    grouped: dict[tuple, list[Cell]] = {}
    for cell in cells_:
        alone = cell.track in (REFERENCE_MODE, "none")
        key = (cell.track, cell.task, cell.method, cell.trials, cell.neighbouring) + ((cell,) if alone else ())
        grouped.setdefault(key, []).append(cell)
    return [tuple(group) for group in grouped.values()]


class _WorkerSetup(WorkerPlugin):
    """A Dask worker plugin: each worker process (also one started after another died) loads the client's plugin
    folders (``DPBENCH_PLUGINS``: the same paths must hold them on a remote worker), chooses its torch threads as
    the ``dpbench`` command does (``threads``, else by the size of each run, at most ``cap``: dpbench/threads.py)
    and keeps freed memory."""

    name = "dpbench-worker-setup"

    def __init__(self, threads: int | None, cap: int, plugins: str):
        self.threads, self.cap, self.plugins = threads, cap, plugins

    def setup(self, worker) -> None:
        if self.plugins:
            os.environ["DPBENCH_PLUGINS"] = self.plugins
        else:
            os.environ.pop("DPBENCH_PLUGINS", None)
        dpbench_threads.configure(self.threads, self.cap)
        dpbench_threads.fit()
        allocator.keep_freed_memory()


def _local_cluster(workers: int, threads: int | None):
    """A Dask ``LocalCluster`` of ``workers`` processes and its client. The workers import dpbench when they start
    (``preload``), so that this and the cluster's start overlap the planning of the grid (:func:`run_grid`)."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.worker.daemon": False, "logging.distributed": "error"}):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, memory_limit=0,
                               dashboard_address=None, preload=["dpbench.board.sweep"])
    try:
        client = Client(cluster)
        client.register_plugin(_WorkerSetup(threads, max(1, (os.cpu_count() or 1) // workers),
                                            os.environ.get("DPBENCH_PLUGINS", "")))
    except BaseException:
        cluster.close()
        raise
    return cluster, client


def _close_local(starting: Future) -> None:
    """Close the local cluster once it has started (one that failed to start left nothing behind). Its worker
    processes are ours and their records are back (or the sweep is failing or interrupted): the trials they still
    claim are put back, uncounted (the sweep's own stop is not an outcome of a trial:
    :func:`dpbench.tuning.claims.put_back_held`), then they are terminated, since a graceful close of processes
    holding PyTorch takes ~1.4 s, and the cluster closes at once."""
    if starting.exception() is None:
        cluster, client = starting.result()
        with contextlib.suppress(Exception):  # a worker already gone: its claims go stale (deaths)
            client.run(claims.put_back_held)
        try:
            for pid in client.run(os.getpid).values():
                os.kill(pid, signal.SIGTERM)
        except Exception:  # a worker already gone: close gracefully
            pass
        client.close()
        cluster.close()


def _remote_client(scheduler: str, threads: int | None):
    """A Dask client of the cluster at ``scheduler``; one torch thread per task unless ``threads`` says otherwise (a
    remote worker's cores are its own business: ``--nthreads``)."""
    from distributed import Client

    try:
        client = Client(scheduler, timeout="30s")
    except (OSError, TimeoutError, ValueError) as error:
        raise UsageError(f"cannot reach the Dask scheduler {scheduler}: {error}") from None
    client.register_plugin(_WorkerSetup(threads, 1, os.environ.get("DPBENCH_PLUGINS", "")))
    return client


def run_grid(grid: dict[str, Any], workers: int = 1, progress: bool = True, scheduler: str | None = None,
             threads: int | None = None) -> dict[str, int]:
    """Run every cell not yet stored; returns counts of runs done, already stored and refused, and (if any) of the
    runs of cells whose job failed (:func:`_outcomes`).

    ``workers`` > 1 runs that many cells at once on a Dask ``LocalCluster`` of worker processes, each with at most
    an equal share of the CPU cores as torch threads (``threads``: that many); ``scheduler`` (``tcp://host:port``)
    sends the cells to an existing Dask cluster instead. Workers return records; this process stores them (workers
    need no shared disk), so a cell whose worker died and that Dask ran again elsewhere is stored once. Results are
    as with one worker.
    """
    known_methods, known_tasks = registry.methods(), registry.tasks()
    unknown = [m for m in grid["methods"] if m not in known_methods] + [t for t in grid["tasks"] if t not in known_tasks]
    if unknown:
        raise UsageError(f"unknown methods or tasks in the grid: {', '.join(unknown)}")
    if not scheduler and not 1 <= workers <= max(2, os.cpu_count() or 1):  # each worker process holds its PyTorch
        raise UsageError(f"workers must lie in 1..{max(2, os.cpu_count() or 1)} (the CPU cores), got {workers}")
    with contextlib.ExitStack() as stack:
        client = None
        if scheduler:
            client = stack.enter_context(_remote_client(scheduler, threads))
        elif workers > 1:  # the local cluster starts (its workers importing dpbench) while the grid is planned
            starting = stack.enter_context(ThreadPoolExecutor(1)).submit(_local_cluster, workers, threads)
            stack.callback(_close_local, starting)
        pending_cells, done, refused = pending(grid)
        counts = {"ran": 0, "already stored": done, "refused": sum(len(cell.seeds) for cell in refused)}
        reported: set[tuple[str, str, str]] = set()

        def report(cell: Cell, reason: str) -> None:
            if (cell.track, cell.task, cell.method) not in reported:
                print(f"sweep: {cell.track}: {cell.method} on {cell.task} refused: {reason}", file=sys.stderr)
            reported.add((cell.track, cell.task, cell.method))

        for cell, reason in refused.items():
            report(cell, reason)
        grouped = jobs(pending_cells)
        if workers == 1 and not scheduler:
            results = (_outcomes(job, lambda job=job: run_job(job)) for job in grouped)
        elif grouped:
            from distributed import as_completed

            client = client or starting.result()[1]
            futures = {client.submit(run_job, job, pure=False): job for job in grouped}
            results = (_outcomes(futures[future], future.result) for future in as_completed(futures))
        else:
            results = iter(())
        bar = stack.enter_context(stages.bar(total=len(pending_cells), desc="sweep", unit="cell", disable=not progress,
                                             file=sys.stderr, dynamic_ncols=True))
        for cell, finished, refusal in (outcome for outcomes in results for outcome in outcomes):
            bar.update(1)
            if isinstance(refusal, Failure):
                print(f"sweep: {cell.label()} failed, nothing stored for it:\n{refusal.trace}", file=sys.stderr)
                counts["failed"] = counts.get("failed", 0) + len(cell.seeds)
                continue
            if refusal is not None:
                report(cell, refusal)
                counts["refused"] += len(cell.seeds)
                continue
            for record in finished:
                store.append(record)
            counts["ran"] += len(finished)
            metric = next(iter(finished[0]["metrics"].items())) if finished else ("", float("nan"))
            bar.set_postfix_str(f"{cell.label()}: {metric[0]}={metric[1]:.4f}", refresh=False)
    return counts
