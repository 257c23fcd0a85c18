"""What each ``dpbench`` command does once its arguments are parsed, importing what it needs only then, and the
summaries it prints."""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from dpbench import catalog
from dpbench.cli.refusals import _check_request, _settings
from dpbench.errors import UsageError


def _names(kind: str, plugins: list[str]) -> dict[str, str]:
    """{name: description} of the methods or tasks (``kind``): read from their files where that is certain
    (:mod:`dpbench.catalog`, no PyTorch), else from the imported registry."""
    found = catalog.names(kind, catalog.plugin_folders(plugins))
    if found is None:
        from dpbench import registry

        classes = (registry.methods if kind == "method" else registry.tasks)(registry.plugin_dirs(plugins))
        found = {name: cls.description for name, cls in classes.items()}
    return found


def _run(args: argparse.Namespace) -> dict[str, Any] | None:
    """``dpbench run``: the run's record (None on a rank other than 0 of a multi-process run)."""
    overrides = {key: value for key, value in
                 [("epochs", args.epochs), ("batch_size", args.batch_size), ("lr", args.lr),
                  ("clip", args.clip)] if value is not None}
    overrides.update(_settings(args.set))
    if args.resume and args.checkpoint_dir and args.resume != args.checkpoint_dir:
        raise UsageError("--resume continues writing checkpoints to its own folder: give --checkpoint-dir "
                         "the same folder or leave it out")
    _check_request(args)
    from dpbench.run import engine
    from dpbench.spec import RunSpec

    spec = RunSpec(
        method=args.method, task=args.task, epsilon=args.epsilon, noise_multiplier=args.noise_multiplier,
        delta=args.delta, seed=args.seed, secret_seed=args.secret_seed, overrides=overrides,
        profile=args.profile, sampler=args.sampler,
        accountant=args.accountant, neighbouring=args.neighbouring, force_delta=args.force_delta,
        accelerator=args.accelerator, devices=args.devices, strategy=args.strategy,
        clipping=args.clipping, noise=args.noise, checkpoint_dir=args.resume or args.checkpoint_dir,
        resume=bool(args.resume), checkpoint_every=args.checkpoint_every, plugins=args.plugins,
        wandb_project=args.wandb_project, wandb_entity=args.wandb_entity, no_wandb=args.no_wandb,
        isolate=args.isolate)
    return engine.run(spec)


def _reference(args: argparse.Namespace) -> dict[str, Any]:
    """``dpbench reference``: the task's converged non-private reference, recorded. An unknown task, or one that is
    not a linear classification task, is refused before PyTorch is imported where the task files say so."""
    folders = catalog.plugin_folders(args.plugins)
    known = catalog.names("task", folders)
    if known is not None and args.task not in known:
        raise UsageError(f"unknown task {args.task!r}; available: {', '.join(known)}")
    if catalog.task_derives(args.task, "dpbench.tasks.linear.LinearClassification", folders) is False:
        raise UsageError(f"task {args.task} is not a linear classification task: the reference is defined for those "
                         f"only")
    from dpbench.tuning import reference

    return reference.run(args.task, args.plugins)


def _tune(args: argparse.Namespace) -> dict[str, Any]:
    """``dpbench tune``: the study's released record."""
    _check_request(args)
    from dpbench.tuning import search, tune

    overrides = {key: value for key, value in [("epochs", args.epochs), ("batch_size", args.batch_size)]
                 if value is not None}
    overrides.update(_settings(args.set))
    spec = tune.TuneSpec(
        method=args.method, task=args.task, epsilon=args.epsilon, delta=args.delta, mode=args.mode,
        trials=args.trials, k_distribution=args.k_distribution, eta=args.eta, sampler=args.search,
        validation_fraction=args.validation_fraction, neighbouring=args.neighbouring, seed=args.seed,
        secret_seed=args.secret_seed, overrides=overrides,
        search_space=search.load_search_space(args.search_space) if args.search_space else None,
        storage=args.storage, study=args.study, heartbeat_interval=args.heartbeat_interval,
        plugins=args.plugins, wandb_project=args.wandb_project, wandb_entity=args.wandb_entity,
        no_wandb=args.no_wandb)
    return tune.tune(spec)


def _audit(args: argparse.Namespace) -> int:
    _check_request(args)
    from dpbench.trust import audit

    overrides = {key: value for key, value in [("epochs", args.epochs), ("batch_size", args.batch_size),
                                               ("lr", args.lr)] if value is not None}
    overrides.update(_settings(args.set))
    record = audit.audit(audit.AuditSpec(
        method=args.method, task=args.task, epsilon=args.epsilon, delta=args.delta, seed=args.seed,
        canaries=args.canaries, threat_model=args.threat_model, overrides=overrides, plugins=args.plugins,
        isolate=args.isolate))
    print(json.dumps(record) if args.json else audit.summary(record))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from dpbench.trust import verify

    if args.rerun < 0:
        raise UsageError(f"--rerun must be at least 0, got {args.rerun}")
    count, problems = verify.verify(args.file, args.rerun, args.seed)
    for problem in problems:
        print(problem)
    print(f"{count} records, {len(problems)} mismatches" + (f", {args.rerun} reruns asked" if args.rerun else ""),
          file=sys.stderr)
    return 1 if problems else 0


def _federated(args: argparse.Namespace) -> dict[str, Any]:
    from dpbench.federated import experiment

    spec = experiment.FederatedSpec(
        client_method=args.client_method, random_fraction=args.random_fraction, task=args.task, rounds=args.rounds,
        batch_size=args.batch_size, client_size=args.client_size, client_state=args.client_state, lr=args.lr,
        overrides=dict(args.set), profile=args.profile, seed=args.seed, wandb_project=args.wandb_project,
        wandb_entity=args.wandb_entity, no_wandb=args.no_wandb)
    return experiment.run(spec)


