"""A study's trials: each one's run (seed, hyperparameter draw and score noise from the study's secret), trained
alone or in a batch with other studies' trials, checked against the mechanism the tuning charges, and told to the
study as COMPLETE or FAIL (it counts either way); a trial whose worker died runs again, the same trial."""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
from typing import Any

import optuna

from dpbench.errors import UsageError
from dpbench.privacy import correlated, streams
from dpbench.run import engine, multiseed, planning
from dpbench.spec import RunSpec, resolve_hyperparameters
from dpbench.tuning import search
from dpbench.tuning.accounting import ValidationSplit
from dpbench.tuning.plan import Plan
from dpbench.tuning.claims import _claim, _Heartbeat, forget, holds, put_back, requeue_stale
from dpbench.tuning.study import study_secret


class _KeyedRandomSampler(optuna.samplers.RandomSampler):
    """Random search with each hyperparameter drawn from its own stream: ``tuning-search`` of the study's secret at
    the trial's number and the parameter's place among the sorted names. A trial run again after its worker died
    between two draws draws the rest as it would have; Optuna keeps the ones already drawn and does not ask again."""

    def __init__(self, secret: int, number: int, names: list[str]):
        super().__init__()
        self._seeds = {name: streams.derive(secret, "tuning-search", number, place) % 2**32
                       for place, name in enumerate(sorted(names))}

    def sample_independent(self, study, trial, param_name, param_distribution):
        self._rng = type(self._rng)(self._seeds[param_name])
        return super().sample_independent(study, trial, param_name, param_distribution)


def _sampler(plan_: Plan, secret: int, trial_number: int) -> optuna.samplers.BaseSampler:
    """Trial k's sampler, on the ``tuning-search`` stream of the study's secret at k, so that workers do not repeat
    each other's draws (QMC: one scrambled sequence for the whole study, indexed by Optuna across workers)."""
    seed = streams.derive(secret, "tuning-search", trial_number) % 2**32
    if plan_.config["sampler"] == "qmc":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(scramble=True, seed=streams.derive(secret, "tuning-search") % 2**32,
                                              warn_independent_sampling=False,
                                              warn_asynchronous_seeding=False)
    if plan_.config["sampler"] == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return _KeyedRandomSampler(secret, trial_number, list(plan_.distributions))


def _trial_run_spec(plan_: Plan, params: dict[str, Any], number: int, secret: int) -> RunSpec:
    """Trial ``number``'s run: its seed from the ``tuning-trial`` stream of the study's secret, its score noise from
    its ``score-noise`` stream, both at ``number``; in the private modes Poisson sampling (what the per-trial event
    assumes, whatever the method's default sampler; the cyclic sampler for correlated noise) at the planned σ (a
    count release's pair combined, as the trial's Gaussian charges it), on the split of the study's public split seed."""
    spec = plan_.spec
    common = dict(method=spec.method, task=spec.task, delta=plan_.delta,
                  seed=streams.child_seed(secret, "tuning-trial", number),
                  overrides={**spec.overrides, **params}, plugins=spec.plugins, progress_bar=False, no_wandb=True,
                  append_to_store=False)
    if spec.mode == "oracle":
        return RunSpec(epsilon=spec.epsilon if plan_.method.private else None, **common)
    validation = ValidationSplit(plan_.validation["fraction"], secret, plan_.validation["noise_multiplier"], number,
                                 split_seed=spec.seed if spec.split_seed is None else spec.split_seed)
    if plan_.trial.kind == "output":
        return RunSpec(noise_multiplier=plan_.trial.noise_multiplier, neighbouring="replace-one",
                       validation=validation, **common)
    return RunSpec(noise_multiplier=plan_.trial.noise_multiplier, noise_is_combined=True, sampler=plan_.trial.sampler,
                   accountant="rdp" if plan_.trial.tree else "pld", neighbouring=spec.neighbouring,
                   validation=validation, **common)


#: The warnings a random-stopping trial raised that this process has shown: (category, message).
_SHOWN: set[tuple[type, str]] = set()


@contextlib.contextmanager
def _warnings_once(hidden: bool):
    """Where K is hidden (``hidden``: random stopping), the warnings of the trials run inside are shown once per
    process, not once per trial: ``engine.run`` sets its own warning filters, which clears Python's once-per-place
    registry, so a warning of every run (e.g. the PyTorch sampler's when ``_philox`` is not built) printed one line per
    trial, counting them (review of 27 November)."""
    if not hidden:
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        yield
    for found in caught:
        if (found.category, str(found.message)) not in _SHOWN:
            _SHOWN.add((found.category, str(found.message)))
            warnings.showwarning(found.message, found.category, found.filename, found.lineno)


