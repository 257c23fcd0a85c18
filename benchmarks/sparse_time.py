"""Sparse rows against the same rows densified (issue 17): ``dpbench run --method dpsgd --task rcv1 --epsilon 0.1`` on
a generated RCV1-shaped set (47,236 features, 20,242 rows — rcv1_train.binary's shape — about 0.16% nonzeros,
labels from a hidden linear rule), written in the canonical LIBSVM format into a temporary mirror; the real file
cannot be fetched here. Each run is a new process; reported: peak resident memory (the process's maxrss), the
training time per step, the whole command's wall time, and the test accuracy (equal up to float rounding)::

    python benchmarks/sparse_time.py [--json benchmarks/results/sparse_time.json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpbench.data import libsvm

ROWS, FEATURES, DENSITY = 20242, 47236, 0.0016


def run(env: dict[str, str], *extra: str) -> dict:
    started = time.perf_counter()
    child = subprocess.run([sys.executable, "-m", "dpbench", "run", "--method", "dpsgd", "--task", "rcv1",
                            "--epsilon", "0.1", "--no-wandb", "--json", *extra], env=env, capture_output=True,
                           text=True, check=True)
    wall = time.perf_counter() - started
    record = json.loads(child.stdout)
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, "wall_s": wall,
            "step_ms": 1000 * record["train_seconds"] / record["steps"], "steps": record["steps"],
            "test_accuracy": record["metrics"]["test_accuracy"], "epsilon": record["epsilon"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dpbench-sparse-"))
    libsvm.write_synthetic(folder / "mirror" / "rcv1" / "rcv1_train.binary.bz2", ROWS, FEATURES, DENSITY)
    env = {**os.environ, "DPBENCH_MIRROR": str(folder / "mirror"), "DPBENCH_HOME": str(folder / "home"),
           "WANDB_MODE": "disabled"}
    # Sparse first: RUSAGE_CHILDREN's maxrss is the largest of the children so far, so the dense run's comes second.
    results = {"sparse": run(env), "densified": run(env, "--set", "dense=true")}
    for name, measured in results.items():
        print(f"{name:10} peak RSS {measured['peak_rss_mb']:7.0f} MB, {measured['step_ms']:6.1f} ms per step "
              f"({measured['steps']} steps), {measured['wall_s']:5.1f} s in all, test accuracy "
              f"{measured['test_accuracy']:.4f}, ε {measured['epsilon']:.4g}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
