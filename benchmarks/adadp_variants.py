"""ADADP's two readings against DP-SGD, untuned and validation-tuned (issue 20): does "no tuning needed" hold?

``ada_dp`` (the published code's variant: next iterate θ̂, err > tol rejected, √(tol/err)), ``ada_dp`` with
``variant=paper`` (Algorithm 2 as written) and ``dpsgd`` on adult and digits at ε ∈ {0.1, 1, 8}, seeds 0–4, under
replace-one neighbours (as the tabular leaderboard): each with its defaults and the task's epochs and batch size
(the board's ``none`` track), and validation-tuned (16 trials from its search space on held-out training data, then
the seeds; the board's ``validation`` track, the selection not charged). The runs go to the results store of
``$DPBENCH_HOME`` and to ``--records``; the table (mean test accuracy ± half-width of the 95% confidence interval)
to stdout and ``--table``::

    python benchmarks/adadp_variants.py --records benchmarks/results/adadp_variants.jsonl \
        --table benchmarks/results/adadp_variants.md
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

from scipy import stats

from dpbench import multiseed, validation
from dpbench.engine import RunSpec

TASKS = ("adult", "digits")
EPSILONS = (0.1, 1.0, 8.0)
SEEDS = [0, 1, 2, 3, 4]
VARIANTS = {"ada_dp (code)": ("ada_dp", {}), "ada_dp (paper)": ("ada_dp", {"variant": "paper"}),
            "dpsgd": ("dpsgd", {})}


def cell(values: list[float]) -> str:
    mean = statistics.fmean(values)
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:.3f} ± {half:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", help="append every record here (JSON lines)")
    parser.add_argument("--table", help="write the markdown table here too")
    args = parser.parse_args()
    results: dict[tuple[str, str, float, str], list[float]] = {}
    records = []
    for task in TASKS:
        for label, (method, fixed) in VARIANTS.items():
            for epsilon in EPSILONS:
                spec = RunSpec(method=method, task=task, epsilon=epsilon, neighbouring="replace-one",
                               overrides=dict(fixed), progress_bar=False, no_wandb=True)
                untuned = multiseed.run_many([replace(spec, seed=seed) for seed in SEEDS])
                tuned = validation.run_cell(task, method, epsilon, SEEDS, validation.TrackSettings(16), "replace-one",
                                            fixed=fixed)
                for track, found in (("untuned", untuned), ("validation-tuned", tuned)):
                    results[task, label, epsilon, track] = [r["metrics"]["test_accuracy"] for r in found]
                    records += found
                print(f"{task:7} {label:15} eps={epsilon:<4g} untuned {cell(results[task, label, epsilon, 'untuned'])}"
                      f"  tuned {cell(results[task, label, epsilon, 'validation-tuned'])}", flush=True)
    header = "| task | method | " + " | ".join(f"ε = {e:g}, {t}" for e in EPSILONS for t in ("untuned", "tuned")) + " |"
    lines = [header, "| " + " | ".join(["---"] * (2 + 2 * len(EPSILONS))) + " |"]
    for task in TASKS:
        for label in VARIANTS:
            lines.append(f"| {task} | {label} | " + " | ".join(
                cell(results[task, label, e, t]) for e in EPSILONS for t in ("untuned", "validation-tuned")) + " |")
    table = "\n".join(lines)
    print(table)
    if args.table:
        Path(args.table).write_text(table + "\n")
    if args.records:
        with open(args.records, "w") as out:
            out.writelines(json.dumps(record, sort_keys=True) + "\n" for record in records)


if __name__ == "__main__":
    main()
