"""How much of an output- or objective-perturbation release is noise, cell by cell (the measurement behind the
board's exceptions for ``output_perturbation``, ``amp`` and ``amp_nt``).

Each record's ledger holds, per binary classifier (K of them one-vs-all on a task of K > 2 classes, each at ε/K by
basic composition), the Gaussian noise it drew. Per (task, track, method, ε) this prints the median over runs of:

* K and each classifier's ε;
* the noise-to-signal ratio, from the ledger and the hyperparameters alone (fixed before training):
  output perturbation: E‖noise‖ / R = σ·√p / R, R the parameter set's radius (``radius``), p the parameters;
  AMP: ‖b₁‖ / L = σ₁·√p / L, the objective's random linear term against the largest data gradient (L =
  ``input_norm``, the loss's Lipschitz constant): above 1, the perturbed minimizer follows b₁ rather than the data;

beside the cell's mean accuracy and the test set's majority-class rate; then, per method, how well "ratio > 1"
predicts a cell that is not above trivial::

    python benchmarks/release_noise.py leaderboards/results.jsonl
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import statistics

from scipy import stats

NOISE = {"output_perturbation": "output noise", "amp": "objective perturbation b1",
         "amp_nt": "objective perturbation b1"}


def parameters(task: str) -> int:
    """p of a built-in task's linear model: its input width, and a bias."""
    from dpbench import registry

    return registry.tasks([])[task]().prepare(0).x_test.shape[1] + 1


def ratio(record: dict, p: int) -> tuple[int, float, float]:
    """(K, each classifier's ε, noise-to-signal ratio) of one record (module docstring)."""
    parts = [entry for entry in record["privacy_ledger"] if entry["what"].startswith(NOISE[record["method"]])]
    # amp_nt fixes L = 1 (methods/amp.py), and records no input_norm
    scale = record["hyperparameters"]["radius"] if record["method"] == "output_perturbation" \
        else record["hyperparameters"].get("input_norm", 1.0)
    # a classifier's ε: all its releases (AMP's b₁ and output noise b₂), by basic composition
    per_classifier = sum(entry["epsilon"] for entry in record["privacy_ledger"]) / len(parts)
    return len(parts), per_classifier, parts[0]["noise_std"] * math.sqrt(p) / scale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    args = parser.parse_args(argv)
    cells = collections.defaultdict(list)
    with open(args.records, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line) if line.strip() else None
            if record and record.get("kind", "run") == "run" and record["method"] in NOISE:
                track = (record.get("tuning") or {}).get("mode", "none")
                cells[record["task"], track, record["method"], record["epsilon_target"]].append(record)
    widths: dict[str, int] = {}
    agree = collections.Counter()
    print(f"{'task':14} {'track':16} {'method':20} {'ε':>4}  K  ε/classifier  noise/signal  accuracy  majority")
    for (task, track, method, epsilon), runs in sorted(cells.items()):
        p = widths.setdefault(task, parameters(task))
        found = [ratio(run, p) for run in runs]
        accuracies = [run["metrics"]["test_accuracy"] for run in runs]
        rate = runs[0]["test_majority_rate"]
        above = len(accuracies) > 1 and statistics.stdev(accuracies) > 0 and stats.ttest_1samp(
            accuracies, rate, alternative="greater").pvalue < 0.05
        noisy = statistics.median(r for _, _, r in found) > 1
        agree[method, noisy, above] += 1
        print(f"{task:14} {track:16} {method:20} {epsilon:4g} {found[0][0]:2d}  "
              f"{statistics.median(e for _, e, _ in found):12.4g}  {statistics.median(r for _, _, r in found):12.3g}  "
              f"{statistics.fmean(accuracies):8.4f}  {rate:8.4f}")
    print()
    for method in sorted({m for m, _, _ in agree}):
        print(f"{method}: ratio > 1 in {agree[method, True, False]} cells not above trivial and "
              f"{agree[method, True, True]} above it; ratio ≤ 1 in {agree[method, False, False]} cells not above "
              f"trivial and {agree[method, False, True]} above it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
