"""What leaves a finished study: its best trial's record with only public tuning fields and the tuning's total ε,
appended to the results store and logged to W&B by the worker that released it."""
from __future__ import annotations

from typing import Any

import optuna

from dpbench.errors import TuningError
from dpbench.results import records, store, tracking
from dpbench.tuning.accounting import total_epsilon, trial_epsilon
from dpbench.tuning.plan import Plan
from dpbench.tuning.study import _release_once


def tuning_config(plan_: Plan) -> dict[str, Any]:
    """What decides a tuning's mechanism and search (public): a released record's ``tuning["config"]``, part of its
    identity (two records of one config are the same experiment with other tuning seeds). ``coins`` names where
    K and the trials' coins come from, so that records of the tuning that drew them from the public seed (their K
    recoverable from the record) never count as stored runs of this one."""
    spec, config = plan_.spec, plan_.config
    return {"mode": spec.mode, "coins": "study secret", "k_distribution": config.get("k_distribution"),
            "trials": None if spec.mode == "random-stopping" else int(spec.trials), "search_space": plan_.space,
            "sampler": config["sampler"], "validation_fraction": spec.validation_fraction,
            "split_seed": spec.split_seed, "overrides": spec.overrides, "neighbouring": spec.neighbouring}


#: Fields of the selected trial's record that are not released: they depend on the other trials (whether it trained
#: in one batch with them, ``clipping`` "multiseed", or alone after another was refused; how many; the batch's time
#: per run) or are the trial's own (its time stamp, hash, exact score).
TRIAL_ONLY_FIELDS = ("run_id", "created_at", "validation", "batched_seeds", "train_seconds", "clipping")

#: The keys of a released record's ``tuning``: nothing that depends on K or on the trials not selected.
PUBLIC_TUNING_FIELDS = frozenset({"config", "study_id",
    "mode", "sampler", "search_space", "selected_params", "study", "private", "selected_by", "trials",
    "note", "per_trial_epsilon", "selected_score", "accountant", "noise_multiplier", "sample_rate",
    "gradient_evaluations", "trial_mechanism", "neighbouring", "per_trial_delta", "per_trial_event", "validation",
    "k_distribution", "total_event"})


def released_record(plan_: Plan, study: optuna.Study) -> dict[str, Any]:
    """The selected trial's record with the tuning's totals (the only thing that leaves the study)."""
    spec, config = plan_.spec, plan_.config
    trials = study.get_trials(deepcopy=False)
    k = study.user_attrs["k"]
    if len(trials) != k or any(not t.state.is_finished() for t in trials):
        raise RuntimeError(f"study {study.study_name}: trials missing or not finished")  # K is never printed
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if k == 0:
        raise TuningError(f"study {study.study_name} drew K = 0 trials (Poisson): nothing trained, nothing released")
    if not complete:
        raise TuningError(f"every trial of study {study.study_name} failed: nothing released; the budget is spent")
    best = max(complete, key=lambda t: (t.value, -t.number))
    record = dict(best.user_attrs["record"])
    # Not released: the trial's own time stamps and score, and how it was trained with the other trials: trials run
    # as one batch (dpbench sweep, tune_together) record how many trained together (the sum of the studies' K) and
    # the batch's time per run (a function of it). TRIAL_ONLY_FIELDS.
    for key in TRIAL_ONLY_FIELDS:
        record.pop(key, None)
    record["train_seconds"] = None
    # Only what is public leaves the study: for random stopping, K and the other trials (how many ran or failed,
    # which one won, its seed) must stay hidden, or the release is best-of-k for a known k (PUBLIC_TUNING_FIELDS).
    tuning = {"mode": spec.mode, "sampler": config["sampler"], "search_space": plan_.space,
              "selected_params": best.params, "study": study.study_name, "study_id": study.user_attrs["study_id"],
              "config": tuning_config(plan_)}  # not the storage's address: where the secrets are is the owner's
    if spec.mode == "oracle":
        tuning.update({"private": False, "selected_by": "test accuracy (not private)", "trials": int(spec.trials),
                       "note": "tuning not private: trials were selected on the test set; epsilon covers one "
                               "trial's training only", "per_trial_epsilon": record["epsilon"]})
    else:
        distribution = config["k_distribution"]
        total = total_epsilon(spec.mode, plan_.trial, distribution, k, plan_.delta)
        if total > spec.epsilon * (1 + 1e-9):
            raise RuntimeError(f"total epsilon {total} exceeds the target {spec.epsilon}: calibration failed")
        tuning.update({"private": True, "selected_by": "noisy validation accuracy",
                       "selected_score": best.value, "accountant": "rdp",
                       "noise_multiplier": plan_.trial.noise_multiplier, "sample_rate": plan_.trial.sample_rate,
                       "gradient_evaluations": plan_.trial.releases, "trial_mechanism": plan_.trial.kind,
                       "neighbouring": plan_.trial.neighbouring,
                       "per_trial_epsilon": trial_epsilon(plan_.trial, plan_.delta), "per_trial_delta": plan_.delta,
                       "per_trial_event": plan_.trial.description(), "validation": plan_.validation})
        if spec.mode == "random-stopping":
            tuning["k_distribution"] = distribution
            tuning["total_event"] = "RepeatAndSelect(per_trial_event, k_distribution.mean, shape)"
        else:  # adaptive: the number of trials is the user's, public, and every trial is charged
            tuning["trials"] = int(spec.trials)
            tuning["total_event"] = "SelfComposed(per_trial_event, trials)"
        record.update({"epsilon": total, "accountant": "rdp", "neighbouring": plan_.trial.neighbouring})
    record.update({"seed": "secret" if spec.secret_seed else spec.seed, "epsilon_target": spec.epsilon,
                   "delta": plan_.delta if plan_.method.private else None, "tuning": tuning})
    if not set(tuning) <= PUBLIC_TUNING_FIELDS:
        raise RuntimeError(f"the released tuning record would carry {sorted(set(tuning) - PUBLIC_TUNING_FIELDS)}")
    return release_day(records.seal(record))


def release_day(record: dict[str, Any]) -> dict[str, Any]:
    """The record stamped with its release's day only (midnight UTC), resealed: the time of a release is the time
    its study took, a function of its K (and, in a sweep's job, of the other studies' K), which the gaps between
    records' times would give away."""
    record["created_at"] = record["created_at"][:10] + "T00:00:00+00:00"
    record["run_id"] = store.content_id(record)
    return record


def _release(plan_: Plan, url: str, study: optuna.Study, name: str) -> dict[str, Any]:
    spec = plan_.spec
    record, ours = _release_once(url, name, released_record(plan_, study))
    if ours:
        settings = tracking.wandb_settings(spec.wandb_project, spec.wandb_entity, spec.no_wandb)
        if settings:
            tracking.finish(tracking.start_run(settings, {k: v for k, v in record.items() if k != "metrics"}), record)
        if spec.append_to_store:
            store.append(record, spec.store_path)
    return record