def _check_correlation(plan_: Plan, params: dict[str, Any]) -> None:
    """RuntimeError (the trial fails, and counts) where the trial's hyperparameters give the method another noise
    correlation than the one the tuning charges, before it touches the data: the plan checks only the ends of each
    searched range (``plan._fixed_correlation``), and a plugin's correlation may change inside one."""
    trial = plan_.trial
    if trial is None or trial.kind != "gradient":
        return
    hp, _ = resolve_hyperparameters(plan_.method, plan_.task, {**plan_.spec.overrides, **params})
    found = plan_.method.correlation(hp)
    if planning.correlated_fields(found) != (trial.bands, trial.tree):
        raise RuntimeError(f"its hyperparameters give the noise correlation {found!r}; the tuning charges "
                           f"{'tree aggregation' if trial.tree else f'{trial.bands} bands' if trial.bands else 'none'}")


def _check_trial(plan_: Plan, number: int, record: dict[str, Any]) -> None:
    """Refuse a trial whose record is not the mechanism the tuning's total charges."""
    trial = plan_.trial
    if trial is None:
        return
    if trial.kind == "output":  # the record's σ is noise std / sensitivity: equal to rounding
        ran = (round(record["noise_multiplier"] / trial.noise_multiplier, 9), record["neighbouring"])
        planned = (1.0, "replace-one")
    else:
        charged = planning.charged_noise_multiplier(record)  # with a count release: the pair's, at most ulps above
        if not trial.noise_multiplier <= charged <= trial.noise_multiplier * (1 + 1e-12):
            raise RuntimeError(f"trial {number} ran at noise multiplier {charged!r} (gradient and extra releases "
                               f"combined); the tuning charges {trial.noise_multiplier!r}")
        found = record.get("noise_correlation") or {}
        ran = (record["sampler"], record["sample_rate"], record["gradient_evaluations"], record["neighbouring"],
               found.get("kind"), found.get("bands"), found.get("min_separation", found.get("steps_per_tree")))
        planned = (trial.sampler, trial.sample_rate, trial.releases, trial.neighbouring,
                   "tree" if trial.tree else "banded" if trial.bands else None, trial.bands or None,
                   trial.releases_per_epoch if trial.sampler == correlated.SAMPLER else None)
    if ran != planned:
        raise RuntimeError(f"trial {number} ran {ran}; the tuning charges {planned}")


def _begin(plan_: Plan, study: optuna.Study, trial_id: int, number: int):
    """A claimed trial's optuna handle and hyperparameters (drawn by its own sampler)."""
    study.sampler = _sampler(plan_, study_secret(study), number)
    trial = optuna.Trial(study, trial_id)
    trial.set_user_attr("worker", f"{os.uname().nodename}:{os.getpid()}")
    return trial, search.suggest(trial, plan_.distributions)


def _finish(plan_: Plan, study: optuna.Study, trial: optuna.Trial, number: int, record: dict[str, Any] | None,
            error: BaseException | None = None) -> None:
    """Tell the study a trial's outcome: COMPLETE with its score, or FAIL (it counts either way; its error is in the
    trial's ``error`` attribute in the study storage, and on stderr unless K is hidden). A trial put back
    meanwhile (its heartbeat was late: :func:`dpbench.tuning.claims.requeue_stale`) and claimed again is left to that
    run (:func:`dpbench.tuning.claims.holds`); between that check and the tell, a late run's tell can still win: the
    same trial, the same coins."""
    if not holds(study._storage, trial._trial_id):
        return  # put back and claimed again by another run: that run tells it
    state, value = optuna.trial.TrialState.FAIL, None
    try:
        if error is not None:
            raise error
        if record is None:
            raise UsageError("the engine refused the trial's settings")
        _check_trial(plan_, number, record)
        trial.set_user_attr("record", record)
        value = (record["validation"]["noisy_accuracy"] if plan_.trial is not None
                 else record["metrics"]["test_accuracy"])
        state = optuna.trial.TrialState.COMPLETE if math.isfinite(value) else optuna.trial.TrialState.FAIL
    except optuna.exceptions.UpdateFinishedTrialError:
        return  # told by the run that ran it again: that is its outcome
    except Exception as failure:  # the trial failed: it counts, and the next one runs
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            trial.set_user_attr("error", f"{type(failure).__name__}: {failure}")
        if plan_.spec.mode != "random-stopping":  # there K is hidden, and each line would bound it from below
            print(f"dpbench: trial {number} failed (it still counts): {type(failure).__name__}: {failure}",
                  file=sys.stderr)
    # Not telling: a finished trial (the other run told it), or one put back to WAITING (it runs again).
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError, ValueError):
        study.tell(trial, value if state == optuna.trial.TrialState.COMPLETE else None, state=state)
    if study._storage.get_trial(trial._trial_id).state.is_finished():
        forget(study._storage, trial._trial_id)  # nothing of it to put back


