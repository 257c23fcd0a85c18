"""The ``dpbench`` command: ``run``, ``tune``, ``federated``, ``list``, ``privacy``, ``sweep``, ``leaderboard``,
``audit``, ``verify``, ``runs``, ``show``. Bad input: one line on stderr, exit 2; a tuning study that cannot release
anything: one line, exit 1."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

# Only light modules here: --help, list and the refusals of bad input must not wait for PyTorch, Lightning, W&B
# or Optuna (seconds); each command imports what it needs (tests/test_cli.py checks which modules load).
from dpbench import catalog, checks, threads
from dpbench.data import stages
from dpbench.choices import (ACCOUNTANTS, BOARD_FORMATS, CLIPPING, GAUSSIAN_SAMPLERS, K_DISTRIBUTIONS, NEIGHBOURING,
                             SAMPLERS, SEARCH_SAMPLERS, STRATEGIES, THREAT_MODELS, TUNING_MODES)
from dpbench.data.files import DataError
from dpbench.errors import PrivacyCheckFailed, RegistryError, TuningError, UsageError
from dpbench.run import allocator

EXIT_USAGE = 2
TRAINING = ("run", "tune", "audit", "sweep", "federated")  # the commands that train: threads, progress lines


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


def _settings(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """``--set`` pairs as a dict; a key given twice is refused rather than silently keeping the last."""
    settings: dict[str, str] = {}
    for key, value in pairs:
        if key in settings and settings[key] != value:
            raise UsageError(f"--set {key} given twice ({settings[key]!r} and {value!r}); give it once")
        settings[key] = value
    return settings


class _Parser(argparse.ArgumentParser):
    """argparse refusing as dpbench does (one line, exit 2), not with the usage text and its own prefix."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")


def _names(kind: str, plugins: list[str]) -> dict[str, str]:
    """{name: description} of the methods or tasks (``kind``): read from their files where that is certain
    (:mod:`dpbench.catalog`, no PyTorch), else from the imported registry."""
    found = catalog.names(kind, catalog.plugin_folders(plugins))
    if found is None:
        from dpbench import registry

        classes = (registry.methods if kind == "method" else registry.tasks)(registry.plugin_dirs(plugins))
        found = {name: cls.description for name, cls in classes.items()}
    return found


def _threads_option(parser: argparse.ArgumentParser,
                    help: str = "torch threads (default: dpbench's choice: one for small models and batches, see "
                                "README; also: DPBENCH_THREADS, OMP_NUM_THREADS)") -> None:
    parser.add_argument("--threads", type=_positive_int, metavar="N", help=help)


def _check_request(args: argparse.Namespace) -> None:
    """Refuse what needs no data before the modules that train are imported (the engine checks it all again): an
    unknown method or task (where the files can be read with certainty; else the engine's registry decides), the
    seed, ε, σ, δ, the hyperparameters of :data:`dpbench.checks.RANGES` (options and ``--set``), and, where the
    task's file states a lower bound on its training examples, δ ≥ 1/n."""
    checks.check_seed(args.seed)
    checks.check_budget(args.epsilon, getattr(args, "noise_multiplier", None), args.delta)
    for key in ("lr", "clip", "epochs", "batch_size"):
        if getattr(args, key, None) is not None:
            checks.check_hyperparameter(key, getattr(args, key))
    settings = _settings(args.set)
    for key, text in settings.items():
        checks.check_setting(key, text)
    folders = catalog.plugin_folders(args.plugins)
    for kind, name in (("method", args.method), ("task", args.task)):
        known = catalog.names(kind, folders)
        if known is not None and name not in known:
            raise UsageError(f"unknown {kind} {name!r}; available: {', '.join(known)}")
    if args.delta is not None and not getattr(args, "force_delta", False):
        _check_delta(args.delta, args.task, folders, settings, getattr(args, "profile", None),
                     hasattr(args, "force_delta"))


