#!/usr/bin/env bash
# Rebuilds the committed leaderboards: runs the grid's three tracks (skipping runs already in $DPBENCH_HOME's store),
# then writes one markdown file per task, the HTML page, the CSV of cells and the records they come from, and
# checks the board (exit 1 if a violation is not explained in exceptions.json).
set -euo pipefail
cd "$(dirname "$0")"
start=$(date +%s)
dpbench sweep grid.json --workers 2  # two cells at a time, one torch thread each on a 2-core machine
echo "sweep: $(( $(date +%s) - start )) s of wall time" >&2
for task in $(python3 -c "import json; print(' '.join(json.load(open('grid.json'))['tasks']))"); do
    dpbench leaderboard --task "$task" --format md --out "$task.md" --grid grid.json
done
dpbench leaderboard --format jsonl --out results.jsonl
dpbench leaderboard --records results.jsonl --format html --out index.html
dpbench leaderboard --records results.jsonl --format csv --out leaderboard.csv
dpbench fidelity --records results.jsonl --records deep/results.jsonl --records federated/records.jsonl \
    --records dperm/results.jsonl --out FIDELITY.md  # dperm/: Yu et al.'s KDDCup99 data, built by dperm/README.md
dpbench leaderboard --records results.jsonl --boundary-hits > boundary-hits.md
# exceptions.json: the violations a cause measured at the cell explains (benchmarks/violation_causes.py); the rest fail
python ../benchmarks/violation_causes.py results.jsonl --grid grid.json --write exceptions.json > causes.txt
dpbench leaderboard --check --records results.jsonl
