"""DP-SGD's ``train_seconds`` over non-private's on ``mnist_mlp`` with W&B logging on (offline), alone and loaded.

Issue 35, item 8: with W&B on, end to end, DP-SGD must train in at most 1.3× the non-private run's time::

    DPBENCH_MIRROR=../shared/data python benchmarks/wandb_overhead.py [--pairs 5] [--json FILE]

Each pair is the two commands below (W&B offline, under a fresh ``DPBENCH_HOME``), run one after the other in
alternating order; "loaded" runs each pair while a third, identical DP-SGD run without W&B trains beside it
(restarted whenever it ends), so that the pair shares the machine as a sweep's worker would. Figures are the
medians of the per-pair ratios of the records' ``train_seconds`` (training only, the threads dpbench chose).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

COMMON = ["--task", "mnist_mlp", "--epochs", "10", "--batch-size", "256", "--json"]
PRIVATE = ["--method", "dpsgd", "--noise-multiplier", "1", *COMMON]
NONPRIVATE = ["--method", "nonprivate", *COMMON]


def _run(args: list[str], home: str, wandb: bool) -> dict:
    env = {**os.environ, "DPBENCH_HOME": home, "WANDB_MODE": "offline" if wandb else "disabled",
           "WANDB_SILENT": "true"}
    done = subprocess.run([sys.executable, "-m", "dpbench", "run", *args], env=env, text=True,
                          capture_output=True)
    if done.returncode:
        raise SystemExit(f"dpbench run {' '.join(args)} failed (exit {done.returncode}): {done.stderr[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pairs(count: int, home: str) -> list[dict]:
    found = []
    for index in range(count):
        order = [("private", PRIVATE), ("nonprivate", NONPRIVATE)]
        if index % 2:
            order.reverse()
        seconds = {}
        for name, args in order:
            record = _run(args, home, wandb=True)
            if not record.get("wandb_run"):
                raise SystemExit("the run did not log to W&B: is wandb installed?")
            seconds[name] = record["train_seconds"]
        found.append({**seconds, "ratio": seconds["private"] / seconds["nonprivate"]})
        print(f"  pair {index + 1}/{count}: DP-SGD {seconds['private']:.2f} s, non-private "
              f"{seconds['nonprivate']:.2f} s, ratio {found[-1]['ratio']:.2f}", flush=True)
    return found


def _summary(pairs: list[dict]) -> dict:
    ratios = [pair["ratio"] for pair in pairs]
    return {"median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
            "median_private_s": statistics.median(p["private"] for p in pairs),
            "median_nonprivate_s": statistics.median(p["nonprivate"] for p in pairs), "pairs": pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="dpbench-wandb-")
    _run(NONPRIVATE, home, wandb=False)  # warm-up: the data cache
    results = {"cores": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    print("alone:", flush=True)
    results["alone"] = _summary(_pairs(args.pairs, home))
    print("loaded (a third run training beside the pair):", flush=True)
    load_env = {**os.environ, "DPBENCH_HOME": tempfile.mkdtemp(prefix="dpbench-load-"), "WANDB_MODE": "disabled"}
    load_command = [sys.executable, "-c",
                    "import subprocess, sys\nwhile True:\n    subprocess.run([sys.executable, '-m', 'dpbench', 'run', "
                    + ", ".join(repr(a) for a in PRIVATE) + "], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"]
    load = subprocess.Popen(load_command, env=load_env, start_new_session=True)
    try:
        results["loaded"] = _summary(_pairs(args.pairs, home))
    finally:
        os.killpg(load.pid, 15)
    results["load_average_at_end"] = os.getloadavg()
    for name in ("alone", "loaded"):
        summary = results[name]
        print(f"{name:7} DP-SGD / non-private train_seconds, W&B offline: median {summary['median_ratio']:.2f}x "
              f"(range {summary['min_ratio']:.2f}-{summary['max_ratio']:.2f}; medians {summary['median_private_s']:.2f} "
              f"s / {summary['median_nonprivate_s']:.2f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