def _run_trial(plan_: Plan, study: optuna.Study, storage: optuna.storages.RDBStorage,
               claimed: tuple[int, int]) -> None:
    """Sample, train and score one claimed trial and tell the study (while its heartbeat beats); any failure is told
    as FAIL (it counts); an interrupt puts it back (:func:`dpbench.tuning.claims.put_back`)."""
    trial_id, number = claimed
    with _Heartbeat(storage, trial_id, plan_.spec.heartbeat_interval):
        if storage.get_trial(trial_id).state != optuna.trial.TrialState.RUNNING:
            return  # put back (or failed) before it started: it never touched the data here
        trial, record, error = None, None, None
        try:
            trial, params = _begin(plan_, study, trial_id, number)
            _check_correlation(plan_, params)
            with _warnings_once(plan_.spec.mode == "random-stopping"):
                record = engine.run(_trial_run_spec(plan_, params, number, study_secret(study)))
        except Exception as failure:
            error = failure
        except BaseException:  # interrupted (Ctrl-C, exit): not an outcome of the trial; it runs again
            put_back(storage, [trial_id])
            raise
        if trial is not None:
            _finish(plan_, study, trial, number, record, error)


def _run_together(claimed: list[tuple[Plan, optuna.Study, tuple[int, int]]],
                  storage: optuna.storages.RDBStorage) -> None:
    """Claimed trials of studies that share a per-trial mechanism, trained as one batch where
    :mod:`dpbench.run.multiseed` applies (each trial keeps its own seed, hyperparameters, noise and score), else one
    by one; each trial is told its own outcome, as :func:`_run_trial` would."""
    ids = [trial_id for _, _, (trial_id, _) in claimed]
    interval = min(plan_.spec.heartbeat_interval for plan_, _, _ in claimed)
    with _Heartbeat(storage, ids, interval):
        try:
            begun = []
            for plan_, study, (trial_id, number) in claimed:
                trial, params = _begin(plan_, study, trial_id, number)
                begun.append((plan_, study, trial, number, params))
            early: dict[int, Exception] = {}  # trials that fail before touching the data
            for index, (plan_, _, _, _, params) in enumerate(begun):
                try:
                    _check_correlation(plan_, params)
                except Exception as error:
                    early[index] = error
            specs = [_trial_run_spec(plan_, params, number, study_secret(study))
                     for index, (plan_, study, _, number, params) in enumerate(begun) if index not in early]
            with _warnings_once(any(plan_.spec.mode == "random-stopping" for plan_, _, _ in claimed)):
                try:
                    refused: dict[int, UsageError] = {}
                    ran = [(record, refused.get(index)) for index, record in
                           enumerate(multiseed.run_many(specs, refusals=refused))]
                except Exception:  # one trial's failure must not fail the others: run them one by one
                    ran = []
                    for spec in specs:
                        try:
                            ran.append((engine.run(spec), None))
                        except Exception as error:
                            ran.append((None, error))
            ran.reverse()
            outcomes = [(None, early[index]) if index in early else ran.pop() for index in range(len(begun))]
        except BaseException as stop:
            if not isinstance(stop, Exception):  # interrupted: not an outcome of the trials; they run again
                put_back(storage, ids)
            raise
        for (plan_, study, trial, number, _), (record, error) in zip(begun, outcomes):
            _finish(plan_, study, trial, number, record, error)


def work(plan_: Plan, study: optuna.Study, storage: optuna.storages.RDBStorage) -> None:
    """Run trials until none is left to claim and none runs elsewhere; a trial whose worker died is run again
    (:func:`dpbench.tuning.claims.requeue_stale`)."""
    while True:
        requeue_stale(study, storage)
        if (claimed := _claim(study, storage)) is not None:
            _run_trial(plan_, study, storage, claimed)
            continue
        if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,
                                                        optuna.trial.TrialState.WAITING)):
            return
        time.sleep(min(plan_.spec.heartbeat_interval, 2))
