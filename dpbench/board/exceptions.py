"""The exceptions file of ``dpbench leaderboard --check`` (:mod:`dpbench.board.check`): the violations that remain
after investigation, explained one entry per cause.

An entry (a JSON object; the file is a JSON list of them)::

    {"kind": "collapsed" or ["collapsed", "below-majority"], "reason": "...", "tested_by": "...",
     "relation": "replace-one",                                                  (optional: every relation)
     "cells": [{"task": ..., "method": ..., "track": ..., "epsilons": [...] or "all",
                "kind": ...}, ...]}                                            (kind optional: the entry's)

``reason`` names the cause and what measuring it found, ``tested_by`` the command that measures it. ``kind`` is one
violation kind or a list of them (one cause that shows as several: a release whose noise swamps its signal scores at
the majority-class rate or below it). ``cells`` lists where the cause holds; in each part, ``task``, ``method`` and
``track`` are a name or a list of names and the part names every combination of them at each of its ε (``null``: a
non-private cell, or a boundary hit's every ε); a part's own ``kind`` (one of the entry's kinds or a list of them)
narrows it to those kinds, so that one entry holds one cause however many kinds it shows as, each cell with the kind
it was tested for: in an entry of several kinds, each part must name exactly one. A cause whose cells form one such
product may give the part's keys at the top level instead of ``cells``. Every cell an entry names must match a
violation of one of its kinds (with ``"all"``, each (task, method, track) at least one): one that matches none is a
stale explanation, itself a violation, so that an entry cannot silence a cell that did not violate when its cause
was tested. The irregular
``cells`` list (27 November 2026) lets one cause name the cells it explains, as the grid's notes do
(:mod:`dpbench.board.notes`), rather than one entry per rectangle of them.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpbench.board.grid import finite
from dpbench.choices import NEIGHBOURING
from dpbench.errors import UsageError

if TYPE_CHECKING:
    from dpbench.board.check import Violation

PART_KEYS = ("task", "method", "track", "epsilons")
PART_OPTIONAL = ("kind",)
REQUIRED = ("kind", "reason", "tested_by")


@dataclass(frozen=True)
class Part:
    """Cells of one product: every (task, method, track) at each ε (``"all"``: at any ε), for violations of
    ``kinds`` (None: the entry's)."""
    tasks: tuple[str, ...]
    methods: tuple[str, ...]
    tracks: tuple[str, ...]
    epsilons: tuple[float | None, ...] | str
    kinds: tuple[str, ...] | None = None

    def names(self, violation: Violation) -> bool:
        return ((self.kinds is None or violation.kind in self.kinds) and violation.task in self.tasks
                and violation.method in self.methods and violation.track in self.tracks
                and (self.epsilons == "all" or violation.epsilon in self.epsilons))


@dataclass(frozen=True)
class Explanation:
    """One entry: a cause (``reason``, ``tested_by``) of violations of ``kinds`` at the cells of ``parts``."""
    kinds: tuple[str, ...]
    relation: str | None
    parts: tuple[Part, ...]
    text: str  # the entry as written, to quote when it is stale

    def explains(self, violation: Violation) -> bool:
        return (violation.kind in self.kinds and self.relation in (None, violation.relation)
                and any(part.names(violation) for part in self.parts))

    def stale(self, found: list[Violation]) -> list[str]:
        """Every cell the entry names that matches none of ``found`` (module docstring)."""
        stale = []
        for part in self.parts:
            matched = {(v.task, v.method, v.track, v.epsilon) for v in found
                       if self.explains(v) and part.names(v)}  # a cell explained by another part is not this one's
            for task, method, track in itertools.product(part.tasks, part.methods, part.tracks):
                if part.epsilons == "all":
                    if not any(cell[:3] == (task, method, track) for cell in matched):
                        stale.append(f"{task} · {method} · {track} · every ε")
                    continue
                stale += [f"{task} · {method} · {track} · ε = {e}" for e in part.epsilons
                          if (task, method, track, e) not in matched]
        return list(dict.fromkeys(stale))


def _names(value: Any) -> bool:
    return (isinstance(value, str) and bool(value)) or (isinstance(value, list) and bool(value) and all(
        isinstance(name, str) and name for name in value) and len(set(value)) == len(value))


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _epsilon_list(value: Any) -> bool:
    """"all", or a non-empty list of distinct numbers (``null`` for a non-private cell or a boundary hit)."""
    return value == "all" or (isinstance(value, list) and bool(value) and all(e is None or finite(e) for e in value)
                              and len(set(value)) == len(value))


def _listed(value: str | list[str]) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, list) else (value,)


