"""A study's trials in its storage: claimed by a worker, kept alive by heartbeats, put back when their worker dies
or is interrupted, and held by a claim token (:mod:`dpbench.tuning.tune` describes the protocol).

A claim and a requeue are each one transaction around a compare-and-set UPDATE of the trial's state (one row
changes or none), so two workers never both take a trial or both put it back, on SQLite (which has no row locks) as
on PostgreSQL. They write Optuna's own tables (``optuna.storages._rdb.models``, a private module) because Optuna's
public calls are one transaction each."""
from __future__ import annotations

import json
import secrets
import sys
import threading
from datetime import datetime, timedelta
from typing import Any

import optuna
import sqlalchemy
from optuna.storages._rdb import models
from optuna.trial import TrialState

#: How often a trial that died *alone* is put back; its next death is its outcome (FAIL: it counts).
REQUEUE_LIMIT = 2

_DEATHS, _ALONE, _BATCHED, _CLAIM = "dpbench_deaths", "dpbench_alone", "dpbench_batched", "dpbench_claim"
_TRIALS = models.TrialModel.__table__
_BEATS = models.TrialHeartbeatModel.__table__
_ATTRS = models.TrialSystemAttributeModel.__table__
#: This process's claims: (storage URL, trial id) → the token of its claim.
_HELD: dict[tuple[str, int], str] = {}
#: The storages of those claims, by URL (for :func:`put_back_held`, which has only the claims).
_STORAGES: dict[str, optuna.storages.RDBStorage] = {}
#: Held while a claim is made and registered, and while the claims are put back (:func:`put_back_held`).
_CLAIMING = threading.Lock()
_STOPPING = False  # set by put_back_held: this process claims nothing more


def _trial_ids(study: optuna.Study, storage: optuna.storages.RDBStorage, states=None) -> list[tuple[int, int]]:
    """(storage id, number) of the study's trials in ``states``."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return [(storage.get_trial_id_from_study_id_trial_number(study_id, trial.number), trial.number)
            for trial in study.get_trials(deepcopy=False, states=states)]


def _attrs(connection, trial_id: int) -> dict[str, Any]:
    rows = connection.execute(sqlalchemy.select(_ATTRS.c.key, _ATTRS.c.value_json).where(_ATTRS.c.trial_id == trial_id))
    return {key: json.loads(value) for key, value in rows}


def _set_attrs(connection, trial_id: int, values: dict[str, Any]) -> None:
    """Set system attributes inside the caller's transaction (Optuna's JSON encoding)."""
    for key, value in values.items():
        text = json.dumps(value)
        if not connection.execute(_ATTRS.update().where(_ATTRS.c.trial_id == trial_id, _ATTRS.c.key == key)
                                  .values(value_json=text)).rowcount:
            connection.execute(_ATTRS.insert().values(trial_id=trial_id, key=key, value_json=text))


def _has(trial_id: int, key: str, value: Any):
    """SQL: the trial's system attribute ``key`` is ``value``."""
    return sqlalchemy.exists().where(_ATTRS.c.trial_id == trial_id, _ATTRS.c.key == key,
                                     _ATTRS.c.value_json == json.dumps(value))


def _now(connection) -> datetime:
    """The database's clock, as Optuna's heartbeats use it."""
    return connection.execute(sqlalchemy.select(sqlalchemy.func.now())).scalar().replace(tzinfo=None)


def _beat(connection, trial_id: int) -> None:
    now = _now(connection)
    if not connection.execute(_BEATS.update().where(_BEATS.c.trial_id == trial_id).values(heartbeat=now)).rowcount:
        connection.execute(_BEATS.insert().values(trial_id=trial_id, heartbeat=now))


def _take(storage: optuna.storages.RDBStorage, trial_id: int, batched: bool) -> bool:
    """Claim one WAITING trial: RUNNING, a fresh heartbeat (a trial claimed after a long wait is never taken for
    dead), a new token this process keeps; in a batch only if it need not run alone. False if it was not WAITING."""
    token = secrets.token_hex(8)
    condition = [_TRIALS.c.trial_id == trial_id, _TRIALS.c.state == TrialState.WAITING]
    if batched:  # a trial that died in a batch runs alone (work() claims it)
        condition.append(~_has(trial_id, _ALONE, True))
    with _CLAIMING:  # registered with its commit, so that put_back_held never misses it
        if _STOPPING:
            return False
        with storage.engine.begin() as connection:
            if connection.execute(_TRIALS.update().where(*condition)
                                  .values(state=TrialState.RUNNING, datetime_start=datetime.now())).rowcount != 1:
                return False
            _beat(connection, trial_id)
            _set_attrs(connection, trial_id, {_CLAIM: token, _BATCHED: batched})
        _HELD[str(storage.engine.url), trial_id] = token
        _STORAGES[str(storage.engine.url)] = storage
    return True


def _claims(study: optuna.Study, storage: optuna.storages.RDBStorage, batched: bool = False):
    """Claim the study's WAITING trials, one (storage id, number) per ``next``, from one listing (the ones another
    worker takes first are skipped). ``batched``: for one batch of trials, which leaves out those that must run
    alone (:func:`requeue_stale`)."""
    for trial_id, number in _trial_ids(study, storage, (TrialState.WAITING,)):
        if _take(storage, trial_id, batched):
            yield trial_id, number


def _claim(study: optuna.Study, storage: optuna.storages.RDBStorage) -> tuple[int, int] | None:
    """Claim one WAITING trial to run alone: its (storage id, number); None when none is left."""
    return next(_claims(study, storage), None)


