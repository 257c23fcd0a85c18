"""Which cause explains each violation of a board's ``--check``, tested cell by cell: the measurement behind the
committed board's ``exceptions.json`` (``--write`` writes it).

A cause explains a violation only where its test holds at that very cell, from the cell's own runs (seed by seed) and
its twins on the board, never from a template over a rectangle of cells. A seed "at the majority rate" scores at or
below the test set's majority-class rate: a cell holding one is split between learning and not, and the spread and
rise causes (2, 8) do not explain it. First match wins, in this order:

1. ``release-noise`` (``collapsed``, ``below-majority``; output perturbation, AMP, AMP-NT): every run's noise-to-signal
   ratio (``benchmarks/release_noise.py``: σ√p / R for output perturbation, σ₁√p / L for AMP's random linear term),
   fixed before training by its hyperparameters, is above 1;
2. ``selection-variance`` (random-stopping ``wide-interval``): the validation track's cell at the same (task, method,
   ε) is at most 0.1 wide and no study released a model at the majority rate: each random-stopping seed is a study
   with its own K and noisy selection, and the spread is the studies' (``benchmarks/board_spread.py``);
3. ``degenerate-selection`` (random-stopping ``wide-interval``, ``collapsed``, ``below-majority``): some of the
   cell's studies released a model at or below the majority rate while more than half of them score above it: the
   track's variance from study to study (a secret K that can be small, a noisy selection, each trial at a fraction of
   ε), not a method that cannot learn at this ε (the reason counts such studies over the whole track);
4. ``adaclip-clipping-bias`` (untuned AdaCliP, ``collapsed``, ``below-majority``, ``decreasing``; every one of the
   board's seeds at or below the majority rate): the independent NumPy transcription of AdaCliP (``benchmarks/root_causes.py``; its output for the task in
   ``benchmarks/results/adaclip_transcription_<task>.txt``) scores the majority rate at the cell's σ on two seeds or
   more and without noise, learns with s pinned at √h2 at the same σ, and, for a decreasing cell, learns with more
   noise: the collapse is the published algorithm's at these settings, not dpbench's code nor the noise;
5. ``quantile-clip-stall`` (untuned quantile clipping, ``collapsed``, every board seed at the majority rate): the
   same test on the transcription of Andrew
   et al.'s algorithm at the paper's defaults (``benchmarks/root_causes.py --quantile-clip``; output in
   ``benchmarks/results/quantile_clip_transcription_<task>.txt``), its control the clip pinned at C_0 (DP-SGD);
6. ``defaults`` (untuned ``collapsed``, ``below-majority``, ``wide-interval``, ``decreasing``): the validation track's
   cell at the same (task, method, ε) learns, has no violation of the same kind and a higher mean, and the untuned
   cell is not degenerate (most seeds exactly at the majority rate: an output that does not depend on the noise is a
   property of the method's mechanics, not of untuned settings, and stays unexplained);
7. ``below-threshold`` (``collapsed``, ``below-majority``): the same (task, method, track) learns (neither collapsed
   nor below the majority rate nor declared infeasible) at a larger ε of the grid and at no smaller one: the method
   needs more budget on this task;
8. ``steep-rise`` (``wide-interval``): the same row's mean at the next larger ε is above this cell's upper 95% bound
   and no seed is at the majority rate: the cell sits where accuracy rises steeply with ε.

Every other violation is printed as unexplained. The causes were written after the complete rebuild's violations were
seen (as the grid's infeasible threshold was) and tightened after a hostile review found cells each first version
explained wrongly; each is a measurement of the cell, which fails where it does not hold::

    python benchmarks/violation_causes.py leaderboards/results.jsonl --grid leaderboards/grid.json [--write FILE]
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path


def _benchmark(name: str):
    """A sibling script of ``benchmarks/`` as a module."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
    module = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


RELEASE, SPREAD, ROOT = _benchmark("release_noise"), _benchmark("board_spread"), _benchmark("root_causes")

TRANSCRIPTIONS = Path(__file__).resolve().parent / "results"
COMMAND = "python benchmarks/violation_causes.py leaderboards/results.jsonl --grid leaderboards/grid.json"
NOT_LEARNING = ("collapsed", "below-majority")
WIDTH = 0.1  # the check's widest interval


