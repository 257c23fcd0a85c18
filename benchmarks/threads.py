"""``train_seconds`` of ``dpbench run`` alone and with a second, identical run beside it, per torch thread setting.

The issue-35 measurement: PyTorch's default of one thread per core oversubscribes a machine that is doing anything
else, and a sweep's workers or a user's parallel runs are exactly that::

    DPBENCH_MIRROR=../shared/data python benchmarks/threads.py [--settings default 1 2] [--repeats 3]
        [--cases digits mnist_mlp] [--source DIR] [--json FILE]

Each case is a ``dpbench run`` command; each setting is ``default`` (no thread variable set: what a user gets) or a
count N (``DPBENCH_THREADS`` and ``OMP_NUM_THREADS`` set to N, so that code before ``--threads`` existed takes it
too). For each case and setting, ``--repeats`` rounds of: the run alone, then two of them started together; the
figures are medians of ``train_seconds`` (the record's, training only) and the ratio of the pair's (both runs'
median) to the lone run's. ``--source`` runs the dpbench of another checkout (e.g. a worktree of an older commit).
Settings alternate within each round, so that a slow spell of a shared machine falls on all of them.
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

CASES = {
    "digits": ["--method", "dpsgd", "--task", "digits", "--epsilon", "1"],
    "mnist_mlp": ["--method", "dpsgd", "--task", "mnist_mlp", "--noise-multiplier", "1", "--epochs", "3",
                  "--batch-size", "256"],
    # The same model on larger batches (about the steps of mnist_mlp's 3 epochs at B = 256: 60)
    "mnist_mlp_b1024": ["--method", "dpsgd", "--task", "mnist_mlp", "--noise-multiplier", "1", "--epochs", "12",
                        "--batch-size", "1024"],
    "mnist_mlp_b4096": ["--method", "dpsgd", "--task", "mnist_mlp", "--noise-multiplier", "1", "--epochs", "60",
                        "--batch-size", "4096"],
    "mnist_logreg": ["--method", "dpsgd", "--task", "mnist_logreg", "--noise-multiplier", "1", "--epochs", "3"],
    "cifar10_cnn_smoke": ["--method", "dpsgd", "--task", "cifar10_cnn", "--profile", "smoke"],
}


def _start(case: list[str], setting: str, source: str | None, home: str) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "DPBENCH_THREADS")}
    env.update({"DPBENCH_HOME": home, "WANDB_MODE": "disabled"})
    if setting != "default":
        env.update({"DPBENCH_THREADS": setting, "OMP_NUM_THREADS": setting})
    if source:
        env["PYTHONPATH"] = source
    return subprocess.Popen([sys.executable, "-m", "dpbench", "run", *case, "--json"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=source or None)


def _seconds(process: subprocess.Popen) -> tuple[float, int | None]:
    out, _ = process.communicate()
    if process.returncode:
        raise SystemExit(f"a run failed (exit {process.returncode})")
    record = json.loads(out.strip().splitlines()[-1])
    return record["train_seconds"], record.get("threads")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["default", "1"])
    parser.add_argument("--cases", nargs="+", default=["digits", "mnist_mlp"], choices=CASES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--source", help="a dpbench checkout to run instead of the installed one")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="dpbench-threads-")
    results = {"cores": os.cpu_count(), "load_average_at_start": os.getloadavg(), "repeats": args.repeats,
               "source": args.source or "installed", "cases": {}}
    for name in args.cases:
        case = CASES[name]
        _seconds(_start(case, "1", args.source, home))  # warm-up: data caches, compiled kernels
        alone = {s: [] for s in args.settings}
        pair = {s: [] for s in args.settings}
        threads = {}
        for _ in range(args.repeats):
            for setting in args.settings:
                seconds, threads[setting] = _seconds(_start(case, setting, args.source, home))
                alone[setting].append(seconds)
                both = [_start(case, setting, args.source, home) for _ in range(2)]
                pair[setting] += [_seconds(process)[0] for process in both]
        results["cases"][name] = {}
        for setting in args.settings:
            lone, two = statistics.median(alone[setting]), statistics.median(pair[setting])
            results["cases"][name][setting] = {"alone_s": lone, "side_by_side_s": two, "ratio": two / lone,
                                               "threads_recorded": threads[setting], "alone_all": alone[setting],
                                               "side_by_side_all": pair[setting]}
            print(f"{name:18} threads {setting:8} (recorded: {threads[setting]})  alone {lone:7.2f} s  "
                  f"two side by side {two:7.2f} s  ({two / lone:5.2f}x)", flush=True)
    results["load_average_at_end"] = os.getloadavg()
    print(f"load average at start {results['load_average_at_start']}, at end {results['load_average_at_end']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
