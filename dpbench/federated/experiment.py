"""``dpbench federated``: one FedAvg run of the seed paper's federated experiments (Koskela & Honkela,
"Learning Rate Adaptation for Federated and Differentially Private Learning", AISTATS 2020, Section "Federated
learning experiments", Figures 1-3), from settings to record. The algorithm is :mod:`dpbench.federated.fedavg`.

Data: the ``cifar10`` task (:class:`dpbench.tasks.cifar.CIFAR10ADADP`) with its frozen, pretrained convolutions'
cached 1600 features per image; only its fully connected 1600-500-500-10 head trains (the paper trains the whole
network in its federated experiments; the issue takes the task's pretraining so that rounds are cheap). The
clients' images come from the task's private training split (here the 40,000 CIFAR-10 images after the 10,000
public ones, 4,000 per class: 8,000 per client, not the paper's 10,000), the test metrics from CIFAR-10's 10,000
test images. Each round every client trains one local epoch from the global model, then the server averages.

Ambiguity: whether a client's optimizer state (ADADP's η, Adam's moments) survives the averaging. The paper's η is
indexed by the step ℓ of one sequence and its η0 is "the initial" learning rate (Figure 2(b)), and a PyTorch client
that keeps its optimizer while the server overwrites its weights keeps it too. So by default (``client_state`` =
``keep``) each client keeps its state across rounds and only its weights are replaced; ``reset`` starts every
round from η0 and zero moments, McMahan et al.'s stateless ClientUpdate.

No privacy is claimed: the clients' updates are exact gradients of their data. Records have ``"kind":
"federated"``; the leaderboard and the sweep read only ``run`` records (:func:`dpbench.results.store.load`).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from dpbench import threads
from dpbench.data import stages
from dpbench.checks import check_seed
from dpbench.errors import UsageError
from dpbench.federated.fedavg import (CLIENT_CLASSES, CLIENT_METHODS, CLIENTS, StackedModel, available_client_size, average,
                                      client_split, local_round, make_clients, round_summary)
from dpbench.privacy import streams
from dpbench.results import records, store, tracking
from dpbench.task import Task

TASKS = ("cifar10",)
#: The paper's setting: 200 rounds ("after 200 communication rounds", Figure 2), |B| = 10, one local epoch of
#: 10,000 images per client (0 here: every image the task's private split has for the client's classes).
SETTINGS = {"rounds": 200, "batch_size": 10, "client_size": 0, "client_state": "keep"}
CLIENT_STATES = ("keep", "reset")
#: Initial learning rates: ADADP's η0 and SGD's η at 10^-2, the middle of the paper's SGD grid
#: {10^-2.5, 10^-2, 10^-1.5}; Adam's at 10^-5, the middle of its grid {10^-5.5, 10^-5, 10^-4.5} (Figure 3).
HYPERPARAMETERS = {
    "ada_dp": {"lr": 1e-2, "tol": 0.1, "alpha_min": 0.9, "alpha_max": 1.1},
    "sgd": {"lr": 1e-2},
    "adam": {"lr": 1e-5, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
}
#: ``paper``: the paper's setting (the defaults). ``smoke``: end to end in seconds, on 2,000 private images after
#: pretraining for one epoch on 1,000 public ones (the ``cifar10`` task's smoke options).
PROFILES = {
    "paper": {},
    "smoke": {"rounds": 2, "client_size": 200,
              "task_options": {"train_limit": 2000, "pretrain_epochs": 1, "pretrain_limit": 1000}},
}


@dataclass
class FederatedSpec:
    """What ``dpbench federated`` was asked for; None means the profile's or the default value."""

    client_method: str
    random_fraction: str  # a number or a fraction such as "1/3"
    task: str = "cifar10"
    rounds: int | None = None
    batch_size: int | None = None
    client_size: int | None = None
    client_state: str | None = None
    lr: float | None = None
    overrides: dict[str, str] = field(default_factory=dict)  # the client method's other hyperparameters
    profile: str | None = None
    seed: int = 0
    progress_bar: bool = True
    store_path: Path | None = None
    wandb_project: str | None = None
    wandb_entity: str | None = None
    no_wandb: bool = False


# --- a run ----------------------------------------------------------------------------------------------------------

