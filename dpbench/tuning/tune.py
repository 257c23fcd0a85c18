"""``dpbench tune``: hyperparameter tuning whose privacy cost is part of the reported ε (or is labelled as not).

Modes:

* ``random-stopping`` (default): Papernot & Steinke, "Hyperparameter Tuning with Renyi Differential Privacy"
  (ICLR 2022). The number of trials K is random: truncated negative binomial with η ∈ {0, 1} (η = 0 the
  logarithmic distribution P[K = k] = (1 − γ)^k / (k·log(1/γ)), η = 1 the geometric γ(1 − γ)^(k−1); their
  Definition 1) or Poisson (their Theorem 6; K = 0 is possible and then nothing is released), with mean
  ``--trials``. Every trial draws its hyperparameters independently from the same distribution (Optuna's
  ``RandomSampler``, seeded per trial), trains, and releases a noisy validation score; only the best trial's
  model and score are released. The theorems bound K independent runs of *one* randomized mechanism, so the
  trials must be i.i.d.: Optuna's ``QMCSampler`` is refused here (its k-th point depends on k and on the other
  points, so trials are neither independent nor identically distributed; we found no result covering that) and
  offered in ``adaptive`` mode, whose accounting needs no independence. The total is dp-accounting's
  ``RepeatAndSelectDpEvent(per_trial, mean, shape)`` (shape = η, or ∞ for Poisson) under the RDP accountant
  (its PLD accountant does not support that event), and the per-trial noise multiplier σ is the smallest
  (bisection tolerance 1e-4) whose total meets the user's (ε, δ).
* ``adaptive``: Optuna's TPE sampler (or ``--search qmc|random``) over a fixed number of trials N = ``--trials``. Each
trial's
  hyperparameters depend on the earlier trials' noisy scores, so every trial's training and score is charged:
  ``SelfComposed(per_trial, N)`` (adaptive composition), RDP accountant, σ calibrated to the total.
* ``oracle``: the seed papers' protocol, to reproduce their numbers: each of N trials trains on the whole
  training set at the full (ε, δ) and the trial with the best *test* accuracy is selected. The record's ε is one
  trial's; the selection is not private and the record and leaderboard say "tuning not private".

The request's checks and the per-trial mechanism decided before any trial runs are in :mod:`dpbench.tuning.plan`;
how training and score compose, the RDP curves under either neighbouring relation and the totals are in
:mod:`dpbench.tuning.accounting`. The study's storage, secret, K, claims and heartbeats are in
:mod:`dpbench.tuning.study`; each trial's run and outcome in :mod:`dpbench.tuning.trials`; the released record in
:mod:`dpbench.tuning.released`.

Trials and the ledger. The study (Optuna storage: an SQLite file under ``DPBENCH_HOME`` by default, any
SQLAlchemy URL, e.g. PostgreSQL, for many workers) holds exactly K trials once it is set up: its secret is stored
in one transaction, then K (drawn from the stored secret, below), the ``ready`` mark and K ``WAITING`` trials in
another, each all or nothing and each finished by the next worker if the one doing it died
(:func:`dpbench.tuning.study._set_up`). A worker claims a trial by a compare-and-set WAITING → RUNNING update with
a fresh heartbeat and a claim token (:mod:`dpbench.tuning.claims`), so no worker can add a (K+1)-th, and tells its
outcome while its heartbeat beats. A trial whose worker died (killed, machine lost) stops beating; after the grace
period any worker puts it back to WAITING (a compare-and-set that checks it is still RUNNING and stale) and runs it
again; an interrupt (Ctrl-C) and the sweep's own close of its workers put it back at once, uncounted; a SIGTERM
from outside (a time or memory limit may be the trial's own doing) is a death. It is the same trial: its seed,
hyperparameter draws (each from its own stream) and score noise come from the secret and its number, so it gives
the result it would have given, up to floating point where the two runs trained in different batches
(:mod:`dpbench.run.multiseed`), and a kill delays the release without changing it (a job's duration depends on its
K: dropping or redrawing killed studies would condition K's law on surviving). A worker whose claim was replaced
meanwhile neither writes nor tells the trial.
Deaths in a batch are not counted, and such a trial runs alone next; a trial that died alone ``REQUEUE_LIMIT``
times and dies again is ``FAIL``, as is one that fails by itself (an error, a non-finite score): it counts as one
of the K and never wins, so the ledger is always "K trials charged". A failure caused by the trial's own
computation on its coins and the data (e.g. divergence) is part of its output, as the bound allows; a death at the
limit is not, when the deaths were stops, whose timing depends on K: that residual is not covered.

The study's coins. When the study is created, its secret is drawn from the operating system's entropy
(:func:`dpbench.privacy.streams.secret_seed`) and kept in the study's user attributes, with a random ``study_id``. K
(stream ``tuning-k``), trial k's run seed (``tuning-trial``, k), its hyperparameter draw (``tuning-search``, k) and its
score noise (``score-noise``, k) all come from the secret, so that the trials are i.i.d. and independent of each other,
as Papernot & Steinke's Theorems 2 and 6 assume, and nothing released determines them: with the public seed in their
place, every released record gave away K and its winner (recompute the draws, match ``selected_params``). The public
``--seed`` only names the study and draws the held-out split, whose coins the analysis allows to be known
(:mod:`dpbench.tuning.accounting`); ``--secret-seed`` draws it from the OS's entropy too.

Release: when all K trials are finished, the best COMPLETE trial (highest noisy score; ties: lowest trial
number) is released exactly once: the first worker to insert it into the table ``dpbench_released`` (in the
study's own database; its primary key is the study name) appends it to the results store and logs it to W&B;
every worker returns the same record. Other trials' scores and models stay in the study storage, which belongs
to the data owner.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from dpbench.errors import UsageError
from dpbench.privacy import streams
from dpbench.tuning.plan import Plan, TuneSpec, plan
from dpbench.tuning.released import _release
from dpbench.tuning.claims import _claims, requeue_stale
from dpbench.tuning.study import _storage, _stored_seed, default_storage, default_study_name, open_study
from dpbench.tuning.trials import _run_together, work


def _open(spec: TuneSpec, storages: dict[tuple[str, int], optuna.storages.RDBStorage] | None = None
          ) -> tuple[Plan, str, optuna.storages.RDBStorage, optuna.Study, str]:
    """The study's plan, storage URL, storage (one per URL and heartbeat in ``storages``), study and name. With
    ``secret_seed`` a new study's seed comes from the OS's entropy, and a worker joining the study takes its own."""
    plan_ = plan(replace(spec, seed=streams.secret_seed()) if spec.secret_seed else spec)
    url = spec.storage or default_storage()
    if url.startswith("sqlite:///"):
        try:
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"cannot create the folder of the study storage {url}: {error.strerror}") from None
    storages = {} if storages is None else storages
    if (url, spec.heartbeat_interval) not in storages:
        storages[url, spec.heartbeat_interval] = _storage(url, spec.heartbeat_interval)
    storage = storages[url, spec.heartbeat_interval]
    name = spec.study or default_study_name(spec)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if spec.secret_seed and (seed := _stored_seed(storage, name)) is not None:
        plan_ = plan(replace(spec, seed=seed))
    return plan_, url, storage, open_study(plan_, storage, name), name


def tune(spec: TuneSpec) -> dict[str, Any]:
    """Run (or join, or resume) the study and return its released record (see the module docstring)."""
    plan_, url, storage, study, name = _open(spec)
    work(plan_, study, storage)
    return _release(plan_, url, study, name)


def tune_together(specs: list[TuneSpec]) -> list[dict[str, Any]]:
    """:func:`tune` for studies that run one per-trial mechanism (the leaderboard's tuning seeds of a cell: same
    method, task, budget, K distribution, fixed settings and split seed), their trials trained as one batch per
    storage. Each study keeps its own K, ledger and single release; the records are those :func:`tune` would give."""
    storages: dict = {}  # one storage for studies in the same database
    opened = [_open(spec, storages) for spec in specs]
    batches: dict[int, tuple] = {}  # one batch per storage, so that its trials' beats go there
    for plan_, _, storage, study, _ in opened:  # all K trials are enqueued when the study is created
        requeue_stale(study, storage)  # a killed sweep's trials train in this batch again
        batch = batches.setdefault(id(storage), (storage, []))[1]
        batch += [(plan_, study, ids) for ids in _claims(study, storage, batched=True)]
    for storage, batch in batches.values():
        if batch:
            _run_together(batch, storage)
    released = []
    for plan_, url, storage, study, name in opened:
        work(plan_, study, storage)  # other workers' trials of these studies, if any
        released.append(_release(plan_, url, study, name))
    return released
