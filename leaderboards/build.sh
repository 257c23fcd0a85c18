#!/usr/bin/env bash
# Rebuilds the committed leaderboards: runs the grid (skipping runs already in $DPBENCH_HOME's store), then writes
# one markdown table file per task, the HTML page, the CSV of cells and the records they come from.
set -euo pipefail
cd "$(dirname "$0")"
dpbench sweep grid.json --workers 2  # two cells at a time, one torch thread each on a 2-core machine
for task in $(python3 -c "import json; print(' '.join(json.load(open('grid.json'))['tasks']))"); do
    dpbench leaderboard --task "$task" --format md --out "$task.md"
done
dpbench leaderboard --format html --out index.html
dpbench leaderboard --format csv --out leaderboard.csv
dpbench leaderboard --format jsonl --out results.jsonl
