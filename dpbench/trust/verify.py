"""``dpbench verify FILE.jsonl [--rerun K]``: check a file of records without trusting the code that wrote them.

For every record (one JSON object per line):

* the content hash: ``run_id`` must be the first 16 hex digits of the sha256 of the record's canonical JSON
  without ``run_id`` (reimplemented from the definition, not imported from ``dpbench.results.store``);
* the ledger version: records of an older version (or without one) were made before privacy fixes of the engine;
* the branch: a record is checked as its method's kind (a built-in gradient method's record with a release
  ledger, or a release method's without one, is refused; a plugin's ledger must come without noisy gradients and
  isolation), and δ must lie in (0, 1) and below 1/n unless the record says it was forced (``delta_forced``);
* n: a built-in task's record must have the task's training examples on this machine (a privately tuned record:
  those its public validation split leaves), since q and the plan's steps follow n; and every run's ``n_test`` and
  ``test_majority_rate`` must be its task's public test set's, since the board's intervals and collapsed checks read
  them; where that cannot be checked (a plugin task, data not here or not the record's, a secret split) a line on
  stderr says how many and why;
* ε, recomputed from the record's mechanism fields with dp-accounting directly (the events are built by
  :mod:`dpbench.trust.recompute`, not by ``dpbench.privacy.accounting``), and compared one-sidedly with the
  record's: a record may state more ε than recomputed, never less by more than the accountant's numerical error
  (:func:`~dpbench.trust.recompute._error`: for the PLD, the spread of ε over discretization intervals Δ/2 … 2Δ
  and σ(1 ± 10⁻¹²); for closed forms, relative
  :data:`~dpbench.trust.recompute.TOLERANCE`), so that the verdict is the same on every machine:

  - gradient runs: the counts come from the record's public plan (:func:`~dpbench.trust.plan_checks._plan`: n,
    batch size or full batch, epochs, the method's releases per step, the sampler), and a record whose ``steps``,
    ``gradient_evaluations`` or q differ from it is refused; Poisson sampling
    ``SelfComposed(PoissonSampled(q, Gaussian(σ)), T)`` (q = 1, full batches: ``SelfComposed(Gaussian(σ), T)``),
    shuffled batches (replace-one only) ``SelfComposed(Gaussian(σ), epochs)``, after the task's data releases
    (``data_release_events``, which for a built-in task must be what it releases under the record's options:
    :func:`~dpbench.trust.plan_checks._data_releases`), under the record's relation and accountant (PLD, or RDP
    with a replace-one Gaussian at sensitivity 2); ε must not exceed the target;
  - non-private baselines: no ε, no σ;
  - tuned records: the per-trial RDP curve from ``tuning`` (which must agree with the record's σ, q, T and
    relation; gradient trials from dp-accounting's add/remove curve, by the weak triangle inequality under
    replace-one; output trials as Gaussians) must give ``per_trial_epsilon``, then repeat-and-select (random
    stopping; shape η, or ∞ for Poisson) or N-fold composition (adaptive) must give ε; a gradient trial's record
    must release nothing its trials do not charge (no count with each gradient, no correlated noise, no data
    release of its method or task, Poisson batches); the score noise
    σ_v must satisfy α/(2σ_v²) ≤ the trial's RDP at every order of the RDP accountant; oracle-tuned records are
    checked as the one run they report;
  - release methods: ε and δ are the sums of the ``privacy_ledger`` parts, one (AMP: one of each kind) per
    one-vs-all classifier of a built-in task's declared classes (:func:`~dpbench.trust.plan_checks._classifiers`);
    each output-noise part's ε is recomputed as dp-accounting's ``GaussianDpEvent(noise std / sensitivity)``
    (PLD); the built-in output perturbation's sensitivity is re-derived from its hyperparameters (Wu et al.:
    2kLη/b convex, 2(L + λR)/(λn) strongly convex); AMP's objective part is checked against the paper's noise
    scale σ1 ≥ (2L/n)(1 + √(2 ln(1/δ1)))/ε3 with ε3 = (ε3/ε1)·ε1 (Iyengar et al. 2019, Algorithm 1);
  - audit records: ``epsilon_claimed`` as a gradient run, and the lower bound from (canaries, guesses, correct,
    δ) with Steinke et al.'s Theorem 3 (``dpbench.trust.audit``) over the whole guess grid fixed in advance (every
    score of the threat model × every k with 2k ≤ m) at the audit's confidence, and ``passed``.
  - converged non-private references (tuning mode ``reference``, :mod:`dpbench.tuning.reference`): no ε, no σ,
    every fit of the l2 grid converged by the record's own criterion, and the chosen l2 the best held-out accuracy
    (ties: lower held-out loss, then the larger l2), refitted.

A record's ``seed`` is read only to rerun it: a ``--secret-seed`` run (``"seed": "secret"``) and a tuned record
without its tuning seed are checked like any other.

The checks of one record are :func:`dpbench.trust.record_checks.check`.

With ``--rerun K`` (:mod:`dpbench.trust.rerun`), K records drawn at random (seed ``--seed``) among those that can be
rerun (untuned runs with their seed, and references; not audits) are trained (references: solved) again with one
torch thread through ``dpbench.spec.RunSpec`` built from their fields, and the rerun's whole record must equal
theirs (ε, δ, σ, q, counts, steps, hyperparameters, metrics, ...: all but :data:`~dpbench.trust.rerun.UNCOMPARED`),
ε within the accountant's error (a reference: its accuracies and chosen l2 exactly, its losses to 6 significant
digits, not its solver's iterations, which depend on the thread count). A file's records with a secret seed, and its
isolated runs' records (``"noise_coins": "secret"``: their noise had a key never written,
:mod:`dpbench.run.isolation`), are counted in a line on stderr each: their ε and counts are checked, but no rerun
can reproduce their metrics.
Records trained as a batch of seeds (``clipping: multiseed``) are rerun as that batch, which must be in the file
(the seeds of the same identity); floating-point summation differs between a batch and a single run.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from dpbench.errors import UsageError
from dpbench.trust.record_checks import check
from dpbench.trust.rerun import rerun


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


def verify(path: str, rerun_count: int = 0, seed: int = 0) -> tuple[int, list[str]]:
    """(number of records, the list of mismatches, each prefixed by its line's run id)."""
    records = load(path)
    unchecked: list[str] = []
    problems = [f"{record['run_id']} ({record['method']} on {record['task']}, seed {record.get('seed')}): {problem}"
                for record in records for problem in check(record, unchecked)]
    if unchecked:
        reasons = Counter(unchecked)
        print(f"{len(unchecked)} record(s) whose n_train or test set is not tied to their task's data here, so that "
              f"only a rerun checks their q, steps, n_test and majority rate: "
              + "; ".join(f"{count}: {reason}" for reason, count in reasons.most_common()), file=sys.stderr)
    if rerun_count:
        problems += rerun(records, rerun_count, seed)
    return len(records), problems
