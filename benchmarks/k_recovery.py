"""The attack of issue 31 item 1 on released random-stopping records: recompute each study's K from the record's public
seed, as the code before the fix drew it, and compare with the K the study drew from its secret (read from the study
storage, which only the data owner holds). Before the fix it recovered K in every record; after it, agreement is at
the rate of two independent draws::

    python benchmarks/k_recovery.py leaderboards/results.jsonl STUDY_STORAGE.sqlite
"""
from __future__ import annotations

import argparse
import collections
import json
import sqlite3

from dpbench.tuning.accounting import draw_k


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    parser.add_argument("storage", help="the Optuna SQLite storage the studies were created in")
    args = parser.parse_args(argv)
    attrs = collections.defaultdict(dict)
    with sqlite3.connect(f"file:{args.storage}?mode=ro", uri=True) as db:
        for study, key, value in db.execute("select study_id, key, value_json from study_user_attributes "
                                            "where key in ('secret', 'study_id')"):
            attrs[study][key] = json.loads(value)
    secrets = {a["study_id"]: a["secret"] for a in attrs.values() if {"study_id", "secret"} <= a.keys()}
    released = recovered = unmatched = 0
    distributions = set()
    with open(args.records, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line) if line.strip() else {}
            tuning = record.get("tuning") or {}
            if tuning.get("mode") != "random-stopping":
                continue
            if tuning["study_id"] not in secrets:
                unmatched += 1
                continue
            released += 1
            distributions.add(json.dumps(tuning["k_distribution"], sort_keys=True))
            recovered += draw_k(tuning["k_distribution"], secrets[tuning["study_id"]]) == draw_k(
                tuning["k_distribution"], record["seed"])
    print(f"{released} random-stopping records matched to their study's secret ({unmatched} not found); K recomputed "
          f"from the public seed equals the study's K in {recovered} ({recovered / max(released, 1):.1%})")
    for distribution in sorted(distributions):
        draws = collections.Counter(draw_k(json.loads(distribution), seed) for seed in range(20000))
        chance = sum((count / 20000) ** 2 for count in draws.values())
        print(f"two independent draws of K ~ {distribution} agree with probability {chance:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
