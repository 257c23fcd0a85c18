"""The ``dpbench`` command: ``run``, ``tune``, ``federated``, ``list``, ``privacy``, ``sweep``, ``leaderboard``,
``fidelity``, ``reference``, ``audit``, ``verify``, ``runs``, ``show``. Bad input: one line on stderr, exit 2; a tuning
study that cannot release anything, or a reference that does not converge: one line, exit 1.

Here the dispatch; the parser is :mod:`dpbench.cli.parser`, the refusals made before anything heavy is imported
:mod:`dpbench.cli.refusals`, and what each command does :mod:`dpbench.cli.commands`."""
from __future__ import annotations

import json
import os
import sys

# Only light modules here: --help, list and the refusals of bad input must not wait for PyTorch, Lightning, W&B
# or Optuna (seconds); each command imports what it needs (tests/test_cli.py checks which modules load).
from dpbench import threads
from dpbench.cli.commands import (_audit, _federated, _federated_summary, _names, _privacy, _reference, _run,
                                  _summary, _tune, _tune_summary, _verify)
from dpbench.cli.parser import _parser
from dpbench.cli.refusals import _refuse
from dpbench.data import stages
from dpbench.data.files import DataError
from dpbench.errors import PrivacyCheckFailed, RegistryError, TuningError, UsageError
from dpbench.run import allocator

TRAINING = ("run", "tune", "audit", "sweep", "federated", "reference")  # commands that train: threads, progress


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

            grid = sweep.load_grid(args.grid)
            counts = sweep.run_grid(grid, args.workers, scheduler=args.scheduler,
                                    threads=threads.requested(args.threads)[0])
            print(", ".join(f"{count} {what}" for what, count in counts.items()))
            if counts.get("failed"):
                print("dpbench: some cells failed (their tracebacks above); run the sweep again to retry them",
                      file=sys.stderr)
                return 1
        elif args.command == "leaderboard" and args.boundary_hits:
            from dpbench.board import boundary, leaderboard

            print(boundary.rates_markdown(leaderboard._tables(leaderboard.load(args.task, args.from_wandb, args.records),
                                                              leaderboard.grid_beside(args.records, args.grid))), end="")
        elif args.command == "leaderboard" and args.check:
            from dpbench.board import leaderboard

            problems = leaderboard.run_check(args.task, args.from_wandb, args.records, args.exceptions, args.grid)
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

            leaderboard.write(args.format, args.task, args.out, args.from_wandb, args.records, args.grid)
        elif args.command == "fidelity":
            from dpbench.board import fidelity

            text = fidelity.write(args.records, args.out)
            if args.out is None:
                sys.stdout.write(text)
        elif args.command == "reference":
            record = _reference(args)
            from dpbench.tuning import reference

            print(json.dumps(record) if args.json else reference.summary(record))
        elif args.command == "tune":
            record = _tune(args)
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
            record = _run(args)
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
