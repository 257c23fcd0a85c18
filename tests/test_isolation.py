"""Isolated methods (dpbench/run/isolation.py): the method's process cannot reach the training data nor the noise,
computes what the in-process method computes, and the board marks plugins by how they ran (issue 31, item 3)."""
import importlib.util
import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpbench import registry
from dpbench.board import leaderboard
from dpbench.errors import UsageError
from dpbench.method import GradientMechanism, Method
from dpbench.methods.dpsgd import DPSGD
from dpbench.privacy import streams
from dpbench.results import records, store
from dpbench.run import engine, isolation, planning
from dpbench.spec import RunSpec

CHEATERS = str(Path(__file__).parent / "cheaters")
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def run(method, task="breast_cancer", isolate=False, plugins=(CHEATERS,), **changes):
    changes.setdefault("overrides", {"epochs": 5})
    spec = RunSpec(method=method, task=task, epsilon=changes.pop("epsilon", 0.05), plugins=list(plugins),
                   progress_bar=False, no_wandb=True, isolate=isolate, **changes)
    return engine.run(spec)


def cli_run(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> dict:
    """The record of ``dpbench run ARGS --json`` run as a command of its own (after ``prefix``): its arguments, the
    seed among them, are on its command line, as when a user types it."""
    result = subprocess.run([*prefix, str(Path(sys.executable).parent / "dpbench"), "run", *args, "--no-wandb",
                             "--json"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def same_noise_as_in_process(monkeypatch):
    """An isolated run's noise has a secret key (``streams.secret_seed``): fixed here to the run's seed (0), so that
    the isolated and in-process runs draw the same noise and can be compared bit for bit."""
    monkeypatch.setattr(streams, "secret_seed", lambda: 0)


def board_labels():
    """Every row label of the board built from the store's runs and audits (dpbench.board.leaderboard)."""
    return [label for table in leaderboard._tables(store.load(kind=None)) for label in table.row_labels().values()]


def test_the_evader_cheats_in_process_and_only_runs_dp_sgd_isolated(monkeypatch):
    same_noise_as_in_process(monkeypatch)
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
                                         canaries=200, plugins=[CHEATERS]))
    # it cannot tell the audit's task from a run's (issue 31), so it cheats under the audit too, and is caught
    assert not record["passed"] and record["epsilon_lower_bound"] > 0.05 >= record["epsilon_claimed"]
    labels = [label for label in board_labels() if label.startswith("cheat_audit_evader")]
    assert sorted(labels) == ["cheat_audit_evader [external plugin, isolated, audit failed]",
                              "cheat_audit_evader [external plugin, unverified: in-process plugin, audit failed]"]


@pytest.mark.parametrize("method_name, task, overrides", [
    ("adaclip", "digits", {"epochs": 1}),  # a CoordinateAffine transform, sent as data every release
    ("ada_dp", "digits", {"epochs": 1}),  # two releases per step, the second at θ½
    ("dpadam_bc", "digits", {"epochs": 1}),  # the mechanism's facts (bias correction)
])
def test_built_in_methods_compute_the_same_isolated(method_name, task, overrides, monkeypatch):
    same_noise_as_in_process(monkeypatch)
    spec = dict(epsilon=1.0, overrides=overrides, plugins=())
    inside, outside = run(method_name, task, **spec), run(method_name, task, isolate=True, **spec)
    assert inside["metrics"] == outside["metrics"] and inside["hyperparameters"] == outside["hyperparameters"]
    assert (inside["clipping"], outside["clipping"]) == ("ghost", "ghost-exact")  # norms an isolated method cannot cancel


def test_an_isolated_runs_batches_are_not_the_public_seeds(monkeypatch):
    """A hostile review (26 November 2026): the sampler's coins followed from the public seed, so an isolated method
    knew every batch's members, and the ε that holds against it was about 5, not 1, on digits at its defaults."""
    monkeypatch.setattr(streams, "secret_seed", lambda: 12345)
    spec = dict(method="dpsgd", task="digits", epsilon=1.0, progress_bar=False, no_wandb=True)
    public, isolated = (planning.plan(RunSpec(**spec, isolate=isolate), calibrate=False) for isolate in (False, True))
    assert isolated.record["sampler_coins"] == "secret" and "sampler_coins" not in public.record
    first_batches = [[batch.tolist() for batch in step] for step, _ in zip(public.sampler, range(3))]
    assert first_batches != [[batch.tolist() for batch in step] for step, _ in zip(isolated.sampler, range(3))]


def test_isolated_runs_never_load_installed_packages(monkeypatch):
    """A hostile review (26 November 2026): an installed package's entry point was imported into the training
    process under --isolate, and its module code could replace the noise's secret key."""
    loaded = []

    class Entry:
        def load(self):
            loaded.append(True)
            raise AssertionError("an installed package's code ran in the training process")

    monkeypatch.setattr(registry, "_entry_points", lambda group, path: (Entry(),))
    method, task = planning.registered("dpsgd", "digits", [], isolate=True)
    assert (method.name, task.name, loaded) == ("dpsgd", "digits", [])


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


# ---- the noise, the seed and the parent's memory (issue 31, item 3: the review's attacks on --isolate) ----------

def test_the_noise_subtractor_gains_nothing_isolated():
    """The review's attack (tests/cheaters/noise_subtractor.py): the seed on the command line gave away the noise,
    which the method subtracted. In process it still does (an in-process plugin is unverified anyway: the attack is
    the right one); isolated the noise has a secret key, so subtracting the seed's noise only adds noise."""
    honest = run("dpsgd", "digits", seed=5, overrides={})["metrics"]["test_accuracy"]
    args = ["--method", "cheat_noise_subtractor", "--task", "digits", "--epsilon", "0.05", "--seed", "5",
            "--plugins", CHEATERS]
    in_process, isolated = cli_run(*args), cli_run(*args, "--isolate")
    assert in_process["metrics"]["test_accuracy"] > honest + 0.4  # 0.82 against 0.17
    assert isolated["metrics"]["test_accuracy"] < honest + 0.1  # before the secret key: 0.82 too
    assert (in_process["isolation"], isolated["isolation"]) == ("in-process", "process")
    assert isolated["noise_coins"] == "secret" and "noise_coins" not in in_process


def test_isolated_noise_has_a_secret_key_written_nowhere(monkeypatch, isolated_home, capsys):
    """Two isolated runs of one seed draw other noise (the in-process run's is the seed's), and their noise's key is
    in no record, log, W&B file or store."""
    from dpbench.cli import main
    from tests.test_cli import revealing, written
    from tests.test_wandb import logged

    drawn, draw = [], streams.secret_seed
    monkeypatch.setattr(streams, "secret_seed", lambda: drawn.append(draw()) or drawn[-1])
    monkeypatch.setenv("WANDB_MODE", "offline")
    args = ["run", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--epochs", "2", "--json"]
    outputs = []
    for extra in (["--isolate", "--wandb-project", "dpbench-tests"], ["--isolate", "--no-wandb"], ["--no-wandb"]):
        assert main([*args, *extra]) == 0
        outputs.append(capsys.readouterr())
    first, second, in_process = (json.loads(out) for out, _ in outputs)
    assert len(set(drawn)) == 4 and first["noise_coins"] == second["noise_coins"] == "secret"  # noise, batches
    assert first["sampler_coins"] == second["sampler_coins"] == "secret" and "sampler_coins" not in in_process
    assert first["seed"] == second["seed"] == in_process["seed"] == 0 and "noise_coins" not in in_process
    assert len({json.dumps(r["metrics"]) for r in (first, second, in_process)}) == 3
    config, _, summary = logged(isolated_home)
    assert config["noise_coins"] == "secret" and json.loads(summary["dpbench_record"]) == first
    hidden = revealing(drawn)
    for text in [log for _, log in outputs] + [json.dumps([first, second, config, summary])]:
        assert not [value for value in hidden if value in text]
    for path, data in written(isolated_home).items():
        assert not [value for value in hidden if value.encode() in data], path


@pytest.mark.parametrize("args, message", [
    (["--checkpoint-dir", "ck"], "--isolate keeps no checkpoints"),
    (["--resume", "ck"], "--isolate keeps no checkpoints"),
    (["--devices", "2"], "--isolate runs the method beside one training process"),
])
def test_isolate_refuses_what_would_need_the_noise_key(refused, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    described = []
    monkeypatch.setattr(isolation, "describe", lambda *args: described.append(args))  # refused before it runs
    assert message in refused("run", "--method", "cheat_audit_evader", "--plugins", CHEATERS, "--task", "digits",
                              "--isolate", *args)
    assert not described and not (tmp_path / "ck").exists()


PROBE = """
import os
import sys

from dpbench.methods.dpsgd import DPSGD


def opens(name):
    try:
        open(f"/proc/{os.getppid()}/{name}", "rb").close()
        return True
    except PermissionError:
        return False


class Probe(DPSGD):
    name = "probe"
    description = "looks for the seed and the parent's memory (test plugin)"

    def setup(self):
        seen = [f"argv {sys.argv}" for word in sys.argv if "seed" in word or "1234567" in word]
        seen += [f"environment {key}" for key in os.environ if key.startswith("DPBENCH_") or "SEED" in key]
        # root without CAP_SYS_PTRACE still reads /proc/<pid>/environ (README: root is not covered)
        seen += [name for name in ("mem", *(("environ",) if os.geteuid() else ())) if opens(name)]
        if seen:
            raise RuntimeError(f"saw {seen}")
        super().setup()
"""


def test_an_isolated_process_sees_no_seed_and_cannot_open_the_parents_memory(tmp_path):
    """Spawn handed the child the parent's sys.argv (the seed) and environment, and a process of the same user
    with no more capabilities opens a dumpable process's /proc/<pid>/mem and environ. Root runs the command
    without CAP_SYS_PTRACE (with it, root opens any process's memory, which the README says)."""
    (tmp_path / "probe.py").write_text(PROBE)
    env = {**os.environ, "PL_GLOBAL_SEED": "1234567"}
    without = ("setpriv", "--bounding-set=-sys_ptrace") if os.geteuid() == 0 else ()
    record = cli_run("--method", "probe", "--plugins", str(tmp_path), "--task", "digits", "--epochs", "1", "--seed",
                     "1234567", "--isolate", env=env, prefix=without)
    assert record["isolation"] == "process" and record["seed"] == 1234567


# ---- what the parent takes from the child: the plugin's code hash, the per-example transform ---------------------

LIAR = """
import dpbench.run.isolation
from dpbench.methods.dpsgd import DPSGD

_send = dpbench.run.isolation._send


def _lying(conn, message):
    if "attributes" in message:  # the description: as if it were built-in DP-SGD's file alone
        message = {**message, "files": [dpbench.run.isolation.inspect.getsourcefile(DPSGD)], "built_in": [],
                   **({"file": dpbench.run.isolation.inspect.getsourcefile(DPSGD)} if FOREIGN_FILE else {})}
    _send(conn, message)


dpbench.run.isolation._send = _lying


class Liar(DPSGD):
    name = "liar"
    description = "describes itself as DP-SGD's file (test plugin)"
"""


def test_the_parent_hashes_the_plugin_folder_itself(tmp_path):
    """The parent hashed the files the describing process named: a plugin naming DP-SGD's file got DP-SGD's code
    hash. Now the hash covers every file of the plugin folders, read by the parent before the child runs (an
    edit to any of them changes it, in process too), and the class's file must be one of them."""
    (tmp_path / "liar.py").write_text(LIAR.replace("FOREIGN_FILE", "False"))
    dpsgd = records.code_of(DPSGD, Method)
    described = isolation.describe("liar", [tmp_path]).code
    assert described["sha256"] != dpsgd["sha256"] and described["file"] == str((tmp_path / "liar.py").resolve())
    (tmp_path / "helper.py").write_text("# a file the registry imports too\n")
    assert isolation.describe("liar", [tmp_path]).code["sha256"] != described["sha256"]
    (tmp_path / "liar.py").write_text(LIAR.replace("FOREIGN_FILE", "True"))
    with pytest.raises(UsageError, match="which is none of its plugin folders' files"):
        isolation.describe("liar", [tmp_path])


BAD_TRANSFORM = """
import torch

from dpbench.methods.adaclip import AdaCliP
from dpbench.privacy.clipping import CoordinateAffine


class BadTransform(AdaCliP):
    name = "bad_transform"
    description = "AdaCliP whose transform goes bad after its first step (test plugin)"

    def setup(self):
        super().setup()
        self.stepped = False

    def step(self, release):
        super().step(release)
        self.stepped = True

    @property
    def per_example_transform(self):
        if not self.stepped:
            return super().per_example_transform
        shift, scale = [m.clone() for m in self.mean], [b.clone() for b in self.scale]
        BAD
        return CoordinateAffine(shift, scale)
"""


@pytest.mark.parametrize("bad", ["scale[0].zero_()", "shift[0][0] = float('inf')"])
def test_an_isolated_transform_that_is_not_finite_and_positive_is_refused(tmp_path, bad):
    """The parent divided by whatever scale the child wrote: zero or infinite values make contributions infinite or
    NaN depending on the data, outside what clipping bounds."""
    (tmp_path / "bad_transform.py").write_text(BAD_TRANSFORM.replace("BAD", bad))
    with pytest.raises(UsageError, match="sent a per-example transform that (is not finite|has a scale that is not "
                                         "positive): refused"):
        run("bad_transform", "digits", isolate=True, plugins=[str(tmp_path)], overrides={"epochs": 1})


MINE = """
from dpbench.methods.dpsgd import DPSGD


class Mine(DPSGD):
    name = "mine"
    description = "DESCRIPTION"
"""


def test_plugins_run_their_hashed_source_never_cached_bytecode(tmp_path):
    """The registry imported plugin files through Python's import system, which runs a ``__pycache__`` file in
    place of its source when its header says so (an unchecked hash-based .pyc is never compared with the source):
    code that is not the hashed source ran, in process and in the isolated processes."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (tmp_path / "other.py").write_text(MINE.replace("DESCRIPTION", "from bytecode"))
    (folder / "mine.py").write_text(MINE.replace("DESCRIPTION", "from source"))
    py_compile.compile(str(tmp_path / "other.py"), cfile=importlib.util.cache_from_source(str(folder / "mine.py")),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    assert registry.methods([folder])["mine"].description == "from source"
    assert isolation.describe("mine", [folder]).description == "from source"


def test_an_isolated_process_runs_the_bytes_the_parent_hashed(tmp_path):
    """The isolated process read the plugin files again after the parent hashed them: a file rewritten meanwhile
    ran unhashed. It is now given the hashed bytes and compiles only those."""
    (tmp_path / "mine.py").write_text(MINE.replace("DESCRIPTION", "hashed"))
    method = isolation.describe("mine", [tmp_path])
    (tmp_path / "mine.py").write_text("raise SystemExit('rewritten after hashing')\n")
    params = [torch.nn.Parameter(torch.zeros(3))]
    isolated = isolation.IsolatedMethod(method, params, {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0,
                                                         "halve_at": 0.0, "epochs": 1, "batch_size": 4, "clip": 1.0}, GradientMechanism(1.0, 1.0, 4.0))
    try:
        assert isolated.transform == "identity"
    finally:
        isolated.close()


def test_an_isolated_plugin_imports_nothing_from_its_folder_but_the_hashed_files(tmp_path):
    """A plugin that put its folder on ``sys.path`` and imported a sibling ran that sibling's cached bytecode (an
    unchecked hash-based .pyc of other source), not its hashed source; a sibling that is no ``*.py`` file (a
    sourceless .pyc) ran unhashed. In the isolated process both now come from the hashed bytes or are refused."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    importer = MINE.replace('description = "DESCRIPTION"', 'description = DESCRIPTION').replace(
        "from dpbench.methods.dpsgd import DPSGD",
        "import os, sys\nsys.path.insert(0, os.path.dirname(__file__))\nfrom helper import DESCRIPTION\n"
        "from dpbench.methods.dpsgd import DPSGD")
    (folder / "mine.py").write_text(importer)
    (folder / "helper.py").write_text('DESCRIPTION = "hashed helper"\n')
    (tmp_path / "other.py").write_text('DESCRIPTION = "unhashed bytecode"\n')
    py_compile.compile(str(tmp_path / "other.py"), cfile=importlib.util.cache_from_source(str(folder / "helper.py")),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    assert isolation.describe("mine", [folder]).description == "hashed helper"
    (folder / "helper.py").unlink()  # only the sourceless .pyc is left beside mine.py
    os.replace(importlib.util.cache_from_source(str(folder / "helper.py")), folder / "helper.pyc")
    with pytest.raises(UsageError, match="none of the files its hash covers"):
        isolation.describe("mine", [folder])
