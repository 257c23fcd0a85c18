"""Isolated methods (dpbench/run/isolation.py): the method's process cannot reach the training data, computes what the
in-process method computes, and the board marks plugins by how they ran (issue 31, item 3)."""
import shutil
import sys
from pathlib import Path

import pytest

from dpbench.board import leaderboard
from dpbench.errors import UsageError
from dpbench.results import store
from dpbench.run import engine
from dpbench.spec import RunSpec

CHEATERS = str(Path(__file__).parent / "cheaters")
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def run(method, task="breast_cancer", isolate=False, plugins=(CHEATERS,), **changes):
    changes.setdefault("overrides", {"epochs": 5})
    spec = RunSpec(method=method, task=task, epsilon=changes.pop("epsilon", 0.05), plugins=list(plugins),
                          progress_bar=False, no_wandb=True, isolate=isolate, **changes)
    return engine.run(spec)


def board_labels():
    """Every row label of the board built from the store's runs and audits (dpbench.board.leaderboard)."""
    return [label for table in leaderboard._tables(store.load(kind=None)) for label in table.row_labels().values()]


def test_the_evader_cheats_in_process_and_only_runs_dp_sgd_isolated():
    honest = run("dpsgd")
    cheating = run("cheat_audit_evader")
    isolated = run("cheat_audit_evader", isolate=True)
    assert (honest["isolation"], cheating["isolation"], isolated["isolation"]) == ("in-process", "in-process",
                                                                                    "process")
    # in-process it reaches the training module and takes unclipped full-batch steps: far above DP-SGD
    assert cheating["metrics"]["test_accuracy"] > honest["metrics"]["test_accuracy"] + 0.1
    # isolated, its process holds no training module: it takes DP-SGD's steps, the same to the last bit
    assert isolated["metrics"] == honest["metrics"]
    assert isolated["epsilon"] == honest["epsilon"] and isolated["gradient_evaluations"] == honest["gradient_evaluations"]
    assert isolated["code"]["method"] == cheating["code"]["method"]  # the same code hash: isolation is no new code


def test_the_board_never_certifies_an_in_process_plugin(mirror):
    from dpbench.trust import audit

    run("cheat_audit_evader")
    run("cheat_audit_evader", isolate=True)
    record = audit.audit(audit.AuditSpec(method="cheat_audit_evader", task="breast_cancer", epsilon=0.05,
                                         plugins=[CHEATERS]))
    assert record["passed"]  # it evades the audit: honest steps whenever it sees the audit's task
    labels = [label for label in board_labels() if label.startswith("cheat_audit_evader")]
    assert sorted(labels) == ["cheat_audit_evader [external plugin, isolated, audit passed]",
                              "cheat_audit_evader [external plugin, unverified: in-process plugin, audit passed]"]


@pytest.mark.parametrize("method_name, task, overrides", [
    ("adaclip", "digits", {"epochs": 1}),  # a CoordinateAffine transform, sent as data every release
    ("ada_dp", "digits", {"epochs": 1}),  # two releases per step, the second at θ½
    ("dpadam_bc", "digits", {"epochs": 1}),  # the mechanism's facts (bias correction)
])
def test_built_in_methods_compute_the_same_isolated(method_name, task, overrides):
    spec = dict(epsilon=1.0, overrides=overrides, plugins=())
    inside, outside = run(method_name, task, **spec), run(method_name, task, isolate=True, **spec)
    assert inside["metrics"] == outside["metrics"] and inside["hyperparameters"] == outside["hyperparameters"]


def test_the_training_process_never_imports_the_plugin(tmp_path):
    folder = tmp_path / "plugins"
    shutil.copytree(CHEATERS, folder)
    before = set(sys.modules)
    run("cheat_audit_evader", isolate=True, plugins=[str(folder)], overrides={"epochs": 1})
    assert not [name for name in set(sys.modules) - before if name.startswith("dpbench_plugin_")]


def test_a_transform_that_is_code_is_refused_isolated(refused):
    message = refused("run", "--method", "cheat_keep_gradients", "--task", "breast_cancer", "--isolate",
                      "--plugins", CHEATERS)
    assert "per_example_transform is code" in message


def test_a_method_that_changes_the_clip_is_refused_isolated(tmp_path):
    (tmp_path / "loosen.py").write_text(
        "from dpbench.methods.dpsgd import DPSGD\n\n\n"
        "class Loosen(DPSGD):\n    name = 'loosen_clip'\n    description = 'sets C to 1e9 in setup'\n\n"
        "    def setup(self):\n        self.hp['clip'] = 1e9\n        super().setup()\n")
    with pytest.raises(UsageError, match="changed the engine's clip"):
        run("loosen_clip", isolate=True, plugins=[str(tmp_path)])


def test_a_crashing_isolated_method_is_reported():
    with pytest.raises(RuntimeError, match="no training module on the stack"):
        run("cheat_stack_walker", isolate=True, overrides={"epochs": 1})


def test_a_plugin_naming_its_module_as_a_built_ins_is_still_an_external_plugin(tmp_path):
    """The review's masquerade: a plugin file that sets ``__name__ = "dpbench.methods.sneaky"`` was recorded as
    built-in (no plugin mark on the board). A method described by the isolated process is a plugin, whatever it
    says of itself."""
    from dpbench.run import isolation

    (tmp_path / "sneaky.py").write_text(
        "import sys\n_real = __name__\n"
        '__name__ = "dpbench.methods.sneaky"\n'
        "sys.modules[__name__] = sys.modules[_real]\n"
        "from dpbench.methods.dpsgd import DPSGD\n\n\n"
        "class Sneaky(DPSGD):\n"
        '    name = "sneaky"\n'
        '    description = "DP-SGD calling itself built-in (test plugin)"\n')
    method = isolation.describe("sneaky", [tmp_path])
    assert method.code["external"] is True and isolation.code_of(method)["external"] is True
