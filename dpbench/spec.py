"""What a run asks for, and its resolution against a method and a task: :class:`RunSpec`, the defaults' order
(method < engine < task < task's per-method < profile < command line), profiles and ``--set`` overrides.

Below both run paths: the gradient engine (:mod:`dpbench.run.engine`) and the one-shot release methods
(:mod:`dpbench.release.runner`) resolve a spec with these functions. Imports only the plugin contract and the
request checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpbench.checks import check_finite, check_hyperparameter
from dpbench.errors import UsageError
from dpbench.method import Method
from dpbench.task import Task

#: Hyperparameters the engine itself uses; tasks override them, then the command line.
ENGINE_DEFAULTS: dict[str, Any] = {"epochs": 10, "batch_size": 64, "clip": 1.0}


@dataclass
class RunSpec:
    """What a user asked for. ``overrides`` holds ``--epochs``/``--batch-size``/``--lr``/``--clip``/``--set``."""

    method: str
    task: str
    epsilon: float | None = None
    noise_multiplier: float | None = None
    #: ``noise_multiplier`` is the one charged, of the gradient and the extra releases on its batch together
    #: (``dpbench.privacy.accounting.combined_noise_multiplier``), which the engine splits into the gradient's σ and
    #: the count's σ_b: a private tuning's trials, whose mechanism is the same Gaussian for every trial.
    noise_is_combined: bool = False
    delta: float | None = None
    seed: int = 0
    #: The seed drawn from the OS's entropy instead (streams.secret_seed) and never written: the record, W&B and the
    #: logs say "secret" (docs/privacy.md, "Threat model").
    secret_seed: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    profile: str | None = None
    sampler: str | None = None
    accountant: str = "pld"
    neighbouring: str | None = None  # "add-remove" or "replace-one"; None: the sampler's (privacy.default_relation)
    force_delta: bool = False
    accelerator: str = "cpu"
    devices: int = 1  # processes (ranks) training together: dpbench.run.distributed
    strategy: str | None = None  # "ddp" (the only one, and the default with devices > 1)
    clipping: str = "fast"  # per-example clipping: "fast" (dpbench.privacy.ghost) or "reference" (torch.func.vmap)
    noise: str = "fast"  # Gaussian sampler: "fast" (dpbench.privacy.noise: Philox on the CPU) or "torch" (PyTorch's normal_)
    checkpoint_dir: str | None = None  # dpbench.run.checkpoint: where the run keeps its checkpoints
    resume: bool = False  # continue the run whose checkpoint is in checkpoint_dir
    checkpoint_every: int = 100  # steps between checkpoints (and one at every epoch's end)
    plugins: list[str] = field(default_factory=list)
    progress_bar: bool = True
    store_path: Path | None = None
    wandb_project: str | None = None
    wandb_entity: str | None = None
    no_wandb: bool = False
    #: Tuning trials (``dpbench.tuning.trials``): an object whose ``split(data)`` holds out a fixed, data-independent
    #: part of the training data before training, returning (training part, held-out part), and whose
    #: ``score(task, held_out)`` scores the trained model on it; its result is the record's ``validation``.
    validation: Any = None
    append_to_store: bool = True  # False for tuning trials: only the selected trial is released
    #: The record's ``tuning`` (e.g. the validation track's selection, ``dpbench.tuning.validation``); None: untuned.
    tuning: dict[str, Any] | None = None
    #: Run the method in a process of its own (dpbench.run.isolation); the record's "isolation". Its gradient noise is
    #: keyed by a secret, never written (the record's "noise_coins": "secret").
    isolate: bool = False


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Parse a ``--set`` value as the type of the default it replaces; NaN and infinity are refused."""
    if isinstance(value, str) and not isinstance(default, str):
        try:
            if isinstance(default, bool):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                value = value.lower() in ("true", "1")
            elif isinstance(default, int):
                value = int(value)
            elif isinstance(default, float):
                value = float(value)
        except ValueError:
            raise UsageError(f"{key}={value!r} is not a valid {type(default).__name__}") from None
    check_finite(key, value)
    return value


BUDGET_KEYS = ("epsilon", "noise_multiplier", "delta")


def profile_settings(task: type[Task], method_name: str, profile: str | None) -> dict[str, Any]:
    """The settings of the task's ``profile`` for ``method_name`` (its per-method entries win); {} for None."""
    if profile is None:
        return {}
    if profile not in task.profiles:
        known = ", ".join(task.profiles) or "none"
        raise UsageError(f"task {task.name} has no profile {profile!r}; profiles: {known}")
    settings = {key: value for key, value in task.profiles[profile].items() if key != "methods"}
    settings.update(task.profiles[profile].get("methods", {}).get(method_name, {}))
    return settings


def apply_overrides(hp: dict[str, Any], task: type[Task], method_name: str, overrides: dict[str, Any],
                    options: dict[str, Any] | None = None):
    """The command line's values over ``hp`` and the task's options; returns (hyperparameters, task options).

    Unknown keys are refused with the list of valid ones."""
    options = dict(task.options if options is None else options)
    for key, value in overrides.items():
        if key in options:
            options[key] = _coerce(key, value, options[key])
        elif key in hp:
            hp[key] = _coerce(key, value, hp[key])
        else:
            valid = ", ".join(sorted([*hp, *options])) or "none"
            raise UsageError(f"{method_name} on {task.name} has no hyperparameter {key!r}; valid: {valid}")
    return hp, options


def resolve_hyperparameters(method: type[Method], task: type[Task], overrides: dict[str, Any],
                            profile: str | None = None):
    """Method defaults < engine defaults < task defaults (a full-batch method's epochs: the task's ``steps``) <
    task's per-method defaults < profile < command line.

    Returns (hyperparameters, task options). A profile's keys that are neither a hyperparameter of this method
    nor a task option (e.g. another method's) are skipped; its budget keys are read by :func:`plan`.
    """
    hp = {**method.defaults, **ENGINE_DEFAULTS}
    if not method.private:
        del hp["clip"]
    options = dict(task.options)
    profiled = profile_settings(task, method.name, profile)
    task_level = dict(task.defaults)
    if method.full_batch and "steps" in task_level:  # a full-batch method's epochs are its steps
        task_level["epochs"] = task_level["steps"]
    for source in (task_level, task.method_defaults.get(method.name, {}), profiled):
        hp.update({key: value for key, value in source.items() if key in hp})
    options.update({key: value for key, value in profiled.items() if key in options})
    hp, options = apply_overrides(hp, task, method.name, overrides, options)
    for key, value in hp.items():
        check_hyperparameter(key, value)
    return hp, options
