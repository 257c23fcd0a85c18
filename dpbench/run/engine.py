"""The engine: trains a planned run (:mod:`dpbench.run.planning`: the spec resolved, the data loaded, σ calibrated)
under a Lightning ``Trainer``, charges what it drew and writes the record.

Privacy boundary: only :class:`~dpbench.run.training.PrivateTraining` touches training data. Per step it draws the
method's batches from the sampler, charges every drawn batch to the ledger, and hands the method a ``release`` callable
that returns the noisy clipped gradient of the next batch. The ε in the record is computed after training from the
number of batches actually drawn, with the same accountant the noise was calibrated with.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
from typing import Any, Callable

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader

from dpbench.data import rows, stages
from dpbench.errors import UsageError
from dpbench.method import ReleaseMethod
from dpbench.privacy import guards
from dpbench.privacy.accounting import epsilon_log
from dpbench.privacy.sampling import IndexedTensors
from dpbench.release import runner
from dpbench.results import records, store, tracking
from dpbench.run import distributed, refusals
from dpbench.run.planning import PlannedRun, over_target, plan, registered
from dpbench.run.training import PrivateTraining, ProgressLines
from dpbench.spec import RunSpec
from dpbench.task import Task, TaskData

# Lightning's informational lines ("GPU available: False, used: False", "TPU available", "💡 Tip: ... litlogger")
# are for its own users, not dpbench's; its warnings stay. Set here, after Lightning's import has set INFO.
logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)


def finish(planned: PlannedRun, module: PrivateTraining, train_seconds: float, wandb_run=None,
           checkpoints=None) -> dict[str, Any]:
    """Charge what ``module`` drew, complete and seal the record, close its W&B run, keep it beside the run's
    ``checkpoints`` (a ``dpbench.run.checkpoint.Checkpoints``) and store it; returns the record."""
    spec, record = planned.spec, planned.record
    try:
        spent = None
        if planned.method.private:
            guards.check_sampling(record["sampler"], record["sample_rate"], planned.data.n_train, module.releases,
                                  module.sampled)
            module.check_correlated_draws()
            spent = planned.releases_charged(module.releases).epsilon(planned.delta, spec.accountant)
            target = record["epsilon_target"]
            if target is not None and over_target(spent, target):
                raise guards.PrivacyCheckFailed(f"spent epsilon {spent} exceeds the target {target}: "
                                                f"calibration failed")
    except BaseException:
        if wandb_run is not None:
            tracking.finish(wandb_run, None)
        raise
    record.update({
        "epsilon": spent,
        "steps": module.steps,
        "gradient_evaluations": module.releases,
        "train_seconds": train_seconds,
        "clipping": record.get("clipping") or (module.clipper.name if module.clipper is not None else None),
        **({"clip_norms": module.clip_norms} if planned.method.private and planned.method.moves_clip else {}),
        "noise": module.noise.name if planned.method.private else None,
        **({"world_size": module.world} if module.world > 1 else {}),
        "metrics": dict(module.test_metrics),
        "wandb_run": wandb_run.path if wandb_run is not None else None,
    })
    if spec.validation is not None:
        record["validation"] = spec.validation.score(planned.task, planned.held_out)
    if spec.tuning is not None:
        record["tuning"] = spec.tuning
    records.seal(record)
    if wandb_run is not None:
        tracking.finish(wandb_run, record)
    if checkpoints is not None:
        checkpoints.finished(record)
    if spec.append_to_store:
        store.append(record, spec.store_path)
    return record


def run(spec: RunSpec, replace_rows: Callable[[Task], TaskData] | None = None,
        callbacks: tuple[pl.Callback, ...] = ()) -> dict[str, Any] | None:
    """Train one model as ``spec`` says, append its record to the results store and return it (None in the ranks
    other than 0 of a multi-process run). ``replace_rows`` (see :func:`plan`) and ``callbacks`` (Lightning
    callbacks that watch the training) are for ``dpbench.trust.audit``."""
    refusals.check_isolation(spec)
    method, registered_task = registered(spec.method, spec.task, spec.plugins, spec.isolate)
    if issubclass(method, ReleaseMethod):  # output/objective perturbation: noise and accounting in dpbench.release.mechanisms
        if spec.secret_seed:
            raise UsageError(f"{method.name} releases through dpbench.release, which does not take --secret-seed")
        if spec.isolate:
            raise UsageError(f"{method.name} releases through dpbench.release: --isolate is for gradient methods")
        return runner.run(spec, method, registered_task)
    if spec.checkpoint_dir:
        from dpbench.run import checkpoint  # imported here: dpbench.run.checkpoint builds on this module

        checkpoint.check_folder(spec.checkpoint_dir)
    planned = plan(spec, replace_rows=replace_rows)
    spec, data, hp = planned.spec, planned.data, planned.hp
    checkpoints, resume_from = None, None
    if spec.checkpoint_dir:
        checkpoints, resume_from, finished = checkpoint.prepare(planned, spec.checkpoint_dir, spec.resume,
                                                                spec.checkpoint_every)
        if finished is not None:  # it ended before: its record, which may not have reached the store
            if spec.append_to_store:
                store.append(finished, spec.store_path)
            return finished
    elif spec.resume:
        raise UsageError("resuming needs the run's checkpoint folder")
    wandb = tracking.wandb_settings(spec.wandb_project, spec.wandb_entity, spec.no_wandb)
    logger = tracking.make_logger(wandb, planned.record) if wandb else False
    epsilon_so_far = epsilon_log(planned.releases_charged(0), planned.delta) if method.private and logger else None
    bar = spec.progress_bar and stages.on_terminal()  # else lines every few seconds (dpbench/data/stages.py)
    lines = [ProgressLines("private training" if method.private else "training")] if spec.progress_bar and not bar \
        else []
    try:  # before anything is written: Lightning refuses unknown or unavailable accelerators here
        trainer = pl.Trainer(
            max_epochs=hp["epochs"], accelerator=spec.accelerator, devices=spec.devices, logger=logger,
            strategy=distributed.strategy(spec.accelerator, spec.devices),
            enable_checkpointing=False, callbacks=[*callbacks, *lines, *([checkpoints] if checkpoints else [])],
            plugins=[checkpoint.AtomicCheckpointIO()] if checkpoints else None,
            enable_progress_bar=bar, enable_model_summary=False, num_sanity_val_steps=0,
            use_distributed_sampler=False, deterministic=True, log_every_n_steps=1,  # only per-epoch values are logged
        )
    except (ValueError, MisconfigurationException) as error:
        raise UsageError(f"--accelerator {spec.accelerator}: {error}") from None
    module = planned.module(epsilon_so_far)
    if checkpoints is not None:
        checkpoints.attach(module)
    # Each DataLoader iteration draws a seed for worker processes (none here); from a generator of its own, so that
    # it does not shift the global one (stream "training": dropout) at every epoch and test, which would make the
    # dropout masks after a resume depend on where the run was resumed.
    train_loader = DataLoader(IndexedTensors(data.x_train, data.y_train), batch_sampler=planned.sampler,
                              collate_fn=list, generator=torch.Generator())
    # In-memory test set in slices of 4096, no per-example collation.
    test_loader = DataLoader(list(zip(rows.chunks(data.x_test, 4096), data.y_test.split(4096))), batch_size=None,
                             generator=torch.Generator())
    if logger:
        with contextlib.redirect_stdout(sys.stderr):
            logger.experiment  # W&B starts here, outside the timed training (it took ~2 s)
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():  # stdout is for results
            warnings.filterwarnings("ignore", message=".*configure_optimizers.*returned `None`")  # the method steps
            warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated")  # inside Lightning itself
            # Several ranks: each evaluates the whole test set with the same parameters, so the values agree.
            warnings.filterwarnings("ignore", message=".*sync_dist=True.*")
            trainer.fit(module, train_loader, test_loader, ckpt_path=resume_from)
        if trainer.interrupted:
            raise KeyboardInterrupt
    except BaseException:
        if logger:
            tracking.finish(logger.experiment, None)
        raise
    if trainer.global_rank != 0:
        return None  # another rank of a multi-process run: rank 0 checks, records and stores it
    return finish(planned, module, time.perf_counter() - started, logger.experiment if logger else None, checkpoints)
