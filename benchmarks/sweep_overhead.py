"""Sweep overhead of the Dask ``LocalCluster`` (issue 18): ``dpbench sweep GRID --workers N`` against the process pool it
replaced, on the same code, so that only the scheduler differs. Each is timed end to end as a user runs it (a fresh
process, an empty results store), alternating, ``--repeats`` times::

    python benchmarks/sweep_overhead.py --workers 2 --repeats 3 --json benchmarks/results/sweep_overhead.json

Without grid files it times :data:`GRIDS`: digits and breast_cancer (36 runs), and with adult (90 runs), × DP-SGD,
DP-GD and AdaCliP × ε ∈ {1, 8}, untuned, replace-one.

The pool is the one dpbench had before Dask (commit f249736): ``multiprocessing``'s spawn context, N processes, each
with cores/N torch threads, ``imap_unordered`` over the sweep's planned jobs, records stored by the parent. Both
sides store the same records (checked: the same (identity, seed) and metrics).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


GRIDS = {"sweep_small": {"tasks": ["digits", "breast_cancer"], "methods": ["dpsgd", "dpgd", "adaclip"], "epsilons": [1, 8],
                         "seeds": 3, "tracks": ["none"], "neighbouring": "replace-one"},
         "sweep_mid": {"tasks": ["digits", "breast_cancer", "adult"], "methods": ["dpsgd", "dpgd", "adaclip"],
                       "epsilons": [1, 8], "seeds": 5, "tracks": ["none"], "neighbouring": "replace-one"}}


def _pool_worker_setup(threads: int) -> None:
    import torch

    from dpbench.run import allocator

    torch.set_num_threads(threads)
    allocator.keep_freed_memory()


def pool_sweep(grid_path: str, workers: int) -> None:
    """The pre-Dask sweep: plan, then a spawn pool of ``workers`` processes; this process stores the records."""
    from dpbench.board import sweep
    from dpbench.results import store

    jobs, _, _ = sweep.pending(sweep.load_grid(grid_path))
    threads = max(1, (os.cpu_count() or 1) // workers)
    with multiprocessing.get_context("spawn").Pool(workers, _pool_worker_setup, (threads,)) as pool:
        for _, records, _ in pool.imap_unordered(sweep.run_cell, jobs):
            for record in records:
                store.append(record)


def timed(command: list[str], home: Path) -> float:
    env = {**os.environ, "DPBENCH_HOME": str(home), "WANDB_MODE": "disabled"}
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def stored(home: Path) -> dict:
    """(identity, seed) → test accuracy of the runs stored under ``home``."""
    code = ("import json; from dpbench.results import store; from dpbench.results.identity import identity; print(json.dumps({json.dumps([identity(r), "
            "r['seed']]): r['metrics']['test_accuracy'] for r in store.load()}))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DPBENCH_HOME": str(home)},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grids", nargs="*", help="grid files (default: GRIDS)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the timings here too")
    parser.add_argument("--pool-run", action="store_true", help=argparse.SUPPRESS)  # one pool sweep (a child)
    args = parser.parse_args()
    if args.pool_run:
        pool_sweep(args.grids[0], args.workers)
        return
    commands = {"pool": lambda grid: [sys.executable, __file__, grid, "--pool-run", "--workers", str(args.workers)],
                "dask": lambda grid: [sys.executable, "-m", "dpbench", "sweep", grid, "--workers", str(args.workers)]}
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        grids = args.grids
        if not grids:
            for name, grid in GRIDS.items():
                (Path(scratch) / f"{name}.json").write_text(json.dumps(grid))
            grids = [str(Path(scratch) / f"{name}.json") for name in GRIDS]
        for grid in grids:
            times = {name: [] for name in commands}
            for repeat in range(args.repeats):
                homes = {}
                for name, command in commands.items():
                    homes[name] = Path(scratch) / f"{Path(grid).stem}-{name}-{repeat}"
                    times[name].append(timed(command(grid), homes[name]))
                    print(f"{Path(grid).name} {name} round {repeat + 1}: {times[name][-1]:.1f} s", flush=True)
                pool_runs, dask_runs = stored(homes["pool"]), stored(homes["dask"])
                if pool_runs != dask_runs:
                    raise SystemExit(f"{grid}: the pool and the Dask sweep stored different runs")
            pool, dask = statistics.median(times["pool"]), statistics.median(times["dask"])
            results.append({"grid": Path(grid).name, "runs": len(pool_runs), "workers": args.workers,
                            "pool_seconds": times["pool"], "dask_seconds": times["dask"],
                            "median_ratio": dask / pool})
            print(f"{Path(grid).name} ({len(pool_runs)} runs): pool median {pool:.1f} s, Dask median {dask:.1f} s, "
                  f"ratio {dask / pool:.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
