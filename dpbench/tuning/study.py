"""A study's Optuna storage: the storage and its release table, the study created with its secret, K and K WAITING
trials (or joined), and the released record inserted once (:mod:`dpbench.tuning.tune` describes the protocol; the
trials' claims and heartbeats are in :mod:`dpbench.tuning.claims`)."""
from __future__ import annotations

import json
import secrets
import time
import warnings
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import optuna
import sqlalchemy
from optuna.storages._rdb import models
from optuna.trial import TrialState

from dpbench.data.files import dpbench_home
from dpbench.errors import UsageError
from dpbench.privacy import streams
from dpbench.tuning.accounting import draw_k
from dpbench.tuning.claims import _BEATS, _TRIALS, _now
from dpbench.tuning.plan import Plan, TuneSpec


_STUDY_ATTRS = models.StudyUserAttributeModel.__table__
_TRIAL_ATTRS = models.TrialSystemAttributeModel.__table__
#: What the first step of a study's setup stores, together (:func:`_set_up`).
_FIRST = {"secret", "dpbench_config", "study_id", "heartbeat_interval"}
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


def _utc(connection, _record) -> None:
    """Set a new PostgreSQL connection's session to UTC (after connecting, so that nothing overrides it). The
    listener belongs to the engine: a storage unpickled elsewhere makes a new engine without it (dpbench never
    pickles one)."""
    cursor = connection.cursor()
    cursor.execute("SET TIME ZONE 'UTC'")
    cursor.close()
    connection.commit()


def _engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy engine options: a SQLite connection waits 60 s for another's write lock before "database is
    locked" (its default 5 s killed the rebuild's sweep under load on 27 November)."""
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}


def _storage(url: str, heartbeat_interval: int, attempts: int = 5) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats, and the release table. Workers starting together on an empty database
    can collide creating the tables (PostgreSQL's CREATE TABLE IF NOT EXISTS is not atomic; SQLite reports "table
    already exists" to the second of two sweep workers): retried."""
    kwargs = _engine_kwargs(url)
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_interval,
                                                     grace_period=3 * heartbeat_interval)
            if url.startswith("postgresql"):  # heartbeats are naive session times: every worker's session in UTC
                sqlalchemy.event.listen(storage.engine, "connect", _utc)
                storage.engine.dispose()  # the connections Optuna opened before the listener
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


