"""ADADP's two readings against DP-SGD, untuned and validation-tuned (issue 20): does "no tuning needed" hold?

``ada_dp`` (the published code's variant: next iterate θ̂, err > tol rejected, √(tol/err)), ``ada_dp`` with
``variant=paper`` (Algorithm 2 as written) and ``dpsgd`` on adult and digits at ε ∈ {0.1, 1, 8}, seeds 0–4, under
replace-one neighbours (as the tabular leaderboard): each with its defaults and the task's epochs and batch size
(the board's ``none`` track), and validation-tuned (16 trials from its search space on held-out training data, then
the seeds; the board's ``validation`` track, the selection not charged). The runs go to the results store of
``$DPBENCH_HOME`` and to ``--records``; the table (mean test accuracy ± half-width of the 95% confidence interval)
to stdout and ``--table``. ``--reuse`` takes the runs of a cell from a records file where they have the identity
this run would have (settings, code, ledger: :func:`dpbench.results.identity.identity`), e.g. the committed leaderboard's
``none`` and ``validation`` cells of ``ada_dp`` and ``dpsgd``, which are these cells::

    python benchmarks/adadp_variants.py --reuse leaderboards/results.jsonl \
        --records benchmarks/results/adadp_variants.jsonl --table benchmarks/results/adadp_variants.md
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

from scipy import stats

from dpbench.results.identity import identity
from dpbench.results.records import check_stored
from dpbench.run import multiseed, planning
from dpbench.spec import RunSpec
from dpbench.tuning import validation

TASKS = ("adult", "digits")
EPSILONS = (0.1, 1.0, 8.0)
SEEDS = [0, 1, 2, 3, 4]
VARIANTS = {"ada_dp (code)": ("ada_dp", {}), "ada_dp (paper)": ("ada_dp", {"variant": "paper"}),
            "dpsgd": ("dpsgd", {})}


def cell(values: list[float]) -> str:
    mean = statistics.fmean(values)
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:.3f} ± {half:.3f}"


def stored_runs(path: str | None) -> dict[tuple[str, int], dict]:
    """(identity, seed) → record of a records file, each checked as the sweep checks its store."""
    runs = {}
    for line in Path(path).read_text().splitlines() if path else []:
        record = json.loads(line)
        check_stored(record)
        runs[identity(record), record["seed"]] = record
    return runs


def reused(runs: dict[tuple[str, int], dict], identity: str) -> list[dict] | None:
    found = [runs.get((identity, seed)) for seed in SEEDS]
    return found if all(found) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", help="append every record here (JSON lines)")
    parser.add_argument("--table", help="write the markdown table here too")
    parser.add_argument("--reuse", help="take a cell's runs from this records file where their identity matches")
    args = parser.parse_args()
    runs = stored_runs(args.reuse)
    results: dict[tuple[str, str, float, str], list[float]] = {}
    records = []
    for task in TASKS:
        for label, (method, fixed) in VARIANTS.items():
            for epsilon in EPSILONS:
                spec = RunSpec(method=method, task=task, epsilon=epsilon, neighbouring="replace-one",
                               overrides=dict(fixed), progress_bar=False, no_wandb=True)
                untuned = reused(runs, planning.describe(spec)) or multiseed.run_many(
                    [replace(spec, seed=seed) for seed in SEEDS])
                tuned = None if fixed else reused(runs, validation.describe(
                    task, method, epsilon, validation.TrackSettings(16), "replace-one"))
                tuned = tuned or validation.run_cell(task, method, epsilon, SEEDS, validation.TrackSettings(16),
                                                     "replace-one", fixed=fixed)
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