def _check_delta(delta: float, task: str, folders: list, settings: dict[str, str], profile: str | None,
                 forcible: bool) -> None:
    """δ ≥ 1/n refused from the bound on n that the task's file states (``Task.min_train_examples``), when the
    request changes none of the task's options (nor picks a profile, which may): n ≥ bound, so δ ≥ 1/bound is
    refused by the engine too, after loading the data (an audit's canaries only add examples)."""
    size = catalog.task_size(task, folders)
    if size is None or profile is not None or size[1] & set(settings):
        return
    bound = size[0]
    if delta >= 1 / bound:
        raise UsageError(f"delta={delta:g} is not below 1/n for task {task}, whose training set has at least "
                         f"{bound} examples (1/{bound} = {1 / bound:g}): such a delta allows releasing an example "
                         f"outright" + ("; pass --force-delta to run anyway" if forcible else ""))


def _refuse(error: Exception) -> int:
    """Print ``error`` as the one line of a refusal (line breaks in the user's input included)."""
    print("dpbench: error: " + " ".join(str(error).splitlines()), file=sys.stderr)
    return EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dpbench", description="Benchmark differentially private optimizers.")
    parser.add_argument("--store", metavar="URL",
                        help="the results store: a SQLAlchemy URL, e.g. postgresql://user@host/db (also: DPBENCH_STORE; "
                             "default: results.sqlite under DPBENCH_HOME)")
    parser.add_argument("--plugins", dest="global_plugins", action="append", default=[], metavar="DIR",
                        help="a folder of method/task plugins, for any command (also after the command)")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="train one model and record the run")
    run.add_argument("--method", required=True)
    run.add_argument("--task", required=True)
    budget = run.add_mutually_exclusive_group()
    budget.add_argument("--epsilon", type=float, help="target ε; σ is calibrated to it (default: the task's)")
    budget.add_argument("--noise-multiplier", type=float, help="σ instead of ε; the run reports the ε it implies")
    run.add_argument("--delta", type=float, help="δ (default: the task's, 1/n² unless it says otherwise)")
    run.add_argument("--force-delta", action="store_true", help="allow δ ≥ 1/n")
    seeding = run.add_mutually_exclusive_group()
    seeding.add_argument("--seed", type=int, default=0)
    seeding.add_argument("--secret-seed", action="store_true",
                         help="draw the seed from the OS's entropy and write it nowhere (the record says \"secret\")")
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
    run.add_argument("--devices", type=_positive_int, default=1,
                     help="train with this many processes, each Poisson-sampling its shard (dpbench/run/distributed.py)")
    run.add_argument("--strategy", choices=STRATEGIES, help="how several processes train: ddp (the default)")
    run.add_argument("--clipping", choices=CLIPPING, default="fast",
                     help="per-example clipping: fast (ghost norms, dpbench/privacy/ghost.py) or reference (torch.func.vmap)")
    run.add_argument("--noise", choices=GAUSSIAN_SAMPLERS, default="fast",
                     help="Gaussian sampler: fast (Philox on the CPU, dpbench/privacy/noise.py) or torch (PyTorch's normal_, "
                          "as runs made before dpbench had its own)")
    run.add_argument("--checkpoint-dir", metavar="DIR",
                     help="keep what the run needs to continue exactly here (dpbench/run/checkpoint.py)")
    run.add_argument("--resume", metavar="DIR", help="continue the run whose checkpoint is in DIR (same command)")
    run.add_argument("--checkpoint-every", type=_positive_int, default=100, metavar="STEPS",
                     help="steps between checkpoints (default 100; also at every epoch's end)")
    run.add_argument("--plugins", action="append", default=[], metavar="DIR",
                     help="folder of extra method/task files (also: DPBENCH_PLUGINS)")
    run.add_argument("--isolate", action="store_true",
                     help="run the method in a process of its own that never holds the data (dpbench/run/isolation.py)")
    run.add_argument("--json", action="store_true", help="print the run record as one JSON object")
    _threads_option(run)
    run.add_argument("--wandb-project", help="log to this W&B project (also: WANDB_PROJECT)")
    run.add_argument("--wandb-entity", help="W&B entity (team or user)")
    run.add_argument("--no-wandb", action="store_true", help="do not log to W&B even where it is configured")

    tune = commands.add_parser("tune", help="tune hyperparameters; the total ε covers the tuning")
    tune.add_argument("--method", required=True)
    tune.add_argument("--task", required=True)
    tune.add_argument("--epsilon", type=float, required=True, help="total ε of the whole tuning (per trial: oracle)")
    tune.add_argument("--delta", type=float, help="total δ (default: the task's, 1/n²)")
    tune.add_argument("--mode", choices=TUNING_MODES, default="random-stopping")
    tune.add_argument("--trials", type=float, default=8,
                      help="mean of the random number of trials K (random-stopping), or the number of trials")
    tune.add_argument("--k-distribution", choices=K_DISTRIBUTIONS, default="negative-binomial")
    tune.add_argument("--eta", type=int, choices=(0, 1), default=0,
                      help="truncated negative binomial shape: 0 logarithmic (default), 1 geometric")
    tune.add_argument("--search", choices=SEARCH_SAMPLERS,
                      help="Optuna sampler: random (random-stopping: the only one), tpe (adaptive's default), qmc")
    tune.add_argument("--search-space", metavar="FILE", help="JSON search space replacing the method's")
    tune.add_argument("--neighbouring", choices=NEIGHBOURING, default="add-remove",
                      help="neighbouring datasets of the total ε: add-remove or replace-one (output perturbation)")
    tune.add_argument("--validation-fraction", type=float, default=0.1,
                      help="share of the training data held out to score trials (private modes)")
    tune_seeding = tune.add_mutually_exclusive_group()
    tune_seeding.add_argument("--seed", type=int, default=0,
                              help="names the study and draws its held-out split (K and the trials' coins come from a "
                                   "secret kept in the study storage)")
    tune_seeding.add_argument("--secret-seed", action="store_true",
                              help="draw the split's seed too from the OS's entropy (the record says \"secret\")")
    tune.add_argument("--epochs", type=_positive_int)
    tune.add_argument("--batch-size", type=_positive_int)
    tune.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                      help="fix a hyperparameter or task option outside the search (repeatable)")
    tune.add_argument("--storage", help="Optuna storage URL (default: sqlite under DPBENCH_HOME); e.g. postgresql://")
    tune.add_argument("--study", help="study name (default: task-method-mode-eps-seed, or a random token with "
                                      "--secret-seed); workers share it")
    tune.add_argument("--heartbeat-interval", type=_positive_int, default=10,
                      help="seconds between a running trial's heartbeats; stale after 3 intervals")
    tune.add_argument("--plugins", action="append", default=[], metavar="DIR")
    tune.add_argument("--json", action="store_true", help="print the released record as one JSON object")
    _threads_option(tune)
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
                              help="train this many cells at once on a local Dask cluster of processes (default 1: "
                                   "in this process)")
    sweep_parser.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                              help="send the cells to this Dask scheduler's workers instead")
    sweep_parser.add_argument("--plugins", action="append", default=[], metavar="DIR",
                              help="folder of extra method/task files, for this process and the workers")
    _threads_option(sweep_parser, "torch threads of each worker (default: dpbench's choice per run, at most the "
                                  "cores over the workers; also: DPBENCH_THREADS)")

    board = commands.add_parser("leaderboard", help="tables (methods × ε) and plots from the local results store")
    board.add_argument("--task", help="only this task")
    board.add_argument("--format", choices=BOARD_FORMATS, default="md")
    board.add_argument("--out", help="write to this file instead of stdout")
    board.add_argument("--from-wandb", metavar="ENTITY/PROJECT", help="build from the runs logged to a W&B project")
    board.add_argument("--records", metavar="FILE.jsonl", help="build from a records file instead of the store")
    board.add_argument("--check", action="store_true",
                       help="list what is wrong with the board (exit 1 if anything is not explained)")
    board.add_argument("--exceptions", metavar="FILE.json",
                       help="explained exceptions for --check (default: exceptions.json beside --records)")
    board.add_argument("--plugins", action="append", default=[], metavar="DIR",
                       help="folder of extra method files (the page describes their methods)")
    _add_audit_parsers(commands)
    _federated_parser(commands)
    return parser


