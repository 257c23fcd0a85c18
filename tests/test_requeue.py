"""A trial whose worker died runs again, the same trial (dpbench.tuning.claims.requeue_stale): a killed study releases
what it would have released; a live worker's trial, a trial just claimed after a long wait and a trial that beats
again after being listed are left alone; a late worker neither writes nor tells a trial claimed again; a trial killed between two draws draws the rest
as it would have; an interrupt is not an outcome and is not
counted; a death in a batch is not counted and the trial runs alone next; a trial that dies alone more than
REQUEUE_LIMIT times fails and counts; a SIGTERM from outside is a death, the sweep's own close is not; processes
claiming at once take each trial once."""
import time

import optuna
import pytest

from dpbench.tuning import claims
from dpbench.tuning import search
from dpbench.tuning import study as study_module
from dpbench.tuning import trials as trials_module
from dpbench.tuning import tune

HEARTBEAT = 1  # seconds; a trial is stale after 3 intervals without a beat


def stale():
    time.sleep(3 * HEARTBEAT + 1.5)


@pytest.fixture
def secret(monkeypatch):
    """A secret whose K ~ Poisson(2) is 2, as every new study's secret."""
    from dpbench.privacy import streams
    from dpbench.tuning.accounting import draw_k

    value = next(s for s in range(1000) if draw_k({"name": "poisson", "mean": 2.0}, s) == 2)
    monkeypatch.setattr(streams, "secret_seed", lambda: value)
    return value


def spec(tmp_path, name):
    return tune.TuneSpec(method="dpsgd", task="digits", epsilon=1.0, trials=2.0, k_distribution="poisson",
                         overrides={"epochs": 2}, storage=f"sqlite:///{tmp_path / (name + '.sqlite')}", study=name,
                         heartbeat_interval=HEARTBEAT, no_wandb=True, append_to_store=False)


def killed(tmp_path, name):
    """A study whose K trials a worker claimed, then died (RUNNING, no more beats)."""
    plan_, _, storage, study, _ = tune._open(spec(tmp_path, name))
    claimed = list(claims._claims(study, storage))
    assert len(claimed) == study.user_attrs["k"] == 2
    return plan_, storage, study, claimed


def test_a_killed_study_releases_what_the_same_study_uninterrupted_releases(tmp_path, secret):
    whole = tune.tune(spec(tmp_path, "whole"))
    _, storage, study, _ = killed(tmp_path, "killed")
    stale()
    again = tune.tune(spec(tmp_path, "killed"))
    for key in ("metrics", "epsilon", "noise_multiplier", "hyperparameters"):
        assert again[key] == whole[key], key
    assert again["tuning"]["selected_params"] == whole["tuning"]["selected_params"]
    assert again["tuning"]["selected_score"] == whole["tuning"]["selected_score"]
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert [t.system_attrs["dpbench_deaths"] for t in trials] == [1, 1]


def test_a_trial_whose_worker_still_beats_is_left_running(tmp_path, secret):
    _, storage, study, claimed = killed(tmp_path, "alive")
    time.sleep(2 * HEARTBEAT)
    for trial_id, _ in claimed:
        storage.record_heartbeat(trial_id)  # within the grace period
    claims.requeue_stale(study, storage)
    assert {t.state for t in study.get_trials()} == {optuna.trial.TrialState.RUNNING}


def test_a_trial_that_dies_more_than_the_limit_fails_and_counts(tmp_path, secret):
    _, storage, study, _ = killed(tmp_path, "dies")
    for deaths in range(1, claims.REQUEUE_LIMIT + 1):
        stale()
        claims.requeue_stale(study, storage)
        assert {t.state for t in study.get_trials()} == {optuna.trial.TrialState.WAITING}
        assert {t.system_attrs["dpbench_deaths"] for t in study.get_trials()} == {deaths}
        assert len(list(claims._claims(study, storage))) == 2  # claimed again, and killed again
    stale()
    claims.requeue_stale(study, storage)
    assert {t.state for t in study.get_trials()} == {optuna.trial.TrialState.FAIL}


