"""Which cause explains each violation of a board's ``--check``, tested cell by cell: the measurement behind the
committed board's ``exceptions.json`` (``--write`` writes it).

A cause explains a violation only where its test holds at that very cell, from the cell's own runs and its twins on
the board (never from a template over a rectangle of cells). First match wins, in this order:

1. ``release-noise`` (``collapsed``, ``below-majority``; output perturbation, AMP, AMP-NT): the median over the cell's
   runs of the release's noise-to-signal ratio (``benchmarks/release_noise.py``: σ√p / R for output perturbation,
   σ₁√p / L for AMP's random linear term), fixed before training by the hyperparameters, is above 1;
2. ``selection-variance`` (random-stopping ``wide-interval``): the validation track's cell at the same (task,
   method, ε) is not wide: each random-stopping seed is a study with its own K and noisy selection, and that spread
   is the study's, not the training's (``benchmarks/board_spread.py``);
3. ``defaults`` (untuned ``collapsed``, ``below-majority``, ``wide-interval``, ``decreasing``): the validation track's
   cell at the same (task, method, ε) has no violation of the same kind, is not collapsed or below the majority
   rate, and its mean is higher: tuning removes it, so the defaults are its cause;
4. ``below-threshold`` (``collapsed``, ``below-majority``): the same (task, method, track) learns (neither collapsed
   nor below the majority rate nor declared infeasible) at some larger ε of the grid: this ε is below what the
   method needs on this task;
5. ``steep-rise`` (``wide-interval``): the same row's mean at the next larger ε is above this cell's upper 95% bound:
   the cell sits where accuracy rises steeply with ε, and the noise draw decides how far a seed has learned.

Every other violation is printed as unexplained. The causes were written after the complete rebuild's violations were
seen (as the grid's infeasible threshold was); each is a measurement of the cell, not a claim about it::

    python benchmarks/violation_causes.py leaderboards/results.jsonl --grid leaderboards/grid.json [--write FILE]
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import statistics
import sys
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("release_noise", Path(__file__).resolve().parent / "release_noise.py")
RELEASE = sys.modules.setdefault("release_noise", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(RELEASE)

COMMAND = "python benchmarks/violation_causes.py leaderboards/results.jsonl --grid leaderboards/grid.json"
NOT_LEARNING = ("collapsed", "below-majority")
WIDTH = 0.1  # the check's widest interval


class Board:
    """The cells of a board's tables by (task, track, method, ε), with their violations."""

    def __init__(self, tables, found):
        self.cells, self.infeasible, self.epsilons = {}, set(), collections.defaultdict(set)
        for table in tables:
            for (row, column), cell in table.cells.items():
                if column.kind == "non-private":
                    continue
                key = (table.task, row.tuning, row.method, column.epsilon)
                self.cells.setdefault(key, cell)  # rows of one method and track in other settings: the first
                self.epsilons[key[:3]].add(column.epsilon)
                if table.declared_infeasible(column, row.tuning):
                    self.infeasible.add(key)
        self.kinds = collections.defaultdict(set)
        for v in found:
            self.kinds[v.task, v.track, v.method, v.epsilon].add(v.kind)

    def learns(self, key) -> bool:
        return key in self.cells and key not in self.infeasible and not self.kinds[key] & set(NOT_LEARNING)

    def narrow(self, key) -> bool:
        interval = self.cells[key].ci95 if key in self.cells else None
        return interval is not None and interval[1] - interval[0] <= WIDTH


def release_ratio(cell, widths: dict[str, int]) -> float:
    task = cell.runs[0]["task"]
    p = widths.setdefault(task, RELEASE.parameters(task))
    return statistics.median(RELEASE.ratio(run, p)[2] for run in cell.runs)


