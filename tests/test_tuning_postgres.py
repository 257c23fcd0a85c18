"""Two ``dpbench tune`` workers on one PostgreSQL-backed study, one killed mid-trial: exactly K trials, the killed
one run again by the other worker (the same trial), and one released record with one privacy total.

The test starts a throwaway PostgreSQL cluster (``initdb`` in a temporary folder, ``postgres`` on a free loopback
port). It needs the server binaries (Debian's ``postgresql`` package, which ``.ci/run`` installs): without them it
fails rather than skips. As root, the server runs as the ``postgres`` user (PostgreSQL refuses to run as root).
"""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import dp_accounting
import optuna
import pytest
import sqlalchemy
from dp_accounting import rdp

STUDY = "digits-dpsgd-two-workers"
SEED = 15


def worker(url: str, home: Path) -> subprocess.Popen:
    """A ``dpbench tune`` process; 100 epochs make each trial last long enough to be caught running."""
    env = {**os.environ, "DPBENCH_HOME": str(home), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "dpbench", "tune", "--method", "dpsgd", "--task", "digits", "--epsilon", "1",
         "--k-distribution", "poisson", "--trials", "4", "--seed", str(SEED), "--epochs", "100",
         "--storage", url, "--study", STUDY, "--heartbeat-interval", "1", "--json", "--no-wandb"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def create_study_with_k_4(url: str, monkeypatch) -> None:
    """Create the workers' study here with a secret whose K ~ Poisson(4) is 4 (enough trials for both workers): K
    comes from the secret a study draws from the OS's entropy (dpbench.tuning.study), which a test cannot choose."""
    from dpbench.privacy import streams
    from dpbench.tuning import tune
    from dpbench.tuning.accounting import draw_k

    secret = next(s for s in range(1000) if draw_k({"name": "poisson", "mean": 4.0}, s) == 4)
    monkeypatch.setattr(streams, "secret_seed", lambda: secret)
    tune._open(tune.TuneSpec(method="dpsgd", task="digits", epsilon=1.0, trials=4.0, k_distribution="poisson",
                                 seed=SEED, overrides={"epochs": 100}, storage=url, study=STUDY, heartbeat_interval=1))


def trials_of(url: str) -> tuple[dict, list[optuna.trial.FrozenTrial]]:
    """The study's user attributes and trials, over a connection closed after (polled in a loop, an engine per call
    left to the garbage collector exhausted the test server's connections under load)."""
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.load_study(study_name=STUDY, storage=storage)
        return study.user_attrs, study.get_trials()
    finally:
        storage.engine.dispose()


def test_two_workers_one_killed_mid_trial_run_exactly_k_trials(postgres_url, tmp_path, monkeypatch):
    create_study_with_k_4(postgres_url, monkeypatch)
    first, second = worker(postgres_url, tmp_path / "first"), worker(postgres_url, tmp_path / "second")
    killed_trial = None
    deadline = time.monotonic() + 300
    while killed_trial is None:  # kill the first worker while it is inside a trial
        assert time.monotonic() < deadline and first.poll() is None, "the first worker never started a trial"
        try:
            _, trials = trials_of(postgres_url)
        except (KeyError, sqlalchemy.exc.SQLAlchemyError):  # the study does not exist yet
            trials = []
        for trial in trials:
            if (trial.state == optuna.trial.TrialState.RUNNING
                    and trial.user_attrs.get("worker", "").endswith(f":{first.pid}")):
                first.kill()
                killed_trial = trial.number
                break
        time.sleep(0.05)
    first.wait()
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    record = json.loads(out)

    attrs, trials = trials_of(postgres_url)
    k = attrs["k"]
    assert k == 4 and len(trials) == k and "trials_run" not in record["tuning"]  # K stays in the study
    assert {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}  # the killed one too: run again
    assert {t.number: t.system_attrs.get("dpbench_deaths", 0) for t in trials if t.number == killed_trial} == {
        killed_trial: 1}
    assert trials[killed_trial].user_attrs["worker"].endswith(f":{second.pid}")
    released = [t for t in trials if t.user_attrs["record"]["metrics"] == record["metrics"]]
    assert released
    assert {t.user_attrs["worker"].rsplit(":", 1)[1] for t in trials} <= {str(first.pid), str(second.pid)}
    assert sum(t.user_attrs["worker"].endswith(f":{second.pid}") for t in trials) >= 1

    # One privacy total: dp-accounting from the record's fields, K's distribution and the per-trial mechanism.
    tuned = record["tuning"]
    once = dp_accounting.PoissonSampledDpEvent(tuned["sample_rate"],
                                               dp_accounting.GaussianDpEvent(tuned["noise_multiplier"]))
    event = dp_accounting.dp_event.RepeatAndSelectDpEvent(
        dp_accounting.SelfComposedDpEvent(once, tuned["gradient_evaluations"]), 4.0, math.inf)
    assert record["epsilon"] <= 1.0
    assert rdp.RdpAccountant().compose(event).get_epsilon(record["delta"]) == pytest.approx(record["epsilon"], rel=0.01)

    # Released once: one row in the study's database, in the store of the worker that released it; a late worker
    # finds nothing to run and returns the same record without storing it again.
    with sqlalchemy.create_engine(postgres_url).connect() as connection:
        rows = connection.execute(sqlalchemy.text("SELECT record FROM dpbench_released")).fetchall()
    assert [json.loads(row[0]) for row in rows] == [record]
    late = worker(postgres_url, tmp_path / "late")
    late_out, late_err = late.communicate(timeout=300)
    assert late.returncode == 0, late_err
    assert json.loads(late_out) == record
    assert not (tmp_path / "late" / "results.sqlite").exists()
    assert len(trials_of(postgres_url)[1]) == k


def test_every_workers_session_is_in_utc(postgres_url):
    """Heartbeats are naive timestamps of the session's clock: a worker whose session has another time zone (the
    role's or database's setting) would take live trials for dead, or dead ones for alive."""
    from dpbench.tuning.study import _storage

    with sqlalchemy.create_engine(postgres_url).begin() as connection:
        connection.execute(sqlalchemy.text("ALTER ROLE CURRENT_USER SET timezone = 'America/New_York'"))
    with sqlalchemy.create_engine(postgres_url).connect() as connection:  # the setting holds for plain sessions
        assert connection.execute(sqlalchemy.text("SHOW timezone")).scalar() == "America/New_York"
    with _storage(postgres_url, 10).engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("SHOW timezone")).scalar() == "UTC"


def test_a_workers_session_is_in_utc_whatever_its_pgtz(postgres_url, monkeypatch):
    """PGTZ in a worker's environment is sent when it connects and overrode a startup option of UTC."""
    from dpbench.tuning.study import _storage

    monkeypatch.setenv("PGTZ", "Asia/Tokyo")
    with sqlalchemy.create_engine(postgres_url).connect() as connection:  # PGTZ holds for plain sessions
        assert connection.execute(sqlalchemy.text("SHOW timezone")).scalar() == "Asia/Tokyo"
    storage = _storage(postgres_url, 10)
    with storage.engine.connect() as pooled, storage.engine.connect() as fresh:  # the second is a new connection
        for connection in (pooled, fresh):
            connection.execute(sqlalchemy.text("SELECT 1"))
            connection.rollback()  # a session setting made in a transaction that rolls back would be undone
            assert connection.execute(sqlalchemy.text("SHOW timezone")).scalar() == "UTC"
