"""``dpbench verify FILE.jsonl [--rerun K]``: check a file of records without trusting the code that wrote them.

For every record (one JSON object per line):

* the content hash: ``run_id`` must be the first 16 hex digits of the sha256 of the record's canonical JSON
  without ``run_id`` (reimplemented here from the definition, not imported from ``dpbench.results.store``);
* the ledger version: records of an older version (or without one) were made before privacy fixes of the engine;
* ε, recomputed from the record's mechanism fields with dp-accounting directly (the events are built here, not
  by ``dpbench.privacy.accounting``), and compared one-sidedly with the record's: a record may state more ε than
  recomputed, never less by more than the accountant's numerical error (:func:`_error`: for the PLD, |ε(Δ) − ε(Δ/2)|;
  for closed forms, relative :data:`TOLERANCE`), so that the verdict is the same on every machine:

  - gradient runs: the counts come from the record's public plan (:func:`_plan`: n, batch size or full batch,
    epochs, the method's releases per step, the sampler), and a record whose ``steps``, ``gradient_evaluations``
    or q differ from it is refused; Poisson sampling ``SelfComposed(PoissonSampled(q, Gaussian(σ)), T)`` (q = 1,
    full batches: ``SelfComposed(Gaussian(σ), T)``), shuffled batches (replace-one only)
    ``SelfComposed(Gaussian(σ), epochs)``, after the task's data releases (``data_release_events``, which for a
    built-in task must be what it releases under the record's options: :func:`_data_releases`), under the
    record's relation and accountant (PLD, or RDP with a replace-one Gaussian at sensitivity 2); ε must not exceed
    the target;
  - non-private baselines: no ε, no σ;
  - tuned records: the per-trial RDP curve from ``tuning`` (which must agree with the record's σ, q, T and
    relation; gradient trials from dp-accounting's add/remove curve, by the weak triangle inequality under
    replace-one; output trials as Gaussians) must give ``per_trial_epsilon``, then repeat-and-select (random
    stopping; shape η, or ∞ for Poisson) or N-fold composition (adaptive) must give ε; the score noise
    σ_v must satisfy α/(2σ_v²) ≤ the trial's RDP at every order of the RDP accountant; oracle-tuned records are
    checked as the one run they report;
  - release methods: ε and δ are the sums of the ``privacy_ledger`` parts, one (AMP: one of each kind) per
    one-vs-all classifier of a built-in task's declared classes (:func:`_classifiers`); each output-noise part's ε is
    recomputed as dp-accounting's ``GaussianDpEvent(noise std / sensitivity)`` (PLD); the built-in output
    perturbation's sensitivity is re-derived from its hyperparameters (Wu et al.: 2kLη/b convex,
    2(L + λR)/(λn) strongly convex); AMP's objective part is checked against the paper's noise scale
    σ1 ≥ (2L/n)(1 + √(2 ln(1/δ1)))/ε3 with ε3 = (ε3/ε1)·ε1 (Iyengar et al. 2019, Algorithm 1);
  - audit records: ``epsilon_claimed`` as a gradient run, and the lower bound from (canaries, guesses, correct,
    δ) with Steinke et al.'s Theorem 3 (``dpbench.trust.audit``), and ``passed``.

A record's ``seed`` is read only to rerun it: a ``--secret-seed`` run (``"seed": "secret"``) and a tuned record
without its tuning seed are checked like any other.

With ``--rerun K``, K records drawn at random (seed ``--seed``) among those that can be rerun (untuned runs with
their seed; not audits) are trained again with one torch thread through ``dpbench.run.engine.RunSpec`` built from their
fields, and the rerun's whole record must equal theirs (ε, δ, σ, q, counts, steps, hyperparameters, metrics, ...:
all but :data:`UNCOMPARED`), ε within the accountant's error. A file's records with a secret seed, and its isolated
runs' records (``"noise_coins": "secret"``: their noise had a key never written, :mod:`dpbench.run.isolation`), are
counted in a line on stderr each: their ε and counts are checked, but no rerun can reproduce their metrics.
Records trained as a batch of seeds (``clipping: multiseed``) are rerun as that batch, which must be in the file
(the seeds of the same identity); floating-point summation differs between a batch and a single run.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import sys
import json
import math
import random
import tempfile
from pathlib import Path
from typing import Any, Callable

import dp_accounting
import numpy as np
import torch
from dp_accounting import pld, rdp

from dpbench import registry
from dpbench.data.files import DataError
from dpbench.errors import UsageError
from dpbench.registry import RegistryError
from dpbench.results.records import LEDGER_VERSION
from dpbench.results.identity import identity
from dpbench.spec import RunSpec
from dpbench.trust import audit

#: Relative tolerance of the figures verify recomputes in closed form (RDP, sums, sensitivities).
TOLERANCE = 1e-6
#: The PLD accountant's discretization of privacy losses, as ``dpbench.privacy.accounting`` reports ε with
#: (dp-accounting's default).
PLD_INTERVAL = 1e-4
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


def _number(recorded: Any, recomputed: float, what: str) -> None:
    if not isinstance(recorded, (int, float)) or isinstance(recorded, bool):
        raise Mismatch(f"{what} is {recorded!r}, recomputed {recomputed:.10g}")


def _close(recomputed: float, recorded: Any, what: str) -> None:
    _number(recorded, recomputed, what)
    if not math.isclose(recomputed, recorded, rel_tol=TOLERANCE, abs_tol=1e-12):
        raise Mismatch(f"{what} is {recorded!r}, recomputed {recomputed:.10g}")


def _at_least(spent: float, recorded: Any, what: str, error: Callable[[], float]) -> None:
    """One-sided: a record may state more ε than recomputed, never less by more than the accountant's ``error()``
    (computed only when it is below)."""
    _number(recorded, spent, what)
    if recorded < spent and spent - recorded > error():
        raise Mismatch(f"{what} is {recorded!r}, recomputed {spent:.10g} (less by more than the accountant's "
                       f"numerical error {error():.3g})")


def _rdp_error(spent: float) -> Callable[[], float]:
    """dp-accounting's RDP ε: closed forms minimised over the orders, no discretization; :data:`TOLERANCE`."""
    return lambda: max(TOLERANCE * abs(spent), 1e-12)