def holds(storage: optuna.storages.RDBStorage, trial_id: int) -> bool:
    """Whether this process's claim on the trial is still the current one: a worker whose trial was put back (its
    heartbeat late) and claimed again by another run neither writes its record nor tells it."""
    storage = getattr(storage, "_backend", storage)  # a study's storage is Optuna's cache around it
    token = _HELD.get((str(storage.engine.url), trial_id))
    return token is not None and storage.get_trial(trial_id).system_attrs.get(_CLAIM) == token


def forget(storage: optuna.storages.RDBStorage, trial_id: int) -> None:
    """Drop this process's claim on a finished trial, so that :func:`put_back_held` walks only live claims."""
    storage = getattr(storage, "_backend", storage)
    _HELD.pop((str(storage.engine.url), trial_id), None)


def requeue_stale(study: optuna.Study, storage: optuna.storages.RDBStorage) -> None:
    """Put the study's RUNNING trials whose heartbeat stopped (their worker was killed, its machine lost) back to
    WAITING, the same trial (number, and so seed, hyperparameter draws and score noise from the study's secret): run
    again, it gives the result it would have given, so a kill delays the study's release without changing it. A
    trial that died in a batch is not counted, and runs alone next. A trial that died alone is counted; after
    ``REQUEUE_LIMIT`` such deaths the next is its outcome (FAIL: it counts and never wins), as one whose own
    computation kills its worker must be, lest the study never release. That residual is K-dependent: a stop that
    lands three times on the same lone trial decides it."""
    for trial_id in storage._get_stale_trial_ids(study._study_id):
        _requeue(storage, trial_id, stale=True)


def put_back(storage: optuna.storages.RDBStorage, trial_ids: list[int]) -> None:
    """Put this process's claimed trials back to WAITING at once, uncounted: it was interrupted (Ctrl-C, exit), which
    is not an outcome of a trial. A trial whose claim this process no longer holds is left alone."""
    for trial_id in trial_ids:
        token = _HELD.get((str(storage.engine.url), trial_id))
        if token is not None:
            _requeue(storage, trial_id, stale=False, token=token)


def put_back_held() -> None:
    """Put every claim this process holds back to WAITING, uncounted, newest first, and claim nothing more: the
    sweep calls it in each of its Dask workers (``client.run``) before it terminates them
    (:func:`dpbench.board.sweep._close_local`), since its own close is not an outcome of their trials. A SIGTERM
    from anyone else (a scheduler's time limit, a nanny's memory limit) may be the trial's own doing and stays a
    death (:func:`requeue_stale` counts it if the trial ran alone), as is the close of a worker that the broadcast
    did not reach (one its nanny restarted after it)."""
    global _STOPPING
    with _CLAIMING:
        _STOPPING = True
        for (url, trial_id), token in reversed(list(_HELD.items())):
            try:
                _requeue(_STORAGES[url], trial_id, stale=False, token=token)
            except sqlalchemy.exc.SQLAlchemyError as error:  # it goes stale and is a death; the others go back
                print(f"dpbench: could not put trial {trial_id} back ({type(error).__name__}); it will count as a "
                      f"death if it ran alone", file=sys.stderr)


def _requeue(storage: optuna.storages.RDBStorage, trial_id: int, stale: bool, token: str | None = None) -> None:
    """RUNNING → WAITING if still RUNNING (and still stale, or still held by ``token``), then the death counted (if
    ``stale`` and the trial ran alone) and, past the limit, FAIL instead; one transaction."""
    with storage.engine.begin() as connection:
        condition = [_TRIALS.c.trial_id == trial_id, _TRIALS.c.state == TrialState.RUNNING]
        if token is not None:
            condition.append(_has(trial_id, _CLAIM, token))
        if stale:
            grace = timedelta(seconds=storage.grace_period or 2 * storage.heartbeat_interval)
            condition.append(sqlalchemy.exists().where(_BEATS.c.trial_id == trial_id,
                                                       _BEATS.c.heartbeat < _now(connection) - grace))
        if connection.execute(_TRIALS.update().where(*condition).values(state=TrialState.WAITING)).rowcount != 1:
            return  # told, claimed again and beating, or put back by another worker since it was listed
        attrs = _attrs(connection, trial_id)
        deaths = attrs.get(_DEATHS, 0) + (stale and not attrs.get(_BATCHED, False))
        if deaths > REQUEUE_LIMIT:
            connection.execute(_TRIALS.update().where(_TRIALS.c.trial_id == trial_id)
                               .values(state=TrialState.FAIL, datetime_complete=datetime.now()))
            return
        _set_attrs(connection, trial_id, {_DEATHS: deaths, _BATCHED: False, _CLAIM: None,
                                          _ALONE: (stale and attrs.get(_BATCHED, False)) or attrs.get(_ALONE, False)})


class _Heartbeat:
    """Record the heartbeats of trials (one id or a list) every ``interval`` seconds while their worker lives; a
    storage error skips one beat (the next may pass) instead of ending the beats."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_ids: int | list[int], interval: int):
        self.storage, self.interval = storage, interval
        self.trial_ids = trial_ids if isinstance(trial_ids, list) else [trial_ids]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self):
        while not self.stop.wait(self.interval):
            for trial_id in self.trial_ids:
                try:
                    self.storage.record_heartbeat(trial_id)
                except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError):
                    continue  # Optuna wraps the storage's errors in StorageInternalError

    def __enter__(self):
        self.thread.start()

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
