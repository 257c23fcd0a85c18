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
:mod:`dpbench.tuning.accounting`.

Trials and the ledger. The study (Optuna storage: an SQLite file under ``DPBENCH_HOME`` by default, any
SQLAlchemy URL, e.g. PostgreSQL, for many workers) holds exactly K trials from the moment it exists: the worker
that creates it draws K once (from the study's secret, below), stores it in the study's user attributes and
enqueues K ``WAITING`` trials. A worker claims a trial by the storage's atomic WAITING → RUNNING transition, so no
trial runs twice and no worker can add a (K+1)-th. A running trial records a heartbeat; a trial whose worker died
(killed, machine lost) stops beating and is marked ``FAIL`` by Optuna's ``fail_stale_trials`` in any worker after
the grace period. It is never retried: a failed, interrupted or stale trial counts as one of the K (it outputs
nothing, i.e. it never wins the selection), so the ledger is always "K trials charged", whatever happened.
Failures are treated as part of the trial's output; this is valid for failures caused by the trial's private
outputs (e.g. divergence) or independent of the data (a killed process).

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

import json
import math
import os
import secrets
import sys
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import optuna
import sqlalchemy

from dpbench.data.files import dpbench_home
from dpbench.errors import TuningError
from dpbench.errors import UsageError
from dpbench.privacy import streams
from dpbench.results import records, store, tracking
from dpbench.run import engine, multiseed
from dpbench.spec import RunSpec
from dpbench.tuning import search
from dpbench.tuning.accounting import ValidationSplit, draw_k, total_epsilon, trial_epsilon
from dpbench.tuning.plan import Plan, TuneSpec, plan

_RELEASED = sqlalchemy.Table("dpbench_released", sqlalchemy.MetaData(),
                             sqlalchemy.Column("study_name", sqlalchemy.String(512), primary_key=True),
                             sqlalchemy.Column("record", sqlalchemy.Text, nullable=False))


# ---- the study -----------------------------------------------------------------------------------------------

def default_storage() -> str:
    return f"sqlite:///{dpbench_home() / 'tuning.sqlite'}"


def default_study_name(spec: TuneSpec) -> str:
    """Named after the settings; a ``--secret-seed`` study after a random token instead of its seed."""
    seed = f"secret-{secrets.token_hex(4)}" if spec.secret_seed else f"seed{spec.seed}"
    return f"{spec.task}-{spec.method}-{spec.mode}-eps{spec.epsilon:g}-{seed}"


def study_secret(study: optuna.Study) -> int:
    """The study's secret (its user attribute ``secret``, in the study storage only): the seed of its K, its trials'
    run seeds and search draws, and its score noise."""
    return study.user_attrs["secret"]


def redacted(url: str) -> str:
    """The storage URL without its password (the record must not carry credentials)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _storage(url: str, heartbeat_interval: int, attempts: int = 5) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats, and the release table. Workers starting together on an empty database
    can collide creating the tables (PostgreSQL's CREATE TABLE IF NOT EXISTS is not atomic; SQLite reports "table
    already exists" to the second of two sweep workers): retried."""
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_interval,
                                                     grace_period=3 * heartbeat_interval)
            _RELEASED.metadata.create_all(storage.engine, checkfirst=True)
            return storage
        except sqlalchemy.exc.OperationalError as error:
            if "already exists" in str(error) and attempt < attempts - 1:  # SQLite: another worker created it first
                time.sleep(0.5 * (attempt + 1))
                continue
            raise UsageError(f"cannot open the study storage {redacted(url)}: {str(error).splitlines()[0]}") from None
        except (ImportError, sqlalchemy.exc.ArgumentError) as error:
            raise UsageError(f"cannot open the study storage {redacted(url)}: {str(error).splitlines()[0]}") from None
        except sqlalchemy.exc.SQLAlchemyError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def _sampler(plan_: Plan, secret: int, trial_number: int) -> optuna.samplers.BaseSampler:
    """Trial k's sampler, on the ``tuning-search`` stream of the study's secret at k, so that workers do not repeat
    each other's draws (QMC: one scrambled sequence for the whole study, indexed by Optuna across workers)."""
    seed = streams.derive(secret, "tuning-search", trial_number) % 2**32
    if plan_.config["sampler"] == "qmc":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(scramble=True, seed=streams.derive(secret, "tuning-search") % 2**32,
                                              warn_independent_sampling=False,
                                              warn_asynchronous_seeding=False)
    if plan_.config["sampler"] == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def open_study(plan_: Plan, storage: optuna.storages.RDBStorage, name: str, wait: float = 120.0) -> optuna.Study:
    """Create the study with its secret and K WAITING trials, or load it (waiting for its creator to finish setting it
    up)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            study = optuna.create_study(storage=storage, study_name=name, direction="maximize")
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=name, storage=storage)
            created = False
    if created:
        spec, secret = plan_.spec, streams.secret_seed()
        k = draw_k(plan_.config["k_distribution"], secret) if spec.mode == "random-stopping" else int(spec.trials)
        study.set_user_attr("dpbench_config", plan_.config)
        study.set_user_attr("secret", secret)
        study.set_user_attr("study_id", secrets.token_hex(8))
        study.set_user_attr("k", k)
        for _ in range(k):
            study.enqueue_trial({})
        for trial_id, _ in _trial_ids(study, storage):  # a claimed trial is never without a heartbeat
            storage.record_heartbeat(trial_id)
        study.set_user_attr("ready", True)
        return study
    deadline = time.monotonic() + wait
    while not study.user_attrs.get("ready"):
        if time.monotonic() > deadline:
            raise UsageError(f"study {name} exists but was never set up (its creator died?); use another --study")
        time.sleep(0.5)
    if study.user_attrs["dpbench_config"] != json.loads(json.dumps(plan_.config)):
        raise UsageError(f"study {name} was created with other settings; use another --study")
    return study


def _trial_ids(study: optuna.Study, storage: optuna.storages.RDBStorage, states=None) -> list[tuple[int, int]]:
    """(storage id, number) of the study's trials in ``states``."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return [(storage.get_trial_id_from_study_id_trial_number(study_id, trial.number), trial.number)
            for trial in study.get_trials(deepcopy=False, states=states)]