class Board:
    """The cells of a board's tables by (relation, task, track, method, ε), with their violations."""

    def __init__(self, tables, found):
        self.cells, self.infeasible, self.epsilons = {}, set(), collections.defaultdict(set)
        for table in tables:
            for (row, column), cell in table.cells.items():
                if column.kind == "non-private":
                    continue
                key = (table.neighbouring, table.task, row.tuning, row.method, column.epsilon)
                self.cells.setdefault(key, cell)  # rows of one method and track in other settings: the first
                self.epsilons[key[:4]].add(column.epsilon)
                if table.declared_infeasible(column, row.tuning):
                    self.infeasible.add(key)
        self.kinds = collections.defaultdict(set)
        for v in found:
            self.kinds[v.relation, v.task, v.track, v.method, v.epsilon].add(v.kind)

    def learns(self, key) -> bool:
        return key in self.cells and key not in self.infeasible and not self.kinds[key] & set(NOT_LEARNING)

    def narrow(self, key) -> bool:
        interval = self.cells[key].ci95 if key in self.cells else None
        return interval is not None and interval[1] - interval[0] <= WIDTH

    def at_majority(self, key) -> int:
        """How many of the cell's seeds score at or below the test set's majority-class rate."""
        cell = self.cells[key]
        return sum(value <= cell.runs[0]["test_majority_rate"] + 1e-9 for value in cell.values)

    def degenerate_seeds(self, key) -> int:
        """How many of the cell's seeds score exactly the majority-class rate."""
        cell = self.cells[key]
        return sum(abs(value - cell.runs[0]["test_majority_rate"]) <= 1e-9 for value in cell.values)

    def degenerate(self, key) -> bool:
        """Most seeds exactly at the majority-class rate: the output did not depend on the noise."""
        return 2 * self.degenerate_seeds(key) > len(self.cells[key].values)


def release_ratios(cell, widths: dict[str, int]) -> list[float]:
    """Each run's noise-to-signal ratio (``benchmarks/release_noise.py``)."""
    task = cell.runs[0]["task"]
    p = widths.setdefault(task, RELEASE.parameters(task))
    return [RELEASE.ratio(run, p)[2] for run in cell.runs]


#: The methods whose collapse a committed transcription tests, and what its control section holds.
CONTROLS = {"adaclip": "s pinned", "quantile_clip": "the clip pinned at C_0"}
#: The kinds of violation each transcription's mechanism predicts: AdaCliP's reversed bias gradient can also put a
#: cell below the majority rate, and fewer runs at it with more noise (decreasing); quantile clipping's stall leaves
#: the majority classifier itself.
TRANSCRIBED = {"adaclip": NOT_LEARNING + ("decreasing",), "quantile_clip": ("collapsed",)}


@functools.cache
def transcription(method: str, task: str) -> list[tuple[bool, float, float, tuple]]:
    """(control, σ, accuracy, settings) of each run in the committed transcription output of ``method`` on ``task``
    (``benchmarks/root_causes.py``; a section headed "# control" holds the control's runs), read by the header's
    column names; settings (B, epochs, lr, clip) are those of the command line that heads the run's block (a DP-Adam
    file's control section runs at its ``--control-lr`` instead; no cause reads that file); empty where none was
    run."""
    path = TRANSCRIPTIONS / f"{method}_transcription_{task}.txt"
    rows, columns, control, settings = [], None, False, None
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        if "python benchmarks/root_causes.py" in line:
            args = ROOT.arguments(line.split("python benchmarks/root_causes.py", 1)[1].split())
            settings = (args.batch, args.epochs, args.lr, args.clip)
        if line.startswith("#"):
            control = line[1:].strip().lower().startswith("control")
        elif line.split()[:1] == ["sigma"]:
            columns = line.split()
        elif line.strip() and columns:
            fields = dict(zip(columns, line.split()))
            rows.append((control, float(fields["sigma"]), float(fields["accuracy"]), settings))
    return rows


