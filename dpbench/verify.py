"""``dpbench verify FILE.jsonl [--rerun K]``: check a file of records without trusting the code that wrote them.

For every record (one JSON object per line):

* the content hash: ``run_id`` must be the first 16 hex digits of the sha256 of the record's canonical JSON
  without ``run_id`` (reimplemented here from the definition, not imported from ``dpbench.store``);
* the ledger version: records of an older version (or without one) were made before privacy fixes of the engine;
* ε, recomputed from the record's mechanism fields with dp-accounting directly (the events are built here, not
  by ``dpbench.privacy``), and compared with the record's (relative tolerance :data:`TOLERANCE`):

  - gradient runs: Poisson sampling ``SelfComposed(PoissonSampled(q, Gaussian(σ)), T)`` (q = 1, full batches:
    ``SelfComposed(Gaussian(σ), T)``), shuffled batches ``SelfComposed(Gaussian(σ), started epochs)`` with
    started epochs = ⌈T / (⌊n / (B·k)⌋·k)⌉ (k releases per step = T / steps), after the task's data releases
    (``data_release_events``), under the record's relation and accountant (PLD or RDP); ε must not exceed the
    target;
  - non-private baselines: no ε, no σ;
  - tuned records: the per-trial RDP curve from ``tuning`` (which must agree with the record's σ, q, T and
    relation; gradient trials from dp-accounting's add/remove curve, by the weak triangle inequality under
    replace-one; output trials as Gaussians) must give ``per_trial_epsilon``, then repeat-and-select (random
    stopping; shape η, or ∞ for Poisson) or N-fold composition (adaptive) must give ε; the score noise
    σ_v must satisfy α/(2σ_v²) ≤ the trial's RDP at every order of the RDP accountant; oracle-tuned records are
    checked as the one run they report;
  - release methods: ε and δ are the sums of the ``privacy_ledger`` parts; each output-noise part's ε is
    recomputed as dp-accounting's ``GaussianDpEvent(noise std / sensitivity)`` (PLD); the built-in output
    perturbation's sensitivity is re-derived from its hyperparameters (Wu et al.: 2kLη/b convex,
    2(L + λR)/(λn) strongly convex); AMP's objective part is checked against the paper's noise scale
    σ1 ≥ (2L/n)(1 + √(2 ln(1/δ1)))/ε3 with ε3 = (ε3/ε1)·ε1 (Iyengar et al. 2019, Algorithm 1);
  - audit records: ``epsilon_claimed`` as a gradient run, and the lower bound from (canaries, guesses, correct,
    δ) with Steinke et al.'s Theorem 3 (``dpbench.audit``), and ``passed``.

With ``--rerun K``, K records drawn at random (seed ``--seed``) among those that can be rerun (untuned runs; not
audits) are trained again with one torch thread through ``dpbench.engine.RunSpec`` built from their fields, and
their metrics must be equal exactly. Records trained as a batch of seeds (``clipping: multiseed``) are rerun as
that batch, which must be in the file (the seeds of the same identity); floating-point summation differs between
a batch and a single run.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import tempfile
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
import torch
from dp_accounting import pld, rdp

from dpbench import audit
from dpbench.data import DataError
from dpbench.registry import RegistryError
from dpbench.engine import RunSpec, UsageError, identity
from dpbench.records import LEDGER_VERSION

TOLERANCE = 1e-6
RELATIONS = {"add-remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
             "replace-one": dp_accounting.NeighboringRelation.REPLACE_ONE}
#: The DpEvents a record's ``data_release_events`` may name, rebuilt from their fields.
EVENTS = {cls.__name__: cls for cls in (dp_accounting.GaussianDpEvent, dp_accounting.LaplaceDpEvent,
                                        dp_accounting.NonPrivateDpEvent, dp_accounting.NoOpDpEvent,
                                        dp_accounting.ComposedDpEvent, dp_accounting.SelfComposedDpEvent,
                                        dp_accounting.PoissonSampledDpEvent)}


class Mismatch(Exception):
    """A record disagrees with what it claims."""


def content_id(record: dict[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, json.dumps defaults) of the record without ``run_id``, 16 hex."""
    body = {key: value for key, value in record.items() if key != "run_id"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def load(path: str) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a file that is not one is refused (:class:`UsageError`)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read {path}: {error}") from None
    found = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{path} line {number}: not JSON ({error.msg})") from None
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("run_id", "method",
                                                                                             "task")):
            raise UsageError(f"{path} line {number}: not a dpbench record (an object with run_id, method, task)")
        found.append(record)
    if not found:
        raise UsageError(f"{path} holds no records")
    return found