def test_a_late_worker_neither_writes_nor_tells_a_trial_claimed_again(tmp_path, secret):
    """Its heartbeat was late, the trial was put back and claimed by another run (another process: another token)."""
    plan_, storage, study, claimed = killed(tmp_path, "late")
    (trial_id, number), _ = claimed
    key = str(storage.engine.url), trial_id
    late_token, late = claims._HELD[key], optuna.Trial(study, trial_id)
    stale()
    claims.requeue_stale(study, storage)
    trials_module._finish(plan_, study, late, number, None, RuntimeError("late"))  # put back: not told
    assert study.get_trials()[number].state == optuna.trial.TrialState.WAITING
    assert "error" not in study.get_trials()[number].user_attrs
    (again, _), = [c for c in claims._claims(study, storage) if c[0] == trial_id]
    new_token, claims._HELD[key] = claims._HELD[key], late_token  # the late worker's view
    trials_module._finish(plan_, study, late, number, {"validation": {"noisy_accuracy": 0.9}})
    assert study.get_trials()[number].state == optuna.trial.TrialState.RUNNING
    assert "record" not in study.get_trials()[number].user_attrs
    claims._HELD[key] = new_token
    study.tell(optuna.Trial(study, again), 0.5)  # the run again tells
    assert study.get_trials()[number].value == 0.5


def test_a_trial_killed_between_two_draws_draws_the_rest_as_it_would_have(tmp_path, secret):
    plan_, storage, study, claimed = killed(tmp_path, "partial")
    (trial_id, number), _ = claimed
    whole_plan, _, whole_storage, whole_study, _ = tune._open(spec(tmp_path, "whole"))  # the same secret
    (whole_id, whole_number), _ = list(claims._claims(whole_study, whole_storage))
    _, expected = trials_module._begin(whole_plan, whole_study, whole_id, whole_number)
    first = next(iter(plan_.distributions))
    study.sampler = trials_module._sampler(plan_, study_module.study_secret(study), number)
    search.suggest(optuna.Trial(study, trial_id), {first: plan_.distributions[first]})  # killed after one draw
    _, params = trials_module._begin(plan_, study, trial_id, number)
    assert len(plan_.distributions) > 1 and params == expected


def test_an_interrupted_trial_is_put_back_at_once_and_not_counted(tmp_path, secret, monkeypatch):
    plan_, storage, study, claimed = killed(tmp_path, "interrupted")

    def interrupt(spec):
        raise KeyboardInterrupt

    monkeypatch.setattr(trials_module.engine, "run", interrupt)
    with pytest.raises(KeyboardInterrupt):
        trials_module._run_trial(plan_, study, storage, claimed[0])
    trial = study.get_trials()[claimed[0][1]]
    assert trial.state == optuna.trial.TrialState.WAITING and "error" not in trial.user_attrs
    assert trial.system_attrs.get("dpbench_deaths", 0) == 0


def test_a_death_in_a_batch_is_not_counted_and_the_trial_runs_alone_next(tmp_path, secret):
    _, _, storage, study, _ = tune._open(spec(tmp_path, "batch"))
    assert len(list(claims._claims(study, storage, batched=True))) == 2
    stale()
    claims.requeue_stale(study, storage)
    trials = study.get_trials()
    assert {t.state for t in trials} == {optuna.trial.TrialState.WAITING}
    assert [t.system_attrs["dpbench_deaths"] for t in trials] == [0, 0]
    assert list(claims._claims(study, storage, batched=True)) == []  # not in a batch again
    assert claims._claim(study, storage) is not None  # alone


def test_a_process_puts_back_only_the_claims_it_holds(tmp_path, secret):
    _, storage, study, claimed = killed(tmp_path, "foreign")
    (trial_id, _), (other_id, _) = claimed
    claims._HELD[str(storage.engine.url), other_id] = "another claim's token"
    claims.put_back(storage, [trial_id, other_id])
    states = [t.state for t in study.get_trials()]
    assert states == [optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING]