def _event(fields: dict[str, Any]) -> dp_accounting.DpEvent:
    """A DpEvent from ``dpbench.privacy.accounting.event_fields``'s form."""
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


def _epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str, relation: str,
             interval: float = PLD_INTERVAL) -> float:
    key = (repr(event), delta, accountant, relation, interval)  # an event's repr names every field (attrs)
    if key not in _EPSILONS:
        _EPSILONS[key] = _compute_epsilon(event, delta, accountant, relation, interval)
    return _EPSILONS[key]


def _compute_epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str, relation: str,
                     interval: float) -> float:
    if relation not in RELATIONS:
        raise Mismatch(f"neighbouring relation {relation!r} is not one verify knows")
    if accountant == "pld":
        found = pld.PLDAccountant(RELATIONS[relation], value_discretization_interval=interval)
    elif accountant == "rdp":  # dp-accounting's RDP reads a Gaussian as sensitivity 1 whatever the relation
        found = rdp.RdpAccountant()
        event = _doubled(event) if relation == "replace-one" else event
    else:
        raise Mismatch(f"accountant {accountant!r} is not one verify knows")
    return float(found.compose(event).get_epsilon(delta))


def _doubled(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
    """Under replace-one a Gaussian release of noise σC moves by up to 2C: RDP α(2C)²/(2σ²C²) (Mironov 2017,
    Proposition 7), that of ``GaussianDpEvent(σ/2)``. Other events have no replace-one RDP analysis here. Written
    again rather than imported from :mod:`dpbench.privacy.accounting`: verify checks that module's results."""
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return dp_accounting.GaussianDpEvent(event.noise_multiplier / 2)
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return dp_accounting.SelfComposedDpEvent(_doubled(event.event), event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return dp_accounting.ComposedDpEvent([_doubled(inner) for inner in event.events])
    if isinstance(event, (dp_accounting.NoOpDpEvent, dp_accounting.NonPrivateDpEvent)):
        return event
    raise Mismatch(f"no replace-one RDP analysis of {type(event).__name__}: such a record needs the pld accountant")


def _scaled(event: dp_accounting.DpEvent, factor: float) -> dp_accounting.DpEvent:
    """``event`` with every noise scale times ``factor``."""
    if isinstance(event, (dp_accounting.GaussianDpEvent, dp_accounting.LaplaceDpEvent)):
        return type(event)(event.noise_multiplier * factor)
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        return dp_accounting.PoissonSampledDpEvent(event.sampling_probability, _scaled(event.event, factor))
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return dp_accounting.SelfComposedDpEvent(_scaled(event.event, factor), event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return dp_accounting.ComposedDpEvent([_scaled(inner, factor) for inner in event.events])
    return event


def _error(event: dp_accounting.DpEvent, delta: float, accountant: str, relation: str) -> Callable[[], float]:
    """The accountant's numerical error on ε for ``event``, for :func:`_at_least`: the spread (max − min) of the
    PLD's ε over its discretization interval Δ (``value_discretization_interval``, :data:`PLD_INTERVAL`) at
    Δ/2, Δ, 2Δ and Δ(1 ± 10⁻⁶), and over the noise scales perturbed by ±10⁻¹² relative.

    dp-accounting's PLD (connect-the-dots, pessimistic) rounds privacy losses to a grid of interval Δ and composes
    by FFT, dropping tail masses below 10⁻¹⁵; machines differ in the last bits of the losses (which grid point a
    borderline loss lands on) and of the FFT, whose rounding in the tail moves δ(ε) by ~10⁻¹⁴. At a δ of 10⁻¹⁰ or
    more that is ~10⁻⁶ of ε; at the δ = 6.4·10⁻¹² of kddcup99 (n = 395,216) it is ~10⁻³: this machine recomputes
    the committed board's kddcup99 ε 0.99992 as 1.00034 and its ε 7.99539 as 7.99919, and perturbing σ by 10⁻¹²
    moves them by up to 1.4·10⁻³ relative. The spread reads these effects from the accountant's own parameters and
    the record's mechanism; measured: adult (δ 7.6·10⁻¹⁰) 1.2·10⁻⁴ relative against 1.4·10⁻⁶ and 2.9·10⁻⁶ between
    machines (``tests/test_verify.py``), kddcup99 5.1·10⁻⁴ and 2.7·10⁻³ against 4.8·10⁻⁴ and 4.2·10⁻⁴. The RDP
    accountant: :func:`_rdp_error`."""
    if accountant != "pld":
        return _rdp_error(_epsilon(event, delta, accountant, relation))

    def spread() -> float:
        values = [_epsilon(event, delta, "pld", relation, PLD_INTERVAL * f) for f in (0.5, 1, 2, 1 - 1e-6, 1 + 1e-6)]
        values += [_epsilon(_scaled(event, f), delta, "pld", relation) for f in (1 - 1e-12, 1 + 1e-12)]
        return max(values) - min(values)

    return spread


@functools.cache
def _builtin_methods() -> dict[str, type]:
    return registry.methods([])


def _builtin(record: dict[str, Any]) -> type | None:
    """The built-in method class the record names, None for a plugin's (``code.method.external``)."""
    external = ((record.get("code") or {}).get("method") or {}).get("external", True)
    return None if external else _builtin_methods().get(record["method"])


@functools.cache
def _builtin_tasks() -> dict[str, type]:
    return registry.tasks([])


def _builtin_task(record: dict[str, Any]) -> type | None:
    """The built-in task class the record names, None for a plugin's (``code.task.external``)."""
    external = ((record.get("code") or {}).get("task") or {}).get("external", True)
    return None if external else _builtin_tasks().get(record["task"])


def _data_releases(record: dict[str, Any]) -> list[dp_accounting.DpEvent]:
    """The record's data releases (``data_release_events``), refused unless they are what its built-in task
    releases under the record's options (``Task.private_release_events``: e.g. mnist_mlp's DP-PCA with
    ``network=adaclip``, of noise multiplier ``pca_noise_multiplier``); a plugin task's, which verify does not load,
    as recorded."""
    recorded = [_event(fields) for fields in record.get("data_release_events") or []]
    task = _builtin_task(record)
    if task is None:
        return recorded
    hp = record["hyperparameters"]
    options = {key: hp.get(key, default) for key, default in task.options.items()}
    expected = list(task.private_release_events(options))
    if recorded != expected:
        raise Mismatch(f"its data releases are {recorded}, but task {task.name} with options {options} releases "
                       f"{expected}")
    return recorded


def _classifiers(record: dict[str, Any], parts: list[str], what: str) -> None:
    """A release method's ledger parts named ``what`` (their suffixes after ``what``, in order): one per binary
    classifier, labelled 0…K−1 (one-vs-all) or unlabelled (K = 1), where K is 1 for a built-in task of 2 classes
    and its number of classes otherwise (``dpbench.release``; the task's declared ``classes``); for a plugin task
    or one without declared classes, K is the number of parts."""
    classes = getattr(_builtin_task(record), "classes", None)
    count = len(parts) if classes is None else 1 if classes == 2 else classes
    labels = [""] if count == 1 else [f", classifier {k} (one-vs-all)" for k in range(count)]
    if parts != labels:
        raise Mismatch(f"its ledger holds {len(parts)} {what} parts {[what + p for p in parts]}, not one per "
                       f"classifier of task {record['task']} ({count})")


def _releases_per_step(record: dict[str, Any]) -> int:
    """k, the noisy gradients a step draws: a built-in method's ``releases_per_step`` (ADADP: 2, both charged
    whether its step is accepted or not); a plugin's, which verify does not load, the record's releases over its
    steps (which :func:`_plan` then checks against the plan)."""
    method = _builtin(record)
    return method.releases_per_step if method is not None else record["gradient_evaluations"] // record["steps"]


def _plan(record: dict[str, Any]) -> tuple[float, int]:
    """The record's (q, releases), refused unless they and its steps are what its public plan implies, as
    ``engine.plan`` derives them: k releases per step (:func:`_releases_per_step`), batch size B (n for a
    full-batch method), q = B/n, steps per epoch max(1, round(n/(Bk))) for Poisson batches and ⌊n/(Bk)⌋ for
    shuffled ones, steps = epochs × that, releases = k × steps. The engine draws every step's k batches and
    charges each (``training.PrivateTraining``): the count depends on the plan only."""
    hp, n, sampler = record["hyperparameters"], record["n_train"], record["sampler"]
    k, batch, epochs = _releases_per_step(record), hp["batch_size"], hp["epochs"]
    q, steps, releases = record["sample_rate"], record["steps"], record["gradient_evaluations"]
    method = _builtin(record)
    if method is not None and method.full_batch and batch != n:
        raise Mismatch(f"{record['method']} uses full batches, but its batch size is {batch} of n = {n}")
    if q != batch / n:
        raise Mismatch(f"sample_rate is {q!r}, but its batch size {batch} of n = {n} gives {batch / n!r}")
    if sampler == "poisson":
        planned = epochs * max(1, round(n / (batch * k)))
    elif sampler == "shuffle":
        planned = epochs * (n // (batch * k))
    else:
        raise Mismatch(f"sampler {sampler!r} is not one verify knows")
    if (steps, releases) != (planned, k * planned):
        raise Mismatch(f"{releases!r} releases in {steps!r} steps, but its plan (n = {n}, batch size {batch}, "
                       f"{epochs} epochs, {k} releases per step, {sampler} batches) implies {k * planned} in "
                       f"{planned}")
    return q, releases


def _training_event(record: dict[str, Any], sigma: float, q: float, releases: int) -> dp_accounting.DpEvent:
    if record["sampler"] == "poisson":
        once = dp_accounting.GaussianDpEvent(sigma)
        if q < 1:
            once = dp_accounting.PoissonSampledDpEvent(q, once)
        return dp_accounting.SelfComposedDpEvent(once, releases)
    if record["sampler"] == "shuffle":  # one Gaussian per started epoch (dpbench.privacy.accounting): the plan's epochs
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma),
                                                 record["hyperparameters"]["epochs"])
    raise Mismatch(f"sampler {record['sampler']!r} is not one verify knows")


def _run_event(record: dict[str, Any]) -> dp_accounting.DpEvent:
    """The event of a gradient run's record: its data releases, then its noisy gradients, counted from its plan."""
    if record.get("data_releases") and len(record.get("data_release_events") or []) != len(record["data_releases"]):
        raise Mismatch("its data releases have no machine-readable events (data_release_events)")
    q, releases = _plan(record)
    training = _training_event(record, record["noise_multiplier"], q, releases)
    before = _data_releases(record)
    return dp_accounting.ComposedDpEvent([*before, training]) if before else training


def _check_gradient_run(record: dict[str, Any], epsilon_key: str = "epsilon") -> None:
    if not record.get("noise_multiplier", 0) > 0:
        raise Mismatch(f"noise multiplier {record.get('noise_multiplier')!r} is not positive")
    relation = record.get("neighbouring") or ("add-remove" if record["sampler"] == "poisson" else "replace-one")
    if record["sampler"] == "shuffle" and relation != "replace-one":
        raise Mismatch(f"shuffled batches are accounted under replace-one neighbours only, not {relation!r}")
    event, delta, accountant = _run_event(record), record["delta"], record["accountant"]
    spent, error = _epsilon(event, delta, accountant, relation), _error(event, delta, accountant, relation)
    _at_least(spent, record[epsilon_key], epsilon_key, error)
    target = record.get("epsilon_target")
    if target is not None and spent > target * (1 + 1e-9) and spent - error() > target * (1 + 1e-9):
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
        _output_classifiers(record)
        _check_output_sensitivities(record)
    else:
        _close(record.get("noise_multiplier"), sigma, "noise_multiplier (tuning.noise_multiplier)")
        for key, value in (("sample_rate", q), ("gradient_evaluations", releases)):
            if record.get(key) != value:
                raise Mismatch(f"{key} is {record.get(key)!r} but tuning.{key} is {value!r}")
        _plan(record)  # the selected trial's counts, from its plan on the training part
    if tuned.get("neighbouring", "add-remove") != record.get("neighbouring", "add-remove"):
        raise Mismatch(f"neighbouring is {record.get('neighbouring')!r} but tuning's is {tuned['neighbouring']!r}")
    orders = np.asarray(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)
    trial = _trial_rdp(record, tuned, orders)
    per_trial = float(rdp.compute_epsilon(orders, trial, tuned["per_trial_delta"])[0])
    _at_least(per_trial, tuned["per_trial_epsilon"], "tuning.per_trial_epsilon", _rdp_error(per_trial))
    for key in ("k_distribution", "trials"):  # the mechanism charged is the one the board groups by
        if (tuned.get("config") or {}).get(key) != tuned.get(key):
            raise Mismatch(f"tuning.{key} is {tuned.get(key)!r} but tuning.config.{key} is "
                           f"{(tuned.get('config') or {}).get(key)!r}")
    if "k_distribution" in tuned:
        distribution = tuned["k_distribution"]
        shape = math.inf if distribution["name"] == "poisson" else float(distribution["eta"])
        total = np.asarray(rdp.rdp_privacy_accountant._compute_rdp_repeat_and_select(
            orders, trial, distribution["mean"], shape))
    else:
        total = tuned["trials"] * trial
    whole = float(rdp.compute_epsilon(orders, total, record["delta"])[0])
    _at_least(whole, record["epsilon"], "epsilon (whole tuning)", _rdp_error(whole))
    sigma_v = tuned["validation"]["noise_multiplier"]
    if np.any(orders / (2 * sigma_v**2) > trial * (1 + 1e-9)):
        raise Mismatch(f"score noise σ_v = {sigma_v} costs more than the trial's training at some RDP order")


def _amp_noise_fraction(record: dict[str, Any], epsilon_k: float) -> float:
    if record["method"] == "amp_nt":
        fraction = min(0.88671 + 0.0186607 / epsilon_k**0.372906, 0.99)
        return max(fraction, 1 - 1 / epsilon_k + 0.001)
    return record["hyperparameters"]["noise_fraction"]


def _amp_out_fraction(record: dict[str, Any]) -> float:
    return 0.01 if record["method"] == "amp_nt" else record["hyperparameters"]["out_fraction"]


def _amp_classifiers(record: dict[str, Any]) -> None:
    """AMP's ledger: one objective and one output part per classifier (:func:`_classifiers`), each classifier's
    budget ε/K (checked per part by the caller)."""
    parts = {"objective perturbation b1": [], "output noise b2": []}
    for entry in record["privacy_ledger"]:
        head, _, suffix = entry["what"].partition(", classifier ")
        if head not in parts:
            raise Mismatch(f"an AMP ledger part {entry['what']!r} verify does not know")
        parts[head].append(suffix and f", classifier {suffix}")
    for what, found in parts.items():
        _classifiers(record, found, what)


def _output_classifiers(record: dict[str, Any]) -> None:
    """The built-in output perturbation's ledger: one output-noise part per classifier (:func:`_classifiers`)."""
    if record["method"] == "output_perturbation":
        _classifiers(record, [entry["what"].removeprefix("output noise") for entry in record["privacy_ledger"]],
                     "output noise")


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
    if record["method"] in ("amp", "amp_nt"):
        _amp_classifiers(record)
    _check_output_sensitivities(record)
    for index, entry in enumerate(ledger):
        what = f"privacy_ledger[{index}] ({entry['what']})"
        if entry["what"].startswith("output noise"):
            event = dp_accounting.GaussianDpEvent(entry["noise_std"] / entry["sensitivity"])
            _at_least(_epsilon(event, entry["delta"], "pld", "add-remove"), entry["epsilon"], f"{what} epsilon",
                      _error(event, entry["delta"], "pld", "add-remove"))
        elif entry in objective and record["method"] in ("amp", "amp_nt"):
            lipschitz = 1.0 if record["method"] == "amp_nt" else hp["input_norm"]
            _close(2 * lipschitz / n, entry["sensitivity"], f"{what} sensitivity 2L/n")
            epsilon_k = record["epsilon_target"] / len(objective)
            _close((1 - _amp_out_fraction(record)) * epsilon_k, entry["epsilon"], f"{what} epsilon (ε1 of ε/K)")
            epsilon_noise = _amp_noise_fraction(record, epsilon_k) * entry["epsilon"]
            needed = entry["sensitivity"] * (1 + math.sqrt(2 * math.log(1 / entry["delta"]))) / epsilon_noise
            if entry["noise_std"] < needed * (1 - TOLERANCE):
                raise Mismatch(f"{what}: noise std {entry['noise_std']:.6g} is below the {needed:.6g} that "
                               f"AMP's theorem needs for ε1 = {entry['epsilon']}")
            mu = entry["sensitivity"] / entry["noise_std"]  # the proof's tail bound (dpbench.release.mechanisms.AMPCalibration)
            if 0.5 * math.erfc((epsilon_noise / mu - mu / 2) / math.sqrt(2)) > entry["delta"] * (1 + TOLERANCE):
                raise Mismatch(f"{what}: b1's privacy loss exceeds ε3 = {epsilon_noise:.6g} with probability above "
                               f"δ1 = {entry['delta']:.6g}")
        else:
            raise Mismatch(f"{what} is a release verify cannot recompute")
    _output_classifiers(record)


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
    isolated = record.get("isolation") == "process" and record.get("private", True)
    for field in ("noise_coins", "sampler_coins"):
        coins = record.get(field)
        if record.get("kind", "run") == "run" and (coins not in (None, "secret") or (coins == "secret") != isolated):
            problems.append(f"{field} {coins!r} with isolation {record.get('isolation')!r}: an isolated private run's "
                            f"noise and batches have secret coins (exempt from reruns), no other run's")
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
    """How far two machines' ε for ``record`` may differ: the accountant's error (:func:`_error`) for a gradient
    run; for a release method, the sum of its output-noise parts' (its other parts are closed forms)."""
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


def _seeded(record: dict[str, Any]) -> bool:
    """Whether the record states its seed (a ``--secret-seed`` run's is ``"secret"``): only such a run can be
    rerun."""
    return isinstance(record.get("seed"), int) and not isinstance(record.get("seed"), bool)


def rerun(records: list[dict[str, Any]], count: int, seed: int = 0) -> list[str]:
    """Rerun ``count`` random rerunnable records; where each rerun's whole record differs from the recorded one
    (:func:`_differences`). Records with a secret seed or secret noise coins cannot be: a line on stderr each says
    how many."""
    from dpbench.run import engine, multiseed

    runs = [r for r in records if r.get("kind", "run") == "run" and r.get("tuning") is None]
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
            try:
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


def verify(path: str, rerun_count: int = 0, seed: int = 0) -> tuple[int, list[str]]:
    """(number of records, the list of mismatches, each prefixed by its line's run id)."""
    records = load(path)
    problems = [f"{record['run_id']} ({record['method']} on {record['task']}, seed {record.get('seed')}): {problem}"
                for record in records for problem in check(record)]
    if rerun_count:
        problems += rerun(records, rerun_count, seed)
    return len(records), problems
