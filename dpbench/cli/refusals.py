"""Bad input refused before the modules that train are imported (tests/test_cli.py checks which modules load): the
request's values, names and δ checked from files, and the one line on stderr, exit 2, of any refusal."""
from __future__ import annotations

import argparse
import sys

from dpbench import catalog, checks
from dpbench.errors import UsageError

EXIT_USAGE = 2


def _settings(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """``--set`` pairs as a dict; a key given twice is refused rather than silently keeping the last."""
    settings: dict[str, str] = {}
    for key, value in pairs:
        if key in settings and settings[key] != value:
            raise UsageError(f"--set {key} given twice ({settings[key]!r} and {value!r}); give it once")
        settings[key] = value
    return settings


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
