"""``dpbench leaderboard``: tables (methods × ε, one per track), plots and checks, from the results store, a records
file or W&B. How runs are grouped and compared: :mod:`dpbench.board.model`; the checks:
:mod:`dpbench.board.check`; the formats: :mod:`dpbench.board.text` (markdown, CSV) and
:mod:`dpbench.board.html` (the page, and its run ids in a file beside it). Only records of the current ledger
version are used.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from dpbench.board.check import check, load_exceptions
from dpbench.board.model import build_tables, unmatched_published
from dpbench.board.text import to_csv, to_markdown
from dpbench.choices import BOARD_FORMATS
from dpbench.errors import UsageError
from dpbench.results import store, tracking
from dpbench.results.records import LEDGER_VERSION, check_stored

FORMATS = BOARD_FORMATS


def render(records: list[dict[str, Any]], fmt: str, task: str | None = None, runs_file: str | None = None,
           grid_path: str | None = None) -> str:
    """The board of ``records`` (training runs, and audit records, which mark external plugins) in ``fmt``; a page
    (html) links to ``runs_file``, the file of its run ids (:func:`render_page` writes both); the cells ``grid_path``
    declares infeasible are drawn so."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "jsonl":  # the records the tables are built from, one per line
        return "".join(json.dumps(record, sort_keys=True) + "\n" for record in records)
    tables = _tables(records, grid_path)
    if fmt == "csv":
        return to_csv(tables)
    unmatched = unmatched_published(tables, task)
    if fmt == "md":
        return to_markdown(tables, unmatched)
    from dpbench import registry
    from dpbench.board.html import to_html

    return to_html(tables, unmatched, registry.methods(), runs_file)


def render_page(records: list[dict[str, Any]], task: str | None, page_name: str,
                grid_path: str | None = None) -> tuple[str, str, str]:
    """The page, the name of its runs file beside it (``index.html`` → ``index.runs.json``) and that file's text."""
    from dpbench import registry
    from dpbench.board.html import runs_file_name, runs_json, to_html

    tables, runs_file = _tables(records, grid_path), runs_file_name(page_name)
    return (to_html(tables, unmatched_published(tables, task), registry.methods(), runs_file), runs_file,
            runs_json(tables))


def _tables(records: list[dict[str, Any]], grid_path: str | None = None):
    """The tables of ``records``, with the infeasible cells, the notes and the seeds asked of the grid at
    ``grid_path`` (if given; read once)."""
    from dpbench.board import grid as grid_file, infeasible, notes
    from dpbench.trust.audit import audit_status

    runs = [record for record in records if record.get("kind", "run") == "run"]
    tables = build_tables(runs, audits=audit_status(records))
    if not grid_path:
        return tables
    grid, where = grid_file.load(grid_path), f"grid {grid_path}"
    asked = grid_file.seeds_asked(grid)
    for table in tables:
        table.seeds_asked = asked.get(table.task, 0)
    return notes.annotate(infeasible.declare(tables, infeasible.from_grid(grid, where)), notes.from_grid(grid, where))


def grid_beside(records_path: str | None, grid_path: str | None = None) -> str | None:
    """The grid whose declarations apply: ``grid_path``, else ``grid.json`` beside the records file if there is one."""
    if grid_path is None and records_path:
        beside = Path(records_path).with_name("grid.json")
        grid_path = str(beside) if beside.exists() else None
    return grid_path


