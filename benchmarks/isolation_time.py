"""Time of one training step with the method in-process vs isolated (``dpbench run --isolate``, dpbench/run/isolation.py).

For each task one process plans the run once and builds two training modules on it, one with the method in-process
and one with the method in a spawned process; their steps (one release of a fixed batch of the task's batch size:
per-example clipping, noise, then the method's update) alternate in rounds, so that a slower or faster spell of the
machine falls on both alike. Reported: the median over rounds of the mean step time of each, and the overhead
(isolated − in-process) per step, which is the pipe's round trips and the copies of parameter values and gradients
through shared memory.

    python benchmarks/isolation_time.py --json benchmarks/results/isolation_time.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

from dpbench.privacy.noise import GaussianNoise
from dpbench.run import planning
from dpbench.spec import RunSpec

TASKS = ("mnist_mlp", "cifar10_cnn")


def measure(task: str, method: str, rounds: int, steps: int) -> dict:
    planned = planning.plan(RunSpec(method=method, task=task, epsilon=1.0, progress_bar=False, no_wandb=True))
    batch = planned.hp["batch_size"]
    x, y = planned.task.augment(planned.data.x_train[:batch]), planned.data.y_train[:batch]
    isolated = replace(planned, spec=replace(planned.spec, isolate=True))
    modules = {"in-process": planned.module(), "isolated": isolated.module()}
    for module in modules.values():
        module.noise = GaussianNoise(planned.spec.seed)
    times = {name: [] for name in modules}
    order = list(modules)
    for index in range(rounds + 1):  # round 0 warms up
        for name in order[index % 2:] + order[:index % 2]:
            module = modules[name]
            started = time.perf_counter()
            for _ in range(steps):
                module.method.step(lambda: module.release(x, y))
            if index:
                times[name].append((time.perf_counter() - started) / steps)
    modules["isolated"].method.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"task": task, "method": method, "batch_size": batch,
            "parameters": sum(p.numel() for p in modules["in-process"].params()),
            "in_process_ms": 1e3 * medians["in-process"], "isolated_ms": 1e3 * medians["isolated"],
            "overhead_ms": 1e3 * (medians["isolated"] - medians["in-process"]),
            "ratio": medians["isolated"] / medians["in-process"], "rounds": rounds, "steps_per_round": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="dpsgd")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [measure(task, args.method, args.rounds, args.steps) for task in TASKS]
    print("| task | parameters | batch | in-process ms/step | isolated ms/step | overhead ms/step | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['task']} | {r['parameters']:,} | {r['batch_size']} | {r['in_process_ms']:.2f} | "
              f"{r['isolated_ms']:.2f} | {r['overhead_ms']:.2f} | {r['ratio']:.3f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