def _close(recomputed: float, recorded: Any, what: str) -> None:
    if not isinstance(recorded, (int, float)) or isinstance(recorded, bool):
        raise Mismatch(f"{what} is {recorded!r}, recomputed {recomputed:.10g}")
    if not math.isclose(recomputed, recorded, rel_tol=TOLERANCE, abs_tol=1e-12):
        raise Mismatch(f"{what} is {recorded!r}, recomputed {recomputed:.10g}")


def _event(fields: dict[str, Any]) -> dp_accounting.DpEvent:
    """A DpEvent from ``dpbench.privacy.event_fields``'s form."""
    fields = dict(fields)
    cls = EVENTS.get(fields.pop("class_name", None))
    if cls is None:
        raise Mismatch(f"data release event {fields} is not one verify can rebuild")
    for key, value in fields.items():
        if isinstance(value, dict):
            fields[key] = _event(value)
        elif isinstance(value, list):
            fields[key] = [_event(item) for item in value]
    return cls(**fields)


_EPSILONS: dict[tuple, float] = {}  # a file's seeds share their mechanisms


def _epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str, relation: str) -> float:
    key = (repr(event), delta, accountant, relation)  # an event's repr names every field (attrs)
    if key not in _EPSILONS:
        _EPSILONS[key] = _compute_epsilon(event, delta, accountant, relation)
    return _EPSILONS[key]


def _compute_epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str, relation: str) -> float:
    if accountant == "pld":
        found = pld.PLDAccountant(RELATIONS[relation])
    elif accountant == "rdp":
        found = rdp.RdpAccountant(neighboring_relation=RELATIONS[relation])
    else:
        raise Mismatch(f"accountant {accountant!r} is not one verify knows")
    return float(found.compose(event).get_epsilon(delta))