def open_study(plan_: Plan, storage: optuna.storages.RDBStorage, name: str) -> optuna.Study:
    """Create the study with its secret and K WAITING trials, or load it; either way, finish its setup if its
    creator died during it (:func:`_set_up`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            study = optuna.create_study(storage=storage, study_name=name, direction="maximize")
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=name, storage=storage)
    _set_up(plan_, storage, study)
    if study.user_attrs["dpbench_config"] != json.loads(json.dumps(plan_.config)):
        raise UsageError(f"study {name} was created with other settings; use another --study")
    beats = study.user_attrs.get("heartbeat_interval")
    if beats is not None and beats != storage.heartbeat_interval:  # one grace period for all of a study's workers
        raise UsageError(f"study {name}'s workers beat every {beats} s: join it with --heartbeat-interval {beats}")
    return study


def _set_up(plan_: Plan, storage: optuna.storages.RDBStorage, study: optuna.Study) -> None:
    """Give a new study its coins and its K trials, or finish the setup of one whose creator died; every worker calls
    it and it does what is missing, once. Two transactions, each all or nothing, each guarded by its first insert
    (a study attribute is unique per key, so a concurrent second insert fails and that worker's transaction rolls
    back):

    1. ``secret`` (from the OS's entropy), ``dpbench_config``, ``study_id`` and ``heartbeat_interval``, unless the
       secret is stored; its duration does not depend on K;
    2. ``ready``, then K WAITING trials (K drawn from the *stored* secret) with a heartbeat each, unless ready.

    A stop during the first leaves no coin anyone saw. A stop during the second, whose duration grows with K, is
    finished by the next worker with the same K: redrawing there would condition K's law on surviving the stop. So
    is a study whose setup by an older dpbench (the attributes one by one, K before ``heartbeat_interval``, then the
    trials one by one) stopped after it stored K; one that stopped before is refused (its stop did not depend on
    K)."""
    study_id = study._study_id
    attrs = _study_attrs(storage, study_id)
    if "ready" not in attrs and "k" in attrs:  # an older dpbench's setup, stopped while enqueuing: finish it
        _insert_attrs(storage, study_id, {"ready": True}, trials=attrs["k"])
        return
    if "ready" not in attrs and attrs and not _FIRST <= set(attrs):
        raise UsageError(f"study {study.study_name} exists but its setup by an older dpbench was interrupted before "
                         f"it drew K; use another --study")
    if "secret" not in attrs:
        _insert_attrs(storage, study_id, {"secret": streams.secret_seed(), "dpbench_config": plan_.config,
                                          "study_id": secrets.token_hex(8),
                                          "heartbeat_interval": storage.heartbeat_interval})
        attrs = _study_attrs(storage, study_id)
    if "ready" in attrs:
        return
    config = attrs["dpbench_config"]  # the creator's, which a worker must match to join
    k = (draw_k(config["k_distribution"], attrs["secret"]) if config["mode"] == "random-stopping"
         else int(config["trials"]))
    _insert_attrs(storage, study_id, {"ready": True, "k": k}, trials=k)


def _study_attrs(storage: optuna.storages.RDBStorage, study_id: int) -> dict[str, Any]:
    with storage.engine.connect() as connection:
        rows = connection.execute(sqlalchemy.select(_STUDY_ATTRS.c.key, _STUDY_ATTRS.c.value_json)
                                  .where(_STUDY_ATTRS.c.study_id == study_id))
        return {key: json.loads(value) for key, value in rows}


def _insert_attrs(storage: optuna.storages.RDBStorage, study_id: int, values: dict[str, Any], trials: int = 0
                  ) -> None:
    """Insert the study's user attributes (Optuna's JSON encoding), then WAITING trials as Optuna's
    ``enqueue_trial({})`` makes them, with a heartbeat each, up to ``trials`` in all (an older dpbench's setup may
    have enqueued some), in one transaction; nothing if another worker inserted the first attribute first (any other
    conflict is an error)."""
    (first, value), *rest = values.items()
    try:
        with storage.engine.begin() as connection:
            try:
                connection.execute(_STUDY_ATTRS.insert().values(study_id=study_id, key=first,
                                                                value_json=json.dumps(value)))
            except sqlalchemy.exc.IntegrityError:
                raise _Done from None  # rolls the transaction back
            for key, value in rest:
                connection.execute(_STUDY_ATTRS.insert().values(study_id=study_id, key=key,
                                                                value_json=json.dumps(value)))
            now = _now(connection)
            made = connection.execute(sqlalchemy.select(sqlalchemy.func.count()).select_from(_TRIALS)
                                      .where(_TRIALS.c.study_id == study_id)).scalar()
            for number in range(made, trials):
                trial_id = connection.execute(_TRIALS.insert().values(
                    study_id=study_id, number=number, state=TrialState.WAITING)).inserted_primary_key[0]
                connection.execute(_TRIAL_ATTRS.insert().values(trial_id=trial_id, key="fixed_params",
                                                                value_json=json.dumps({})))
                connection.execute(_BEATS.insert().values(trial_id=trial_id, heartbeat=now))
    except _Done:
        pass  # another worker's transaction committed first: it did this


class _Done(Exception):
    """Another worker did this step of the setup first."""


def ledger(study: optuna.Study) -> dict[str, Any]:
    """The study's trials by state: every one of them is charged."""
    trials = study.get_trials(deepcopy=False)
    states = {}
    for trial in trials:
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    return {"k": study.user_attrs["k"], "trials": len(trials), "states": states}


def _stored_seed(storage: optuna.storages.RDBStorage, name: str) -> int | None:
    """The seed study ``name`` was created with (in its storage), None if there is no such study yet."""
    try:
        return optuna.load_study(study_name=name, storage=storage).user_attrs.get("dpbench_config", {}).get("seed")
    except KeyError:
        return None


def _release_once(url: str, name: str, record: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Insert the study's released record unless another worker did first: (the stored record, whether we did)."""
    db = sqlalchemy.create_engine(url, **_engine_kwargs(url))
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