def reproduced(v, cell) -> str | None:
    """The transcription's measurement where it reproduces this untuned cell's collapse (module docstring, causes 4
    and 5)."""
    rate, sigma = cell.runs[0]["test_majority_rate"], cell.runs[0]["noise_multiplier"]
    hp = cell.runs[0]["hyperparameters"]
    ours = (hp.get("batch_size"), hp.get("epochs"), hp.get("lr"), hp.get("clip"))
    if any(run["hyperparameters"] != hp for run in cell.runs):
        return None
    # the runs at the cell's own settings (the transcription's command line against the records' hyperparameters)
    rows = [(control, s, a) for control, s, a, settings in transcription(v.method, cell.runs[0]["task"])
            if settings == ours]
    here = [a for control, s, a in rows if not control and math.isclose(s, sigma, rel_tol=1e-3)]
    quiet = [a for control, s, a in rows if not control and s == 0]
    pinned = [a for control, s, a in rows if control and math.isclose(s, sigma, rel_tol=1e-3)]
    noisier = [a for control, s, a in rows if not control and s > sigma * (1 + 1e-3)]
    if (len(here) >= 2 and len(quiet) >= 2 and len(pinned) >= 2 and all(abs(a - rate) < 1e-3 for a in here + quiet)
            and all(a > rate + 0.01 for a in pinned)
            and (v.kind != "decreasing" or any(a > rate + 0.01 for a in noisier))):
        return (f"transcription at σ = {sigma:.4g}: {len(here)} seeds at {rate:.4f}, also without noise; "
                f"{CONTROLS[v.method]} at the same σ: {min(pinned):.4f} or more"
                + (f"; learns with more noise: {max(noisier):.4f}" if v.kind == "decreasing" else ""))
    return None


def cause(v, board: Board, widths: dict[str, int]) -> tuple[str, str] | None:
    """(cause, the measurement at this cell) of violation ``v``, or None (module docstring)."""
    key = (v.relation, v.task, v.track, v.method, v.epsilon)
    if key not in board.cells:  # a boundary hit or mixed code: every ε, or a task pooled
        return None
    row, cell = key[:4], board.cells[key]
    twin = (v.relation, v.task, "validation", v.method, v.epsilon)
    if v.kind in NOT_LEARNING and v.method in RELEASE.NOISE:
        ratios = release_ratios(cell, widths)
        if min(ratios) > 1:
            return "release-noise", f"noise/signal of every run above 1 (smallest {min(ratios):.3g})"
    if (v.kind == "wide-interval" and v.track == "random-stopping" and board.narrow(twin)
            and not board.at_majority(key)):
        low, high = board.cells[twin].ci95
        return "selection-variance", f"validation twin's interval {high - low:.3f} wide"
    if (v.kind in NOT_LEARNING + ("wide-interval",) and v.track == "random-stopping" and board.at_majority(key)
            and 2 * board.at_majority(key) < len(cell.values)):
        return "degenerate-selection", (f"{board.at_majority(key)} of {len(cell.values)} studies at or below the "
                                        f"majority rate, the others above it")
    if (v.track == "none" and v.kind in TRANSCRIBED.get(v.method, ())
            and board.at_majority(key) == len(cell.values)):  # the transcription's claim is every seed's
        measured = reproduced(v, cell)
        if measured:
            return {"adaclip": "adaclip-clipping-bias", "quantile_clip": "quantile-clip-stall"}[v.method], measured
    if (v.kind in NOT_LEARNING + ("wide-interval", "decreasing") and v.track == "none" and board.learns(twin)
            and v.kind not in board.kinds[twin] and board.cells[twin].mean > cell.mean
            and not board.degenerate(key)):
        return "defaults", f"validation twin {board.cells[twin].mean:.4f} against {cell.mean:.4f}"
    epsilons = sorted(board.epsilons[row])
    if v.kind in NOT_LEARNING:
        larger = [e for e in epsilons if e > v.epsilon and board.learns(row + (e,))]
        if larger and not any(board.learns(row + (e,)) for e in epsilons if e < v.epsilon):
            return "below-threshold", f"learns at ε = {larger[0]:g}, at no smaller ε"
    if v.kind == "wide-interval" and not board.at_majority(key):
        larger = [e for e in epsilons if e > v.epsilon]
        if larger and board.cells[row + (larger[0],)].mean > cell.ci95[1]:
            return "steep-rise", (f"{board.cells[row + (larger[0],)].mean:.4f} at ε = {larger[0]:g} above its bound "
                                  f"{cell.ci95[1]:.4f}")
    return None


