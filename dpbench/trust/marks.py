"""How far the board trusts an external plugin's row: its isolation, then its audit as evidence (no imports beyond
the standard library: the board reads it without loading PyTorch)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str, str]  # (method code sha256, task, isolation: "in-process" | "process")

#: The fields of a run that an audit's pass is tied to: what a plugin sees and can branch on.
CONDITIONS = ("hyperparameters", "epsilon_target", "delta", "neighbouring", "data_id", "sampler", "noise")


def settings_key(record: dict[str, Any]) -> str:
    """Canonical JSON of a run's (or an audit's run's) :data:`CONDITIONS`: its resolved hyperparameters, target ε,
    δ (a larger δ lowers an audit's bound), neighbouring relation, data (an audit's without its canaries' suffix),
    sampler and noise sampler."""
    found = {name: record.get(name) for name in CONDITIONS}
    if record.get("kind") == "audit" and isinstance(found["data_id"], str):
        found["data_id"] = found["data_id"].removesuffix(f"+{record.get('canaries')}-audit-canaries")
    return json.dumps(found, sort_keys=True)


@dataclass
class AuditEvidence:
    """The audits of external plugins, as the board uses them (``dpbench.trust.audit.audit_status``): the codes
    whose audit failed on a task, and, for each (code, task, isolation), the settings (:func:`settings_key`) at
    which one passed.

    A plugin can branch on its hyperparameters, its σ, the relation or the data as on anything else it sees, so a
    pass is evidence for runs of those settings only: a row whose runs used others shows "audit passed at other
    settings". A privately tuned row is judged by its released (selected) trial's settings: its other trials, whose
    settings are never released, are covered by no audit."""

    failed: set[Key] = field(default_factory=set)
    passed: dict[Key, set[str]] = field(default_factory=dict)

    def of(self, key: Key, runs: list[dict[str, Any]]) -> str:
        """"failed", "passed" (every one of ``runs`` made at audited settings), "passed at other settings" or
        "unaudited"."""
        if key in self.failed:
            return "failed"
        audited = self.passed.get(key)
        if not audited:
            return "unaudited"
        if runs and all(settings_key(run) in audited for run in runs):
            return "passed"
        return "passed at other settings"


def plugin_mark(isolation: str, audit: str) -> str:
    """The board's mark of an external plugin's row: "isolated" for ``isolation`` "process", else "unverified:
    in-process plugin"; then the audit of its code on the task, as evidence ("audit passed", "audit passed at other
    settings", "audit failed", "unaudited")."""
    trust = "isolated" if isolation == "process" else "unverified: in-process plugin"
    return f"{trust}, {audit if audit == 'unaudited' else 'audit ' + audit}"
