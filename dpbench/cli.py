"""The ``dpbench`` command: ``run``, ``tune``, ``list``, ``privacy``, ``sweep``, ``leaderboard``. Bad input: one line on
stderr, exit 2; a tuning study that cannot release anything: one line, exit 1."""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from typing import Any

from dpbench import allocator, engine, guards, leaderboard, registry, search, sweep, tuning
from dpbench.data import DataError
from dpbench.engine import UsageError
from dpbench.privacy import (ACCOUNTANTS, NEIGHBOURING, SAMPLERS, GaussianReleases, calibrate_noise_multiplier,
                             check_relation)

EXIT_USAGE = 2


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpbench", description="Benchmark differentially private optimizers.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="train one model and record the run")
    run.add_argument("--method", required=True)
    run.add_argument("--task", required=True)
    budget = run.add_mutually_exclusive_group()
    budget.add_argument("--epsilon", type=float, help="target ε; σ is calibrated to it (default: the task's)")
    budget.add_argument("--noise-multiplier", type=float, help="σ instead of ε; the run reports the ε it implies")
    run.add_argument("--delta", type=float, help="δ (default: the task's, 1/n² unless it says otherwise)")
    run.add_argument("--force-delta", action="store_true", help="allow δ ≥ 1/n")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--epochs", type=_positive_int)
    run.add_argument("--batch-size", type=_positive_int, help="expected batch size B (Poisson rate q = B/n)")
    run.add_argument("--lr", type=float)
    run.add_argument("--clip", type=float, help="per-example L2 clipping norm C")
    run.add_argument("--profile", help="a named setting of the task: paper (the seed paper's), smoke (a quick test)")
    run.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                     help="any other hyperparameter or task option (repeatable)")
    run.add_argument("--sampler", choices=SAMPLERS, help="poisson (default for private methods) or shuffle")
    run.add_argument("--accountant", choices=ACCOUNTANTS, default="pld")
    run.add_argument("--neighbouring", choices=NEIGHBOURING,
                     help="neighbouring datasets of the ε: add-remove (default for Poisson sampling) or replace-one")
    run.add_argument("--accelerator", default="cpu", help="Lightning accelerator: cpu, gpu, auto, ...")
    run.add_argument("--clipping", choices=engine.CLIPPING, default="fast",
                     help="per-example clipping: fast (ghost norms, dpbench/ghost.py) or reference (torch.func.vmap)")
    run.add_argument("--noise", choices=engine.NOISE, default="fast",
                     help="Gaussian sampler: fast (Philox on the CPU, dpbench/noise.py) or torch (PyTorch's normal_, "
                          "as runs made before dpbench had its own)")
    run.add_argument("--checkpoint-dir", help="save Lightning checkpoints (last epoch) here")
    run.add_argument("--plugins", action="append", default=[], metavar="DIR",
                     help="folder of extra method/task files (also: DPBENCH_PLUGINS)")
    run.add_argument("--json", action="store_true", help="print the run record as one JSON object")
    run.add_argument("--wandb-project", help="log to this W&B project (also: WANDB_PROJECT)")
    run.add_argument("--wandb-entity", help="W&B entity (team or user)")
    run.add_argument("--no-wandb", action="store_true", help="do not log to W&B even where it is configured")

    tune = commands.add_parser("tune", help="tune hyperparameters; the total ε covers the tuning")
    tune.add_argument("--method", required=True)
    tune.add_argument("--task", required=True)
    tune.add_argument("--epsilon", type=float, required=True, help="total ε of the whole tuning (per trial: oracle)")
    tune.add_argument("--delta", type=float, help="total δ (default: the task's, 1/n²)")
    tune.add_argument("--mode", choices=tuning.MODES, default="random-stopping")
    tune.add_argument("--trials", type=float, default=8,
                      help="mean of the random number of trials K (random-stopping), or the number of trials")
    tune.add_argument("--k-distribution", choices=tuning.K_DISTRIBUTIONS, default="negative-binomial")
    tune.add_argument("--eta", type=int, choices=(0, 1), default=0,
                      help="truncated negative binomial shape: 0 logarithmic (default), 1 geometric")
    tune.add_argument("--search", choices=tuning.SAMPLERS,
                      help="Optuna sampler: random (random-stopping: the only one), tpe (adaptive's default), qmc")
    tune.add_argument("--search-space", metavar="FILE", help="JSON search space replacing the method's")
    tune.add_argument("--neighbouring", choices=NEIGHBOURING, default="add-remove",
                      help="neighbouring datasets of the total ε: add-remove or replace-one (output perturbation)")
    tune.add_argument("--validation-fraction", type=float, default=0.1,
                      help="share of the training data held out to score trials (private modes)")
    tune.add_argument("--seed", type=int, default=0, help="draws K, the split, the samplers and the trials' seeds")
    tune.add_argument("--epochs", type=_positive_int)
    tune.add_argument("--batch-size", type=_positive_int)
    tune.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                      help="fix a hyperparameter or task option outside the search (repeatable)")
    tune.add_argument("--storage", help="Optuna storage URL (default: sqlite under DPBENCH_HOME); e.g. postgresql://")
    tune.add_argument("--study", help="study name (default: task-method-mode-eps-seed); workers share it")
    tune.add_argument("--heartbeat-interval", type=_positive_int, default=10,
                      help="seconds between a running trial's heartbeats; stale after 3 intervals")
    tune.add_argument("--plugins", action="append", default=[], metavar="DIR")
    tune.add_argument("--json", action="store_true", help="print the released record as one JSON object")
    tune.add_argument("--wandb-project")
    tune.add_argument("--wandb-entity")
    tune.add_argument("--no-wandb", action="store_true")

    listing = commands.add_parser("list", help="list methods or tasks")
    listing.add_argument("what", choices=["methods", "tasks"])
    listing.add_argument("--plugins", action="append", default=[], metavar="DIR")

    privacy = commands.add_parser("privacy", help="ε from σ, or σ from ε, for Poisson-subsampled Gaussian steps")
    privacy.add_argument("--sample-rate", type=float, required=True)
    target = privacy.add_mutually_exclusive_group(required=True)
    target.add_argument("--noise-multiplier", type=float)
    target.add_argument("--epsilon", type=float)
    privacy.add_argument("--steps", type=_positive_int, required=True)
    privacy.add_argument("--delta", type=float, required=True)
    privacy.add_argument("--accountant", choices=ACCOUNTANTS, default="pld")
    privacy.add_argument("--neighbouring", choices=NEIGHBOURING, default="add-remove")
    privacy.add_argument("--json", action="store_true")

    sweep_parser = commands.add_parser("sweep", help="run a grid of tasks × methods × ε × seeds, skipping stored runs")
    sweep_parser.add_argument("grid", help="JSON file: {\"tasks\": [...], \"methods\": [...], \"epsilons\": [...], "
                                           "\"seeds\": N}")
    sweep_parser.add_argument("--workers", type=_positive_int, default=1,
                              help="train this many cells at once in worker processes (default 1)")

    board = commands.add_parser("leaderboard", help="tables (methods × ε) and plots from the local results store")
    board.add_argument("--task", help="only this task")
    board.add_argument("--format", choices=leaderboard.FORMATS, default="md")
    board.add_argument("--out", help="write to this file instead of stdout")
    board.add_argument("--from-wandb", metavar="ENTITY/PROJECT", help="build from the runs logged to a W&B project")
    board.add_argument("--records", metavar="FILE.jsonl", help="build from a records file instead of the store")
    board.add_argument("--check", action="store_true",
                       help="list what is wrong with the board (exit 1 if anything is not explained)")
    board.add_argument("--exceptions", metavar="FILE.json",
                       help="explained exceptions for --check (default: exceptions.json beside --records)")
    _add_audit_parsers(commands)
    return parser