REASONS = {
    "release-noise": "the release's noise outweighs its signal before any training: every run's noise-to-signal ratio "
                     "(output perturbation: sigma*sqrt(p)/R; AMP: sigma1*sqrt(p)/L) is above 1. Over the board's "
                     "feasible release cells, every run above 1: {table[0]} cells do not learn, {table[1]} do; "
                     "otherwise: {table[2]} do not learn, {table[3]} do (the ratio predicts failure, it does not "
                     "find every failure; benchmarks/release_noise.py)",
    "selection-variance": "each random-stopping seed is a study of its own (its own secret K, noisy selection): the "
                          "validation track's cell at the same task, method and epsilon (which also tunes epochs and "
                          "batch size) is at most 0.1 wide and no study released a model at the majority rate, so "
                          "the width is the studies' spread, not the training's "
                          "(benchmarks/board_spread.py: median sd ratio random stopping / validation {ratio})",
    "degenerate-selection": "some of the cell's random-stopping studies released a model at or below the majority "
                            "rate while most of its studies learn: the track's variance from study to study (a secret "
                            "K that can be small, a noisy selection, each trial at a fraction of epsilon), not a "
                            "method that cannot learn at this epsilon. Over the track's feasible cells, {degenerate} "
                            "of {studies} studies released a model at the majority rate ({exact} exactly, {below} "
                            "below it)",
    "adaclip-clipping-bias": "AdaCliP's own mechanics at its untuned settings (Pichapati et al. 2019, Algorithm 1, "
                             "h1 = 1e-12): with little noise its variance estimates shrink, many transformed gradients "
                             "are clipped (every minority example on kddcup99 and breast_cancer) and the released "
                             "bias gradient is reversed (kddcup99) or shrunk (breast_cancer, adult) against the true "
                             "one, so the model predicts the majority class. The test: the independent NumPy "
                             "transcription (benchmarks/results/adaclip_transcription_<task>.txt) scores the majority "
                             "rate at the cell's sigma (two seeds or more) and without noise, learns with s pinned at "
                             "sqrt(h2) at the same sigma, and, for a decreasing cell, learns with more noise",
    "quantile-clip-stall": "quantile clipping's own mechanics at the paper's defaults (Andrew et al. 2021, "
                           "Algorithm 1: target quantile 0.5, eta_C = 0.2, the clip starting at the task's C): the "
                           "clip follows the median per-example gradient norm, that of the well-classified majority "
                           "examples, and falls geometrically through training (after the first epoch about 0.15 on "
                           "adult, 0.037 on kddcup99, 0.6 on breast_cancer at epsilon 8; at the end 0.009, 0.017, "
                           "0.09), so the minority examples' gradients are clipped to it and every run predicts the "
                           "majority class for every test row. The test: the independent NumPy transcription "
                           "(benchmarks/results/quantile_clip_transcription_<task>.txt) scores the majority rate at "
                           "the cell's sigma (two seeds or more) and without noise, and learns with the clip pinned "
                           "at C_0 (DP-SGD) at the same sigma; every one of the board's seeds is at the majority rate",
    "defaults": "the untuned defaults: the validation track's cell at the same task, method and epsilon learns, has no "
                "violation of this kind and a higher mean, and at most half the untuned seeds sit exactly at the "
                "majority rate",
    "below-threshold": "this epsilon is below what the method needs on this task: the same method and track learns at "
                       "a larger epsilon of the grid and at no smaller one",
    "steep-rise": "the cell sits where accuracy rises steeply with epsilon: the same row's mean at the next larger "
                  "epsilon is above this cell's upper 95% bound, and no seed is at the majority rate",
}
TESTED_BY = {"release-noise": "; python benchmarks/release_noise.py leaderboards/results.jsonl",
             "selection-variance": "; python benchmarks/board_spread.py leaderboards/results.jsonl "
                                   "--grid leaderboards/grid.json",
             "adaclip-clipping-bias": "; the commands heading each benchmarks/results/adaclip_transcription_<task>.txt",
             "quantile-clip-stall": "; the commands heading each "
                                    "benchmarks/results/quantile_clip_transcription_<task>.txt"}