def parse_fraction(text: str) -> float:
    """``--random-fraction``: a number or a fraction ("1/3") in [0, 1]."""
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"random fraction must be a number or a fraction such as 1/3, got {text!r}") from None
    if not 0 <= value <= 1:
        raise UsageError(f"random fraction must lie in [0, 1], got {text}")
    return float(value)


def _coerce(key: str, text: str, default: Any) -> Any:
    try:
        return type(default)(text)
    except ValueError:
        raise UsageError(f"{key}={text!r} is not a valid {type(default).__name__}") from None


def resolve(spec: FederatedSpec) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(settings, client hyperparameters, task options): defaults < profile < command line, checked."""
    if spec.client_method not in CLIENT_METHODS:
        raise UsageError(f"unknown client method {spec.client_method!r}; choose one of {', '.join(CLIENT_METHODS)}")
    if spec.task not in TASKS:
        raise UsageError(f"federated learning runs on task cifar10 only (the paper's split is of CIFAR-10's classes), "
                         f"not {spec.task!r}")
    if spec.profile is not None and spec.profile not in PROFILES:
        raise UsageError(f"no federated profile {spec.profile!r}; profiles: {', '.join(PROFILES)}")
    check_seed(spec.seed)
    profile = PROFILES.get(spec.profile, {})
    settings = {**SETTINGS, **{k: v for k, v in profile.items() if k in SETTINGS}}
    settings["random_fraction"] = parse_fraction(spec.random_fraction)
    for key in ("rounds", "batch_size", "client_size", "client_state"):
        if getattr(spec, key) is not None:
            settings[key] = getattr(spec, key)
    if settings["rounds"] < 1 or settings["batch_size"] < 1:
        raise UsageError(f"rounds and batch size must be at least 1, got {settings['rounds']}, {settings['batch_size']}")
    if settings["client_size"] < 0 or settings["client_size"] % 2:
        raise UsageError(f"client size must be an even number (two classes each), got {settings['client_size']}")
    if settings["client_state"] not in CLIENT_STATES:
        raise UsageError(f"client state must be one of {', '.join(CLIENT_STATES)}, got {settings['client_state']!r}")
    hp = dict(HYPERPARAMETERS[spec.client_method])
    if spec.lr is not None:
        hp["lr"] = spec.lr
    for key, text in spec.overrides.items():
        if key not in hp:
            raise UsageError(f"client method {spec.client_method} has no hyperparameter {key!r}; "
                             f"valid: {', '.join(sorted(hp))}")
        hp[key] = _coerce(key, text, hp[key])
    if not all(math.isfinite(v) and v > 0 for v in hp.values()):
        raise UsageError(f"hyperparameters must be finite and positive, got {hp}")
    if spec.client_method == "ada_dp" and not hp["alpha_min"] <= 1 <= hp["alpha_max"]:
        raise UsageError(f"need alpha_min <= 1 <= alpha_max, got {hp['alpha_min']}, {hp['alpha_max']}")
    if spec.client_method == "adam" and not (hp["beta1"] < 1 and hp["beta2"] < 1):
        raise UsageError(f"Adam's betas must lie in (0, 1), got {hp['beta1']}, {hp['beta2']}")
    return settings, hp, dict(profile.get("task_options", {}))


def _code() -> dict[str, str]:
    """sha256 of this module and :mod:`dpbench.federated.fedavg` (the client rules live there, not in a method
    plugin)."""
    folder = Path(__file__).parent
    return {f"dpbench/federated/{name}": hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in ("fedavg.py", "experiment.py")}


CODE = _code()  # at import: the code this process runs, even if the files change later


@torch.no_grad()
def evaluate(model: StackedModel, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """The global model's mean test metrics (``test_accuracy``, ``test_loss``), in slices of 2,000 images."""
    sums: dict[str, float] = {}
    stacked = [p.unsqueeze(0) for p in params]
    for xs, ys in zip(x.split(2000), y.split(2000)):
        outputs = model.forward(stacked, xs.unsqueeze(0))[0]
        for name, values in model.task.per_example_metrics(outputs, ys).items():
            sums[name] = sums.get(name, 0.0) + float(values.sum())
    return {f"test_{name}": total / len(y) for name, total in sums.items()}


