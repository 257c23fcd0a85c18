"""Cold-start wall time of the ``dpbench`` command, as a user meets it (issue 17), and where a first run's time goes.

Each command runs ``--repeats`` times (default 5) as a new process, nothing cached in memory; the median is
reported. Then one ``dpbench run --method dpsgd --task digits --epsilon 1`` is broken down by phase, in a new
process that wraps the engine's phases with timers (nothing else changes): importing the command line, importing
the engine (PyTorch, Lightning), loading the data, calibrating σ, training (Lightning's fit, test passes excluded),
the test passes, the record and the store::

    python benchmarks/cold_start.py [--repeats 5] [--json benchmarks/results/cold_start.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "dpbench --help": ["--help"],
    "dpbench list methods": ["list", "methods"],
    "dpbench run --method nope --task digits (refused)": ["run", "--method", "nope", "--task", "digits"],
    "dpbench run --method dpsgd --task digits --lr -1 (refused)": ["run", "--method", "dpsgd", "--task", "digits",
                                                                  "--lr", "-1"],
    "dpbench run --method dpsgd --task digits --clip 0 (refused)": ["run", "--method", "dpsgd", "--task", "digits",
                                                                   "--clip", "0"],
    "dpbench run --method dpsgd --task digits --delta 0.5 (refused)": ["run", "--method", "dpsgd", "--task",
                                                                      "digits", "--delta", "0.5"],
    "dpbench privacy (ε from σ)": ["privacy", "--sample-rate", "0.01", "--noise-multiplier", "1", "--steps", "1000",
                                   "--delta", "1e-5"],
    "dpbench run --method dpsgd --task digits --epsilon 1": ["run", "--method", "dpsgd", "--task", "digits",
                                                              "--epsilon", "1", "--no-wandb"],
}

PHASES = r'''
import json, sys, time
started = time.perf_counter()
phases = {}
def timed(name, function):
    def wrapper(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - begin
    return wrapper
from dpbench import cli
phases["import dpbench.cli"] = time.perf_counter() - started
begin = time.perf_counter()
from dpbench import task
from dpbench.results import store
from dpbench.run import engine, planning
import pytorch_lightning as pl
import pytorch_lightning.loops.evaluation_loop as loop
phases["import the engine (PyTorch, Lightning)"] = time.perf_counter() - begin
task.Task.prepare = timed("load the data, build the model", task.Task.prepare)
planning.calibrate_noise_multiplier = timed("calibrate sigma", planning.calibrate_noise_multiplier)
pl.Trainer.fit = timed("fit (training and test passes)", pl.Trainer.fit)
loop._EvaluationLoop.run = timed("test passes (inside fit)", loop._EvaluationLoop.run)
engine.finish = timed("finish: epsilon, record, store", engine.finish)
store.append = timed("append to the store (inside finish)", store.append)
code = cli.main(sys.argv[1:])
phases["total"] = time.perf_counter() - started
phases["training (fit without test passes)"] = (phases.pop("fit (training and test passes)", 0.0)
                                               - phases.get("test passes (inside fit)", 0.0))
print(json.dumps({"exit": code, "phases": phases}))
'''


def _time(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dpbench", *argv], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="dpbench-cold-")
    env = {**os.environ, "DPBENCH_HOME": home, "WANDB_MODE": "disabled"}
    results: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                     "python": platform.python_version(), "repeats": args.repeats, "commands": {}}
    for label, argv in COMMANDS.items():
        times = [_time(argv, env) for _ in range(args.repeats)]
        results["commands"][label] = {"median_s": statistics.median(times), "all_s": times}
        print(f"{label:60} median {statistics.median(times):6.2f} s  ({', '.join(f'{t:.2f}' for t in times)})")
    argv = COMMANDS["dpbench run --method dpsgd --task digits --epsilon 1"]
    out = subprocess.run([sys.executable, "-c", PHASES, *argv], env=env, capture_output=True, text=True, check=True)
    breakdown = json.loads(out.stdout.strip().splitlines()[-1])["phases"]
    results["run_breakdown_s"] = breakdown
    print("\nbreakdown of one `dpbench run --method dpsgd --task digits --epsilon 1`:")
    for phase, seconds in breakdown.items():
        print(f"  {phase:45} {seconds:6.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