def _claims(study: optuna.Study, storage: optuna.storages.RDBStorage):
    """Atomically take WAITING trials (WAITING → RUNNING in one locked update each), one (storage id, number) per
    ``next``, from one listing of the study's waiting trials: the ones another worker takes first are skipped."""
    for trial_id, number in _trial_ids(study, storage, (optuna.trial.TrialState.WAITING,)):
        try:
            if storage.set_trial_state_values(trial_id, optuna.trial.TrialState.RUNNING):
                storage.record_heartbeat(trial_id)
                yield trial_id, number
        except optuna.exceptions.UpdateFinishedTrialError:
            continue


def _claim(study: optuna.Study, storage: optuna.storages.RDBStorage) -> tuple[int, int] | None:
    """Atomically take a WAITING trial: its (storage id, number); None when none is left."""
    return next(_claims(study, storage), None)


class _Heartbeat:
    """Record the heartbeats of trials (one id or a list) every ``interval`` seconds while their worker lives."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_ids: int | list[int], interval: int):
        self.storage, self.interval = storage, interval
        self.trial_ids = trial_ids if isinstance(trial_ids, list) else [trial_ids]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self):
        while not self.stop.wait(self.interval):
            for trial_id in self.trial_ids:
                self.storage.record_heartbeat(trial_id)

    def __enter__(self):
        self.thread.start()

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _trial_run_spec(plan_: Plan, params: dict[str, Any], number: int, secret: int) -> RunSpec:
    """Trial ``number``'s run: its seed from the ``tuning-trial`` stream of the study's secret, its score noise from
    its ``score-noise`` stream, both at ``number``; in the private modes Poisson sampling (what the per-trial event
    assumes, whatever the method's default sampler) at the planned σ, on the split of the study's public split seed."""
    spec = plan_.spec
    common = dict(method=spec.method, task=spec.task, delta=plan_.delta,
                  seed=streams.child_seed(secret, "tuning-trial", number),
                  overrides={**spec.overrides, **params}, plugins=spec.plugins, progress_bar=False, no_wandb=True,
                  append_to_store=False)
    if spec.mode == "oracle":
        return RunSpec(epsilon=spec.epsilon if plan_.method.private else None, **common)
    validation = ValidationSplit(plan_.validation["fraction"], secret, plan_.validation["noise_multiplier"], number,
                                 split_seed=spec.seed if spec.split_seed is None else spec.split_seed)
    if plan_.trial.kind == "output":
        return RunSpec(noise_multiplier=plan_.trial.noise_multiplier, neighbouring="replace-one",
                       validation=validation, **common)
    return RunSpec(noise_multiplier=plan_.trial.noise_multiplier, sampler="poisson",
                   neighbouring=spec.neighbouring, validation=validation, **common)


def _check_trial(plan_: Plan, number: int, record: dict[str, Any]) -> None:
    """Refuse a trial whose record is not the mechanism the tuning's total charges."""
    trial = plan_.trial
    if trial is None:
        return
    if trial.kind == "output":  # the record's σ is noise std / sensitivity: equal to rounding
        ran = (round(record["noise_multiplier"] / trial.noise_multiplier, 9), record["neighbouring"])
        planned = (1.0, "replace-one")
    else:
        ran = (record["sampler"], record["sample_rate"], record["gradient_evaluations"], record["neighbouring"])
        planned = ("poisson", trial.sample_rate, trial.releases, trial.neighbouring)
    if ran != planned:
        raise RuntimeError(f"trial {number} ran {ran}; the tuning charges {planned}")


def _begin(plan_: Plan, study: optuna.Study, trial_id: int, number: int):
    """A claimed trial's optuna handle and hyperparameters (drawn by its own sampler)."""
    study.sampler = _sampler(plan_, study_secret(study), number)
    trial = optuna.Trial(study, trial_id)
    trial.set_user_attr("worker", f"{os.uname().nodename}:{os.getpid()}")
    return trial, search.suggest(trial, plan_.distributions)


def _finish(plan_: Plan, study: optuna.Study, trial: optuna.Trial, number: int, record: dict[str, Any] | None,
            error: BaseException | None = None) -> None:
    """Tell the study a trial's outcome: COMPLETE with its score, or FAIL (it counts either way)."""
    state, value = optuna.trial.TrialState.FAIL, None
    try:
        if error is not None:
            raise error
        if record is None:
            raise UsageError("the engine refused the trial's settings")
        _check_trial(plan_, number, record)
        trial.set_user_attr("record", record)
        value = (record["validation"]["noisy_accuracy"] if plan_.trial is not None
                 else record["metrics"]["test_accuracy"])
        state = optuna.trial.TrialState.COMPLETE if math.isfinite(value) else optuna.trial.TrialState.FAIL
    except Exception as failure:  # the trial failed: it counts, and the next one runs
        trial.set_user_attr("error", f"{type(failure).__name__}: {failure}")
        print(f"dpbench: trial {number} failed (it still counts): {type(failure).__name__}: {failure}",
              file=sys.stderr)
    finally:  # also on KeyboardInterrupt: the trial is told FAIL and still counts
        try:
            study.tell(trial, value if state == optuna.trial.TrialState.COMPLETE else None, state=state)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # failed as stale by another worker meanwhile: it counts, once


def _run_trial(plan_: Plan, study: optuna.Study, storage: optuna.storages.RDBStorage,
               claimed: tuple[int, int]) -> None:
    """Sample, train and score one claimed trial and tell the study; any failure is told as FAIL (it counts)."""
    (trial_id, number), trial, record, error = claimed, None, None, None
    try:
        with _Heartbeat(storage, trial_id, plan_.spec.heartbeat_interval):
            if storage.get_trial(trial_id).state != optuna.trial.TrialState.RUNNING:
                return  # failed as stale before it started: it counts, and it never touches the data
            trial, params = _begin(plan_, study, trial_id, number)
            record = engine.run(_trial_run_spec(plan_, params, number, study_secret(study)))
    except Exception as failure:
        error = failure
    finally:
        if trial is not None:
            _finish(plan_, study, trial, number, record, error)


def _run_together(claimed: list[tuple[Plan, optuna.Study, tuple[int, int]]],
                  storage: optuna.storages.RDBStorage) -> None:
    """Claimed trials of studies that share a per-trial mechanism, trained as one batch where
    :mod:`dpbench.run.multiseed` applies (each trial keeps its own seed, hyperparameters, noise and score), else one
    by one; each trial is told its own outcome, as :func:`_run_trial` would."""
    interval = min(plan_.spec.heartbeat_interval for plan_, _, _ in claimed)
    with _Heartbeat(storage, [trial_id for _, _, (trial_id, _) in claimed], interval):
        begun = []
        for plan_, study, (trial_id, number) in claimed:
            trial, params = _begin(plan_, study, trial_id, number)
            begun.append((plan_, study, trial, number, params))
        specs = [_trial_run_spec(plan_, params, number, study_secret(study))
                 for plan_, study, _, number, params in begun]
        try:
            outcomes = [(record, None) for record in multiseed.run_many(specs)]
        except Exception:  # one trial's failure must not fail the others: run them one by one
            outcomes = []
            for spec in specs:
                try:
                    outcomes.append((engine.run(spec), None))
                except Exception as error:
                    outcomes.append((None, error))
    for (plan_, study, trial, number, _), (record, error) in zip(begun, outcomes):
        _finish(plan_, study, trial, number, record, error)


def work(plan_: Plan, study: optuna.Study, storage: optuna.storages.RDBStorage) -> None:
    """Run trials until none is left to claim, then wait for the other workers' trials (failing stale ones)."""
    while (claimed := _claim(study, storage)) is not None:
        _run_trial(plan_, study, storage, claimed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        while True:
            optuna.storages.fail_stale_trials(study)
            if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,
                                                            optuna.trial.TrialState.WAITING)):
                return
            time.sleep(min(plan_.spec.heartbeat_interval, 2))


