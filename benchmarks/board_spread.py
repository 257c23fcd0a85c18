"""Where a board's seed-to-seed spread comes from: the random-stopping track against the validation track, cell by
cell (the ``wide-interval`` exceptions' measurement).

In the validation track every seed retrains one selected configuration: its spread over seeds is the training's own
(noise, batches, initialization). In the random-stopping track every seed is a study of its own, with its own secret
number of trials K and its own noisy selection: its spread adds the study's. Per (task, method, ε) present in both
tracks, this prints both standard deviations over seeds, their ratio, and the seeds a 95% interval of width 0.1
would need at the random-stopping spread (n with 2·t(0.975, n−1)·sd/√n ≤ 0.1); then, over all such cells, the
median ratio, and how many wide random-stopping cells (the ``wide-interval`` violations) have a validation twin that
is not wide::

    python benchmarks/board_spread.py leaderboards/results.jsonl [--grid leaderboards/grid.json]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics

from scipy import stats


def seeds_for_width(sd: float, width: float = 0.1) -> int:
    """The fewest seeds n ≥ 2 whose Student-t 95% interval at standard deviation ``sd`` is at most ``width`` wide."""
    n = 2
    while 2 * stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) > width:
        n += 1
    return n


def twins(tables, note=lambda message: None) -> list[tuple]:
    """(task, method, ε, random-stopping cell, validation cell) for every private (task, method, ε) with a cell of two
    seeds or more in both tracks; of several rows of one method and track (other sampler, accountant or settings),
    the first, with ``note`` told."""
    found = []
    for table in tables:
        by_track = {}
        for (row, column), cell in table.cells.items():
            key = (row.tuning, row.method, column.epsilon)
            if column.kind == "non-private" or cell.std is None:
                continue
            if key in by_track:
                note(f"{table.task} {key}: several rows; the first is compared")
                continue
            by_track[key] = cell
        found += [(table.task, method, epsilon, stopping, by_track[("validation", method, epsilon)])
                  for (track, method, epsilon), stopping in sorted(by_track.items())
                  if track == "random-stopping" and ("validation", method, epsilon) in by_track]
    return found


def sd_ratio(stopping, validated) -> float:
    """The random-stopping cell's standard deviation over seeds against its validation twin's."""
    return stopping.std / validated.std if validated.std > 0 else math.inf


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    parser.add_argument("--grid", default=None, help="the grid whose infeasible declarations apply")
    args = parser.parse_args(argv)
    from dpbench.board.check import violations
    from dpbench.board.leaderboard import _tables

    with open(args.records, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    tables = _tables(records, args.grid)
    wide = {(v.task, v.method, v.epsilon) for v in violations(tables)
            if v.kind == "wide-interval" and v.track == "random-stopping"}
    ratios, twins_narrow, print_rows = [], 0, []
    for task, method, epsilon, stopping, validated in twins(tables, print):
        ratio = sd_ratio(stopping, validated)
        ratios.append(ratio)
        key = (task, method, epsilon)
        if key in wide:
            low, high = validated.ci95 or (0.0, 0.0)
            twins_narrow += high - low <= 0.1
        print_rows.append(f"{task:14} {method:20} {epsilon:5g}  {stopping.std:.4f}  {validated.std:.4f}  "
                          f"{ratio:6.2f}  {seeds_for_width(stopping.std):5d}{'  wide, undecided' if key in wide else ''}")
    print(f"{'task':14} {'method':20} {'ε':>5}  sd(RS)  sd(val)  ratio  seeds for width 0.1")
    print("\n".join(print_rows))
    if ratios:
        print(f"\n{len(ratios)} cells in both tracks: median sd ratio (random stopping / validation) "
              f"{statistics.median(ratios):.2f}; {sum(r > 1 for r in ratios)} of them above 1")
        print(f"{len(wide)} wide undecided random-stopping cells; the validation twin of {twins_narrow} of them is not "
              f"wide")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
