"""Weights & Biases logging: on when W&B is configured, offline whenever it could not be reached.

A run logs its configuration (method, task, data id, seed, hyperparameters, privacy mechanism, versions), the
test metrics and the ε spent so far after every epoch, and at the end its full record (``dpbench_record`` in the
run summary, as JSON), from which ``dpbench leaderboard --from-wandb`` rebuilds leaderboards: a record's
``run_id`` is a hash of its content, so records logged from several machines merge without duplicates.
"""
from __future__ import annotations

import json
import netrc
import os
import socket
from dataclasses import dataclass
from typing import Any

from dpbench.data.files import dpbench_home

WANDB_HOST = "api.wandb.ai"


@dataclass(frozen=True)
class WandbSettings:
    project: str
    entity: str | None
    mode: str  # "online" or "offline"


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators(WANDB_HOST) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _reachable(host: str = WANDB_HOST, timeout: float = 2.0) -> bool:
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def wandb_settings(project: str | None, entity: str | None, disabled: bool) -> WandbSettings | None:
    """None when logging is off: ``--no-wandb``, or W&B neither named (``--wandb-project``, ``WANDB_PROJECT``) nor
    configured (an API key, ``WANDB_MODE``). ``WANDB_MODE`` is respected; otherwise online only with an API key
    and a reachable server, so that a run never waits for W&B."""
    if disabled or os.environ.get("WANDB_MODE") == "disabled":
        return None
    project = project or os.environ.get("WANDB_PROJECT")
    if not (project or os.environ.get("WANDB_MODE") or _has_api_key()):
        return None
    mode = os.environ.get("WANDB_MODE") or ("online" if _has_api_key() and _reachable() else "offline")
    return WandbSettings(project or "dpbench", entity or os.environ.get("WANDB_ENTITY"), mode)


#: W&B's settings for every dpbench run: quiet, and none of W&B's own metadata (the command line, which can hold a
#: ``--storage`` URL with its password or a study's folder, the host, the program, git state, code): a run publishes
#: its configuration and record only (a review of 28 November found the storage URL in a tuned release's run file).
RUN_SETTINGS = {"silent": True, "x_disable_meta": True, "disable_git": True, "save_code": False, "disable_code": True}


def _save_dir() -> str:
    save_dir = dpbench_home() / "wandb"
    save_dir.mkdir(parents=True, exist_ok=True)
    return str(save_dir)


def make_logger(settings: WandbSettings, config: dict[str, Any]):
    """Lightning's ``WandbLogger`` writing under ``$DPBENCH_HOME/wandb``, for runs trained under Lightning."""
    from pytorch_lightning.loggers import WandbLogger

    return WandbLogger(project=settings.project, entity=settings.entity, mode=settings.mode, save_dir=_save_dir(),
                       config=config, settings=dict(RUN_SETTINGS))


def start_run(settings: WandbSettings, config: dict[str, Any]):
    """A W&B run for runs outside Lightning (output and objective perturbation)."""
    import wandb

    return wandb.init(project=settings.project, entity=settings.entity, mode=settings.mode, dir=_save_dir(),
                      config=config, settings=wandb.Settings(**RUN_SETTINGS))


def finish(run, record: dict[str, Any] | None) -> None:
    """Write the final metrics, ε and the whole record to the run summary and close the run (failed if no record)."""
    import wandb

    if record is not None:
        run.summary.update({**{f"final/{k}": v for k, v in record["metrics"].items()},
                            "final/epsilon": record["epsilon"], "final/delta": record["delta"],
                            "run_id": record["run_id"], "dpbench_record": json.dumps(record, sort_keys=True)})
    run.finish(exit_code=0 if record is not None else 1)
    wandb.teardown()


def records_from_wandb(path: str) -> list[dict[str, Any]]:
    """The dpbench records logged to a W&B project ``ENTITY/PROJECT`` (needs network and an API key)."""
    import wandb

    from dpbench.errors import UsageError

    try:
        return [json.loads(run.summary["dpbench_record"]) for run in wandb.Api().runs(path)
                if "dpbench_record" in run.summary]
    except Exception as error:  # noqa: BLE001 (W&B's errors: no API key, network, no such project, bad JSON)
        raise UsageError(f"cannot read the records of W&B project {path}: {type(error).__name__}: {error}") from None
