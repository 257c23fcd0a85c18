"""``dpbench tune``: the distribution of K, the accounting, the validation split and score, the study ledger, the
released record, oracle labelling and refusals. The two-worker PostgreSQL run is in ``test_tuning_postgres.py``."""
import itertools
import json
import math
import re
import textwrap
import time
import warnings

import dp_accounting
import optuna
import pytest
import torch
from dp_accounting import rdp

from dpbench.board import leaderboard
from dpbench.cli import main
from dpbench.privacy import streams
from dpbench.privacy.accounting import GaussianReleases
from dpbench.results import records, store
from dpbench.run import engine, planning
from dpbench.spec import RunSpec
from dpbench.trust import record_checks
from dpbench.tuning import search, tune
from dpbench.tuning import trials as trials_module
from dpbench.tuning.accounting import ValidationSplit, draw_k
from dpbench.tuning.plan import MAX_TRIALS
from dpbench.tuning.released import PUBLIC_TUNING_FIELDS
from dpbench.tuning.study import _storage, default_storage, open_study, redacted, study_secret
from dpbench.tuning.trials import _KeyedRandomSampler, _sampler, _trial_run_spec

FAST = ["--epochs", "2", "--trials", "3", "--no-wandb"]  # a few seconds per study on digits


def tune_json(capsys, *args):
    assert main(["tune", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ---- the held-out part of a trial -----------------------------------------------------------------------------

def test_a_trial_trains_on_the_training_part_only_and_is_not_stored():
    split = ValidationSplit(0.25, seed=1, noise_multiplier=1.0, trial=0)
    held = int(split.mask(1437).sum())
    record = engine.run(RunSpec(method="dpsgd", task="digits", noise_multiplier=5.0, overrides={"epochs": 1},
                                validation=split, append_to_store=False, no_wandb=True, progress_bar=False))
    assert record["n_train"] == 1437 - held and record["sample_rate"] == 64 / (1437 - held)
    assert set(record["validation"]) == {"noisy_accuracy"} and math.isfinite(record["validation"]["noisy_accuracy"])
    assert store.load() == []


# ---- studies -----------------------------------------------------------------------------------------------------

def study_of(record):
    """The study behind a released record, in the default storage (the record does not say where the storage is)."""
    return optuna.load_study(study_name=record["tuning"]["study"], storage=default_storage())


def reproduce_total(record):
    """The total from the record's fields alone, with dp-accounting's own event classes."""
    tuned = record["tuning"]
    once = dp_accounting.PoissonSampledDpEvent(tuned["sample_rate"],
                                               dp_accounting.GaussianDpEvent(tuned["noise_multiplier"]))
    trial = dp_accounting.SelfComposedDpEvent(once, tuned["gradient_evaluations"])
    if tuned["mode"] == "adaptive":
        event = dp_accounting.SelfComposedDpEvent(trial, tuned["trials"])
    else:
        k = tuned["k_distribution"]
        shape = math.inf if k["name"] == "poisson" else k["eta"]
        event = dp_accounting.dp_event.RepeatAndSelectDpEvent(trial, k["mean"], shape)
    return rdp.RdpAccountant().compose(event).get_epsilon(record["delta"])


def test_random_stopping_releases_one_trial_with_a_reproducible_total(capsys):
    record = tune_json(capsys, "--method", "dpsgd", "--task", "digits", "--epsilon", "1", *FAST)
    tuned = record["tuning"]
    assert record["epsilon"] <= 1.0 and reproduce_total(record) == pytest.approx(record["epsilon"], rel=0.01)
    assert record["delta"] == pytest.approx(1 / 1437**2) and record["accountant"] == "rdp"
    assert tuned["k_distribution"] == {"name": "truncated_negative_binomial", "eta": 0, "mean": 3.0}
    assert tuned["noise_multiplier"] == record["noise_multiplier"] and tuned["private"]
    study = study_of(record)
    trials = study.get_trials()
    assert len(trials) == study.user_attrs["k"] >= 1
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    best = max(trials, key=lambda t: (t.value, -t.number))
    assert tuned["selected_params"] == best.params and tuned["selected_score"] == best.value
    assert record["metrics"] == best.user_attrs["record"]["metrics"]
    assert set(tuned["selected_params"]) == {"lr", "clip", "momentum"}
    assert {k: record["hyperparameters"][k] for k in ("lr", "clip", "momentum")} == best.params
    # Only the released record is stored; running the command again returns it and adds nothing.
    assert [r["run_id"] for r in store.load()] == [record["run_id"]]
    assert tune_json(capsys, "--method", "dpsgd", "--task", "digits", "--epsilon", "1", *FAST) == record
    assert len(store.load()) == 1


def test_failed_trials_count_and_never_win(capsys, tmp_path, monkeypatch):
    # The study's coins are its secret: fixed here (to one whose six draws include lr > 1) so that some trials fail.
    monkeypatch.setattr(streams, "secret_seed", lambda: 2)
    (tmp_path / "fragile.py").write_text(textwrap.dedent("""
        from dpbench.methods.dpsgd import DPSGD

        class Fragile(DPSGD):
            name = "fragile"
            description = "DP-SGD that crashes when lr > 1 (test plugin)"

            def step(self, release):
                if self.hp["lr"] > 1:
                    raise RuntimeError("diverged")
                super().step(release)
    """))
    record = tune_json(capsys, "--plugins", str(tmp_path), "--method", "fragile", "--task", "digits", "--epsilon",
                       "1", "--mode", "adaptive", "--epochs", "1", "--trials", "6", "--seed", "2", "--no-wandb")
    trials = study_of(record).get_trials()
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(trials) == 6 and failed and all(t.params["lr"] > 1 for t in failed)
    assert record["tuning"]["trials"] == 6
    assert record["hyperparameters"]["lr"] <= 1
    assert reproduce_total(record) == pytest.approx(record["epsilon"], rel=0.01) and record["epsilon"] <= 1


def test_adaptive_composes_every_trial(capsys):
    record = tune_json(capsys, "--method", "adaclip", "--task", "digits", "--epsilon", "2", "--mode", "adaptive",
                       "--epochs", "1", "--trials", "2", "--search", "qmc", "--no-wandb")
    assert record["tuning"]["sampler"] == "qmc" and record["tuning"]["trials"] == 2
    assert reproduce_total(record) == pytest.approx(record["epsilon"], rel=0.01) and record["epsilon"] <= 2
    assert set(record["tuning"]["selected_params"]) == {"lr", "h1", "h2", "clip"}  # AdaCliP's search space


def test_oracle_selects_on_the_test_set_and_says_so_everywhere(capsys, tmp_path):
    record = tune_json(capsys, "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--mode", "oracle",
                       "--epochs", "2", "--trials", "3", "--no-wandb")
    trials = study_of(record).get_trials()
    assert len(trials) == 3 and record["tuning"]["private"] is False
    assert record["metrics"]["test_accuracy"] == max(t.value for t in trials)
    assert "tuning not private" in record["tuning"]["note"]
    assert record["epsilon"] == pytest.approx(1.0, rel=1e-3) and record["accountant"] == "pld"  # one trial's
    assert main(["run", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--epochs", "2"]) == 0
    capsys.readouterr()
    text = leaderboard.render(store.load(), "md")
    oracle, none = text.split("### oracle (tuning not private)")[1], text.split("### none")[1]
    assert "selected on the test set" in oracle and "| dpsgd | poisson | pld |" in oracle  # its own track
    assert "| dpsgd | poisson | pld |" in none.split("###")[0]
    assert "oracle (tuning not private)" in leaderboard.render(store.load(), "html")
    csv_text = leaderboard.render(store.load(), "csv")
    assert ",oracle,tuning not private," in csv_text and ",none,," in csv_text


@pytest.mark.parametrize("args, message", [
    (["--method", "amp", "--task", "adult"], "AMP's privacy is an (ε, δ) theorem"),
    (["--method", "nonprivate", "--task", "digits"], "only --mode oracle"),
    (["--method", "dpsgd", "--task", "digits", "--mode", "adaptive", "--trials", "2.5"], "whole number"),
    (["--method", "norm_bound", "--task", "digits", "--search-space", "{space}"], "clip cannot be tuned"),
    (["--method", "dpsgd", "--task", "digits", "--search", "qmc"], "needs i.i.d. trials"),
    (["--method", "dpsgd", "--task", "digits", "--mode", "oracle", "--search", "tpe"], "not allowed in mode oracle"),
])
def test_bad_requests_are_refused(refused, capsys, tmp_path, args, message):
    (tmp_path / "space.json").write_text(json.dumps({"clip": {"type": "float", "low": 0.1, "high": 1.0}}))
    args = [arg.replace("{space}", str(tmp_path / "space.json")) for arg in args]
    assert message in refused("tune", *args, "--epsilon", "1")


def test_batch_size_cannot_be_searched_in_private_modes(refused, tmp_path):
    (tmp_path / "space.json").write_text(json.dumps({"batch_size": {"type": "categorical", "choices": [64, 128]}}))
    assert "fixes each trial's mechanism" in refused("tune", "--method", "dpsgd", "--task", "digits", "--epsilon", "1",
                                                      "--search-space", str(tmp_path / "space.json"))


def test_a_study_is_not_reused_with_other_settings(refused, capsys):
    tune_json(capsys, "--method", "dpsgd", "--task", "digits", "--epsilon", "1", *FAST, "--study", "s")
    store.default_path().unlink()
    assert "other settings" in refused("tune", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--study",
                                       "s", "--epochs", "3", "--trials", "3")


def test_a_storage_url_in_an_error_message_has_no_password():
    assert redacted("postgresql://alice:s3cret@db:5432/x") == "postgresql://alice:***@db:5432/x"
    assert redacted("sqlite:////tmp/a.sqlite") == "sqlite:////tmp/a.sqlite"


def test_an_interrupted_trial_runs_again_when_the_study_resumes(capsys, monkeypatch):
    """An interrupt is not an outcome of the trial: it is put back, uncounted, and the resumed study runs it again,
    the same trial (its seed from the study's secret: dpbench.tuning.claims.put_back)."""
    real_run, calls = engine.run, []

    def interrupted_once(spec):
        calls.append(spec.seed)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run(spec)

    monkeypatch.setattr(engine, "run", interrupted_once)
    args = ["tune", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--mode", "adaptive", "--trials", "3",
            "--epochs", "1", "--heartbeat-interval", "1", "--no-wandb", "--json"]
    with pytest.raises(KeyboardInterrupt):
        main(args)
    capsys.readouterr()
    assert main(args) == 0  # the rerun runs the interrupted trial again, and the one left
    record = json.loads(capsys.readouterr().out)
    trials = study_of(record).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert [t.system_attrs.get("dpbench_deaths", 0) for t in trials] == [0, 0, 0]
    assert len(calls) == 4 and calls[2] == calls[1] and record["tuning"]["trials"] == 3


def test_only_the_released_record_reaches_wandb(capsys, monkeypatch):
    from dpbench.results import tracking

    logged, trial_loggers = [], []
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(tracking, "start_run", lambda settings, config: config)
    monkeypatch.setattr(tracking, "finish", lambda run, record: logged.append(record))
    monkeypatch.setattr(tracking, "make_logger", lambda *args: trial_loggers.append(args))
    assert main(["tune", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--epochs", "1", "--trials", "3",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert logged == [record] and trial_loggers == []


# ---- what the released record may say (privacy review, ledger version 2) ----------------------------------------

def test_the_release_reveals_neither_k_nor_the_other_trials(capsys):
    """Random stopping is private only while K and the trials not selected stay hidden: publishing K makes it
    best-of-k for a known k, which the reported ε does not cover. The record says K's distribution, never K."""
    record = tune_json(capsys, "--method", "dpsgd", "--task", "digits", "--epsilon", "1", *FAST, "--seed", "3")
    study = study_of(record)
    k = study.user_attrs["k"]
    tuned = record["tuning"]
    # nor where the study storage, which holds the secrets, lives (a hostile review, 27 November)
    hidden = {"trials_run", "trials_completed", "trials_failed", "selected_trial", "trial_seed", "k", "trials",
              "storage"}
    assert not hidden & set(tuned), hidden & set(tuned)
    assert set(tuned) <= PUBLIC_TUNING_FIELDS
    assert tuned["k_distribution"]["mean"] == 3.0 and record["seed"] == 3
    text = json.dumps(record)
    assert default_storage() not in text and default_storage().split("///", 1)[1] not in text  # under any key
    assert not [t.number for t in study.get_trials() if str(t.user_attrs["record"]["seed"]) in text]  # nor their seeds
    assert str(study_secret(study)) not in text and tuned["study_id"] == study.user_attrs["study_id"]
    assert k >= 1


def recomputed_draws(seed, record, count=MAX_TRIALS):
    """The hyperparameter draws of trials 0, 1, ... of a study whose coins come from ``seed`` (the attack)."""
    found = search.distributions(record["tuning"]["search_space"])
    study = optuna.create_study(direction="maximize")
    draws = []
    for number in range(count):
        study.sampler = _KeyedRandomSampler(seed, number, list(found))  # trial k's draws: its streams of the coins
        draws.append(study.ask(found).params)
    return draws


def test_the_release_carries_its_day_not_its_time(capsys):
    """A release's time is its study's duration, a function of K: only the day leaves the study."""
    record = tune_json(capsys, "--method", "dpsgd", "--task", "digits", "--epsilon", "1", *FAST)
    assert record["created_at"].endswith("T00:00:00+00:00") and record["train_seconds"] is None
    assert record["run_id"] == store.content_id(record)


def test_k_and_the_winner_cannot_be_recomputed_from_the_released_record(capsys):
    """The attack on the committed board (issue 31): K was draw_k(k_distribution, seed) and trial k's draw came from
    the seed's ``tuning-search`` stream at k, both public, so every random-stopping record gave away K and which
    trial won. Now they come from the study's secret (storage only): the same computation from the record finds
    neither, while from the secret it finds both (so the attack is the right one)."""
    record = tune_json(capsys, "--method", "dpsgd", "--task", "digits", "--epsilon", "1", *FAST, "--seed", "2")
    study, selected = study_of(record), record["tuning"]["selected_params"]
    secret, k = study_secret(study), study.user_attrs["k"]
    assert draw_k(record["tuning"]["k_distribution"], secret) == k
    from_secret = recomputed_draws(secret, record, k)
    assert selected in from_secret and from_secret == [t.params for t in study.get_trials()]
    assert selected not in recomputed_draws(record["seed"], record)


def test_every_study_draws_its_own_secret(tmp_path):
    """Two studies of the same public settings (other names) draw other secrets, K from each."""
    spec = tune.TuneSpec(method="dpsgd", task="digits", epsilon=1.0, trials=3, overrides={"epochs": 1})
    plan_ = tune.plan(spec)
    storage = _storage(f"sqlite:///{tmp_path / 'studies.sqlite'}", 10)
    studies = [open_study(plan_, storage, f"secret-{i}") for i in range(2)]
    assert len({study_secret(study) for study in studies}) == 2
    assert all(len(study.get_trials()) == study.user_attrs["k"] for study in studies)


def test_a_secret_seed_study_writes_its_seed_nowhere_but_in_its_storage(capsys, isolated_home):
    """``dpbench tune --secret-seed``: the split's seed too from the OS's entropy; the record says "secret", and the
    seed and the study's secret are in the study storage only. A worker joining the study takes its seed."""
    args = ["--method", "dpsgd", "--task", "digits", "--epsilon", "1", *FAST, "--secret-seed"]
    record = tune_json(capsys, *args)
    study = study_of(record)
    seed, secret = study.user_attrs["dpbench_config"]["seed"], study_secret(study)
    assert record["seed"] == "secret" and record["tuning"]["validation"]["seed"] == "secret"
    assert record["tuning"]["config"]["split_seed"] is None
    for path in isolated_home.rglob("*"):
        if path.is_file() and not path.name.startswith("tuning.sqlite"):
            assert str(seed).encode() not in path.read_bytes() and str(secret).encode() not in path.read_bytes(), path
    assert tune_json(capsys, *args, "--study", record["tuning"]["study"]) == record
    assert tune_json(capsys, *args)["tuning"]["study"] != record["tuning"]["study"]  # a new study by default


# ---- the independence of a study's trials (Papernot & Steinke: K i.i.d. runs of one mechanism) -------------------

class _Constant(torch.nn.Module):
    """Predicts wrong on everything: a score is then its noise alone."""

    def forward(self, x):
        return x

    def per_example_metrics(self, outputs, y):
        return {"accuracy": torch.zeros(len(y))}


def trial_coins(plan_, secret, number):
    """What trial ``number`` of a study with this secret draws, each from the code that draws it for the trial: its
    run seed, its hyperparameters, its first Poisson batch, and the noise on its validation score."""
    study = optuna.create_study(direction="maximize", sampler=_sampler(plan_, secret, number))
    params = study.ask(plan_.distributions).params
    spec = _trial_run_spec(plan_, params, number, secret)
    (batch,) = next(iter(planning.plan(spec, calibrate=False).sampler))  # one release per step
    fraction, n = spec.validation.fraction, 1000
    score = spec.validation.score(_Constant(), (torch.zeros(4, 1), torch.zeros(4), n))["noisy_accuracy"]
    return {"run seed": spec.seed, "search draw": tuple(sorted(params.items())),
            "batches": tuple(batch.tolist()),
            "score noise": score * fraction * n / spec.validation.noise_multiplier}


def shared_coins(coins):
    """The coins that two trials share (none, for independent trials)."""
    return {key for a, b in itertools.combinations(coins, 2) for key in a if a[key] == b[key]}


@pytest.fixture(scope="module")
def random_stopping_plan():
    return tune.plan(tune.TuneSpec(method="dpsgd", task="digits", epsilon=1.0, trials=3,
                                       overrides={"epochs": 1}))


def test_trials_draw_independent_seeds_hyperparameters_batches_and_score_noise(random_stopping_plan):
    """Every coin of a trial comes from the study's secret at the trial's number: no two trials of a study, nor
    trial 0 of two studies, share one."""
    coins = [trial_coins(random_stopping_plan, 7, number) for number in range(4)]
    coins.append(trial_coins(random_stopping_plan, 8, 0))
    assert shared_coins(coins) == set()


@pytest.mark.parametrize("coin", ["run seed", "search draw", "batches", "score noise"])
def test_the_independence_check_fails_on_trials_sharing_one_coin(random_stopping_plan, coin):
    """The check above, given trials that are independent but for one coin (trial 1 given trial 0's), fails on
    exactly that coin."""
    coins = [trial_coins(random_stopping_plan, 7, number) for number in range(3)]
    coins[1] = {**coins[1], coin: coins[0][coin]}
    assert shared_coins(coins) == {coin}


def test_studies_tuned_together_release_nothing_of_their_batch(monkeypatch):
    """The leaderboard tunes a cell's five tuning seeds together (tune_together), their trials trained as one batch:
    the selected trial's record said how many trials trained with it (the sum of the studies' K), the batch's
    time per run, and whether it trained in the batch at all (``clipping``: "multiseed", or the engine's path when
    another trial's refusal sent them one by one). The release keeps none of them; it equals the release of the study tuned alone (with the same study
    secret), but for that."""
    secrets = iter([11, 12, 13, 11])  # the studies' secrets, in the order they are created
    monkeypatch.setattr(streams, "secret_seed", lambda: next(secrets))

    def specs(seeds):
        return [tune.TuneSpec(method="dpsgd", task="digits", epsilon=1.0, trials=3, seed=seed, split_seed=0,
                                overrides={"epochs": 2}, study=f"together-{seeds}-{seed}", no_wandb=True)
                for seed in seeds]

    together = tune.tune_together(specs((0, 1, 2)))
    ks = [study_of(record).user_attrs["k"] for record in together]
    assert sum(ks) > 1
    for record in together:
        assert "batched_seeds" not in record and "clipping" not in record and record["train_seconds"] is None
    [alone] = tune.tune_together(specs((0,)))
    differs = {key for key in alone if key not in ("run_id", "created_at", "tuning") and alone[key] != together[0][key]}
    assert not differs or differs <= {"metrics"}, differs  # float rounding of a batch of another size at most


def test_a_count_methods_trials_draw_the_combined_noise_the_tuning_charges(capsys, monkeypatch):
    """quantile_clip tuned by random stopping: every trial's gradient σ and count σ_b make the Gaussian of
    tuning.noise_multiplier (Andrew et al. 2021, Theorem 1); the gradient alone drawing the tuning's σ, with the count
    on top (less noise than charged), fails every trial."""
    record = tune_json(capsys, "--method", "quantile_clip", "--task", "digits", "--epsilon", "1", *FAST)
    z = record["tuning"]["noise_multiplier"]
    trial_records = [t.user_attrs["record"] for t in study_of(record).get_trials()]
    assert trial_records and all(planning.charged_noise_multiplier(r) >= z and r["noise_multiplier"] > z * 1.001
                                 for r in trial_records)
    assert record["epsilon"] <= 1.0 and reproduce_total(record) == pytest.approx(record["epsilon"], rel=0.01)

    def gradient_at_z(*args):
        spec = _trial_run_spec(*args)
        spec.noise_is_combined = False
        return spec

    monkeypatch.setattr(trials_module, "_trial_run_spec", gradient_at_z)
    assert main(["tune", "--method", "quantile_clip", "--task", "digits", "--epsilon", "1", *FAST,
                 "--study", "charged-less"]) != 0
    err = capsys.readouterr().err
    assert "every trial" in err and "trial 0" not in err  # random stopping: no line per trial (each bounds K)
    failed = optuna.load_study(study_name="charged-less", storage=default_storage()).get_trials()
    assert failed and all("ran at noise multiplier" in t.user_attrs["error"] for t in failed)


@pytest.mark.parametrize("method", ["bandmf", "dpftrl"])
def test_correlated_noise_is_tuned_with_its_own_mechanism(capsys, method):
    """bandmf (banded noise) and dpftrl (tree aggregation) tuned by random stopping: every trial runs the cyclic
    sampler's correlated noise, and the total is dp-accounting's RepeatAndSelect of that mechanism (replace-one:
    sensitivity 2, under REPLACE_SPECIAL), computed here from the paper's coefficients, not dpbench's."""
    record = tune_json(capsys, "--method", method, "--task", "digits", "--epsilon", "1", *FAST, "--neighbouring",
                       "replace-one")
    tuned, trials = record["tuning"], [t.user_attrs["record"] for t in study_of(record).get_trials()]
    epochs, batches = record["hyperparameters"]["epochs"], record["n_train"] // record["hyperparameters"]["batch_size"]
    assert trials and all(r["sampler"] == "cyclic" and r["noise_multiplier"] == tuned["noise_multiplier"]
                          and r["noise_correlation"] == record["noise_correlation"] for r in trials + [record])
    sigma = tuned["noise_multiplier"]
    if method == "bandmf":
        bands = record["hyperparameters"]["bands"]
        column = math.sqrt(sum((math.comb(2 * j, j) / 4**j) ** 2 for j in range(bands)))  # (1 − x)^(−1/2), b terms
        trial = dp_accounting.GaussianDpEvent(sigma / (2 * math.sqrt(epochs) * column))  # sensitivity 2√k‖c‖
    else:
        trial = dp_accounting.SelfComposedDpEvent(dp_accounting.SingleEpochTreeAggregationDpEvent(sigma / 2, batches),
                                                  epochs)
    k = tuned["k_distribution"]
    event = dp_accounting.dp_event.RepeatAndSelectDpEvent(trial, k["mean"], k["eta"])
    total = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL).compose(
        event).get_epsilon(record["delta"])
    assert record["epsilon"] == pytest.approx(total, rel=1e-6) and record["epsilon"] <= 1.0
    assert record_checks.check(record) == []
    # Charged as Poisson-subsampled independent noise (amplified: less ε), the rest consistent: verify refuses it.
    poisson = {key: value for key, value in record.items() if key != "noise_correlation"}
    poisson["sampler"] = "poisson"
    [problem] = record_checks.check(records.seal(poisson))
    assert f"{method} with its hyperparameters adds correlated noise" in problem, problem


def test_a_trial_whose_correlation_is_not_the_tunings_fails_before_training(capsys, tmp_path, monkeypatch):
    """Review of 27 November: a plugin's correlation that changes inside a searched range passes the plan (which
    checks the ends); such a trial trained, then failed. It now fails before it touches the data."""
    (tmp_path / "wobble.py").write_text(textwrap.dedent("""
        from dpbench.privacy.correlated import banded
        from methods.bandmf import BandMF

        class Wobble(BandMF):
            name = "wobble"
            description = "bandmf with 8 bands for 0.01 < lr < 1, else 4 (test plugin)"
            search_space = {"lr": {"type": "float", "low": 0.0005, "high": 5.0, "log": True}}

            @classmethod
            def correlation(cls, hp):
                return banded(8 if 0.01 < hp["lr"] < 1 else 4)
    """))
    monkeypatch.setattr(streams, "secret_seed", lambda: 2)  # the study's coins: fixed, so that some lr fall inside
    trained = []

    def spy(spec, *args, **kwargs):  # what reaches the engine: refused here, so nothing trains in this test
        trained.append(spec)
        raise RuntimeError("the spy does not train")

    monkeypatch.setattr(engine, "run", spy)
    monkeypatch.setattr(trials_module.multiseed, "run_many", lambda specs, **k: [engine.run(s) for s in specs])
    assert main(["tune", "--plugins", str(tmp_path), "--method", "wobble", "--task", "digits", "--epsilon", "1",
                 "--mode", "adaptive", "--trials", "8", "--epochs", "1", "--neighbouring", "replace-one",
                 "--no-wandb", "--study", "wobble"]) != 0
    err = capsys.readouterr().err
    failed = optuna.load_study(study_name="wobble", storage=default_storage()).get_trials()
    middle = [t for t in failed if 0.01 < t.params["lr"] < 1]
    assert middle and all("its hyperparameters give the noise correlation Banded(bands=8" in t.user_attrs["error"]
                          for t in middle), err
    assert len(trained) == len(failed) - len(middle) > 0  # the others reached the engine (refused by the spy)


def test_correlated_noise_tuning_refuses_what_would_change_the_trials_mechanism(refused, tmp_path):
    args = ["--task", "digits", "--epsilon", "1", "--epochs", "2", "--trials", "2", "--no-wandb"]
    assert "replace-one" in refused("tune", "--method", "dpftrl", *args)
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"bands": {"type": "int", "low": 2, "high": 8},
                                 "lr": {"type": "float", "low": 0.001, "high": 1.0}}))
    message = refused("tune", "--method", "bandmf", *args, "--neighbouring", "replace-one", "--search-space",
                      str(space))
    assert "bands cannot be searched in a private mode" in message


def test_random_stopping_shows_a_trials_warning_once_not_once_per_trial(capsys, monkeypatch):
    """Review of 27 November: each run's warning filters reset Python's once-per-place registry, so a warning of
    every run (here the PyTorch sampler's, without ``_philox``) printed K lines; K is hidden."""
    from dpbench.privacy import noise

    monkeypatch.setattr(noise, "fill_normal", None)
    monkeypatch.setattr(trials_module, "_SHOWN", set())
    monkeypatch.setattr(streams, "secret_seed", lambda: 5)  # a study whose K is at least 2 (checked below)
    with warnings.catch_warnings(record=True) as shown:  # what a terminal would print (pytest records warnings)
        warnings.simplefilter("default")  # Python's own: once per place
        assert main(["tune", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--epochs", "1", "--trials",
                     "4", "--no-wandb", "--json"]) == 0
    assert study_of(json.loads(capsys.readouterr().out)).user_attrs["k"] >= 2
    assert sum("_philox is not built" in str(w.message) for w in shown) == 1, [str(w.message) for w in shown]


def test_a_release_waits_for_another_workers_write_lock(tmp_path):
    """The rebuild's sweep died at 13:00 on 27 November: a release's insert gave up on SQLite's write lock after its
    default 5 s ("database is locked") while the other worker wrote; it waits 60 s, as the study storage does."""
    import sqlite3
    import threading

    from dpbench.tuning import study as study_module

    path = tmp_path / "studies.db"
    study_module._storage(f"sqlite:///{path}", 60)  # the tables
    holder = sqlite3.connect(path, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another worker's write, held for 7 s
    threading.Timer(7, holder.rollback).start()
    started = time.monotonic()
    assert study_module._release_once(f"sqlite:///{path}", "s", {"a": 1}) == ({"a": 1}, True)
    assert time.monotonic() - started >= 6


def test_trials_sample_as_the_tuning_accountant_assumes_whatever_the_methods_sampler(capsys, tmp_path):
    """A method whose default sampler is shuffle was tuned under the Poisson accountant (one trial alone cost
    ε ≈ 9.8 under shuffle accounting for a total reported as 1). Trials now always sample Poisson batches."""
    (tmp_path / "shuffled.py").write_text(textwrap.dedent("""
        from dpbench.methods.dpsgd import DPSGD

        class Shuffled(DPSGD):
            name = "shuffled_dpsgd"
            description = "DP-SGD whose default sampler is shuffle (test plugin)"
            default_sampler = "shuffle"
    """))
    record = tune_json(capsys, "--plugins", str(tmp_path), "--method", "shuffled_dpsgd", "--task", "digits",
                       "--epsilon", "1", *FAST)
    trial_records = [t.user_attrs["record"] for t in study_of(record).get_trials()]
    assert trial_records and all(r["sampler"] == "poisson" and r["neighbouring"] == "add-remove"
                                 for r in trial_records)
    assert record["sampler"] == "poisson" and record["epsilon"] <= 1.0
    per_trial = GaussianReleases(record["tuning"]["sample_rate"], record["tuning"]["noise_multiplier"],
                                 record["tuning"]["gradient_evaluations"]).epsilon(record["delta"], "rdp")
    assert per_trial == pytest.approx(record["tuning"]["per_trial_epsilon"], rel=1e-9)


def test_a_study_whose_every_trial_failed_does_not_say_how_many_ran(capsys, tmp_path):
    """A failure can depend on the data (divergence): the refusal of a random-stopping study whose trials all failed
    says that they did, never K (the review's finding 8)."""
    (tmp_path / "broken.py").write_text(textwrap.dedent("""
        from dpbench.methods.dpsgd import DPSGD

        class Broken(DPSGD):
            name = "broken"
            description = "DP-SGD that always crashes (test plugin)"

            def step(self, release):
                raise RuntimeError("diverged")
    """))
    code = main(["tune", "--plugins", str(tmp_path), "--method", "broken", "--task", "digits", "--epsilon", "1",
                 "--epochs", "1", "--trials", "3", "--seed", "4", "--no-wandb"])
    err = capsys.readouterr().err
    name = "digits-broken-random-stopping-eps1-seed4"
    k = optuna.load_study(study_name=name, storage=default_storage()).user_attrs["k"]
    assert code == 1 and "failed" in err and k >= 1
    assert not re.search(rf"\b{k}\b", err.replace(name, "")), err