def _add_audit_parsers(commands) -> None:
    """``dpbench audit`` (dpbench/audit.py) and ``dpbench verify`` (dpbench/verify.py)."""
    from dpbench import audit

    auditing = commands.add_parser("audit", help="one-run privacy audit (Steinke et al. 2023): an ε lower bound")
    auditing.add_argument("--method", required=True)
    auditing.add_argument("--task", required=True)
    auditing.add_argument("--epsilon", type=float, help="target ε of the audited run (default: the task's)")
    auditing.add_argument("--delta", type=float)
    auditing.add_argument("--seed", type=int, default=0, help="draws the run and the canaries")
    auditing.add_argument("--canaries", type=int, default=1000, help="m, each in the data with probability 1/2")
    auditing.add_argument("--threat-model", choices=audit.THREAT_MODELS, default="white-box",
                          help="white-box: the parameters after every step; black-box: the final model")
    auditing.add_argument("--epochs", type=_positive_int)
    auditing.add_argument("--batch-size", type=_positive_int)
    auditing.add_argument("--lr", type=float)
    auditing.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE")
    auditing.add_argument("--plugins", action="append", default=[], metavar="DIR")
    auditing.add_argument("--json", action="store_true", help="print the audit record as one JSON object")

    verifying = commands.add_parser("verify", help="recompute every record's ε and content hash; rerun some")
    verifying.add_argument("file", help="a JSON-lines file of records (e.g. leaderboards/results.jsonl)")
    verifying.add_argument("--rerun", type=int, default=0, metavar="K", help="train K random records again")
    verifying.add_argument("--seed", type=int, default=0, help="which records --rerun draws")


