"""The ``dpbench`` command's argument parser: its commands and options, refusing bad syntax as dpbench does (one
line, exit 2). Only light modules: ``--help`` must not wait for PyTorch."""
from __future__ import annotations

import argparse

from dpbench.choices import (ACCOUNTANTS, BOARD_FORMATS, CLIPPING, GAUSSIAN_SAMPLERS, K_DISTRIBUTIONS, NEIGHBOURING,
                             SAMPLERS, SEARCH_SAMPLERS, STRATEGIES, THREAT_MODELS, TUNING_MODES)
from dpbench.errors import UsageError


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


class _Parser(argparse.ArgumentParser):
    """argparse refusing as dpbench does (one line, exit 2), not with the usage text and its own prefix."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")


def _threads_option(parser: argparse.ArgumentParser,
                    help: str = "torch threads (default: dpbench's choice: one for small models and batches, see "
                                "README; also: DPBENCH_THREADS, OMP_NUM_THREADS)") -> None:
    parser.add_argument("--threads", type=_positive_int, metavar="N", help=help)


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
    run.add_argument("--sampler", choices=SAMPLERS, help="poisson (default for private methods), shuffle, or cyclic "
                     "(one fixed partition, the same order every epoch: correlated noise, bandmf and dpftrl)")
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
    board.add_argument("--grid", metavar="GRID.json",
                       help="the grid whose declared infeasible cells --check applies (default: grid.json beside "
                            "--records)")
    board.add_argument("--boundary-hits", action="store_true",
                       help="print the boundary-hit rate of the tuned cells per track and method (markdown)")
    board.add_argument("--plugins", action="append", default=[], metavar="DIR",
                       help="folder of extra method files (the page describes their methods)")
    fidelity = commands.add_parser("fidelity", help="the seed papers' published numbers beside the board's cells "
                                                    "(leaderboards/FIDELITY.md; dpbench/board/fidelity.py)")
    fidelity.add_argument("--records", action="append", default=[], required=True, metavar="FILE.jsonl",
                          help="a records file (repeat: the board's, the deep tasks', the federated runs')")
    fidelity.add_argument("--out", help="write to this file instead of stdout")
    reference = commands.add_parser("reference", help="the converged non-private reference of a linear classification "
                                                      "task (dpbench/tuning/reference.py)")
    reference.add_argument("--task", required=True)
    reference.add_argument("--plugins", action="append", default=[], metavar="DIR")
    reference.add_argument("--json", action="store_true", help="print the record as one JSON object")
    _threads_option(reference)
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
