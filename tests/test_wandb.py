"""W&B logging for real, in offline mode, read back from the files W&B wrote."""
import json

import pytest

from dpbench.cli import main
from tests.wandb_log import records


def logged(home):
    (log,) = (home / "wandb").glob("wandb/offline-run-*/run-*.wandb")
    config, history, summary = {}, [], {}
    for record in records(log):
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):  # the run's initial configuration, then any later updates
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update(as_dict(updates))
        elif kind == "history":
            history.append(as_dict(record.history.item))
        elif kind == "summary":
            summary.update(as_dict(record.summary.update))
    return config, history, summary


def as_dict(items):
    """W&B items name their key either as ``key`` or as a path of ``nested_key`` parts."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def test_offline_run_logs_config_epochs_and_final_record(isolated_home, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["run", "--method", "dpsgd", "--task", "breast_cancer", "--epsilon", "1", "--epochs", "3",
                 "--wandb-project", "dpbench-tests", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    config, history, summary = logged(isolated_home)
    assert config["method"] == "dpsgd" and config["data_id"] == "breast_cancer"
    assert config["hyperparameters"]["epochs"] == 3 and config["noise_multiplier"] == record["noise_multiplier"]
    spent = [row["privacy/epsilon_spent_rdp"] for row in history if "privacy/epsilon_spent_rdp" in row]
    # RDP per epoch (milliseconds, not a PLD from scratch): an upper bound, above the record's PLD ε, not far off.
    assert len(spent) == 3 and spent == sorted(spent) and record["epsilon"] <= spent[-1] <= 1.5 * record["epsilon"]
    assert summary["final/test_accuracy"] == pytest.approx(record["metrics"]["test_accuracy"])
    assert summary["final/epsilon"] == pytest.approx(record["epsilon"])
    assert json.loads(summary["dpbench_record"]) == record
    (run_dir,) = (isolated_home / "wandb" / "wandb").glob("offline-run-*")
    assert record["wandb_run"].endswith("/" + run_dir.name.split("-")[-1])


def test_no_wandb_unless_configured(isolated_home, monkeypatch, capsys):
    assert main(["run", "--method", "dpsgd", "--task", "breast_cancer", "--epochs", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["wandb_run"] is None
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["run", "--method", "dpsgd", "--task", "breast_cancer", "--epochs", "1", "--no-wandb"]) == 0
    assert not (isolated_home / "wandb").exists()


def test_release_methods_log_too(isolated_home, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["run", "--method", "amp", "--task", "breast_cancer", "--epsilon", "1", "--wandb-project", "t",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    config, _, summary = logged(isolated_home)
    assert config["method"] == "amp" and config["privacy_ledger"] == record["privacy_ledger"]
    assert summary["final/test_accuracy"] == pytest.approx(record["metrics"]["test_accuracy"])
    assert summary["final/epsilon"] == pytest.approx(record["epsilon"]) and record["wandb_run"]


@pytest.mark.parametrize("command", [
    ["run", "--method", "dpsgd", "--task", "breast_cancer", "--epsilon", "1", "--epochs", "1"],  # under Lightning
    ["run", "--method", "amp", "--task", "breast_cancer", "--epsilon", "1"],  # a release method's own run
    ["tune", "--method", "dpsgd", "--task", "breast_cancer", "--epsilon", "1", "--epochs", "1", "--trials", "2"]])
def test_a_logged_run_carries_no_command_line_nor_folder(isolated_home, monkeypatch, capsys, command):
    """W&B records the process's command line and host unless told not to: a tuned release's run file held the
    ``--storage`` URL with its password (a review of 28 November). Every dpbench run turns W&B's metadata off; the
    configuration and record (which name no storage) are what a run publishes."""
    import sys

    monkeypatch.setenv("WANDB_MODE", "offline")
    secret = "postgresql://alice:s3cret-canary@db.internal:5432/studies"
    monkeypatch.setattr(sys, "argv", ["dpbench", *command, "--storage", secret])
    assert main([*command, "--wandb-project", "t", "--json"]) == 0
    capsys.readouterr()
    (log,) = (isolated_home / "wandb").glob("wandb/offline-run-*/run-*.wandb")
    content = log.read_bytes()
    assert b"s3cret-canary" not in content and b"db.internal" not in content
    assert str(isolated_home).encode() not in content  # the folder of the default study storage
