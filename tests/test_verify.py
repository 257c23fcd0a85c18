"""``dpbench verify`` (dpbench/verify.py) on records of small real runs of every kind the sweep and tuning make."""
import copy
import json

import pytest
import torch

from dpbench import audit, engine, multiseed, records, store, tuning, validation, verify
from dpbench.cli import main
from dpbench.engine import RunSpec


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


PLUGIN_TASK = '''
import dp_accounting
from dataclasses import replace
from dpbench.privacy import DataRelease
from dpbench.tasks.linear import Digits


class DigitsWithRelease(Digits):
    """digits, plus a (pretend) private release of its training data before training: a test of the ledger."""

    name = "digits_release"

    def load_data(self):
        release = DataRelease("a test release: Gaussian, sensitivity 1, sigma 20", dp_accounting.GaussianDpEvent(20.0))
        return replace(super().load_data(), private_releases=(release,))
'''


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """Records of every kind, from short real runs (digits, breast_cancer), as a JSON-lines file."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_thread, which comes after this module's fixture
    folder = tmp_path_factory.mktemp("verify")
    (folder / "plugins").mkdir()
    (folder / "plugins" / "digits_release.py").write_text(PLUGIN_TASK)
    store_path = folder / "results.sqlite"

    def run(method, task="digits", **changes):
        changes.setdefault("epsilon", 1.0 if method != "nonprivate" else None)
        changes.setdefault("overrides", {"epochs": 2} if method not in ("output_perturbation", "amp", "amp_nt") else {})
        return engine.run(RunSpec(method=method, task=task, progress_bar=False, no_wandb=True, append_to_store=False,
                                  store_path=store_path, **changes))

    sigma = {"epsilon": None, "noise_multiplier": 5.0}  # no calibration: faster
    found = {
        "dpsgd": run("dpsgd"),
        "rdp": run("dpsgd", accountant="rdp", **sigma),
        "shuffle": run("dpsgd", sampler="shuffle", **sigma),
        "replace-one": run("dpsgd", neighbouring="replace-one", **sigma),
        "dpgd": run("dpgd", overrides={"epochs": 3}, **sigma),
        "ada_dp": run("ada_dp", **sigma),
        "nonprivate": run("nonprivate"),
        "data release": run("dpsgd", task="digits_release", plugins=[str(folder / "plugins")], **sigma),
        "output_perturbation": run("output_perturbation", task="breast_cancer"),
        "amp": run("amp", task="breast_cancer"),
        "amp_nt": run("amp_nt"),
    }
    batch = multiseed.run_seeds(RunSpec(method="dpsgd", task="digits", epsilon=1.0, overrides={"epochs": 2},
                                        progress_bar=False, no_wandb=True, append_to_store=False), [0, 1])
    found["multiseed 0"], found["multiseed 1"] = batch
    for mode, trials in (("random-stopping", 2), ("adaptive", 2), ("oracle", 2)):
        found[f"tuned {mode}"] = tuning.tune(tuning.TuneSpec(
            method="dpsgd", task="digits", epsilon=1.0, mode=mode, trials=trials, overrides={"epochs": 1},
            storage=f"sqlite:///{folder / 'studies.db'}", store_path=store_path, no_wandb=True))
    found["tuned output_perturbation"] = tuning.tune(tuning.TuneSpec(
        method="output_perturbation", task="breast_cancer", epsilon=1.0, trials=2, neighbouring="replace-one",
        storage=f"sqlite:///{folder / 'studies.db'}", store_path=store_path, no_wandb=True))
    for method in ("output_perturbation", "amp", "nonprivate"):  # the board's validation track: ε of one run
        [found[f"validation {method}"]] = validation.run_cell(
            "breast_cancer", method, None if method == "nonprivate" else 1.0, [0], validation.TrackSettings(2),
            append_to_store=False)
    found["audit"] = audit.audit(audit.AuditSpec(method="dpsgd", task="digits", epsilon=1.0, canaries=100,
                                                 overrides={"epochs": 2}, store_path=store_path))
    path = folder / "genuine.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in found.values()))
    torch.set_num_threads(threads)
    return found, path


def write(tmp_path, *found):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in found))
    return str(path)


def forged(record, **changes):
    """``record`` with ``changes`` and a fresh content hash, as someone editing a file would make it."""
    record = copy.deepcopy(record)
    for key, value in changes.items():
        target = record
        *path, last = key.split(".")
        for part in path:
            target = target[int(part) if isinstance(target, list) else part]
        target[int(last) if isinstance(target, list) else last] = value(target[int(last) if isinstance(target, list)
                                                                               else last])
    return records.seal(record)


def test_the_hash_is_the_stores():
    record = {"b": 1, "a": [1.5, None, "é"], "run_id": "x"}
    assert verify.content_id(record) == store.content_id(record)


def test_genuine_records_of_every_kind_pass(genuine):
    found, path = genuine
    assert found["data release"]["data_release_events"] == [{"class_name": "GaussianDpEvent", "noise_multiplier": 20.0}]
    assert verify.verify(str(path)) == (len(found), [])


@pytest.mark.parametrize("kind, field", [
    ("dpsgd", "epsilon"), ("rdp", "epsilon"), ("shuffle", "epsilon"), ("replace-one", "epsilon"),
    ("dpgd", "epsilon"), ("ada_dp", "epsilon"), ("data release", "epsilon"), ("multiseed 1", "epsilon"),
    ("output_perturbation", "privacy_ledger.0.epsilon"), ("amp", "privacy_ledger.1.epsilon"),
    ("tuned random-stopping", "epsilon"), ("tuned adaptive", "tuning.per_trial_epsilon"),
    ("tuned oracle", "epsilon"), ("tuned output_perturbation", "epsilon"), ("validation amp", "epsilon"),
    ("audit", "epsilon_claimed"), ("audit", "epsilon_lower_bound")])
def test_an_edited_epsilon_fails(tmp_path, genuine, kind, field):
    record = forged(genuine[0][kind], **{field: lambda value: value * 0.8 + 0.003})
    count, problems = verify.verify(write(tmp_path, record))
    assert count == 1 and problems and record["run_id"] in problems[0], problems


@pytest.mark.parametrize("kind, field", [
    ("dpsgd", "noise_multiplier"), ("data release", "noise_multiplier"), ("rdp", "noise_multiplier"),
    ("output_perturbation", "privacy_ledger.0.noise_std"), ("amp", "privacy_ledger.0.noise_std"),
    ("amp_nt", "privacy_ledger.1.noise_std"), ("tuned random-stopping", "tuning.noise_multiplier"),
    ("tuned output_perturbation", "privacy_ledger.0.noise_std"),
    ("validation output_perturbation", "privacy_ledger.0.noise_std"),
    ("audit", "noise_multiplier"), ("dpsgd", "sample_rate"), ("dpsgd", "gradient_evaluations")])
def test_an_edited_mechanism_fails(tmp_path, genuine, kind, field):
    record = forged(genuine[0][kind], **{field: lambda value: value * 1.1 if isinstance(value, float) else value - 1})
    _, problems = verify.verify(write(tmp_path, record))
    assert problems, kind


def test_the_hash_the_ledger_version_and_unreadable_releases(tmp_path, genuine):
    record = genuine[0]["dpsgd"]
    edited = {**record, "seed": 7}  # not re-sealed
    old = forged(record, ledger_version=lambda value: 1)
    opaque = forged(genuine[0]["data release"], data_release_events=lambda value: [])
    nonprivate = forged(genuine[0]["nonprivate"], epsilon=lambda value: 0.5)
    _, problems = verify.verify(write(tmp_path, edited, old, opaque, nonprivate))
    assert [p.split(": ", 1)[1] for p in problems] == [
        f"run_id {record['run_id']} is not the content hash {verify.content_id(edited)}",
        f"ledger version 1, not the current {records.LEDGER_VERSION}",
        "its data releases have no machine-readable events (data_release_events)",
        "a non-private run with ε 0.5 and σ 0.0"]


def test_rerun_gives_the_same_metrics(tmp_path, genuine):
    found, _ = genuine
    kept = [found[k] for k in ("dpsgd", "output_perturbation", "nonprivate", "multiseed 0", "multiseed 1")]
    assert verify.verify(write(tmp_path, *kept), rerun_count=len(kept)) == (len(kept), [])
    lucky = forged(found["dpsgd"], **{"metrics.test_accuracy": lambda value: value + 0.01})
    _, problems = verify.verify(write(tmp_path, lucky), rerun_count=1)
    assert len(problems) == 1 and "rerun metrics" in problems[0]
    _, problems = verify.verify(write(tmp_path, found["multiseed 0"]), rerun_count=1)
    assert problems == [f"{found['multiseed 0']['run_id']}: trained in a batch of 2 seeds, of which the file "
                        f"holds 1: cannot rerun it exactly"]


def test_the_command(tmp_path, genuine, capsys, refused):
    found, path = genuine
    assert main(["verify", str(path)]) == 0
    assert capsys.readouterr().out == ""
    bad = forged(found["dpsgd"], epsilon=lambda value: value / 2)
    assert main(["verify", write(tmp_path, found["rdp"], bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"{bad['run_id']} (dpsgd on digits, seed 0): epsilon is")
    (tmp_path / "broken.jsonl").write_text(json.dumps(found["dpsgd"]) + "\n{not json\n")
    assert "line 2: not JSON" in refused("verify", str(tmp_path / "broken.jsonl"))
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    assert "not a dpbench record" in refused("verify", str(tmp_path / "list.jsonl"))
    assert "cannot read" in refused("verify", str(tmp_path / "missing.jsonl"))
    assert "--rerun" in refused("verify", str(path), "--rerun", "-1")
