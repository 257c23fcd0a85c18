"""``dpbench verify --rerun``: records trained again from their fields, each rerun's whole record compared with
the recorded one."""
from __future__ import annotations

import contextlib
import math
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import dp_accounting
import torch

from dpbench.choices import REFERENCE_MODE
from dpbench.data.files import DataError
from dpbench.errors import TuningError, UsageError
from dpbench.registry import RegistryError
from dpbench.results.identity import identity
from dpbench.spec import RunSpec
from dpbench.trust.plan_checks import _run_event
from dpbench.trust.recompute import Mismatch, _error


def _spec(record: dict[str, Any], store_path: Path) -> RunSpec:
    gradient = "privacy_ledger" not in record
    target = record.get("epsilon_target")
    return RunSpec(
        method=record["method"], task=record["task"], epsilon=target if record.get("private") else None,
        noise_multiplier=(record["noise_multiplier"] if record.get("private") and gradient and target is None
                          else None),
        delta=record["delta"] if record.get("private") else None, seed=record["seed"],
        overrides=dict(record.get("overrides") or {}), profile=record.get("profile"),
        sampler=record["sampler"] if gradient else None,
        accountant=(record.get("accountant") or "pld") if gradient else "pld",
        neighbouring=record.get("neighbouring") if gradient and record.get("private") else None,
        clipping="reference" if record.get("clipping") == "vmap" else "fast",
        isolate=record.get("isolation") == "process",
        noise="torch" if str(record.get("noise") or "").startswith("torch") else "fast", progress_bar=False,
        no_wandb=True, append_to_store=False, store_path=store_path)


@contextlib.contextmanager
def _restored_threads(threads: int):
    try:
        yield
    finally:
        torch.set_num_threads(threads)


#: What a rerun's record may differ in: when, where, by which commit and libraries and how fast it ran, its hash.
#: The code is compared without its file hashes (:func:`_without_hashes`): a later commit may reproduce the record.
UNCOMPARED = ("run_id", "created_at", "train_seconds", "threads", "git_commit", "versions", "wandb_run")


