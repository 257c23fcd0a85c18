"""Which random-stopping releases of the committed board have their creation time to the second in this repository's
git history (issue 31): released tuned records carry only their day, because a study's time is a function of its
secret K, but checkpoints and boards committed before that stamp (26–27 November 2026) hold the same studies' records
with their times. Reads every committed version of ``leaderboards/rebuild/records.jsonl.gz`` and
``leaderboards/results.jsonl``, matches releases to the current board by ``tuning.study_id`` and prints, per cell, how
many of its studies are exposed and in which commits. With ``--check`` it exits 1 unless the grid's note marked
``--mark`` names exactly the exposed cells (every study of each exposed cell must be exposed: a note marks whole
cells)::

    python benchmarks/history_timing.py leaderboards/results.jsonl --grid leaderboards/grid.json --mark ‡ --check

Needs the full history (not a shallow clone).
"""
from __future__ import annotations

import argparse
import collections
import functools
import gzip
import json
import subprocess
import sys
from pathlib import Path

PATHS = ("leaderboards/rebuild/records.jsonl.gz", "leaderboards/results.jsonl")
MIDNIGHT = "T00:00:00+00:00"


def git(*args: str, binary: bool = False):
    result = subprocess.run(["git", *args], capture_output=True, check=True, cwd=Path(__file__).resolve().parents[1])
    return result.stdout if binary else result.stdout.decode()


def released(records_path: str) -> dict[str, tuple[str, str, float]]:
    """Each random-stopping release of the board by study id: (task, method, ε)."""
    studies = {}
    with open(records_path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line) if line.strip() else {}
            tuning = record.get("tuning") or {}
            if tuning.get("mode") == "random-stopping":
                studies[tuning["study_id"]] = (record["task"], record["method"], float(record["epsilon_target"]))
    return studies


@functools.cache
def committed_releases() -> tuple[tuple[str, str, str], ...]:
    """(study id, created_at, commit) of every random-stopping release in every committed version of :data:`PATHS`
    (read once per process: the history does not change under it)."""
    found = []
    for path in PATHS:
        for commit in git("log", "--format=%h", "--", path).split():
            try:
                blob = git("show", f"{commit}:{path}", binary=True)
            except subprocess.CalledProcessError:  # the commit deleted the file
                continue
            text = gzip.decompress(blob).decode() if path.endswith(".gz") else blob.decode()
            for line in text.splitlines():
                record = json.loads(line) if line.strip() else {}
                tuning = record.get("tuning") or {}
                if tuning.get("mode") == "random-stopping":
                    found.append((tuning.get("study_id"), str(record.get("created_at", "")), commit))
    return tuple(found)


def exposed(studies: dict) -> dict[str, set[str]]:
    """The board's studies whose release appears in some committed file with a time other than midnight, and the
    commits that hold it."""
    found = collections.defaultdict(set)
    for study, created_at, commit in committed_releases():
        if study in studies and not created_at.endswith(MIDNIGHT):
            found[study].add(commit)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    parser.add_argument("--grid")
    parser.add_argument("--mark", default="‡")
    parser.add_argument("--check", action="store_true", help="exit 1 unless the grid's note names exactly these cells")
    args = parser.parse_args(argv)
    studies = released(args.records)
    found = exposed(studies)
    per_cell = collections.defaultdict(lambda: [0, 0])
    for study, cell in studies.items():
        per_cell[cell][1] += 1
        per_cell[cell][0] += study in found
    cells = {cell for cell, (hit, total) in per_cell.items() if hit}
    commits = collections.Counter(commit for held in found.values() for commit in held)
    print(f"{len(found)} of {len(studies)} random-stopping releases, in {len(cells)} of {len(per_cell)} cells, have "
          f"their time to the second in the history ({', '.join(f'{c}: {n}' for c, n in commits.most_common())})")
    partial = sorted(cell for cell in cells if per_cell[cell][0] != per_cell[cell][1])
    for task, method, epsilon in sorted(cells):
        hit, total = per_cell[task, method, epsilon]
        print(f"  {task} · {method} · ε = {epsilon:g}: {hit} of {total} studies")
    if not args.check:
        return 0
    grid = json.loads(Path(args.grid).read_text(encoding="utf-8"))
    noted = {(part["task"], part["method"], float(e)) for note in grid.get("notes", []) if note["mark"] == args.mark
             for part in note["cells"] if part["track"] == "random-stopping" for e in part["epsilons"]}
    if partial or noted != cells:
        def some(found):
            return f"{len(found)} {sorted(found)[:3]}{' ...' if len(found) > 3 else ''}"
        print(f"the grid's {args.mark} note does not name exactly the exposed cells: missing {some(cells - noted)}, "
              f"extra {some(noted - cells)}, partly exposed {some(set(partial))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