def release_table(board: Board, widths: dict[str, int]) -> tuple[int, int, int, int]:
    """Over the board's feasible release-method cells: (every run's ratio above 1 and the cell does not learn, above
    and learns, not every run above 1 and does not learn, and learns)."""
    counts = collections.Counter()
    for key, cell in board.cells.items():
        if key[3] in RELEASE.NOISE and key not in board.infeasible:
            counts[min(release_ratios(cell, widths)) > 1, board.learns(key)] += 1
    return counts[True, False], counts[True, True], counts[False, False], counts[False, True]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    parser.add_argument("--grid", default=None)
    parser.add_argument("--write", default=None, help="write the explained violations as an exceptions file")
    args = parser.parse_args(argv)
    from dpbench.board.check import violations
    from dpbench.board.leaderboard import _tables

    with open(args.records, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    tables = _tables(records, args.grid)
    found = violations(tables)
    board, widths = Board(tables, found), {}
    explained, unexplained = collections.defaultdict(list), []
    for v in found:
        found_cause = cause(v, board, widths)
        if found_cause is None:
            unexplained.append(v)
        else:
            explained[found_cause[0]].append((v, found_cause[1]))
    for name in REASONS:
        print(f"{name}: {len(explained[name])}")
        for v, measured in explained[name]:
            print("  " + dataclasses.replace(v, detail=measured).line())
    print(f"unexplained: {len(unexplained)}")
    for v in unexplained:
        print("  " + v.line())
    if args.write:
        write(args.write, tables, found, explained, board, widths)
    return 0


def write(path: str, tables, found, explained, board: Board, widths: dict[str, int]) -> None:
    from dpbench.board import exceptions
    from dpbench.board.check import KINDS
    table = release_table(board, widths) if explained["release-noise"] else (0, 0, 0, 0)
    ratio = ""
    if explained["selection-variance"]:  # the figure benchmarks/board_spread.py prints
        ratio = f"{statistics.median(SPREAD.sd_ratio(rs, val) for *_, rs, val in SPREAD.twins(tables)):.2f}"
    track = [key for key in board.cells if key[2] == "random-stopping" and key not in board.infeasible]
    degenerate = sum(board.at_majority(key) for key in track)
    exact = sum(board.degenerate_seeds(key) for key in track)
    studies = sum(len(board.cells[key].values) for key in track)
    entries = []  # one per cause and relation, each part with the kind its cells were tested for
    for name, reason in REASONS.items():
        for relation in sorted({v.relation for v, _ in explained[name]}, key=str):
            cells = collections.defaultdict(list)
            for v, _ in explained[name]:
                if v.relation == relation:
                    cells[KINDS.index(v.kind), v.task, v.method, v.track].append(v.epsilon)
            kinds = [KINDS[k] for k in sorted({k for k, *_ in cells})]
            entries.append({"kind": kinds if len(kinds) > 1 else kinds[0],
                            **({"relation": relation} if relation else {}),
                            "reason": reason.format(table=table, ratio=ratio, degenerate=degenerate,
                                                   studies=studies, exact=exact, below=degenerate - exact),
                            "tested_by": f"{COMMAND} (cause {list(REASONS).index(name) + 1})"
                                         + TESTED_BY.get(name, ""),
                            "cells": [{"task": t, "method": m, "track": tr, "epsilons": sorted(es),
                                       **({"kind": KINDS[k]} if len(kinds) > 1 else {})}
                                      for (k, t, m, tr), es in sorted(cells.items())]})
    Path(path).write_text(dumps(entries), encoding="utf-8")
    loaded = exceptions.load(Path(path), KINDS)  # the file explains exactly the violations a cause was found for
    wrote = {id(v) for v in found if any(entry.explains(v) for entry in loaded)}
    if wrote != {id(v) for name in REASONS for v, _ in explained[name]}:
        raise SystemExit(f"{path} explains other violations than the causes found: a bug of this script")


def dumps(entries: list[dict]) -> str:
    """The entries as JSON, one cell part per line (a reviewer reads the file)."""
    def one(value) -> str:
        return json.dumps(value, ensure_ascii=False)
    blocks = []
    for entry in entries:
        head = ",\n  ".join(f"{one(key)}: {one(value)}" for key, value in entry.items() if key != "cells")
        parts = ",\n   ".join(one(part) for part in entry["cells"])
        blocks.append(f" {{{head},\n  \"cells\": [\n   {parts}]}}")
    return "[\n" + ",\n".join(blocks) + "\n]\n"


if __name__ == "__main__":
    raise SystemExit(main())