def run(spec: FederatedSpec) -> dict[str, Any]:
    """Train FedAvg as ``spec`` says, append its record to the results store and return it."""
    from dpbench.tasks.cifar import CIFAR10ADADP

    settings, hp, task_options = resolve(spec)
    streams.seed_run(spec.seed)
    task = CIFAR10ADADP(**task_options)
    threads.fit()  # one thread (or the user's count): batches of 10 on a small head (dpbench/threads.py)
    data = task.prepare(spec.seed)  # cached features; the head's initial weights from stream "init"
    available = available_client_size(data.y_train)
    size = settings["client_size"] or available
    if size > available:
        raise UsageError(f"client size {size} exceeds the {available} images per client that {data.data_id} holds "
                         f"for the paper's class pairs")
    model = StackedModel(task)
    params = model.stack(CLIENTS)
    clients = make_clients(spec.client_method, params, hp)
    per_step = clients[0].batches_per_step
    if per_step * settings["batch_size"] > size:
        raise UsageError(f"batch size {settings['batch_size']} leaves no local step on {size} images per client")
    settings["client_size"] = size
    split = client_split(data.y_train, settings["random_fraction"], size, spec.seed)
    x = torch.stack([data.x_train[index] for index in split])
    y = torch.stack([data.y_train[index] for index in split])
    weights = torch.tensor([len(index) for index in split], dtype=torch.float64) / sum(map(len, split))
    steps = size // (settings["batch_size"] * per_step)  # local steps per round: one epoch
    record: dict[str, Any] = {
        "kind": "federated", "task": spec.task, "method": "fedavg", "client_method": spec.client_method,
        "data_id": data.data_id, "data_note": data.note, "preprocessing": data.preprocessing,
        "n_train": CLIENTS * size, "n_test": len(data.x_test), "seed": spec.seed, "profile": spec.profile,
        "hyperparameters": hp, "overrides": dict(spec.overrides),
        "settings": {**settings, "clients": CLIENTS, "client_fraction": 1, "local_epochs": 1, "local_steps": steps},
        "split": {"client_classes": [list(pair) for pair in CLIENT_CLASSES],
                  "class_counts": [y[k].bincount(minlength=10).tolist() for k in range(CLIENTS)],
                  "random_fraction_text": spec.random_fraction},
        "trains": "the cifar10 task's fully connected head (1600-500-500-10); its convolutions stay frozen",
        "private": False, "epsilon": None, "delta": None,
        "versions": records.versions(), "git_commit": records.git_commit(),
        "code": {"federated": CODE, "task": records.code_of(CIFAR10ADADP, Task)},
        "ledger_version": records.LEDGER_VERSION,
    }
    wandb_settings = tracking.wandb_settings(spec.wandb_project, spec.wandb_entity, spec.no_wandb)
    wandb_run = tracking.start_run(wandb_settings, record) if wandb_settings else None
    history = []
    started = time.perf_counter()
    try:
        bar = stages.bar(range(1, settings["rounds"] + 1), desc=f"fedavg {spec.client_method} {spec.random_fraction}",
                         unit="round", disable=not spec.progress_bar)
        for round_number in bar:
            if settings["client_state"] == "reset" and round_number > 1:
                clients = make_clients(spec.client_method, params, hp)
            local_round(clients, model, x, y, settings["batch_size"], spec.seed, round_number)
            global_params = average(params, weights)
            with torch.no_grad():
                for param, mean in zip(params, global_params):
                    param.copy_(mean.expand_as(param))
            entry = {"round": round_number, **evaluate(model, global_params, data.x_test, data.y_test),
                     **round_summary(clients)}
            history.append(entry)
            bar.set_postfix(acc=f"{entry['test_accuracy']:.4f}", refresh=False)
            if wandb_run is not None:
                wandb_run.log({k: v for k, v in entry.items() if not isinstance(v, list)}, step=round_number)
    except BaseException:
        if wandb_run is not None:
            tracking.finish(wandb_run, None)
        raise
    record.update({
        "steps": settings["rounds"] * steps,
        "gradient_evaluations": settings["rounds"] * steps * per_step * CLIENTS,
        "train_seconds": time.perf_counter() - started,
        "metrics": {k: history[-1][k] for k in ("test_accuracy", "test_loss")},
        "history": history,
        "wandb_run": wandb_run.path if wandb_run is not None else None,
    })
    records.seal(record)
    if wandb_run is not None:
        wandb_run.summary.update({**{f"final/{k}": v for k, v in record["metrics"].items()},
                                  "run_id": record["run_id"], "dpbench_federated_record": json.dumps(record)})
        wandb_run.finish()
        import wandb

        wandb.teardown()
    store.append(record, spec.store_path)
    return record
