"""A study's Optuna storage: the storage and its release table, the study created with its secret, K and K WAITING
trials (or joined), trials claimed atomically and kept alive by heartbeats, and the released record inserted once
(:mod:`dpbench.tuning.tune` describes the protocol)."""
from __future__ import annotations

import json
import secrets
import threading
import time
import warnings
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import optuna
import sqlalchemy
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session

from dpbench.data.files import dpbench_home
from dpbench.errors import UsageError
from dpbench.privacy import streams
from dpbench.tuning.accounting import draw_k
from dpbench.tuning.plan import Plan, TuneSpec


_RELEASED = sqlalchemy.Table("dpbench_released", sqlalchemy.MetaData(),
                             sqlalchemy.Column("study_name", sqlalchemy.String(512), primary_key=True),
                             sqlalchemy.Column("record", sqlalchemy.Text, nullable=False))


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
    """Take WAITING trials, one (storage id, number) per ``next``, from one listing of the study's waiting trials (the
    ones another worker takes first are skipped): each in one locked transaction, WAITING → RUNNING with a fresh
    heartbeat (a trial claimed after a long wait is never taken for dead) and a new claim token, which this process
    keeps (:func:`holds`)."""
    for trial_id, number in _trial_ids(study, storage, (optuna.trial.TrialState.WAITING,)):
        token = secrets.token_hex(8)
        with _create_scoped_session(storage.scoped_session, True) as session:
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            if trial.state != optuna.trial.TrialState.WAITING:
                continue
            trial.state, trial.datetime_start = optuna.trial.TrialState.RUNNING, datetime.now()
            beat = models.TrialHeartbeatModel.where_trial_id(trial_id, session, True)
            if beat is None:
                session.add(models.TrialHeartbeatModel(trial_id=trial_id))
            else:
                beat.heartbeat = session.execute(sqlalchemy.func.now()).scalar()
            _set_system_attrs(session, trial, {_CLAIM: token})
        _HELD[trial_id] = token
        yield trial_id, number


def holds(storage: optuna.storages.RDBStorage, trial_id: int) -> bool:
    """Whether this process's claim on the trial is still the current one: a worker whose trial was put back (its
    heartbeat late) and claimed again by another run neither writes its record nor tells it."""
    token = _HELD.get(trial_id)
    return token is not None and storage.get_trial(trial_id).system_attrs.get(_CLAIM) == token


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


def ledger(study: optuna.Study) -> dict[str, Any]:
    """The study's trials by state: every one of them is charged."""
    trials = study.get_trials(deepcopy=False)
    states = {}
    for trial in trials:
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    return {"k": study.user_attrs["k"], "trials": len(trials), "states": states}


#: How often a trial that died *alone* is put back to run again; its next death is its outcome (FAIL, counted).
REQUEUE_LIMIT = 2


def put_back(storage: optuna.storages.RDBStorage, trial_ids: list[int]) -> None:
    """Put claimed trials that were interrupted in this living process (Ctrl-C, exit) back to WAITING at once, not
    counted as deaths: an interrupt is not an outcome of a trial."""
    for trial_id in trial_ids:
        _requeue(storage, trial_id, stale_only=False, count=False)


def requeue_stale(study: optuna.Study, storage: optuna.storages.RDBStorage) -> None:
    """Put the study's RUNNING trials whose heartbeat stopped (their worker was killed, its machine lost) back to
    WAITING, the same trial (number, and so seed, hyperparameter draw and score noise from the study's secret): run
    again, it gives the result it would have given, so a kill delays the study's release and does not change it,
    whatever the kill depended on (a job's duration depends on its K: a policy that drops or redraws killed studies
    would condition K's law on surviving). A trial that died in a batch (:func:`mark_batched`) is not counted: it
    runs alone next (:func:`dies_alone`). A trial that died alone is counted, and after ``REQUEUE_LIMIT`` such
    deaths the next is its outcome (FAIL: it counts, and never wins), as one whose own computation kills its worker
    must be, lest the study never release; a stop that lands on the same lone trial three times does decide it."""
    for trial_id in storage._get_stale_trial_ids(study._study_id):
        _requeue(storage, trial_id, stale_only=True, count=True)


def _requeue(storage: optuna.storages.RDBStorage, trial_id: int, stale_only: bool, count: bool) -> None:
    """One trial RUNNING → WAITING (or FAIL at the limit) in one locked transaction that checks again that it is
    RUNNING and, if ``stale_only``, still stale: a trial told, or claimed again and beating, since it was listed is
    left alone, and of two processes requeueing it one does. Optuna's own schema (a private module): its public
    calls are one transaction each."""
    grace = timedelta(seconds=storage.grace_period or 2 * storage.heartbeat_interval)
    with _create_scoped_session(storage.scoped_session, True) as session:
        trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
        if trial.state != optuna.trial.TrialState.RUNNING:
            return
        if stale_only:
            beat = models.TrialHeartbeatModel.where_trial_id(trial_id, session)
            now = session.execute(sqlalchemy.func.now()).scalar().replace(tzinfo=None)
            if beat is None or now - beat.heartbeat <= grace:
                return
        attrs = {a.key: json.loads(a.value_json) for a in trial.system_attributes}
        batched = attrs.get(_BATCHED, False)
        deaths = attrs.get(_DEATHS, 0) + (count and not batched)
        if deaths > REQUEUE_LIMIT:
            trial.state = optuna.trial.TrialState.FAIL
            trial.datetime_complete = datetime.now()
            return
        trial.state = optuna.trial.TrialState.WAITING
        _set_system_attrs(session, trial, {_DEATHS: deaths, _BATCHED: False, _CLAIM: None,
                                           _ALONE: (batched and count) or attrs.get(_ALONE, False)})


def _set_system_attrs(session, trial, values: dict[str, Any]) -> None:
    """Set a trial's system attributes inside the caller's transaction (Optuna's JSON encoding)."""
    for key, value in values.items():
        found = models.TrialSystemAttributeModel.find_by_trial_and_key(trial, key, session)
        if found is None:
            session.add(models.TrialSystemAttributeModel(trial_id=trial.trial_id, key=key, value_json=json.dumps(value)))
        else:
            found.value_json = json.dumps(value)


_DEATHS, _BATCHED, _ALONE, _CLAIM = "dpbench_deaths", "dpbench_batched", "dpbench_alone", "dpbench_claim"
#: This process's claims: trial id → the token of its claim.
_HELD: dict[int, str] = {}


def mark_batched(storage: optuna.storages.RDBStorage, trial_id: int) -> None:
    """The trial trains in a batch with others now: if its worker dies, the death is not counted against it."""
    storage.set_trial_system_attr(trial_id, _BATCHED, True)


def dies_alone(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the trial died once in a batch and must run alone (where a death of its own is counted)."""
    return trial.system_attrs.get(_ALONE, False)


def _stored_seed(storage: optuna.storages.RDBStorage, name: str) -> int | None:
    """The seed study ``name`` was created with (in its storage), None if there is no such study yet."""
    try:
        return optuna.load_study(study_name=name, storage=storage).user_attrs.get("dpbench_config", {}).get("seed")
    except KeyError:
        return None


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