def cause(v, board: Board, widths: dict[str, int]) -> tuple[str, str] | None:
    """(cause, the measurement at this cell) of violation ``v``, or None (module docstring)."""
    key = (v.task, v.track, v.method, v.epsilon)
    twin = (v.task, "validation", v.method, v.epsilon)
    if v.kind in NOT_LEARNING and v.method in RELEASE.NOISE and key in board.cells:
        ratio = release_ratio(board.cells[key], widths)
        if ratio > 1:
            return "release-noise", f"noise/signal {ratio:.3g}"
    if v.kind == "wide-interval" and v.track == "random-stopping" and board.narrow(twin):
        low, high = board.cells[twin].ci95
        return "selection-variance", f"validation twin's interval {high - low:.3f} wide"
    if (v.kind in NOT_LEARNING + ("wide-interval", "decreasing") and v.track == "none" and board.learns(twin)
            and v.kind not in board.kinds[twin] and board.cells[twin].mean > board.cells[key].mean):
        return "defaults", f"validation twin {board.cells[twin].mean:.4f} against {board.cells[key].mean:.4f}"
    if v.kind in NOT_LEARNING:
        larger = [e for e in sorted(board.epsilons[key[:3]]) if e > v.epsilon and board.learns(key[:3] + (e,))]
        if larger:
            return "below-threshold", f"learns at ε = {larger[0]:g}"
    if v.kind == "wide-interval" and key in board.cells:
        larger = sorted(e for e in board.epsilons[key[:3]] if e > v.epsilon)
        if larger:
            nxt = key[:3] + (larger[0],)
            upper = board.cells[key].ci95[1]
            if board.cells[nxt].mean > upper:
                return "steep-rise", f"{board.cells[nxt].mean:.4f} at ε = {larger[0]:g} above its bound {upper:.4f}"
    return None


REASONS = {
    "release-noise": "the release's noise outweighs its signal before any training: the median noise-to-signal ratio "
                     "of the cell's runs (output perturbation: sigma*sqrt(p)/R; AMP: sigma1*sqrt(p)/L) is above 1. "
                     "Over the complete rebuild, ratio > 1 held in {held} cells that do not learn and {against} "
                     "that do (benchmarks/release_noise.py)",
    "selection-variance": "each random-stopping seed is a study of its own (its own secret K, noisy selection): the "
                          "validation track's cell at the same task, method and epsilon is at most 0.1 wide, so the "
                          "width is the studies' spread, not the training's (benchmarks/board_spread.py: median "
                          "sd ratio random stopping / validation {ratio})",
    "defaults": "the untuned defaults: the validation track's cell at the same task, method and epsilon learns, has no "
                "violation of this kind and a higher mean",
    "below-threshold": "this epsilon is below what the method needs on this task: the same method and track learns at "
                       "a larger epsilon of the grid",
    "steep-rise": "the cell sits where accuracy rises steeply with epsilon: the same row's mean at the next larger "
                  "epsilon is above this cell's upper 95% bound, so the noise draw decides how far a seed has "
                  "learned",
}
TESTED_BY = {"release-noise": " (cause 1); python benchmarks/release_noise.py leaderboards/results.jsonl",
             "selection-variance": " (cause 2); python benchmarks/board_spread.py leaderboards/results.jsonl "
                                   "--grid leaderboards/grid.json"}


def release_contingency(board: Board, widths: dict[str, int]) -> tuple[int, int]:
    """Over the board's release-method cells with noise/signal above 1: (how many do not learn, how many do)."""
    noisy = [key for key, cell in board.cells.items()
             if key[2] in RELEASE.NOISE and key not in board.infeasible and release_ratio(cell, widths) > 1]
    learning = sum(board.learns(key) for key in noisy)
    return len(noisy) - learning, learning


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
            print(f"  {v.kind}: {v.task} · {v.track} · {v.method} · ε = {v.epsilon:g}: {measured}")
    print(f"unexplained: {len(unexplained)}")
    for v in unexplained:
        print("  " + v.line())
    if args.write:
        write(args.write, found, explained, board, widths)
    return 0


def write(path: str, found, explained, board: Board, widths: dict[str, int]) -> None:
    from dpbench.board import exceptions
    from dpbench.board.check import KINDS
    held, against = release_contingency(board, widths) if explained["release-noise"] else (0, 0)
    ratio = ""
    if explained["selection-variance"]:
        ratios = [board.cells[k].std / board.cells[(k[0], "validation") + k[2:]].std for k in board.cells
                  if k[1] == "random-stopping" and (k[0], "validation") + k[2:] in board.cells
                  and board.cells[k].std is not None and board.cells[(k[0], "validation") + k[2:]].std]
        ratio = f"{statistics.median(ratios):.2f}"
    entries = []  # one per cause and kind: an entry's kinds apply to all its cells, and a cause holds per kind
    for name, reason in REASONS.items():
        for kind in KINDS:
            cells = collections.defaultdict(list)
            for v, _ in explained[name]:
                if v.kind == kind:
                    cells[v.task, v.method, v.track].append(v.epsilon)
            if cells:
                entries.append({"kind": kind, "reason": reason.format(held=held, against=against, ratio=ratio),
                                "tested_by": COMMAND + TESTED_BY.get(name, f" (cause {list(REASONS).index(name) + 1})"),
                                "cells": [{"task": t, "method": m, "track": tr, "epsilons": sorted(es)}
                                          for (t, m, tr), es in sorted(cells.items())]})
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