def test_a_trial_claimed_after_a_long_wait_is_not_taken_for_dead(tmp_path, secret):
    """Its heartbeat is the one recorded when the study was created; the claim beats first."""
    _, _, storage, study, _ = tune._open(spec(tmp_path, "late-claim"))
    stale()
    claimed = list(claims._claims(study, storage))
    claims.requeue_stale(study, storage)
    assert len(claimed) == 2 and {t.state for t in study.get_trials()} == {optuna.trial.TrialState.RUNNING}


def test_a_trial_that_beats_again_after_being_listed_is_left_running(tmp_path, secret, monkeypatch):
    """Between Optuna's listing of stale trials and the requeue, its worker beat (or another worker claimed it)."""
    _, storage, study, claimed = killed(tmp_path, "listed")
    stale()
    for trial_id, _ in claimed:
        storage.record_heartbeat(trial_id)
    monkeypatch.setattr(type(storage), "_get_stale_trial_ids", lambda self, study_id: [i for i, _ in claimed])
    claims.requeue_stale(study, storage)
    assert {t.state for t in study.get_trials()} == {optuna.trial.TrialState.RUNNING}


def test_a_storage_error_skips_a_beat_and_the_beats_go_on(tmp_path, secret, monkeypatch):
    """Optuna wraps the storage's errors (a lock timeout, a lost connection) in StorageInternalError: the heartbeat
    must survive one, or a live trial goes stale and is run again (and, alone, counted dead)."""
    _, storage, study, claimed = killed(tmp_path, "beats")
    calls, real = [], type(storage).record_heartbeat

    def flaky(self, trial_id):
        calls.append(trial_id)
        if len(calls) == 1:
            raise optuna.exceptions.StorageInternalError("database is locked")
        return real(self, trial_id)

    monkeypatch.setattr(type(storage), "record_heartbeat", flaky)
    with claims._Heartbeat(storage, [claimed[0][0]], HEARTBEAT):
        time.sleep(2.5 * HEARTBEAT)
    assert len(calls) >= 2


def test_a_worker_joining_with_another_heartbeat_is_refused(tmp_path, secret):
    """Staleness is judged by each worker's own grace period: a worker beating every 10 s would take the trials of
    one beating every 60 s for dead (and count their deaths)."""
    from dataclasses import replace

    from dpbench.errors import UsageError

    tune._open(spec(tmp_path, "beats-slow"))
    with pytest.raises(UsageError, match="heartbeat-interval 1"):
        tune._open(replace(spec(tmp_path, "beats-slow"), heartbeat_interval=10))
    tune._open(spec(tmp_path, "beats-slow"))  # the same interval joins