def ledger(study: optuna.Study) -> dict[str, Any]:
    """The study's trials by state: every one of them is charged."""
    trials = study.get_trials(deepcopy=False)
    states = {}
    for trial in trials:
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    return {"k": study.user_attrs["k"], "trials": len(trials), "states": states}


# ---- the release ---------------------------------------------------------------------------------------------

def tuning_config(plan_: Plan) -> dict[str, Any]:
    """What decides a tuning's mechanism and search (public): a released record's ``tuning["config"]``, part of its
    identity (two records of one config are the same experiment with other tuning seeds). ``coins`` names where
    K and the trials' coins come from, so that records of the tuning that drew them from the public seed (their K
    recoverable from the record) never count as stored runs of this one."""
    spec, config = plan_.spec, plan_.config
    return {"mode": spec.mode, "coins": "study secret", "k_distribution": config.get("k_distribution"),
            "trials": None if spec.mode == "random-stopping" else int(spec.trials), "search_space": plan_.space,
            "sampler": config["sampler"], "validation_fraction": spec.validation_fraction,
            "split_seed": spec.split_seed, "overrides": spec.overrides, "neighbouring": spec.neighbouring}


#: Fields of the selected trial's record that are not released: they depend on the other trials (how many trained
#: in one batch with it, the batch's time per run) or are the trial's own (its time stamp, hash, exact score).
TRIAL_ONLY_FIELDS = ("run_id", "created_at", "validation", "batched_seeds", "train_seconds")

