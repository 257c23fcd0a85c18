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

from dpbench.data.files import dpbench_home
from dpbench.errors import UsageError
from dpbench.privacy import streams
from dpbench.tuning.accounting import draw_k
from dpbench.tuning.claims import _trial_ids
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


def _utc(connection, _record) -> None:
    """Set a new PostgreSQL connection's session to UTC (after connecting, so that nothing overrides it)."""
    cursor = connection.cursor()
    cursor.execute("SET TIME ZONE 'UTC'")
    cursor.close()
    connection.commit()


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
        study.set_user_attr("heartbeat_interval", storage.heartbeat_interval)
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
    beats = study.user_attrs.get("heartbeat_interval")
    if beats is not None and beats != storage.heartbeat_interval:  # one grace period for all of a study's workers
        raise UsageError(f"study {name}'s workers beat every {beats} s: join it with --heartbeat-interval {beats}")
    return study


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