def read_records(path: str) -> list[dict[str, Any]]:
    """A JSON-lines file of records (``dpbench leaderboard --format jsonl`` writes one)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read records {path}: {error}") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise UsageError(f"{path}:{number}: not a JSON record: {error}") from None
        required = ({"run_id", "task", "method", "data_id", "private", "seed", "metrics", "sampler", "accountant"}
                    if isinstance(record, dict) and record.get("kind", "run") == "run" else {"run_id", "kind"})
        if not isinstance(record, dict) or not required <= set(record) or not isinstance(record.get("metrics", {}),
                                                                                        dict):
            raise UsageError(f"{path}:{number}: a record needs at least {', '.join(sorted(required))}")
        records.append(record)
    return records


def _load(task: str | None, wandb_path: str | None, records_path: str | None) -> tuple[list[dict[str, Any]], str]:
    """The records of the current ledger version (from a records file, W&B or the store, in that order), checked,
    and the note on what was left out ("" if nothing): printed only once the command has succeeded, so that a
    refusal stays one line."""
    if records_path:
        records, source = read_records(records_path), records_path
    elif wandb_path:
        logged = tracking.records_from_wandb(wandb_path)  # merged by run id: logged from several machines
        records = list({str(r.get("run_id")) if isinstance(r, dict) else f"#{i}": r
                        for i, r in enumerate(logged)}.values())
        source = f"W&B project {wandb_path}"
    else:
        records, source = store.load(kind=None), str(store.describe())
    for record in records:
        if not isinstance(record, dict):
            raise UsageError(f"{source}: a record is not an object: {str(record)[:80]}")
    records = [r for r in records if r.get("kind", "run") in ("run", "audit")]
    records = [r for r in records if task is None or r.get("task") == task]
    current = [r for r in records if r.get("ledger_version") == LEDGER_VERSION]
    for record in current:  # the store, a records file or W&B: anyone can edit them
        try:
            check_stored(record)
        except ValueError as error:
            raise UsageError(f"{source}: {error}") from None
    older = (f"{len(records) - len(current)} records of older ledger versions (made before privacy fixes of the "
             f"engine; see dpbench/results/records.py)")
    if not current:
        raise UsageError(f"no runs{f' of task {task!r}' if task else ''} of ledger version {LEDGER_VERSION} in "
                         f"{source}" + (f" ({older} left out)" if records else ""))
    return current, f"dpbench: leaving out {older}" if len(current) < len(records) else ""


def load(task: str | None, wandb_path: str | None, records_path: str | None) -> list[dict[str, Any]]:
    """The records of the current ledger version, from a records file, W&B or the store (in that order)."""
    current, note = _load(task, wandb_path, records_path)
    if note:
        print(note, file=sys.stderr)
    return current


def write(fmt: str, task: str | None = None, out: str | None = None, wandb_path: str | None = None,
          records_path: str | None = None, grid_path: str | None = None) -> None:
    """``dpbench leaderboard``: write the board in ``fmt`` to ``out`` or stdout."""
    records, note = _load(task, wandb_path, records_path)
    grid_path = grid_beside(records_path, grid_path)
    if out is None:
        sys.stdout.write(render(records, fmt, task, grid_path=grid_path))
    else:
        path = Path(out)
        files = [(path, render(records, fmt, task, grid_path=grid_path))] if fmt != "html" else []
        if fmt == "html":  # the page, and its run ids in a file beside it
            page, runs_file, runs_text = render_page(records, task, path.name, grid_path)
            files = [(path.with_name(runs_file), runs_text), (path, page)]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for target, text in files:
                target.write_text(text, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {out}: {error.strerror or error}") from None
    if note:
        print(note, file=sys.stderr)


def run_check(task: str | None = None, wandb_path: str | None = None, records_path: str | None = None,
              exceptions_path: str | None = None, grid_path: str | None = None) -> list[str]:
    """``dpbench leaderboard --check``: the unexplained violations (empty if the board passes). The exceptions file
    and the grid (whose ``infeasible`` declarations apply) default to ``exceptions.json`` and ``grid.json`` beside the
    records file, if there are."""
    if exceptions_path is None and records_path:
        beside = Path(records_path).with_name("exceptions.json")
        exceptions_path = str(beside) if beside.exists() else None
    exceptions = load_exceptions(Path(exceptions_path)) if exceptions_path else []
    return check(_tables(load(task, wandb_path, records_path), grid_beside(records_path, grid_path)), exceptions)
