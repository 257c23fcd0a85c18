"""``dpbench runs`` and ``dpbench show``: what is in the results store, without a leaderboard."""
from __future__ import annotations

import json
from typing import Any

from dpbench.errors import UsageError
from dpbench.results import store


def _track(record: dict[str, Any]) -> str:
    return (record.get("tuning") or {}).get("mode", "none")


def runs_table(task: str | None = None, method: str | None = None, limit: int | None = None) -> str:
    """One line per stored run (newest last): id, time, task, method, track, ε (target/spent), seed, first metric."""
    where = {key: value for key, value in (("task", task), ("method", method)) if value}
    found = store.load(kind=None, **where)
    if not found:
        raise UsageError(f"no runs{' matching ' + ', '.join(f'{k}={v}' for k, v in where.items()) if where else ''}"
                         f" in {store.describe()}")
    shown = found[-limit:] if limit else found
    lines = [f"{'run':16}  {'created':25}  {'task':14}  {'method':20}  {'track':15}  {'ε target':>8}  "
             f"{'ε spent':>8}  {'seed':>4}  metric"]
    for record in shown:
        metrics = record.get("metrics") or {}
        metric = next(iter(sorted(metrics.items())), None)
        target, spent = record.get("epsilon_target"), record.get("epsilon", record.get("epsilon_claimed"))
        kind = record.get("kind", "run")
        lines.append(f"{record['run_id']:16}  {record.get('created_at', ''):25}  {record.get('task', ''):14.14}  "
                     f"{record.get('method', record.get('client_method', '')):20.20}  "
                     f"{_track(record) if kind == 'run' else kind:15.15}  "
                     f"{'—' if target is None else f'{target:g}':>8}  {'—' if spent is None else f'{spent:.4g}':>8}  "
                     f"{record.get('seed', ''):>4}  {f'{metric[0]} = {metric[1]:.4f}' if metric else ''}")
    if limit and len(found) > limit:
        lines.append(f"({len(found) - limit} earlier runs not shown)")
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