def _part(value: Any) -> Part | str:
    """The part a ``cells`` item (or an entry's top-level keys) gives, or what is wrong with it."""
    if not isinstance(value, dict) or any(key not in value for key in PART_KEYS):
        return f"each part of cells needs {', '.join(PART_KEYS)}"
    if not all(_names(value[key]) for key in ("task", "method", "track")):
        return "task, method and track must each be a name or a list of distinct names"
    if not _epsilon_list(value["epsilons"]):
        return 'epsilons must be "all" or a non-empty list of distinct numbers (null: non-private or every ε)'
    epsilons = "all" if value["epsilons"] == "all" else tuple(None if e is None else float(e)
                                                                 for e in value["epsilons"])
    kinds = _listed(value["kind"]) if "kind" in value else None
    if kinds is not None and not _names(value["kind"]):
        return "a part's kind must be a name or a list of distinct names"
    return Part(_listed(value["task"]), _listed(value["method"]), _listed(value["track"]), epsilons, kinds)


def parse(entry: Any, kinds: tuple[str, ...]) -> Explanation | str:
    """The explanation an entry gives (``kinds``: the violation kinds there are), or what is wrong with it."""
    if not isinstance(entry, dict) or any(key not in entry for key in REQUIRED):
        return f"it needs {', '.join(REQUIRED)}, and cells or {', '.join(PART_KEYS)} (relation optional)"
    listed = entry["kind"] if isinstance(entry["kind"], list) else [entry["kind"]]
    if not _names(entry["kind"]) or any(kind not in kinds for kind in listed):
        return f"kind must be one of {', '.join(kinds)}, or a list of distinct ones"
    if not _text(entry["reason"]) or not _text(entry["tested_by"]):
        return "reason (the cause, and what measuring it found) and tested_by (the command that measures it) must " \
               "be non-empty"
    flat = [key for key in PART_KEYS if key in entry]
    if ("cells" in entry) == bool(flat):
        return f"give either cells or {', '.join(PART_KEYS)}, not both and not neither"
    unknown = set(entry) - set(REQUIRED) - {"relation", "cells", *PART_KEYS}
    if unknown:
        return f"unknown keys {', '.join(sorted(unknown))}"
    if "relation" in entry and entry["relation"] not in NEIGHBOURING:
        return f"relation must be one of {', '.join(NEIGHBOURING)} (or left out: every relation)"
    items = entry["cells"] if "cells" in entry else [{key: entry.get(key) for key in PART_KEYS}]
    if not isinstance(items, list) or not items:
        return "cells must be a non-empty list of {task, method, track, epsilons}"
    parts = []
    for item in items:
        unknown = set(item) - set(PART_KEYS) - set(PART_OPTIONAL) if isinstance(item, dict) else set()
        if unknown:
            return f"unknown keys in a part of cells: {', '.join(sorted(unknown))}"
        part = _part(item)
        if isinstance(part, str):
            return part
        if part.kinds is not None and not set(part.kinds) <= set(listed):
            return f"a part's kind must be among the entry's kinds ({', '.join(listed)})"
        if len(listed) > 1 and (part.kinds is None or len(part.kinds) != 1):
            return "in an entry of several kinds each part names one kind, the kind its cells were tested for"
        # every kind at every ε of a method: a blanket, not a cause
        if part.epsilons == "all" and len(part.kinds or listed) > 1:
            return 'epsilons "all" takes one kind: list the ε of a cause that shows as several kinds'
        parts.append(part)
    return Explanation(tuple(listed), entry.get("relation"), tuple(parts), json.dumps(entry, ensure_ascii=False))


def load(path: Path, kinds: tuple[str, ...]) -> list[Explanation]:
    """The explanations of the exceptions file at ``path``; UsageError naming the first entry that is wrong."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read the exceptions file {path}: {error}") from None
    if not isinstance(entries, list):
        raise UsageError(f"{path}: a JSON list of exceptions is expected")
    found = []
    for number, entry in enumerate(entries):
        explanation = parse(entry, kinds)
        if isinstance(explanation, str):
            raise UsageError(f"{path}: entry {number}: {explanation}")
        found.append(explanation)
    return found
