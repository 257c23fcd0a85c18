"""A study's setup (dpbench.tuning.study._set_up): a creator killed during it leaves a study the next worker finishes
with the same K (from the stored secret), not one refused for good or one redrawn; workers opening a new study at
once make exactly K trials and agree on one secret."""
import optuna

from dpbench.privacy import streams
from dpbench.tuning import study as study_module
from dpbench.tuning import tune
from dpbench.tuning.accounting import draw_k

POISSON_2 = {"name": "poisson", "mean": 2.0}


def trial_numbers(storage, study_id: int) -> list[int]:
    """The study's trials' numbers as the database holds them (Optuna's cache keys trials by number: two trials of
    one number would show as one)."""
    import sqlalchemy
    from optuna.storages._rdb import models

    table = models.TrialModel.__table__
    with storage.engine.connect() as connection:
        return sorted(connection.execute(sqlalchemy.select(table.c.number).where(table.c.study_id == study_id))
                      .scalars())


def spec(tmp_path, name="setup"):
    return tune.TuneSpec(method="dpsgd", task="digits", epsilon=1.0, trials=2.0, k_distribution="poisson",
                         overrides={"epochs": 2}, storage=f"sqlite:///{tmp_path / 'studies.sqlite'}", study=name,
                         heartbeat_interval=1, no_wandb=True, append_to_store=False)


def secret_with_k(k: int, after: int = 0) -> int:
    return next(s for s in range(after, 100000) if draw_k(POISSON_2, s) == k)


def test_a_study_whose_creator_died_after_storing_its_secret_is_finished_with_its_k(tmp_path, monkeypatch):
    stored, joiner = secret_with_k(5), secret_with_k(1)
    plan_ = tune.plan(spec(tmp_path))
    storage = study_module._storage(spec(tmp_path).storage, 1)
    created = optuna.create_study(storage=storage, study_name="setup", direction="maximize")
    monkeypatch.setattr(streams, "secret_seed", lambda: stored)
    study_module._insert_attrs(storage, created._study_id, {  # the creator's first transaction, then its death
        "secret": stored, "dpbench_config": plan_.config, "study_id": "abc", "heartbeat_interval": 1})
    monkeypatch.setattr(streams, "secret_seed", lambda: joiner)
    _, _, _, study, _ = tune._open(spec(tmp_path))  # refused for good before ("never set up")
    assert study.user_attrs["secret"] == stored and study.user_attrs["k"] == 5
    trials = study.get_trials()
    assert trial_numbers(study._storage._backend, study._study_id) == list(range(5))
    assert {t.state for t in trials} == {optuna.trial.TrialState.WAITING}
    assert all(t.system_attrs["fixed_params"] == {} for t in trials)


def test_a_study_whose_creator_died_before_drawing_is_set_up_by_the_next_worker(tmp_path, monkeypatch):
    storage = study_module._storage(spec(tmp_path).storage, 1)
    optuna.create_study(storage=storage, study_name="setup", direction="maximize")  # then its creator died
    monkeypatch.setattr(streams, "secret_seed", lambda: secret_with_k(3))
    _, _, _, study, _ = tune._open(spec(tmp_path))
    assert study.user_attrs["k"] == 3 and len(study.get_trials()) == 3


def test_workers_opening_a_new_study_at_once_make_k_trials_and_one_secret(tmp_path, together):
    """Each worker plans and opens the storage first, then all open the study together; K ~ Poisson(40), so that
    making the trials takes long enough for the others to try too."""
    seen = together("from dataclasses import replace\nimport test_study_setup as t\n"
                    "from dpbench.tuning import study, tune\n"
                    "spec = replace(t.spec(root, 'race'), trials=40.0)\n"
                    "plan_, storage = tune.plan(spec), study._storage(spec.storage, 1)",
                    "(lambda opened: [opened.user_attrs['secret'], opened.user_attrs['k']])"
                    "(study.open_study(plan_, storage, 'race'))", 4)
    seen = [tuple(pair) for pair in seen]
    (secret, k), = set(seen)
    assert k == draw_k({"name": "poisson", "mean": 40.0}, secret)
    storage = study_module._storage(spec(tmp_path).storage, 1)
    study = optuna.load_study(study_name="race", storage=storage)
    assert trial_numbers(storage, study._study_id) == list(range(k))


def test_a_worker_that_read_the_study_before_another_set_it_up_makes_no_trials(tmp_path, monkeypatch):
    """The race above, made certain: a worker read the study's attributes before another worker's setup committed
    (on SQLite the lock waits mostly serialize them; on PostgreSQL they need not). The ``ready`` mark, inserted
    first in the transaction that makes the trials, turns its attempt into nothing."""
    monkeypatch.setattr(streams, "secret_seed", lambda: secret_with_k(2))
    plan_, _, storage, study, _ = tune._open(spec(tmp_path))
    real = study_module._study_attrs
    monkeypatch.setattr(study_module, "_study_attrs",
                        lambda *args: {key: value for key, value in real(*args).items() if key not in ("ready", "k")})
    study_module._set_up(plan_, storage, study)
    assert trial_numbers(storage, study._study_id) == [0, 1]


def test_a_study_an_older_dpbench_left_half_made_is_finished_with_its_k_or_refused_before_k(tmp_path):
    """The older setup stored the config, secret, study id, K and heartbeat one by one, then enqueued the K trials one
    by one, then ``ready``. Stopped after storing K, the study is finished with that K (refused, it would have been
    run again under another name only where the stop missed the K-long enqueuing: K's law conditioned); stopped
    before, it is refused (nothing of K was drawn)."""
    import pytest

    from dpbench.errors import UsageError

    plan_ = tune.plan(spec(tmp_path))
    storage = study_module._storage(spec(tmp_path).storage, 1)
    for name, stored in (("before-secret", {"dpbench_config": plan_.config}),
                         ("after-k", {"dpbench_config": plan_.config, "secret": secret_with_k(4), "study_id": "x",
                                      "k": 4, "heartbeat_interval": 1})):
        old = optuna.create_study(storage=storage, study_name=name, direction="maximize")
        for key, value in stored.items():
            old.set_user_attr(key, value)
        if "k" not in stored:
            with pytest.raises(UsageError, match="before it drew K"):
                tune._open(spec(tmp_path, name))
            continue
        old.enqueue_trial({})
        old.enqueue_trial({})
        _, _, _, study, _ = tune._open(spec(tmp_path, name))
        assert study.user_attrs["ready"] and study.user_attrs["k"] == 4
        assert trial_numbers(storage, study._study_id) == [0, 1, 2, 3]
        assert {t.state for t in study.get_trials()} == {optuna.trial.TrialState.WAITING}
