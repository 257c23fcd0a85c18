"""Carry an unfinished rebuild of the board from one machine to the next: ``save`` writes the store's training runs
(``$DPBENCH_HOME``) to ``leaderboards/rebuild/records.jsonl.gz``; ``load`` puts them back into a store, where
``dpbench sweep grid.json`` skips them and runs only what is missing.

    DPBENCH_HOME=/path/to/store python leaderboards/checkpoint.py save|load

What is saved is what the board publishes: the store's training-run records (no audit or federated records),
each sealed by its run id (the hash of its content). A random-stopping study's secret (its K and trial draws) lives
in the study storage, never in a record, and is not saved: a study cut short is run again from the start with fresh
coins. ``load`` checks the whole file before it stores anything and refuses it (exit 2, nothing stored) if it is
not gzip JSON lines, a line is not a training-run record, a record's run id is not its content's hash, or a record
fails what ``dpbench verify`` checks without rerunning (its ε from its public plan). The hash is not a signature:
anyone can reseal an edited record, and a forged metric only ``verify --rerun`` catches, as for any file of
records. ``save`` writes a new file and then replaces the old one.
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from dpbench.results import store
from dpbench.trust import record_checks

CHECKPOINT = Path(__file__).resolve().parent / "rebuild" / "records.jsonl.gz"
REQUIRED = ("run_id", "task", "method", "data_id", "created_at")


def save() -> int:
    records = store.load()
    if not records:  # a wrong DPBENCH_HOME would otherwise overwrite the checkpoint with nothing
        print(f"checkpoint: {store.describe()} holds no runs: nothing saved", file=sys.stderr)
        return 2
    CHECKPOINT.parent.mkdir(exist_ok=True)
    partial = CHECKPOINT.with_suffix(".partial")  # a machine lost mid-save leaves the last checkpoint whole
    with gzip.open(partial, "wt", encoding="utf-8") as out:
        out.writelines(json.dumps(record, sort_keys=True) + "\n" for record in records)
    partial.replace(CHECKPOINT)
    print(f"{len(records)} records from {store.describe()} to {CHECKPOINT}")
    return 0


def load() -> int:
    if not CHECKPOINT.exists():
        print(f"checkpoint: no {CHECKPOINT}: nothing loaded", file=sys.stderr)
        return 2
    try:
        with gzip.open(CHECKPOINT, "rt", encoding="utf-8") as found:
            records = [json.loads(line) for line in found]
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as error:
        print(f"checkpoint: {CHECKPOINT} is not gzip JSON lines ({error}): nothing loaded", file=sys.stderr)
        return 2
    malformed = [number for number, record in enumerate(records, 1)
                 if not isinstance(record, dict) or any(key not in record for key in REQUIRED)
                 or record.get("kind", "run") != "run"]
    if malformed:
        print(f"checkpoint: {len(malformed)} lines that are not records (first line {malformed[0]}): nothing loaded",
              file=sys.stderr)
        return 2
    forged = [record["run_id"] for record in records if store.content_id(record) != record["run_id"]]
    if forged:
        print(f"checkpoint: {len(forged)} records whose run id is not their content's hash (first {forged[0]}): "
              "nothing loaded", file=sys.stderr)
        return 2
    for record in records:  # what dpbench verify checks of each record, before any takes a cell's place
        problems = record_checks.check(record)
        if problems:
            print(f"checkpoint: record {record['run_id']} fails verify ({problems[0]}): nothing loaded",
                  file=sys.stderr)
            return 2
    for record in records:
        store.append(record)
    print(f"{len(records)} records from {CHECKPOINT} into {store.describe()}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] not in (["save"], ["load"]):
        print("usage: python leaderboards/checkpoint.py save|load", file=sys.stderr)
        sys.exit(2)
    sys.exit(save() if sys.argv[1] == "save" else load())
