"""The tuning table of docs/tuning.md: test accuracy at total ε = 1 with random-stopping tuning, oracle tuning and the task's
defaults (no tuning), for DP-SGD, AdaCliP, DP-AdamBC and ADADP on adult and digits, mean of seeds 0-2.

    DPBENCH_MIRROR=... DPBENCH_HOME=... python benchmarks/tuning_table.py [--tasks adult digits] [--methods ...]

* random-stopping: ``dpbench tune --mode random-stopping --k-distribution poisson --trials 8 --seed S``: K ~ Poisson
  with mean 8, the total ε = 1 covers all K trials and the noisy validation scores (RDP accountant);
* oracle: ``dpbench tune --mode oracle --trials 8 --seed S``: 8 trials, each at ε = 1 on the whole training set,
  the best on the test set (the seed papers' protocol; tuning not private);
* defaults: ``dpbench run --epsilon 1 --seed S`` with the task's defaults (some of which were themselves picked on
  test accuracy, see ``tasks/linear.py``).

Every study and run is resumable: finished ones are read back from the study storage and the results store under
``DPBENCH_HOME``. Writes ``benchmarks/results/tuning_table.json`` (every released record's figures) and
``benchmarks/results/tuning_table.md`` after each cell, so a partial run leaves a partial table that says which
cells are measured.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from dpbench.errors import TuningError
from dpbench.results import store
from dpbench.run import engine
from dpbench.spec import RunSpec
from dpbench.tuning import tune

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("random-stopping", "oracle", "defaults")
MEAN_TRIALS = 8
EPSILON = 1.0
SEEDS = (0, 1, 2)


def run_cell(task: str, method: str, mode: str, seed: int) -> dict:
    """One released record's figures (tuned or default)."""
    started = time.perf_counter()
    if mode == "defaults":
        done = [r for r in store.load(task=task, method=method) if r["seed"] == seed
                and r.get("epsilon_target") == EPSILON and not r["overrides"] and "tuning" not in r]
        record = done[0] if done else engine.run(RunSpec(method=method, task=task, epsilon=EPSILON, seed=seed,
                                                         no_wandb=True, progress_bar=False))
    else:
        try:
            record = tune.tune(tune.TuneSpec(
                method=method, task=task, epsilon=EPSILON, mode=mode, trials=MEAN_TRIALS, k_distribution="poisson",
                seed=seed, no_wandb=True))
        except TuningError:  # the mechanism's output "nothing" (K = 0, or every trial failed, which stays hidden)
            return {"task": task, "method": method, "mode": mode, "seed": seed, "test_accuracy": None,
                    "nothing_released": True}
    tuned = record.get("tuning", {})
    row = {"task": task, "method": method, "mode": mode, "seed": seed,
           "test_accuracy": record["metrics"]["test_accuracy"], "epsilon": record["epsilon"],
           "delta": record["delta"], "noise_multiplier": record["noise_multiplier"],
           "selected_params": tuned.get("selected_params"), "run_id": record["run_id"]}
    if mode != "random-stopping":  # a private study's K and its duration (a function of K) stay with its owner
        row.update(trials=tuned.get("trials_run"), seconds=round(time.perf_counter() - started, 1))
    return row


def markdown(rows: list[dict], tasks: list[str], methods: list[str]) -> str:
    lines = [f"Test accuracy at total ε = {EPSILON:g} (δ = 1/n²), mean ± std over seeds {', '.join(map(str, SEEDS))} "
             f"(n = seeds measured). random-stopping: K ~ Poisson(mean {MEAN_TRIALS}), the ε covers the tuning; "
             f"oracle: {MEAN_TRIALS} trials at ε = {EPSILON:g} each, best on the test set (tuning not private); "
             "defaults: the task's hyperparameters, no tuning. K and each study's duration are the study's secret "
             "and not written; a study that released nothing (K = 0, probability e^-8, or every trial failed) is "
             "counted apart, as the mechanism's output it is.", "",
             "| task | method | random-stopping (private) | oracle (tuning not private) | defaults (no tuning) |",
             "| --- | --- | --- | --- | --- |"]
    for task in tasks:
        for method in methods:
            cells = []
            for mode in MODES:
                measured = [r["test_accuracy"] for r in rows
                            if (r["task"], r["method"], r["mode"]) == (task, method, mode)]
                values = [value for value in measured if value is not None]
                nothing = f", {len(measured) - len(values)} released nothing" if len(values) < len(measured) else ""
                if not values:
                    cells.append(f"not measured{nothing}")
                    continue
                spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
                cells.append(f"{statistics.fmean(values):.3f}{spread} (n = {len(values)}{nothing})")
            lines.append(f"| {task} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["adult", "digits"])
    parser.add_argument("--methods", nargs="+", default=["dpsgd", "dpadam_bc", "ada_dp", "adaclip"])
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "tuning_table.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    tasks = sorted({r["task"] for r in rows} | set(args.tasks))
    methods = list(dict.fromkeys([*args.methods, *(r["method"] for r in rows)]))
    (RESULTS / "tuning_table.md").write_text(markdown(rows, tasks, methods))
    for method in args.methods:
        for task in args.tasks:
            for mode in MODES:
                for seed in SEEDS:
                    if any((r["task"], r["method"], r["mode"], r["seed"]) == (task, method, mode, seed) for r in rows):
                        continue
                    rows.append(run_cell(task, method, mode, seed))
                    print(json.dumps(rows[-1]), flush=True)
                    path.write_text(json.dumps(rows, indent=1) + "\n")
                    (RESULTS / "tuning_table.md").write_text(markdown(rows, tasks, methods))


if __name__ == "__main__":
    main()