def _without_hashes(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its code's file hashes left out (a later commit may reproduce it); which code it names, and
    whether that is an external plugin, stay compared."""
    code = {part: {k: v for k, v in (found or {}).items() if k != "sha256"}
            for part, found in (record.get("code") or {}).items()}
    return {**record, "code": code}


def _epsilon_error(record: dict[str, Any]) -> float:
    """How far two machines' ε for ``record`` may differ: the accountant's error
    (:func:`~dpbench.trust.recompute._error`) for a gradient run; for a release method, the sum of its output-noise
    parts' (its other parts are closed forms)."""
    if "privacy_ledger" not in record:
        relation = record.get("neighbouring") or ("add-remove" if record["sampler"] == "poisson" else "replace-one")
        return _error(_run_event(record), record["delta"], record["accountant"], relation)()
    events = [(dp_accounting.GaussianDpEvent(e["noise_std"] / e["sensitivity"]), e["delta"])
              for e in record["privacy_ledger"] if e["what"].startswith("output noise")]
    return math.fsum(_error(event, delta, "pld", "add-remove")() for event, delta in events) + 1e-12


def _differences(again: Any, recorded: Any, error: float, where: str = "") -> list[str]:
    """Where a rerun's record differs from the recorded one: ε (any ``epsilon`` field) by more than ``error``,
    anything else at all."""
    if isinstance(again, dict) and isinstance(recorded, dict):
        return [found for key in sorted(again.keys() | recorded.keys()) if not (not where and key in UNCOMPARED)
                for found in _differences(again.get(key), recorded.get(key), error, f"{where}.{key}".lstrip("."))]
    if isinstance(again, list) and isinstance(recorded, list) and len(again) == len(recorded):
        return [found for index, (a, b) in enumerate(zip(again, recorded))
                for found in _differences(a, b, error, f"{where}[{index}]")]
    if where.rsplit(".", 1)[-1] == "epsilon" and isinstance(again, float) and isinstance(recorded, float):
        return [] if abs(again - recorded) <= error else [f"{where} {again!r} (recorded {recorded!r})"]
    return [] if again == recorded else [f"{where} {again!r} (recorded {recorded!r})"]


def _solved(record: dict[str, Any]) -> dict[str, Any]:
    """A reference record (:mod:`dpbench.tuning.reference`) as reruns must reproduce it: the solver's iterations,
    last gradient and weights' bytes left out, its losses to 6 significant digits (they depend on the thread count
    and the BLAS); the held-out accuracies, the chosen l2 and the test accuracy exactly."""
    def solve(fit: dict[str, Any]) -> dict[str, Any]:
        return {key: float(f"{value:.6g}") if key in ("objective", "validation_loss") else value
                for key, value in fit.items() if key not in ("iterations", "max_gradient")}

    tuning = record["tuning"]
    metrics = {**record["metrics"], "test_loss": float(f"{record['metrics']['test_loss']:.6g}")}
    return {**{k: v for k, v in record.items() if k != "weights_sha256"}, "metrics": metrics,
            "tuning": {**tuning, "fits": [solve(fit) for fit in tuning["fits"]], "refit": solve(tuning["refit"])}}


def _solve_again(record: dict[str, Any]) -> dict[str, Any]:
    """A reference record solved again with its grid and split."""
    from dpbench.tuning import reference
    from dpbench.tuning.validation import TrackSettings

    config = record["tuning"]["config"]
    settings = TrackSettings(fraction=config["validation_fraction"], seed=config["split_seed"])
    return reference.run(record["task"], grid=tuple(config["l2_grid"]), settings=settings, append_to_store=False)


def _seeded(record: dict[str, Any]) -> bool:
    """Whether the record states its seed (a ``--secret-seed`` run's is ``"secret"``): only such a run can be
    rerun."""
    return isinstance(record.get("seed"), int) and not isinstance(record.get("seed"), bool)


def rerun(records: list[dict[str, Any]], count: int, seed: int = 0) -> list[str]:
    """Rerun ``count`` random rerunnable records; where each rerun's whole record differs from the recorded one
    (:func:`_differences`). Records with a secret seed or secret noise coins cannot be: a line on stderr each says
    how many."""
    from dpbench.run import engine, multiseed

    runs = [r for r in records if r.get("kind", "run") == "run" and (r.get("tuning") is None or
                                                                     r["tuning"].get("mode") == REFERENCE_MODE)]
    secret = [r for r in runs if not _seeded(r)]
    if secret:
        print(f"{len(secret)} record(s) with a secret seed (e.g. {secret[0]['run_id']}): their ε is recomputed, but "
              f"they cannot be rerun", file=sys.stderr)
    noisy = [r for r in runs if _seeded(r) and r.get("noise_coins") == "secret"]
    if noisy:
        print(f"{len(noisy)} isolated run record(s) with secret noise coins (e.g. {noisy[0]['run_id']}): their ε and "
              f"counts are recomputed, but no rerun can reproduce their metrics, so none is compared", file=sys.stderr)
    candidates = [r for r in runs if _seeded(r) and r.get("noise_coins") != "secret"]
    chosen = random.Random(seed).sample(candidates, min(count, len(candidates)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    problems = []
    with tempfile.TemporaryDirectory() as scratch, _restored_threads(threads):
        store_path = Path(scratch) / "results.sqlite"  # release methods always store; not the user's store
        for record in chosen:
            reference = record.get("tuning") is not None  # the only tuned records rerun: solved again
            spec = None if reference else _spec(record, store_path)
            if record.get("clipping") == "multiseed":
                seeds = sorted({r["seed"] for r in candidates if r.get("clipping") == "multiseed" and
                                r.get("batched_seeds") == record["batched_seeds"] and
                                identity(r) == identity(record)})
                if len(seeds) != record["batched_seeds"]:
                    problems.append(f"{record['run_id']}: trained in a batch of {record['batched_seeds']} seeds, "
                                    f"of which the file holds {len(seeds)}: cannot rerun it exactly")
                    continue
            try:
                if reference:
                    again = _solve_again(record)
                else:
                    again = (multiseed.run_seeds(spec, seeds)[seeds.index(record["seed"])]
                             if record.get("clipping") == "multiseed" else engine.run(spec))
            except (UsageError, DataError, RegistryError, TuningError, multiseed.NotBatchable) as error:
                problems.append(f"{record['run_id']}: cannot rerun it: {error}")  # e.g. a plugin not here
                continue
            try:
                if reference:
                    differences = _differences(_solved(_without_hashes(again)), _solved(_without_hashes(record)), 0.0)
                else:
                    # Gradient runs recorded before they could be isolated (dpbench.run.isolation) ran in process.
                    ran_in = {"isolation": "in-process"} if "isolation" in again else {}
                    differences = _differences(_without_hashes(again), _without_hashes({**ran_in, **record}),
                                               _epsilon_error(record) if record.get("private") else 0.0)
            except (Mismatch, KeyError, TypeError, ValueError, ZeroDivisionError) as error:  # check() says why
                differences = [f"ε not recomputable ({type(error).__name__}: {error})"]
            if differences:
                problems.append(f"{record['run_id']} ({record['method']} on {record['task']}, seed "
                                f"{record['seed']}): the rerun differs in {'; '.join(differences)}")
    return problems