def _training_event(record: dict[str, Any], sigma: float, q: float, releases: int) -> dp_accounting.DpEvent:
    if record["sampler"] == "poisson":
        once = dp_accounting.GaussianDpEvent(sigma)
        if q < 1:
            once = dp_accounting.PoissonSampledDpEvent(q, once)
        return dp_accounting.SelfComposedDpEvent(once, releases)
    if record["sampler"] == "shuffle":
        per_step = releases // record["steps"] if record["steps"] else 1
        batch = record["hyperparameters"]["batch_size"]
        per_epoch = record["n_train"] // (batch * per_step) * per_step
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), -(-releases // per_epoch))
    raise Mismatch(f"sampler {record['sampler']!r} is not one verify knows")


def _run_event(record: dict[str, Any]) -> dp_accounting.DpEvent:
    """The event of a gradient run's record: its data releases, then its noisy gradients."""
    if record.get("data_releases") and len(record.get("data_release_events") or []) != len(record["data_releases"]):
        raise Mismatch("its data releases have no machine-readable events (data_release_events)")
    releases = record["gradient_evaluations"]
    training = (dp_accounting.NoOpDpEvent() if releases == 0 else
                _training_event(record, record["noise_multiplier"], record["sample_rate"], releases))
    before = [_event(fields) for fields in record.get("data_release_events") or []]
    return dp_accounting.ComposedDpEvent([*before, training]) if before else training


def _check_gradient_run(record: dict[str, Any], epsilon_key: str = "epsilon") -> None:
    if not record.get("noise_multiplier", 0) > 0:
        raise Mismatch(f"noise multiplier {record.get('noise_multiplier')!r} is not positive")
    relation = record.get("neighbouring") or ("add-remove" if record["sampler"] == "poisson" else "replace-one")
    spent = _epsilon(_run_event(record), record["delta"], record["accountant"], relation)
    _close(spent, record[epsilon_key], epsilon_key)
    target = record.get("epsilon_target")
    if target is not None and spent > target * (1 + 1e-9):
        raise Mismatch(f"spent ε {spent:.10g} exceeds the target {target}")


def _rdp(event: dp_accounting.DpEvent, orders: np.ndarray, relation: str) -> np.ndarray:
    """RDP of ``event`` from dp-accounting's add/remove accountant; under replace-one by the weak triangle inequality
    of Rényi divergence (Mironov 2017, Proposition 11): ρ_rep(α) ≤ (α − ½)/(α − 1)·ρ(2α) + ρ(2α − 1)."""
    if relation == "add-remove":
        accountant = rdp.RdpAccountant(orders=[float(a) for a in orders])
        accountant.compose(event)
        return np.asarray(accountant.rdp, dtype=np.float64)
    if relation != "replace-one":
        raise Mismatch(f"neighbouring relation {relation!r} is not one verify knows")
    doubled = _rdp(event, np.concatenate([2 * orders, 2 * orders - 1]), "add-remove")
    return (orders - 0.5) / (orders - 1) * doubled[:len(orders)] + doubled[len(orders):]


def _trial_rdp(record: dict[str, Any], tuned: dict[str, Any], orders: np.ndarray) -> np.ndarray:
    """One trial's RDP: its gradient releases (Poisson, rate q) or its Gaussian output mechanisms, under the
    tuning's relation (a full-batch replace-one trial is a Gaussian of sensitivity 2: 4× the add/remove curve)."""
    sigma, q, releases = tuned["noise_multiplier"], tuned["sample_rate"], tuned["gradient_evaluations"]
    relation = tuned.get("neighbouring", "add-remove")
    if tuned.get("trial_mechanism", "gradient") == "output":
        return releases * orders / (2 * sigma**2)
    if relation == "replace-one" and q >= 1:
        return releases * orders * 2 / sigma**2
    return _rdp(_training_event({**record, "sampler": "poisson"}, sigma, q, releases), orders, relation)


def _check_tuned(record: dict[str, Any]) -> None:
    """A privately tuned record (random stopping, adaptive): its selected trial's mechanism, the per-trial ε and
    the whole tuning's ε."""
    tuned = record["tuning"]
    sigma, q, releases = tuned["noise_multiplier"], tuned["sample_rate"], tuned["gradient_evaluations"]
    if tuned.get("trial_mechanism", "gradient") == "output":  # one Gaussian output mechanism per classifier
        ledger = record["privacy_ledger"]
        if len(ledger) != releases:
            raise Mismatch(f"{len(ledger)} output releases in the ledger but tuning.gradient_evaluations is {releases}")
        for index, entry in enumerate(ledger):
            _close(entry["noise_std"] / entry["sensitivity"], sigma, f"privacy_ledger[{index}] noise multiplier")
        _check_output_sensitivities(record)
    else:
        _close(record.get("noise_multiplier"), sigma, "noise_multiplier (tuning.noise_multiplier)")
        for key, value in (("sample_rate", q), ("gradient_evaluations", releases)):
            if record.get(key) != value:
                raise Mismatch(f"{key} is {record.get(key)!r} but tuning.{key} is {value!r}")
    if tuned.get("neighbouring", "add-remove") != record.get("neighbouring", "add-remove"):
        raise Mismatch(f"neighbouring is {record.get('neighbouring')!r} but tuning's is {tuned['neighbouring']!r}")
    orders = np.asarray(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)
    trial = _trial_rdp(record, tuned, orders)
    _close(float(rdp.compute_epsilon(orders, trial, tuned["per_trial_delta"])[0]), tuned["per_trial_epsilon"],
           "tuning.per_trial_epsilon")
    if "k_distribution" in tuned:
        distribution = tuned["k_distribution"]
        shape = math.inf if distribution["name"] == "poisson" else float(distribution["eta"])
        total = np.asarray(rdp.rdp_privacy_accountant._compute_rdp_repeat_and_select(
            orders, trial, distribution["mean"], shape))
    else:
        total = tuned["trials"] * trial
    _close(float(rdp.compute_epsilon(orders, total, record["delta"])[0]), record["epsilon"], "epsilon (whole tuning)")
    sigma_v = tuned["validation"]["noise_multiplier"]
    if np.any(orders / (2 * sigma_v**2) > trial * (1 + 1e-9)):
        raise Mismatch(f"score noise σ_v = {sigma_v} costs more than the trial's training at some RDP order")


def _amp_noise_fraction(record: dict[str, Any], epsilon_k: float) -> float:
    if record["method"] == "amp_nt":
        fraction = min(0.88671 + 0.0186607 / epsilon_k**0.372906, 0.99)
        return max(fraction, 1 - 1 / epsilon_k + 0.001)
    return record["hyperparameters"]["noise_fraction"]


def _check_output_sensitivities(record: dict[str, Any]) -> None:
    """The built-in output perturbation's sensitivity, re-derived from its hyperparameters (Wu et al.: 2kLη/b
    convex, 2(L + λR)/(λn) strongly convex), for each output-noise part of its ledger."""
    if record["method"] != "output_perturbation":
        return
    hp, n = record["hyperparameters"], record["n_train"]
    lipschitz = hp["input_norm"]
    expected = (2 * hp["epochs"] * lipschitz * hp["lr"] / hp["batch_size"] if hp["variant"] == "convex"
                else 2 * (lipschitz + hp["regularization"] * hp["radius"]) / (hp["regularization"] * n))
    for index, entry in enumerate(record["privacy_ledger"]):
        if entry["what"].startswith("output noise"):
            _close(expected, entry["sensitivity"], f"privacy_ledger[{index}] sensitivity (Wu et al.)")


def _check_release(record: dict[str, Any]) -> None:
    ledger = record["privacy_ledger"]
    _close(math.fsum(entry["epsilon"] for entry in ledger), record["epsilon"], "epsilon (sum of the ledger)")
    _close(math.fsum(entry["delta"] for entry in ledger), record["delta"], "delta (sum of the ledger)")
    _close(ledger[0]["noise_std"] / ledger[0]["sensitivity"], record["noise_multiplier"], "noise_multiplier")
    if record["epsilon"] > record["epsilon_target"] * (1 + 1e-9):
        raise Mismatch(f"spent ε {record['epsilon']} exceeds the target {record['epsilon_target']}")
    hp, n = record["hyperparameters"], record["n_train"]
    objective = [entry for entry in ledger if entry["what"].startswith("objective perturbation")]
    _check_output_sensitivities(record)
    for index, entry in enumerate(ledger):
        what = f"privacy_ledger[{index}] ({entry['what']})"
        if entry["what"].startswith("output noise"):
            sigma = entry["noise_std"] / entry["sensitivity"]
            _close(_epsilon(dp_accounting.GaussianDpEvent(sigma), entry["delta"], "pld", "add-remove"),
                   entry["epsilon"], f"{what} epsilon")
        elif entry in objective and record["method"] in ("amp", "amp_nt"):
            lipschitz = 1.0 if record["method"] == "amp_nt" else hp["input_norm"]
            _close(2 * lipschitz / n, entry["sensitivity"], f"{what} sensitivity 2L/n")
            epsilon_noise = _amp_noise_fraction(record, record["epsilon_target"] / len(objective)) * entry["epsilon"]
            needed = entry["sensitivity"] * (1 + math.sqrt(2 * math.log(1 / entry["delta"]))) / epsilon_noise
            if entry["noise_std"] < needed * (1 - TOLERANCE):
                raise Mismatch(f"{what}: noise std {entry['noise_std']:.6g} is below the {needed:.6g} that "
                               f"AMP's theorem needs for ε1 = {entry['epsilon']}")
        else:
            raise Mismatch(f"{what} is a release verify cannot recompute")


def _check_audit(record: dict[str, Any]) -> None:
    _check_gradient_run(record, "epsilon_claimed")
    rows = record["guess_grid"]
    significance = (1 - record["confidence"]) / len(rows)
    bounds = [audit.epsilon_lower_bound(record["canaries"], row["guesses"], row["correct"], record["delta"],
                                        significance) for row in rows]
    for row, bound in zip(rows, bounds):
        _close(bound, row["epsilon_lower_bound"], f"the bound for {row['correct']} of {row['guesses']} right")
    _close(max(bounds), record["epsilon_lower_bound"], "epsilon_lower_bound")
    if record["passed"] != (record["epsilon_lower_bound"] <= record["epsilon_claimed"]):
        raise Mismatch(f"passed is {record['passed']} for a bound of {record['epsilon_lower_bound']} and a claim "
                       f"of {record['epsilon_claimed']}")


def check(record: dict[str, Any]) -> list[str]:
    """What is wrong with one record (empty: nothing)."""
    problems = []
    if record["run_id"] != content_id(record):
        problems.append(f"run_id {record['run_id']} is not the content hash {content_id(record)}")
    if record.get("ledger_version") != LEDGER_VERSION:
        problems.append(f"ledger version {record.get('ledger_version', 1)}, not the current {LEDGER_VERSION}")
    try:
        if record.get("kind") == "audit":
            _check_audit(record)
        elif (record.get("tuning") or {}).get("private"):
            _check_tuned(record)  # else (validation track, oracle) the record's ε is its own run's, checked below
        elif not record.get("private", True):
            if record.get("epsilon") is not None or record.get("noise_multiplier"):
                raise Mismatch(f"a non-private run with ε {record.get('epsilon')} and σ "
                               f"{record.get('noise_multiplier')}")
        elif "privacy_ledger" in record:
            _check_release(record)
        else:
            _check_gradient_run(record)
    except Mismatch as error:
        problems.append(str(error))
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError,
            dp_accounting.UnsupportedEventError) as error:  # a field missing or of the wrong kind
        problems.append(f"cannot recompute its privacy: {type(error).__name__}: {error}")
    return problems


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
        noise="torch" if str(record.get("noise") or "").startswith("torch") else "fast", progress_bar=False,
        no_wandb=True, append_to_store=False, store_path=store_path)


