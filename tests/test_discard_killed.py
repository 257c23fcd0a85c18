"""Discarding studies a killed sweep left with no outcome (dpbench.tuning.study.discard_killed, ``dpbench sweep
--discard-killed``): a study is discarded only when nothing was released and every trial's worker died without telling
anything; each test below differs from the discarded study in exactly one respect, and keeps it."""
import time

import optuna
import pytest
import sqlalchemy

from dpbench.tuning import study as study_module
from dpbench.tuning import tune

HEARTBEAT = 1  # seconds; Optuna fails a trial as stale after 3 intervals without a beat


@pytest.fixture
def killed(tmp_path, monkeypatch):
    """A random-stopping study (K = 2) whose two trials were claimed by a worker that then died: RUNNING, their
    heartbeats stopped; returns (storage, name, the study's secret)."""
    from dpbench.privacy import streams
    from dpbench.tuning.accounting import draw_k

    secret = next(s for s in range(1000) if draw_k({"name": "poisson", "mean": 2.0}, s) == 2)
    monkeypatch.setattr(streams, "secret_seed", lambda: secret)
    url = f"sqlite:///{tmp_path / 'tuning.sqlite'}"
    spec = tune.TuneSpec(method="dpsgd", task="digits", epsilon=1.0, trials=2.0, k_distribution="poisson",
                         storage=url, study="killed", heartbeat_interval=HEARTBEAT)
    _, _, storage, study, name = tune._open(spec)
    claimed = list(study_module._claims(study, storage))
    assert len(claimed) == 2
    for trial_id, number in claimed:  # what _begin records before training
        storage.set_trial_user_attr(trial_id, "worker", "vm:1")
    monkeypatch.setattr(streams, "secret_seed", lambda: secret + 1)  # a new study draws another secret
    return spec, storage, name, claimed


def stale():
    """Wait until Optuna counts the claimed trials' last beats as stale."""
    time.sleep(3 * HEARTBEAT + 1.5)


def exists(storage, name) -> bool:
    return name in {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}


def test_a_study_whose_every_trial_was_killed_is_discarded_and_runs_again_with_a_new_secret(killed):
    spec, storage, name, _ = killed
    old = optuna.load_study(study_name=name, storage=storage).user_attrs["study_id"]
    stale()
    assert study_module.discard_killed(storage, [name, "no-such-study"]) == [name]
    assert not exists(storage, name)
    _, _, _, again, _ = tune._open(spec)
    assert again.user_attrs["study_id"] != old and len(again.get_trials()) == again.user_attrs["k"]
    assert {t.state for t in again.get_trials()} == {optuna.trial.TrialState.WAITING}


def test_a_study_never_set_up_is_discarded(tmp_path):
    """Its creator died before enqueueing the trials: no trial can have run (a worker joins only a ready study)."""
    storage = study_module._storage(f"sqlite:///{tmp_path / 'tuning.sqlite'}", HEARTBEAT)
    optuna.create_study(storage=storage, study_name="half-made", direction="maximize")
    assert study_module.discard_killed(storage, ["half-made"]) == ["half-made"] and not exists(storage, "half-made")


def test_a_study_not_named_is_kept(killed):
    _, storage, name, _ = killed
    stale()
    assert study_module.discard_killed(storage, ["another"]) == [] and exists(storage, name)


def test_a_study_whose_workers_still_beat_is_kept(killed):
    _, storage, name, claimed = killed
    for trial_id, _ in claimed:  # alive: beating within the grace period
        storage.record_heartbeat(trial_id)
    assert study_module.discard_killed(storage, [name]) == [] and exists(storage, name)


@pytest.mark.parametrize("told", ["score", "error", "record"])
def test_a_study_with_one_trial_told_an_outcome_is_kept(killed, told):
    """A score, an error of the trial's own or a record with a non-finite score may depend on the data: the study's
    failures count, and it is never run again."""
    _, storage, name, claimed = killed
    trial_id, _ = claimed[0]
    if told == "score":
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.COMPLETE, [0.5])
    elif told == "error":
        storage.set_trial_user_attr(trial_id, "error", "RuntimeError: diverged")
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
    else:
        storage.set_trial_user_attr(trial_id, "record", {"validation": {"noisy_accuracy": float("nan")}})
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
    stale()
    assert study_module.discard_killed(storage, [name]) == [] and exists(storage, name)


def test_a_study_with_a_trial_still_waiting_is_kept(killed):
    """Its other trials were killed, but one was never claimed: the next worker runs it (the study is not dead)."""
    _, storage, name, claimed = killed
    study = optuna.load_study(study_name=name, storage=storage)
    trial_id, _ = claimed[0]
    with storage.engine.begin() as connection:  # back to WAITING, as if never claimed
        connection.execute(sqlalchemy.text("UPDATE trials SET state = 'WAITING' WHERE trial_id = :i"), {"i": trial_id})
    stale()
    assert study_module.discard_killed(storage, [name]) == [] and exists(storage, name)
    assert len(study.get_trials(states=(optuna.trial.TrialState.WAITING,))) == 1


def test_a_released_study_is_kept(killed):
    _, storage, name, _ = killed
    with storage.engine.begin() as connection:
        connection.execute(study_module._RELEASED.insert().values(study_name=name, record="{}"))
    stale()
    assert study_module.discard_killed(storage, [name]) == [] and exists(storage, name)


def test_the_sweep_discards_only_its_grids_killed_studies(tmp_path, monkeypatch, capsys):
    """``dpbench sweep --discard-killed`` finds the grid's studies by the names its random-stopping cells give them."""
    from dpbench.board import sweep
    from dpbench.privacy import streams
    from dpbench.tuning.accounting import draw_k

    grid_file = tmp_path / "grid.json"
    grid_file.write_text('{"tasks": ["digits"], "methods": ["dpsgd", "nonprivate"], "epsilons": [1], "seeds": 2, '
                         '"tracks": ["random-stopping", "validation"], "trials": 2}')
    grid = sweep.load_grid(str(grid_file))
    (cell,) = [c for c in sweep.cells(grid) if c.track == "random-stopping" and c.method == "dpsgd"]
    specs = sweep._tune_specs(cell, cell.seeds)
    secret = next(s for s in range(1000) if draw_k({"name": "truncated_negative_binomial", "mean": 2.0, "eta": 0}, s))
    monkeypatch.setattr(streams, "secret_seed", lambda: secret)
    for spec in specs:  # the sweep's storage (DPBENCH_HOME), its heartbeat
        _, _, storage, study, _ = tune._open(spec)
        list(study_module._claims(study, storage))
    other = tune.TuneSpec(method="dpsgd", task="digits", epsilon=1.0, trials=2.0, study="not-the-grids")
    _, _, storage, study, _ = tune._open(other)
    list(study_module._claims(study, storage))

    def running(self, study_id):  # stale now, not after 30 s (the default heartbeat's grace)
        with self.engine.connect() as connection:
            return list(connection.execute(sqlalchemy.text(
                "SELECT trial_id FROM trials WHERE study_id = :s AND state = 'RUNNING'"), {"s": study_id}).scalars())

    monkeypatch.setattr(optuna.storages.RDBStorage, "_get_stale_trial_ids", running)
    assert sorted(sweep.discard_killed(grid)) == sorted(spec.study for spec in specs)
    assert exists(storage, "not-the-grids")