#: The keys of a released record's ``tuning``: nothing that depends on K or on the trials not selected.
PUBLIC_TUNING_FIELDS = frozenset({"config", "study_id",
    "mode", "sampler", "search_space", "selected_params", "study", "storage", "private", "selected_by", "trials",
    "note", "per_trial_epsilon", "selected_score", "accountant", "noise_multiplier", "sample_rate",
    "gradient_evaluations", "trial_mechanism", "neighbouring", "per_trial_delta", "per_trial_event", "validation",
    "k_distribution", "total_event"})


def released_record(plan_: Plan, study: optuna.Study, storage_url: str) -> dict[str, Any]:
    """The selected trial's record with the tuning's totals (the only thing that leaves the study)."""
    spec, config = plan_.spec, plan_.config
    trials = study.get_trials(deepcopy=False)
    k = study.user_attrs["k"]
    if len(trials) != k or any(not t.state.is_finished() for t in trials):
        raise RuntimeError(f"study {study.study_name}: trials missing or not finished")  # K is never printed
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if k == 0:
        raise TuningError(f"study {study.study_name} drew K = 0 trials (Poisson): nothing trained, nothing released")
    if not complete:
        raise TuningError(f"every trial of study {study.study_name} failed: nothing released; the budget is spent")
    best = max(complete, key=lambda t: (t.value, -t.number))
    record = dict(best.user_attrs["record"])
    # Not released: the trial's own time stamps and score, and how it was trained with the other trials: trials run
    # as one batch (dpbench sweep, tune_together) record how many trained together (the sum of the studies' K) and
    # the batch's time per run (a function of it). TRIAL_ONLY_FIELDS.
    for key in TRIAL_ONLY_FIELDS:
        record.pop(key, None)
    record["train_seconds"] = None
    # Only what is public leaves the study: for random stopping, K and the other trials (how many ran or failed,
    # which one won, its seed) must stay hidden, or the release is best-of-k for a known k (PUBLIC_TUNING_FIELDS).
    tuning = {"mode": spec.mode, "sampler": config["sampler"], "search_space": plan_.space,
              "selected_params": best.params, "study": study.study_name, "study_id": study.user_attrs["study_id"],
              "storage": redacted(storage_url), "config": tuning_config(plan_)}
    if spec.mode == "oracle":
        tuning.update({"private": False, "selected_by": "test accuracy (not private)", "trials": int(spec.trials),
                       "note": "tuning not private: trials were selected on the test set; epsilon covers one "
                               "trial's training only", "per_trial_epsilon": record["epsilon"]})
    else:
        distribution = config["k_distribution"]
        total = total_epsilon(spec.mode, plan_.trial, distribution, k, plan_.delta)
        if total > spec.epsilon * (1 + 1e-9):
            raise RuntimeError(f"total epsilon {total} exceeds the target {spec.epsilon}: calibration failed")
        tuning.update({"private": True, "selected_by": "noisy validation accuracy",
                       "selected_score": best.value, "accountant": "rdp",
                       "noise_multiplier": plan_.trial.noise_multiplier, "sample_rate": plan_.trial.sample_rate,
                       "gradient_evaluations": plan_.trial.releases, "trial_mechanism": plan_.trial.kind,
                       "neighbouring": plan_.trial.neighbouring,
                       "per_trial_epsilon": trial_epsilon(plan_.trial, plan_.delta), "per_trial_delta": plan_.delta,
                       "per_trial_event": plan_.trial.description(), "validation": plan_.validation})
        if spec.mode == "random-stopping":
            tuning["k_distribution"] = distribution
            tuning["total_event"] = "RepeatAndSelect(per_trial_event, k_distribution.mean, shape)"
        else:  # adaptive: the number of trials is the user's, public, and every trial is charged
            tuning["trials"] = int(spec.trials)
            tuning["total_event"] = "SelfComposed(per_trial_event, trials)"
        record.update({"epsilon": total, "accountant": "rdp", "neighbouring": plan_.trial.neighbouring})
    record.update({"seed": "secret" if spec.secret_seed else spec.seed, "epsilon_target": spec.epsilon,
                   "delta": plan_.delta if plan_.method.private else None, "tuning": tuning})
    if not set(tuning) <= PUBLIC_TUNING_FIELDS:
        raise RuntimeError(f"the released tuning record would carry {sorted(set(tuning) - PUBLIC_TUNING_FIELDS)}")
    return records.seal(record)


