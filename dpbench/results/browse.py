"""``dpbench runs`` and ``dpbench show``: what is in the results store, without a leaderboard."""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from dpbench.errors import UsageError
from dpbench.results import store
from dpbench.results.identity import identity


def _track(record: dict[str, Any]) -> str:
    return (record.get("tuning") or {}).get("mode", "none")


def _experiment(record: dict[str, Any]) -> tuple[str, Any] | None:
    """(identity, seed) of a training run with a known seed, None for other records (audits, federated runs,
    secret seeds): the runs of one experiment (:mod:`dpbench.results.identity`)."""
    if record.get("kind", "run") != "run" or record.get("seed") == "secret":
        return None
    return identity(record), record.get("seed")


def reruns(records: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """run id -> (k, m): the k-th of the m stored runs (in the order stored) of its settings and seed."""
    groups: dict[tuple[str, Any], list[str]] = defaultdict(list)
    for record in records:
        if (key := _experiment(record)) is not None:
            groups[key].append(record["run_id"])
    return {run_id: (k, len(ids)) for ids in groups.values() for k, run_id in enumerate(ids, 1)}


def runs_table(task: str | None = None, method: str | None = None, limit: int | None = None) -> str:
    """One line per stored run (newest last): id, time, task, method, track, ε (target/spent), seed, which rerun of
    its settings and seed it is (k/m), first metric."""
    where = {key: value for key, value in (("task", task), ("method", method)) if value}
    found = store.load(kind=None, **where)
    if not found:
        raise UsageError(f"no runs{' matching ' + ', '.join(f'{k}={v}' for k, v in where.items()) if where else ''}"
                         f" in {store.describe()}")
    numbers = reruns(found)
    shown = found[-limit:] if limit else found
    lines = [f"{'run':16}  {'created':25}  {'task':14}  {'method':20}  {'track':15}  {'ε target':>8}  "
             f"{'ε spent':>8}  {'seed':>4}  {'rerun':>5}  metric"]
    for record in shown:
        metrics = record.get("metrics") or {}
        metric = next(iter(sorted(metrics.items())), None)
        target, spent = record.get("epsilon_target"), record.get("epsilon", record.get("epsilon_claimed"))
        kind = record.get("kind", "run")
        rerun = "%d/%d" % numbers[record["run_id"]] if record["run_id"] in numbers else "—"
        lines.append(f"{record['run_id']:16}  {record.get('created_at', ''):25}  {record.get('task', ''):14.14}  "
                     f"{record.get('method', record.get('client_method', '')):20.20}  "
                     f"{_track(record) if kind == 'run' else kind:15.15}  "
                     f"{'—' if target is None else f'{target:g}':>8}  {'—' if spent is None else f'{spent:.4g}':>8}  "
                     f"{record.get('seed', ''):>4}  {rerun:>5}  {f'{metric[0]} = {metric[1]:.4f}' if metric else ''}")
    if limit and len(found) > limit:
        lines.append(f"({len(found) - limit} earlier runs not shown)")
    if any(m > 1 for _, m in numbers.values()):
        lines.append("(rerun k/m: the k-th of m stored runs of the same settings and seed; the leaderboard and the "
                     "sweep count the seed once)")
    return "\n".join(lines)


def show(run_id: str) -> dict[str, Any]:
    """The stored record whose id is ``run_id`` or starts with it (a unique prefix)."""
    matches = [record for record in store.load(kind=None) if record["run_id"].startswith(run_id)]
    if not matches:
        raise UsageError(f"no run {run_id!r} in {store.describe()}")
    if len(matches) > 1:
        raise UsageError(f"{run_id!r} matches {len(matches)} runs: {', '.join(r['run_id'] for r in matches[:5])}")
    return matches[0]


def show_text(run_id: str) -> str:
    return json.dumps(show(run_id), indent=1, sort_keys=True)