def _audit(args: argparse.Namespace) -> int:
    from dpbench import audit

    overrides = {key: value for key, value in [("epochs", args.epochs), ("batch_size", args.batch_size),
                                               ("lr", args.lr)] if value is not None}
    overrides.update(args.set)
    record = audit.audit(audit.AuditSpec(
        method=args.method, task=args.task, epsilon=args.epsilon, delta=args.delta, seed=args.seed,
        canaries=args.canaries, threat_model=args.threat_model, overrides=overrides, plugins=args.plugins))
    print(json.dumps(record) if args.json else audit.summary(record))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from dpbench import verify

    if args.rerun < 0:
        raise UsageError(f"--rerun must be at least 0, got {args.rerun}")
    count, problems = verify.verify(args.file, args.rerun, args.seed)
    for problem in problems:
        print(problem)
    print(f"{count} records, {len(problems)} mismatches" + (f", {args.rerun} reruns asked" if args.rerun else ""),
          file=sys.stderr)
    return 1 if problems else 0


def _privacy(args: argparse.Namespace) -> dict[str, Any]:
    if not 0 < args.sample_rate <= 1:
        raise UsageError(f"sample rate must lie in (0, 1], got {args.sample_rate}")
    if not 0 < args.delta < 1:
        raise UsageError(f"delta must lie in (0, 1), got {args.delta}")
    try:
        check_relation(args.accountant, "poisson", args.neighbouring)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.epsilon is not None:
        if not (math.isfinite(args.epsilon) and args.epsilon > 0):
            raise UsageError(f"epsilon must be a finite number > 0, got {args.epsilon}")
        sigma = calibrate_noise_multiplier(args.epsilon, args.delta, args.sample_rate, args.steps, args.accountant,
                                           neighbouring=args.neighbouring)
    else:
        sigma = args.noise_multiplier
        if not (math.isfinite(sigma) and sigma > 0):
            raise UsageError(f"noise multiplier must be a finite number > 0, got {sigma}")
    releases = GaussianReleases(args.sample_rate, sigma, args.steps, neighbouring=args.neighbouring)
    return {"epsilon": releases.epsilon(args.delta, args.accountant), "noise_multiplier": sigma,
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
    lines.append(f"  {record['steps']} steps in {record['train_seconds']:.1f} s; {metrics}")
    lines.append(f"  run {record['run_id']}")
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    allocator.keep_freed_memory()  # speed only: a step's large tensors are not page-faulted in again every step
    # Lightning's informational lines would mix with --json output on stdout.
    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)

    try:
        if args.command == "privacy":
            result = _privacy(args)
            print(json.dumps(result) if args.json else
                  f"ε = {result['epsilon']:.6g}, σ = {result['noise_multiplier']:.6g} "
                  f"(q = {args.sample_rate}, {args.steps} steps, δ = {args.delta}, {args.accountant})")
        elif args.command == "sweep":
            counts = sweep.run_grid(sweep.load_grid(args.grid), args.workers)
            print(", ".join(f"{count} {what}" for what, count in counts.items()))
        elif args.command == "leaderboard" and args.check:
            problems = leaderboard.run_check(args.task, args.from_wandb, args.records, args.exceptions)
            for line in problems:
                print(line)
            print(f"dpbench: {len(problems)} unexplained problem(s)" if problems else "dpbench: the board passes its "
                  "checks", file=sys.stderr)
            return 1 if problems else 0
        elif args.command == "leaderboard":
            leaderboard.write(args.format, args.task, args.out, args.from_wandb, args.records)
        elif args.command == "tune":
            overrides = {key: value for key, value in [("epochs", args.epochs), ("batch_size", args.batch_size)]
                         if value is not None}
            overrides.update(args.set)
            spec = tuning.TuneSpec(
                method=args.method, task=args.task, epsilon=args.epsilon, delta=args.delta, mode=args.mode,
                trials=args.trials, k_distribution=args.k_distribution, eta=args.eta, sampler=args.search,
                validation_fraction=args.validation_fraction, neighbouring=args.neighbouring, seed=args.seed,
                overrides=overrides,
                search_space=search.load_search_space(args.search_space) if args.search_space else None,
                storage=args.storage, study=args.study, heartbeat_interval=args.heartbeat_interval,
                plugins=args.plugins, wandb_project=args.wandb_project, wandb_entity=args.wandb_entity,
                no_wandb=args.no_wandb)
            record = tuning.tune(spec)
            print(json.dumps(record) if args.json else _tune_summary(record))
        elif args.command == "audit":
            return _audit(args)
        elif args.command == "verify":
            return _verify(args)
        elif args.command == "list":
            folders = registry.plugin_dirs(args.plugins)
            found = registry.methods(folders) if args.what == "methods" else registry.tasks(folders)
            width = max(map(len, found))
            for name, cls in found.items():
                print(f"{name:<{width}}  {cls.description}")
        else:
            overrides = {key: value for key, value in
                         [("epochs", args.epochs), ("batch_size", args.batch_size), ("lr", args.lr),
                          ("clip", args.clip)] if value is not None}
            overrides.update(args.set)
            spec = engine.RunSpec(
                method=args.method, task=args.task, epsilon=args.epsilon, noise_multiplier=args.noise_multiplier,
                delta=args.delta, seed=args.seed, overrides=overrides, profile=args.profile, sampler=args.sampler,
                accountant=args.accountant, neighbouring=args.neighbouring, force_delta=args.force_delta,
                accelerator=args.accelerator,
                clipping=args.clipping, noise=args.noise, checkpoint_dir=args.checkpoint_dir, plugins=args.plugins,
                wandb_project=args.wandb_project, wandb_entity=args.wandb_entity, no_wandb=args.no_wandb)
            record = engine.run(spec)
            print(json.dumps(record) if args.json else _summary(record))
    except (UsageError, DataError, registry.RegistryError) as error:
        print(f"dpbench: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except tuning.TuningError as error:
        print(f"dpbench: {error}", file=sys.stderr)
        return 1
    except guards.PrivacyCheckFailed as error:
        print(f"dpbench: refused, nothing recorded: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