def _release_once(url: str, name: str, record: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Insert the study's released record unless another worker did first: (the stored record, whether we did)."""
    db = sqlalchemy.create_engine(url)
    try:
        try:
            with db.begin() as connection:
                connection.execute(_RELEASED.insert().values(study_name=name, record=json.dumps(record)))
            return record, True
        except sqlalchemy.exc.IntegrityError:
            with db.connect() as connection:
                stored = connection.execute(sqlalchemy.select(_RELEASED.c.record)
                                            .where(_RELEASED.c.study_name == name)).scalar_one()
            return json.loads(stored), False
    finally:
        db.dispose()


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


def _stored_seed(storage: optuna.storages.RDBStorage, name: str) -> int | None:
    """The seed study ``name`` was created with (in its storage), None if there is no such study yet."""
    try:
        return optuna.load_study(study_name=name, storage=storage).user_attrs.get("dpbench_config", {}).get("seed")
    except KeyError:
        return None


def _release(plan_: Plan, url: str, study: optuna.Study, name: str) -> dict[str, Any]:
    spec = plan_.spec
    record, ours = _release_once(url, name, released_record(plan_, study, url))
    if ours:
        settings = tracking.wandb_settings(spec.wandb_project, spec.wandb_entity, spec.no_wandb)
        if settings:
            tracking.finish(tracking.start_run(settings, {k: v for k, v in record.items() if k != "metrics"}), record)
        if spec.append_to_store:
            store.append(record, spec.store_path)
    return record


def tune(spec: TuneSpec) -> dict[str, Any]:
    """Run (or join, or resume) the study and return its released record (see the module docstring)."""
    plan_, url, storage, study, name = _open(spec)
    work(plan_, study, storage)
    return _release(plan_, url, study, name)


def tune_together(specs: list[TuneSpec]) -> list[dict[str, Any]]:
    """:func:`tune` for studies that run one per-trial mechanism (the leaderboard's tuning seeds of a cell: same
    method, task, budget, K distribution, fixed settings and split seed), their trials trained as one batch. Each
    study keeps its own K, ledger and single release; the records are those :func:`tune` would give."""
    storages: dict = {}  # one storage for studies in the same database
    opened = [_open(spec, storages) for spec in specs]
    claimed = []
    for plan_, _, storage, study, _ in opened:  # all K trials are enqueued when the study is created
        claimed += [(plan_, study, ids) for ids in _claims(study, storage)]
    if claimed:
        _run_together(claimed, opened[0][2])
    released = []
    for plan_, url, storage, study, name in opened:
        work(plan_, study, storage)  # other workers' trials of these studies, if any
        released.append(_release(plan_, url, study, name))
    return released
