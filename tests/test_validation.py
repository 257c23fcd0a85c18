"""The leaderboard's validation track (dpbench/validation.py): every method tuned alike on held-out training data."""

from dpbench import engine, multiseed, registry, validation
from dpbench.tuning_privacy import ValidationSplit

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
    assert len(trial_specs) == 4 and all(isinstance(s.validation, ValidationSplit) for s in trial_specs)
    assert all(s.validation.noise_multiplier == 0 and s.validation.purpose == "validation-split" for s in trial_specs)
    held = int(trial_specs[0].validation.mask(1437).sum())
    assert all(r["n_train"] == 1437 - held and r["epsilon"] <= 2.0 for r in trials)
    scores = [r["validation"]["accuracy"] for r in trials]
    best = max(range(4), key=lambda i: (scores[i], -i))
    tuning = records[0]["tuning"]
    assert tuning["selected_params"] == trial_specs[best].overrides and tuning["selected_score"] == scores[best]
    assert tuning["mode"] == "validation" and tuning["private"] is False and "not charged" in tuning["selected_by"]
    assert [s.validation for s in final_specs] == [None, None] and [r["seed"] for r in records] == [0, 1]
    assert all(r["n_train"] == 1437 and r["hyperparameters"]["lr"] == selected for r, selected in
               zip(records, [tuning["selected_params"]["lr"]] * 2))
    # The sweep knows a cell is done from the identity its records have.
    assert validation.describe("digits", "dpsgd", 2.0, settings) == engine.identity(records[0])


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