@contextlib.contextmanager
def _restored_threads(threads: int):
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def rerun(records: list[dict[str, Any]], count: int, seed: int = 0) -> list[str]:
    """Rerun ``count`` random rerunnable records; the mismatches of their metrics."""
    from dpbench import engine, multiseed

    candidates = [r for r in records if r.get("kind", "run") == "run" and r.get("tuning") is None]
    chosen = random.Random(seed).sample(candidates, min(count, len(candidates)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    problems = []
    with tempfile.TemporaryDirectory() as scratch, _restored_threads(threads):
        store_path = Path(scratch) / "results.sqlite"  # release methods always store; not the user's store
        for record in chosen:
            spec = _spec(record, store_path)
            if record.get("clipping") == "multiseed":
                seeds = sorted({r["seed"] for r in candidates if r.get("clipping") == "multiseed" and
                                r.get("batched_seeds") == record["batched_seeds"] and
                                identity(r) == identity(record)})
                if len(seeds) != record["batched_seeds"]:
                    problems.append(f"{record['run_id']}: trained in a batch of {record['batched_seeds']} seeds, "
                                    f"of which the file holds {len(seeds)}: cannot rerun it exactly")
                    continue
            try:
                again = (multiseed.run_seeds(spec, seeds)[seeds.index(record["seed"])]
                         if record.get("clipping") == "multiseed" else engine.run(spec))
            except (UsageError, DataError, RegistryError, multiseed.NotBatchable) as error:  # e.g. a plugin not here
                problems.append(f"{record['run_id']}: cannot rerun it: {error}")
                continue
            if again["metrics"] != record["metrics"]:
                problems.append(f"{record['run_id']} ({record['method']} on {record['task']}, seed "
                                f"{record['seed']}): rerun metrics {again['metrics']} differ from {record['metrics']}")
    return problems


def verify(path: str, rerun_count: int = 0, seed: int = 0) -> tuple[int, list[str]]:
    """(number of records, the list of mismatches, each prefixed by its line's run id)."""
    records = load(path)
    problems = [f"{record['run_id']} ({record['method']} on {record['task']}, seed {record.get('seed')}): {problem}"
                for record in records for problem in check(record)]
    if rerun_count:
        problems += rerun(records, rerun_count, seed)
    return len(records), problems