def terminated_while_running(tmp_path, command: list[str], name: str) -> list[optuna.trial.FrozenTrial]:
    """Start ``command`` (a process that joins the study ``name`` of :func:`spec`, whose K is 2), SIGTERM it once it
    runs a trial, and return the study's trials after it ended of it."""
    import os
    import signal
    import subprocess
    import sys

    _, _, storage, study, _ = tune._open(spec(tmp_path, name))  # created here, with the fixture's secret
    child = subprocess.Popen([sys.executable, *command], env={**os.environ, "OMP_NUM_THREADS": "1",
                                                             "DPBENCH_HOME": str(tmp_path / "home")},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(t.state == optuna.trial.TrialState.RUNNING for t in study.get_trials()):
        assert time.monotonic() < deadline and child.poll() is None, child.communicate()
        time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM, child.communicate()
    return study.get_trials()


def test_a_sigterm_from_outside_is_a_death_and_counts_for_a_lone_trial(tmp_path, secret):
    """A scheduler's time limit or a nanny's memory limit arrives as SIGTERM and may be the trial's own doing (it
    ran long, it grew large): put back uncounted, such a trial would never fail and its study never release."""
    trials = terminated_while_running(tmp_path, [
        "-m", "dpbench", "tune", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--trials", "2",
        "--k-distribution", "poisson", "--epochs", "2", "--storage", f"sqlite:///{tmp_path / 'cli.sqlite'}",
        "--study", "cli", "--heartbeat-interval", str(HEARTBEAT), "--no-wandb"], "cli")
    running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    assert len(running) == 1
    _, _, storage, study, _ = tune._open(spec(tmp_path, "cli"))
    stale()
    claims.requeue_stale(study, storage)
    assert study.get_trials()[running[0].number].system_attrs["dpbench_deaths"] == 1


def _claim_batch_and_wait(tune_spec) -> None:
    """A sweep job's start (in a Dask worker): claim the study's trials as one batch, then train for long."""
    _, _, storage, study, _ = tune._open(tune_spec)
    assert len(list(claims._claims(study, storage, batched=True))) == 2
    time.sleep(300)


def test_a_sweeps_close_puts_its_workers_claims_back_uncounted(tmp_path, secret):
    """The sweep's own stop (it failed, or was interrupted) is not an outcome of the trials its workers hold: they
    are WAITING before the workers are terminated, with no death counted and not marked to run alone."""
    from concurrent.futures import Future

    from dpbench.board import sweep

    _, _, storage, study, _ = tune._open(spec(tmp_path, "worker"))
    starting = Future()
    starting.set_result(sweep._local_cluster(1, 1))
    future = starting.result()[1].submit(_claim_batch_and_wait, spec(tmp_path, "worker"), pure=False)
    deadline = time.monotonic() + 120
    while {t.state for t in study.get_trials()} != {optuna.trial.TrialState.RUNNING}:
        assert time.monotonic() < deadline and not future.done(), future
        time.sleep(0.2)
    sweep._close_local(starting)
    trials = study.get_trials()
    assert {t.state for t in trials} == {optuna.trial.TrialState.WAITING}
    assert {t.system_attrs.get("dpbench_deaths", 0) for t in trials} == {0}
    assert not any(t.system_attrs.get("dpbench_alone") for t in trials)


def test_a_process_that_put_its_claims_back_claims_nothing_more(tmp_path, secret, monkeypatch):
    """Its trials keep running in other threads until it is terminated: a claim made after the put-back would die
    with it (and count)."""
    monkeypatch.setattr(claims, "_STOPPING", False)
    _, storage, study, _ = killed(tmp_path, "stopping")
    claims.put_back_held()
    assert {t.state for t in study.get_trials()} == {optuna.trial.TrialState.WAITING}
    assert claims._claim(study, storage) is None
    assert {t.state for t in study.get_trials()} == {optuna.trial.TrialState.WAITING}


def test_processes_claiming_at_once_never_take_the_same_trial(tmp_path, monkeypatch, together):
    """Claims are compare-and-set updates: SQLite has no row locks (it ignores the ORM's FOR UPDATE), so a claim
    that read the state and then wrote it would let two workers that listed the same WAITING trial both take it."""
    from dataclasses import replace

    from dpbench.privacy import streams
    from dpbench.tuning.accounting import draw_k

    k = 40
    monkeypatch.setattr(streams, "secret_seed",
                        lambda: next(s for s in range(10000) if draw_k({"name": "poisson", "mean": k}, s) == k))
    tune._open(replace(spec(tmp_path, "race"), trials=float(k)))
    claimed = sum(together(f"from dataclasses import replace\nfrom dpbench.tuning import claims, tune\n"
                           f"import test_requeue\n_, _, storage, study, _ = tune._open(replace("
                           f"test_requeue.spec(root, 'race'), trials={float(k)}))",
                           "[number for _, number in claims._claims(study, storage)]", 3), [])
    assert sorted(claimed) == list(range(k))  # each trial once, by one process



def test_a_told_trial_is_no_longer_held(tmp_path, secret):
    """The sweep's close walks only live claims: a worker's told trials are forgotten."""
    plan_, storage, study, claimed = killed(tmp_path, "told")
    (trial_id, number), (other_id, _) = claimed
    key = str(storage.engine.url)
    trials_module._finish(plan_, study, optuna.Trial(study, trial_id), number, None, RuntimeError("fails"))
    assert (key, trial_id) not in claims._HELD and (key, other_id) in claims._HELD