def _add_audit_parsers(commands) -> None:
    """``dpbench audit`` (dpbench/trust/audit.py) and ``dpbench verify`` (dpbench/trust/verify.py)."""
    auditing = commands.add_parser("audit", help="one-run privacy audit (Steinke et al. 2023): an ε lower bound")
    auditing.add_argument("--method", required=True)
    auditing.add_argument("--task", required=True)
    auditing.add_argument("--epsilon", type=float, help="target ε of the audited run (default: the task's)")
    auditing.add_argument("--delta", type=float)
    auditing.add_argument("--seed", type=int, default=0, help="draws the run and the canaries")
    auditing.add_argument("--canaries", type=int, default=1000, help="m, each in the data with probability 1/2")
    auditing.add_argument("--threat-model", choices=THREAT_MODELS, default="white-box",
                          help="white-box: the parameters after every step; black-box: the final model")
    auditing.add_argument("--epochs", type=_positive_int)
    auditing.add_argument("--batch-size", type=_positive_int)
    auditing.add_argument("--lr", type=float)
    auditing.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE")
    auditing.add_argument("--plugins", action="append", default=[], metavar="DIR")
    auditing.add_argument("--isolate", action="store_true", help="audit the method run isolated (as dpbench run)")
    auditing.add_argument("--json", action="store_true", help="print the audit record as one JSON object")
    _threads_option(auditing)

    listing_runs = commands.add_parser("runs", help="list the runs in the results store, newest last")
    listing_runs.add_argument("--task")
    listing_runs.add_argument("--method")
    listing_runs.add_argument("--limit", type=_positive_int, default=50, help="show the newest N (default 50)")
    showing = commands.add_parser("show", help="print one stored record (by its run id or a unique prefix)")
    showing.add_argument("run_id")

    verifying = commands.add_parser("verify", help="recompute every record's ε and content hash; rerun some")
    verifying.add_argument("file", help="a JSON-lines file of records (e.g. leaderboards/results.jsonl)")
    verifying.add_argument("--rerun", type=int, default=0, metavar="K", help="train K random records again")
    verifying.add_argument("--seed", type=int, default=0, help="which records --rerun draws")


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


