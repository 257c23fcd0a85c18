"""The leaderboard's validation track (dpbench/tuning/validation.py): every method tuned alike on held-out training data."""

import math
from collections import Counter

from dpbench import registry
from dpbench.results.identity import identity
from dpbench.run import multiseed
from dpbench.tuning import validation
from dpbench.tuning.accounting import ValidationSplit

METHODS, TASKS = registry.methods([]), registry.tasks([])


def test_search_spaces_add_the_tasks_shared_lists_by_kind_of_method():
    adult = TASKS["adult"]
    minibatch = validation.search_space(METHODS["dpsgd"], adult)
    assert minibatch["epochs"]["choices"] == adult.search_lists["epochs"]
    assert minibatch["batch_size"]["choices"] == adult.search_lists["batch_size"]
    assert minibatch["lr"]["log"] and minibatch["lr"]["high"] / minibatch["lr"]["low"] >= 1000  # ≥ 3 decades
    full = validation.search_space(METHODS["dpgd"], adult)
    assert full["epochs"]["choices"] == adult.search_lists["steps"] and "batch_size" not in full
    assert set(validation.search_space(METHODS["amp"], adult)) == {"noise_fraction", "out_fraction", "input_norm"}
    assert validation.search_space(METHODS["amp_nt"], adult) == {}  # hyperparameter-free: nothing to tune
    for name, method in METHODS.items():
        space = validation.search_space(method, adult)
        if "clip" in method.search_space:
            assert space["clip"]["low"] <= 0.1 and space["clip"]["high"] >= 10


def test_selection_reads_held_out_training_data_only_and_the_records_say_so(monkeypatch):
    seen = []
    real = multiseed.run_many

    def recording(specs, on_done=None):
        results = real(specs, on_done)
        seen.append((specs, results))
        return results

    monkeypatch.setattr(multiseed, "run_many", recording)
    settings = validation.TrackSettings(trials=4)
    records = validation.run_cell("digits", "dpsgd", 2.0, [0, 1], settings)
    (trial_specs, trials), (final_specs, finals) = seen
    assert len(trial_specs) == 4 * settings.trial_seeds == 8  # each configuration twice, with other seeds
    assert all(isinstance(s.validation, ValidationSplit) for s in trial_specs)
    assert len({s.seed for s in trial_specs}) == 8 and trial_specs[0].overrides == trial_specs[1].overrides
    assert all(s.validation.noise_multiplier == 0 and s.validation.purpose == "validation-split" for s in trial_specs)
    held = int(trial_specs[0].validation.mask(1437).sum())
    assert all(r["n_train"] == 1437 - held and r["epsilon"] <= 2.0 for r in trials)
    scores = [(trials[2 * i]["validation"]["accuracy"] + trials[2 * i + 1]["validation"]["accuracy"]) / 2
              for i in range(4)]  # the mean over a configuration's runs
    best = max(range(4), key=lambda i: (scores[i], -i))
    tuning = records[0]["tuning"]
    assert tuning["selected_params"] == trial_specs[2 * best].overrides and tuning["selected_score"] == scores[best]
    assert tuning["config"]["search"] == "sobol" and tuning["config"]["trial_seeds"] == 2
    assert tuning["mode"] == "validation" and tuning["private"] is False and "not charged" in tuning["selected_by"]
    assert [s.validation for s in final_specs] == [None, None] and [r["seed"] for r in records] == [0, 1]
    assert all(r["n_train"] == 1437 and r["hyperparameters"]["lr"] == selected for r, selected in
               zip(records, [tuning["selected_params"]["lr"]] * 2))
    # The sweep knows a cell is done from the identity its records have.
    assert validation.describe("digits", "dpsgd", 2.0, settings) == identity(records[0])


def test_refused_trials_count_and_never_win():
    """Output perturbation's convex bound refuses η > 2/β: such a trial is drawn, charged nothing, never selected."""
    records = validation.run_cell("breast_cancer", "output_perturbation", 1.0, [0], validation.TrackSettings(trials=8))
    selected = records[0]["tuning"]["selected_params"]
    if selected["variant"] == "convex":
        assert selected["lr"] <= 2 / (selected["input_norm"] ** 2 / 4)
    assert records[0]["tuning"]["config"]["trials"] == 8


def test_a_method_with_nothing_to_tune_runs_its_defaults():
    records = validation.run_cell("breast_cancer", "amp_nt", 1.0, [0], validation.TrackSettings(trials=16))
    assert records[0]["tuning"]["selected_params"] == {} and records[0]["tuning"]["config"]["trials"] == 0


def test_spread_draws_cover_the_space_evenly_and_reproducibly():
    from dpbench.tuning import search

    space = {"lr": {"type": "float", "low": 0.01, "high": 100.0, "log": True},
             "clip": {"type": "float", "low": 0.1, "high": 10.0, "log": True},
             "epochs": {"type": "categorical", "choices": [12, 25, 50]}}
    drawn = search.spread_draws(space, 16, 0, "validation-search")
    assert drawn == search.spread_draws(space, 16, 0, "validation-search") != search.spread_draws(space, 16, 1,
                                                                                                 "validation-search")
    decades = sorted(int(math.floor(math.log10(d["lr"]))) for d in drawn)
    assert decades == [-2] * 4 + [-1] * 4 + [0] * 4 + [1] * 4  # a Sobol sequence puts 4 of 16 in each quarter
    assert all(0.1 <= d["clip"] <= 10 for d in drawn) and {d["epochs"] for d in drawn} == {12, 25, 50}
    assert max(Counter(d["epochs"] for d in drawn).values()) - min(Counter(d["epochs"] for d in drawn).values()) <= 2
