"""How far the board trusts an external plugin's row: its isolation, then its audit as evidence (no imports beyond
the standard library: the board reads it without loading PyTorch)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str, str]  # (method code sha256, task, isolation: "in-process" | "process")


def settings_key(hyperparameters: dict[str, Any]) -> str:
    """Canonical JSON of a run's resolved hyperparameters: what an audit's pass is tied to."""
    return json.dumps(hyperparameters, sort_keys=True)


@dataclass
class AuditEvidence:
    """The audits of external plugins, as the board uses them (``dpbench.trust.audit.audit_status``): the codes
    whose audit failed on a task, and, for each (code, task, isolation), the hyperparameters at which one passed.

    A plugin can branch on its hyperparameters as on anything else it sees, so a pass is evidence for runs of those
    settings only: a row whose runs used others shows "audit passed at other hyperparameters"."""

    failed: set[Key] = field(default_factory=set)
    passed: dict[Key, set[str]] = field(default_factory=dict)

    def of(self, key: Key, hyperparameters: list[dict[str, Any]]) -> str:
        """"failed", "passed" (every one of ``hyperparameters`` audited), "passed at other hyperparameters" or
        "unaudited"."""
        if key in self.failed:
            return "failed"
        audited = self.passed.get(key)
        if not audited:
            return "unaudited"
        if hyperparameters and all(settings_key(hp) in audited for hp in hyperparameters):
            return "passed"
        return "passed at other hyperparameters"


def plugin_mark(isolation: str, audit: str) -> str:
    """The board's mark of an external plugin's row: "isolated" for ``isolation`` "process", else "unverified:
    in-process plugin"; then the audit of its code on the task, as evidence ("audit passed", "audit passed at other
    hyperparameters", "audit failed", "unaudited")."""
    trust = "isolated" if isolation == "process" else "unverified: in-process plugin"
    return f"{trust}, {audit if audit == 'unaudited' else 'audit ' + audit}"