def _federated_summary(record: dict[str, Any]) -> str:
    settings, hp = record["settings"], ", ".join(f"{k}={v:g}" for k, v in record["hyperparameters"].items())
    return (f"fedavg with {record['client_method']} clients ({hp}) on {record['task']} (data {record['data_id']}, "
            f"seed {record['seed']})\n  {settings['clients']} clients x {settings['client_size']} images, "
            f"{settings['random_fraction']:.4g} assigned at random; {settings['rounds']} rounds of "
            f"{settings['local_steps']} local steps (|B| = {settings['batch_size']}) in {record['train_seconds']:.1f} s"
            f"\n  final test accuracy {record['metrics']['test_accuracy']:.4f}\n  run {record['run_id']}")


def _privacy(args: argparse.Namespace) -> dict[str, Any]:
    from dpbench.privacy.accounting import GaussianReleases, calibrate_noise_multiplier, check_relation

    if not 0 < args.sample_rate <= 1:
        raise UsageError(f"sample rate must lie in (0, 1], got {args.sample_rate}")
    if not 0 < args.delta < 1:
        raise UsageError(f"delta must lie in (0, 1), got {args.delta}")
    try:
        check_relation(args.accountant, "poisson", args.neighbouring)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.epsilon is not None and not (math.isfinite(args.epsilon) and args.epsilon > 0):
        raise UsageError(f"epsilon must be a finite number > 0, got {args.epsilon}")
    if args.noise_multiplier is not None and not (math.isfinite(args.noise_multiplier) and args.noise_multiplier > 0):
        raise UsageError(f"noise multiplier must be a finite number > 0, got {args.noise_multiplier}")
    try:
        sigma = args.noise_multiplier or calibrate_noise_multiplier(
            args.epsilon, args.delta, args.sample_rate, args.steps, args.accountant, neighbouring=args.neighbouring)
        releases = GaussianReleases(args.sample_rate, sigma, args.steps, neighbouring=args.neighbouring)
        epsilon = releases.epsilon(args.delta, args.accountant)
    except ValueError as error:  # e.g. more releases than dpbench accounts, or σ = 1e300
        raise UsageError(str(error)) from None
    return {"epsilon": epsilon, "noise_multiplier": sigma,
            "sample_rate": args.sample_rate, "steps": args.steps, "delta": args.delta, "accountant": args.accountant,
            "sampler": "poisson", "neighbouring": args.neighbouring}


def _summary(record: dict[str, Any]) -> str:
    hp = ", ".join(f"{k}={v}" for k, v in record["hyperparameters"].items())
    lines = [f"{record['method']} on {record['task']} (data {record['data_id']}, seed {record['seed']})"]
    if record["data_note"]:
        lines.append(f"  note: {record['data_note']}")
    lines.append(f"  hyperparameters: {hp}")
    if record["private"]:
        lines.append(f"  privacy: ε = {record['epsilon']:.4g} spent (target {record['epsilon_target']}, "
                     f"{record['neighbouring']} neighbours), "
                     f"δ = {record['delta']:.3g}, σ = {record['noise_multiplier']:.4g}, q = {record['sample_rate']:.4g}, "
                     f"{record['gradient_evaluations']} noisy gradients, {record['sampler']} sampling, "
                     f"{record['accountant']} accountant, {record.get('clipping')} clipping, "
                     f"noise from {record.get('noise')}")
    else:
        lines.append("  privacy: none (non-private baseline)")
    metrics = ", ".join(f"{k} = {v:.4f}" for k, v in record["metrics"].items())
    seconds = record.get("train_seconds")  # not released by a tuning (it depends on the other trials)
    steps = "" if record["steps"] is None else f"{record['steps']} steps"  # AMP's solver count is not released
    timing = "" if seconds is None else f" in {seconds:.1f} s"
    lines.append(f"  {steps}{timing}{'; ' if steps or timing else ''}{metrics}")
    from dpbench.results import browse, store

    lines.append(f"  run {record['run_id']} stored in {store.describe()} (dpbench show {record['run_id']})")
    rerun, runs = browse.reruns(store.load(task=record["task"], method=record["method"])).get(record["run_id"], (1, 1))
    if runs > 1:
        lines.append(f"  rerun {rerun} of {runs} stored runs of these settings and seed (dpbench runs numbers them; "
                     f"the leaderboard counts the seed once)")
    return "\n".join(lines)


def _tune_summary(record: dict[str, Any]) -> str:
    tuned = record["tuning"]
    trials = (f"K ~ {tuned['k_distribution']['name']} with mean {tuned['k_distribution']['mean']:g} (K and the "
              f"other trials stay in study {tuned['study']})" if "k_distribution" in tuned else f"{tuned['trials']} trials")
    lines = [_summary(record).splitlines()[0],
             f"  tuning: {tuned['mode']}, {trials}; selected by {tuned['selected_by']}: "
             + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in tuned["selected_params"].items())]
    if tuned["private"]:
        lines.append(f"  privacy: total ε = {record['epsilon']:.4g} (target {record['epsilon_target']}), "
                     f"δ = {record['delta']:.3g}, rdp accountant; per trial σ = {tuned['noise_multiplier']:.4g}, "
                     f"q = {tuned['sample_rate']:.4g}, {tuned['gradient_evaluations']} noisy gradients")
    else:
        lines.append(f"  privacy: {tuned['note']}")
    metrics = ", ".join(f"{k} = {v:.4f}" for k, v in record["metrics"].items())
    lines += [f"  released model: {metrics}", f"  run {record['run_id']}"]
    return "\n".join(lines)