def _federated_parser(commands) -> None:
    """``dpbench federated``: FedAvg with ADADP, SGD or Adam clients on the paper's CIFAR-10 split
    (:mod:`dpbench.federated.experiment`). Values are checked there, so that bad input gets one line."""
    fed = commands.add_parser("federated", help="federated averaging with adaptive (ADADP), SGD or Adam clients")
    fed.add_argument("--client-method", required=True, help="ada_dp, sgd or adam")
    fed.add_argument("--task", default="cifar10")
    fed.add_argument("--random-fraction", required=True,
                     help="share of the data assigned at random, e.g. 0, 1/3, 2/3, 1 (0: the pathological split)")
    fed.add_argument("--rounds", type=int, help="communication rounds (paper: 200)")
    fed.add_argument("--profile", help="paper (the seed paper's setting, the default) or smoke (seconds)")
    fed.add_argument("--seed", type=int, default=0)
    fed.add_argument("--lr", type=float, help="the clients' (initial) learning rate")
    fed.add_argument("--batch-size", type=int, help="|B| (paper: 10)")
    fed.add_argument("--client-size", type=int, help="images per client (default: all the task's split holds)")
    fed.add_argument("--client-state", help="keep (default) or reset the clients' optimizer state every round")
    fed.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                     help="another hyperparameter of the client method (tol, alpha_min, alpha_max, beta1, ...)")
    fed.add_argument("--json", action="store_true", help="print the record as one JSON object")
    fed.add_argument("--wandb-project")
    fed.add_argument("--wandb-entity")
    fed.add_argument("--no-wandb", action="store_true")


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


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except UsageError as error:
        return _refuse(error)
    if hasattr(args, "plugins"):
        args.plugins = [*args.global_plugins, *args.plugins]
    elif args.global_plugins:
        return _refuse(UsageError(f"dpbench {args.command} takes no plugins"))
    if args.store is not None:
        if not args.store.strip():
            return _refuse(UsageError("--store needs a URL (or a SQLite file's path)"))
        os.environ["DPBENCH_STORE"] = args.store  # read by dpbench.results.store here and in the sweep's worker processes
    if args.command in ("sweep", "leaderboard") and args.plugins:  # these read the registry's default folders
        os.environ["DPBENCH_PLUGINS"] = os.pathsep.join(  # here and in the sweep's workers (dpbench/board/sweep.py)
            [*os.environ.get("DPBENCH_PLUGINS", "").split(os.pathsep), *map(os.path.abspath, args.plugins)]).strip(
            os.pathsep)
    if args.command in TRAINING:
        try:  # bad values refused before anything heavy is imported
            stages.interval()
            threads.configure(getattr(args, "threads", None))
        except UsageError as error:
            return _refuse(error)
    allocator.keep_freed_memory()  # speed only: a step's large tensors are not page-faulted in again every step

    try:
        if args.command == "privacy":
            result = _privacy(args)
            print(json.dumps(result) if args.json else
                  f"ε = {result['epsilon']:.6g}, σ = {result['noise_multiplier']:.6g} "
                  f"(q = {args.sample_rate}, {args.steps} steps, δ = {args.delta}, {args.accountant})")
        elif args.command == "sweep":
            from dpbench.board import sweep

            counts = sweep.run_grid(sweep.load_grid(args.grid), args.workers, scheduler=args.scheduler,
                                    threads=threads.requested(args.threads)[0])
            print(", ".join(f"{count} {what}" for what, count in counts.items()))
        elif args.command == "leaderboard" and args.check:
            from dpbench.board import leaderboard

            problems = leaderboard.run_check(args.task, args.from_wandb, args.records, args.exceptions)
            for line in problems:
                print(line)
            print(f"dpbench: {len(problems)} unexplained problem(s)" if problems else "dpbench: the board passes its "
                  "checks", file=sys.stderr)
            return 1 if problems else 0
        elif args.command == "federated":
            record = _federated(args)
            print(json.dumps(record) if args.json else _federated_summary(record))
        elif args.command == "leaderboard":
            from dpbench.board import leaderboard

            leaderboard.write(args.format, args.task, args.out, args.from_wandb, args.records)
        elif args.command == "tune":
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
            record = tune.tune(spec)
            print(json.dumps(record) if args.json else _tune_summary(record))
        elif args.command == "audit":
            return _audit(args)
        elif args.command == "verify":
            return _verify(args)
        elif args.command == "runs":
            from dpbench.results import browse

            print(browse.runs_table(args.task, args.method, args.limit))
        elif args.command == "show":
            from dpbench.results import browse

            print(browse.show_text(args.run_id))
        elif args.command == "list":
            found = _names(args.what[:-1], args.plugins)
            width = max(map(len, found))
            for name, description in found.items():
                print(f"{name:<{width}}  {description}")
        else:
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
            record = engine.run(spec)
            if record is not None:  # None: a rank other than 0 of a multi-process run, which rank 0 reports
                print(json.dumps(record) if args.json else _summary(record))
    except (UsageError, DataError, RegistryError) as error:
        return _refuse(error)
    except TuningError as error:
        print(f"dpbench: {error}", file=sys.stderr)
        return 1
    except PrivacyCheckFailed as error:
        print(f"dpbench: refused, nothing recorded: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
