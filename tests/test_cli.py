"""End to end through the command line: runs, records, plugins and refusals."""
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpbench.cli import main
from dpbench.data import tabular
from dpbench.results import store

REPO = Path(__file__).resolve().parents[1]
RECORD_FIELDS = {"task", "method", "data_id", "seed", "hyperparameters", "epsilon", "delta", "noise_multiplier",
                 "sample_rate", "steps", "gradient_evaluations", "accountant", "sampler", "train_seconds", "metrics",
                 "versions", "git_commit", "run_id"}


def run_json(capsys, *args):
    assert main(["run", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_nonprivate_digits_reaches_093(capsys):
    record = run_json(capsys, "--method", "nonprivate", "--task", "digits", "--lr", "5")
    assert record["metrics"]["test_accuracy"] >= 0.93
    assert record["epsilon"] is None and record["sampler"] == "shuffle"


def test_dpsgd_digits_at_epsilon_1_is_recorded_and_accurate(capsys):
    record = run_json(capsys, "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--batch-size", "256",
                      "--lr", "2")
    assert RECORD_FIELDS <= set(record)
    assert record["metrics"]["test_accuracy"] >= 0.80
    assert record["epsilon"] <= 1.0 and record["epsilon"] > 0.99
    assert record["sampler"] == "poisson" and record["accountant"] == "pld"
    assert record["delta"] == pytest.approx(1 / 1437**2) and record["data_id"] == "digits"
    # Poisson rate q = B/n, steps = epochs * round(n/B), one noisy gradient per step.
    assert record["sample_rate"] == pytest.approx(256 / 1437)
    assert record["steps"] == record["gradient_evaluations"] == 30 * round(1437 / 256)
    assert [r["run_id"] for r in store.load()] == [record["run_id"]]


def test_runs_are_deterministic_under_a_seed(capsys):
    args = ("--method", "dpsgd", "--task", "breast_cancer", "--epsilon", "2", "--epochs", "3", "--seed", "5")
    first, second = run_json(capsys, *args), run_json(capsys, *args)
    assert first["metrics"] == second["metrics"] and first["noise_multiplier"] == second["noise_multiplier"]


def test_digits_gives_the_same_run_on_the_fast_and_the_reference_clipping_path(capsys):
    """Ghost norms and book-keeping (dpbench/privacy/ghost.py) against materialized per-example gradients (vmap)."""
    args = ("--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--epochs", "10", "--lr", "2")
    fast = run_json(capsys, *args)
    reference = run_json(capsys, *args, "--clipping", "reference")
    assert (fast["clipping"], reference["clipping"]) == ("ghost", "vmap")
    assert fast["metrics"]["test_accuracy"] == reference["metrics"]["test_accuracy"] >= 0.7
    assert fast["metrics"]["test_loss"] == pytest.approx(reference["metrics"]["test_loss"], rel=1e-4)


def test_noise_multiplier_instead_of_epsilon_reports_the_implied_epsilon(capsys):
    record = run_json(capsys, "--method", "dpsgd", "--task", "breast_cancer", "--noise-multiplier", "1.5",
                      "--epochs", "2")
    assert record["noise_multiplier"] == 1.5 and record["epsilon_target"] is None and record["epsilon"] > 0


def test_settings_reach_the_method(capsys):
    record = run_json(capsys, "--method", "dpsgd", "--task", "breast_cancer", "--epsilon", "1", "--epochs", "2",
                      "--batch-size", "100", "--lr", "0.5", "--set", "momentum=0.9", "--clip", "0.5")
    assert record["hyperparameters"] | {"epochs": 2, "batch_size": 100, "lr": 0.5, "momentum": 0.9, "clip": 0.5} \
        == record["hyperparameters"]


def test_a_rerun_of_the_same_settings_and_seed_is_a_numbered_record(capsys):
    """Issue 35, item 4: every run is a record of its own (its time, its train_seconds); reruns of one setting and
    seed are numbered, and the leaderboard counts the seed once. The same record appended again is skipped."""
    from dpbench.board import model as board_model

    args = ["run", "--method", "dpsgd", "--task", "breast_cancer", "--epsilon", "1", "--epochs", "1", "--no-wandb"]
    assert main(args) == 0 and "\n  rerun" not in capsys.readouterr().out
    assert main(args) == 0
    assert "\n  rerun 2 of 2 stored runs of these settings and seed" in capsys.readouterr().out
    assert main([*args, "--seed", "1"]) == 0 and "\n  rerun" not in capsys.readouterr().out
    first, second, other = store.load()
    store.append(first)
    assert len(store.load()) == 3
    assert main(["runs"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[-2:] == ["rerun", "metric"]
    assert [line.split()[8] for line in table[1:4]] == ["1/2", "2/2", "1/1"]
    assert table[4].startswith("(rerun k/m: the k-th of m stored runs of the same settings and seed")
    [board] = board_model.build_tables(store.load())
    assert [cell.n_seeds for cell in board.cells.values()] == [2]


def test_shuffled_batches_are_recorded_as_such_and_cost_more(capsys):
    common = ("--method", "dpsgd", "--task", "breast_cancer", "--noise-multiplier", "2", "--epochs", "2")
    shuffled = run_json(capsys, *common, "--sampler", "shuffle")
    poisson = run_json(capsys, *common)
    assert shuffled["sampler"] == "shuffle" and shuffled["epsilon"] > poisson["epsilon"]


def test_plugin_folder_and_environment_variable(capsys, monkeypatch):
    plugins = str(REPO / "examples" / "plugins")
    assert main(["list", "methods", "--plugins", plugins]) == 0
    assert "dp_nesterov" in capsys.readouterr().out
    assert main(["--plugins", plugins, "list", "methods"]) == 0  # before the command too
    assert "dp_nesterov" in capsys.readouterr().out
    assert main(["--plugins", plugins, "privacy", "--sample-rate", "0.1", "--steps", "10", "--epsilon", "1",
                 "--delta", "1e-5"]) == 2
    assert capsys.readouterr().err == "dpbench: error: dpbench privacy takes no plugins\n"
    monkeypatch.setenv("DPBENCH_PLUGINS", plugins)
    record = run_json(capsys, "--method", "dp_nesterov", "--task", "digits", "--epsilon", "1", "--epochs", "2")
    assert record["method"] == "dp_nesterov" and record["epsilon"] <= 1


def test_a_record_names_the_code_that_ran_it(capsys, tmp_path):
    """Which plugin file produced a run, and the sha256 of its source: after an edit, another code hash."""
    plugin = tmp_path / "mine.py"
    plugin.write_text(textwrap.dedent("""
        from dpbench.methods.dpsgd import DPSGD

        class Mine(DPSGD):
            name = "mine"
            description = "DP-SGD under another name (test plugin)"
    """))
    args = ("--plugins", str(tmp_path), "--method", "mine", "--task", "breast_cancer", "--epsilon", "1", "--epochs", "1")
    first = run_json(capsys, *args)
    assert first["code"]["method"]["file"] == str(plugin) and first["code"]["method"]["external"] is True
    assert first["code"]["task"] == {**first["code"]["task"], "file": "tasks/linear.py", "external": False}
    assert first["ledger_version"] >= 2
    plugin.write_text(plugin.read_text() + "\n# edited\n")
    second = run_json(capsys, *args)
    assert second["code"]["method"]["sha256"] != first["code"]["method"]["sha256"]
    dpsgd = run_json(capsys, "--method", "dpsgd", "--task", "breast_cancer", "--epsilon", "1", "--epochs", "1")
    assert dpsgd["code"]["method"]["file"] == "methods/dpsgd.py" and dpsgd["code"]["method"]["external"] is False


def test_entry_point_plugin(capsys, tmp_path, monkeypatch):
    (tmp_path / "my_dp_package.py").write_text(textwrap.dedent("""
        from dpbench.methods.dpsgd import DPSGD

        class Mine(DPSGD):
            name = "mine"
            description = "installed through an entry point"
    """))
    info = tmp_path / "my_dp_package-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-dp-package\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dpbench.methods]\nmine = my_dp_package:Mine\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["list", "methods"]) == 0
    assert "mine" in capsys.readouterr().out


def test_the_record_names_its_noise_sampler(capsys):
    args = ("--method", "dpsgd", "--task", "breast_cancer", "--epsilon", "2", "--epochs", "2")
    fast, pytorch = run_json(capsys, *args), run_json(capsys, *args, "--noise", "torch")
    assert fast["noise"] == "philox4x32-10 + box-muller, float32 (dpbench.privacy._philox)"
    assert pytorch["noise"] == "torch normal_ (cpu)"
    assert fast["metrics"]["test_loss"] != pytorch["metrics"]["test_loss"]  # other draws, the same mechanism
    assert fast["epsilon"] == pytorch["epsilon"] and fast["noise_multiplier"] == pytorch["noise_multiplier"]
    assert run_json(capsys, "--method", "nonprivate", "--task", "breast_cancer", "--epochs", "1")["noise"] is None


@pytest.mark.parametrize("args, message", [
    (["--method", "nope", "--task", "digits"], "unknown method 'nope'; available: "),
    (["--method", "dpsgd", "--task", "nope"], "unknown task 'nope'; available: "),
    (["--method", "dpsgd", "--task", "digits", "--epsilon", "0"], "epsilon must be a finite number > 0"),
    (["--method", "dpsgd", "--task", "digits", "--epsilon", "-1"], "epsilon must be a finite number > 0"),
    (["--method", "dpsgd", "--task", "digits", "--epsilon", "nan"], "epsilon must be a finite number > 0"),
    (["--method", "dpsgd", "--task", "digits", "--epsilon", "inf"], "epsilon must be a finite number > 0"),
    (["--method", "dpsgd", "--task", "digits", "--delta", "0"], "delta must lie in (0, 1)"),
    (["--method", "dpsgd", "--task", "digits", "--delta", "1"], "delta must lie in (0, 1)"),
    (["--method", "dpsgd", "--task", "digits", "--delta", "0.001"], "not below 1/n"),
    (["--method", "dpsgd", "--task", "digits", "--batch-size", "5000"], "exceeds the 1437 training examples"),
    (["--method", "dpsgd", "--task", "digits", "--set", "momentun=0.9"], "no hyperparameter 'momentun'"),
    (["--method", "dpsgd", "--task", "digits", "--set", "momentum=0.9", "--set", "momentum=0.5"], "given twice"),
    (["--method", "dpsgd", "--task", "digits", "--set", "momentum=fast"], "momentum='fast' is not a valid float"),
    (["--method", "nonprivate", "--task", "digits", "--epsilon", "1"], "not private"),
    (["--method", "nonprivate", "--task", "digits", "--set", "optimizer=lbfgs"], "optimizer must be"),
    (["--method", "dpgd", "--task", "digits", "--batch-size", "10"], "full batches"),
    (["--method", "dpsgd", "--task", "digits", "--seed", "-1"], "seed must be a whole number"),
    (["--method", "output_perturbation", "--task", "digits", "--seed", "-1"], "seed must be a whole number"),
    (["--method", "dpsgd", "--task", "digits", "--sampler", "shuffle", "--neighbouring", "add-remove"],
     "replace-one neighbours only"),
    (["--method", "dpsgd", "--task", "digits", "--accountant", "rdp", "--neighbouring", "replace-one"],
     "no replace-one analysis"),
    (["--method", "amp", "--task", "digits", "--neighbouring", "add-remove"], "replace-one neighbours only"),
    (["--method", "nonprivate", "--task", "digits", "--neighbouring", "add-remove"], "not private"),
    # Issue 35: values that trained and were stored.
    (["--method", "dpsgd", "--task", "digits", "--lr", "-1"], "lr must be a number > 0, got -1"),
    (["--method", "dpsgd", "--task", "digits", "--lr", "0"], "lr must be a number > 0, got 0"),
    (["--method", "dpgd", "--task", "digits", "--set", "lr=-1"], "lr must be a number > 0"),
    (["--method", "norm_bound", "--task", "digits", "--lr", "0"], "lr must be a number > 0"),
    (["--method", "dpadam", "--task", "digits", "--lr", "-0.1"], "lr must be a number > 0"),
    (["--method", "dpadam_bc", "--task", "digits", "--lr", "-1"], "lr must be a number > 0"),
    (["--method", "adaclip", "--task", "digits", "--lr", "-1"], "lr must be a number > 0"),
    (["--method", "dpsgd", "--task", "digits", "--set", "momentum=-1"], "momentum must be a number in [0, 1)"),
    (["--method", "dpsgd", "--task", "digits", "--set", "momentum=1.5"], "momentum must be a number in [0, 1)"),
    (["--method", "dpsgd", "--task", "digits", "--set", "weight_decay=-1"], "weight_decay must be a number >= 0"),
    (["--method", "dpsgd", "--task", "digits", "--set", "epochs=0"], "epochs must be a whole number >= 1"),
    (["--method", "dpadam", "--task", "digits", "--set", "gamma=-1"], "gamma must be positive"),
    (["--method", "dpsgd", "--task", "mnist_mlp", "--set", "pca_dims=0"], "pca_dims must lie in 1..784"),
    (["--method", "dpsgd", "--task", "mnist_mlp", "--set", "pca_noise_multiplier=-1"],
     "pca_noise_multiplier must be a number > 0"),
    (["--method", "dpsgd", "--task", "cifar10", "--set", "train_limit=-1"], "train_limit must be 0 (all) or"),
    (["--method", "dpsgd", "--task", "cifar10_cnn", "--set", "train_limit=-5"], "train_limit must be 0 (all) or"),
])
def test_bad_input_is_refused(refused, args, message):
    assert message in refused("run", *args)


def test_an_audit_refuses_a_bad_learning_rate(refused):
    assert "lr must be a number > 0" in refused("audit", "--method", "dpsgd", "--task", "digits", "--lr", "-1")


def test_a_task_that_overstates_its_training_examples_is_refused(refused, monkeypatch):
    """The refusal of δ ≥ 1/n before PyTorch loads trusts ``min_train_examples``: every run checks it."""
    from dpbench.tasks.linear import Digits

    monkeypatch.setattr(Digits, "min_train_examples", 1438)
    assert "digits states min_train_examples = 1438, but its data has 1437" in refused(
        "run", "--method", "dpsgd", "--task", "digits", "--epochs", "1")


@pytest.mark.parametrize("task", ["digits", "breast_cancer", "adaclip_regression", "adult", "covertype",
                                  "mnist_logreg", "mnist_mlp", "kddcup99"])
def test_the_stated_training_examples_are_a_lower_bound(task, mirror):
    from dpbench import registry

    cls = registry.tasks()[task]
    assert cls().load_data().n_train >= cls.min_train_examples >= 1


def test_missing_dataset_without_network_says_where_to_put_it(refused, tmp_path, monkeypatch):
    monkeypatch.setenv("DPBENCH_MIRROR", str(tmp_path / "empty-mirror"))
    monkeypatch.setattr(tabular, "ADULT_DATA", dataclasses.replace(tabular.ADULT_DATA, url="http://127.0.0.1:9/x"))
    err = refused("run", "--method", "dpsgd", "--task", "adult")
    assert "put adult.data" in err and str(tmp_path / "empty-mirror" / "adult") in err


def test_corrupt_file_names_the_file_and_both_hashes(refused, tmp_path, monkeypatch, mirror):
    corrupt = tmp_path / "mirror" / "adult"
    shutil.copytree(mirror / "adult", corrupt)
    (corrupt / "adult.data").chmod(0o644)
    with open(corrupt / "adult.data", "r+b") as f:
        f.write(b"X")
    monkeypatch.setenv("DPBENCH_MIRROR", str(tmp_path / "mirror"))
    err = refused("run", "--method", "dpsgd", "--task", "adult")
    actual = hashlib.sha256((corrupt / "adult.data").read_bytes()).hexdigest()
    assert str(corrupt / "adult.data") in err and actual in err and tabular.ADULT_DATA.checksum.split(":")[1] in err


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """One ``dpbench run`` as a script, a CI job or a sweep worker runs it: output to pipes, not a terminal."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("DPBENCH_", "WANDB_")) and key != "OMP_NUM_THREADS"}
    env.update(DPBENCH_HOME=str(tmp_path_factory.mktemp("logged")), DPBENCH_PROGRESS_SECONDS="0.1")
    return subprocess.run([sys.executable, "-m", "dpbench", "run", "--method", "dpsgd", "--task", "digits",
                           "--epsilon", "1", "--json", "--no-wandb"], capture_output=True, text=True, env=env,
                          cwd=REPO, check=True)


def test_lightning_says_nothing_a_user_did_not_ask_for(logged_run):
    """Issue 35, item 6: no "GPU available", "TPU available" or "💡 Tip" lines; Lightning's warnings are kept."""
    for line in ("GPU available", "TPU available", "💡", "litlogger", "litmodels"):
        assert line not in logged_run.stderr + logged_run.stdout
    from pytorch_lightning.utilities import rank_zero

    with pytest.warns(UserWarning, match="a real warning"):
        rank_zero.rank_zero_warn("a real warning")


def test_progress_is_a_bar_on_a_terminal_and_lines_off_one(capsys, monkeypatch):
    """Issue 35, item 3: off a terminal, nothing showed during a 29.5-minute private training."""
    from dpbench.data import stages

    monkeypatch.setenv("DPBENCH_PROGRESS_SECONDS", "0.02")
    args = ["run", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--epochs", "6", "--no-wandb"]
    monkeypatch.setattr(stages, "on_terminal", lambda: True)
    assert main(args) == 0
    terminal = capsys.readouterr().err
    monkeypatch.setattr(stages, "on_terminal", lambda: False)
    assert main([*args, "--seed", "1"]) == 0
    logged = capsys.readouterr().err
    assert "Epoch 5/5" in terminal and "private training:" not in terminal  # Lightning's bar
    assert "\r" not in logged and "Epoch" not in logged
    lines = [line for line in logged.splitlines() if line.startswith("private training:")]
    assert len(lines) >= 2 and re.fullmatch(
        r"private training: \d+/\d+ step \(\d+%\), [\d.]+ step/s, \d+:\d\d elapsed, ETA \d+:\d\d, epoch [1-6]/6", lines[0])
    assert re.fullmatch(r"private training: 132/132 step \(100%\), [\d.]+ step/s, done in \d+:\d\d, epoch 6/6",
                        lines[-1])


def test_off_a_terminal_a_run_prints_progress_lines_not_a_bar(logged_run):
    lines = [line for line in logged_run.stderr.splitlines() if line.startswith("private training: ")]
    assert lines and lines[-1].startswith("private training: 660/660 step (100%)") and "\r" not in logged_run.stderr


def test_a_run_off_a_terminal_trains_with_one_thread_on_a_small_model(logged_run):
    """Issue 35, item 1: PyTorch's one thread per core made digits 5.3-72.9 s on a busy machine, one thread 0.9-5.8."""
    assert json.loads(logged_run.stdout)["threads"] == 1


def test_console_script_exits_2_on_bad_input():
    script = Path(sys.executable).parent / "dpbench"
    result = subprocess.run([str(script), "run", "--method", "nope", "--task", "digits"], capture_output=True,
                            text=True)
    assert result.returncode == 2 and result.stderr.startswith("dpbench: error: unknown method 'nope'")


HEAVY = ("torch", "pytorch_lightning", "lightning_fabric", "wandb", "optuna", "transformers")


@pytest.mark.parametrize("argv, exit_code", [
    (["--help"], 0),
    (["list", "methods"], 0),
    (["list", "tasks"], 0),
    (["--plugins", "examples/plugins", "list", "methods"], 0),
    (["run", "--method", "nope", "--task", "digits"], 2),
    (["run", "--method", "dpsgd", "--task", "nope"], 2),
    (["run", "--method", "dpsgd", "--task", "digits", "--seed", "-1"], 2),
    (["run", "--method", "dpsgd", "--task", "digits", "--epsilon", "0"], 2),
    (["run", "--method", "dpsgd", "--task", "digits", "--clip", "inf"], 2),
    (["tune", "--method", "dpsgd", "--task", "digits", "--epsilon", "nan"], 2),
    (["audit", "--method", "nope", "--task", "digits"], 2),
    (["privacy", "--sample-rate", "0.01", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"], 0),
    # Issue 35: refused at once too.
    (["run", "--method", "dpsgd", "--task", "digits", "--lr", "-1"], 2),
    (["run", "--method", "dpsgd", "--task", "digits", "--lr", "0"], 2),
    (["run", "--method", "dpsgd", "--task", "digits", "--clip", "0"], 2),
    (["run", "--method", "dpsgd", "--task", "digits", "--delta", "0.5"], 2),
    (["run", "--method", "dpsgd", "--task", "digits", "--delta", "0.001"], 2),  # 1/n = 0.000696
    (["run", "--method", "dpsgd", "--task", "digits", "--set", "momentum=1.5"], 2),
    (["tune", "--method", "dpsgd", "--task", "adult", "--epsilon", "1", "--delta", "1e-4"], 2),
    (["run", "--method", "dpsgd", "--task", "digits", "--threads", "0"], 2),
    (["sweep", "leaderboards/grid.json", "--threads", "many"], 2),
])
def test_help_listing_refusals_and_privacy_load_no_training_stack(argv, exit_code, env=None):
    """Issue 17: these commands must not wait for PyTorch, Lightning, W&B, transformers or Optuna (seconds)."""
    code = ("import sys\nfrom dpbench.cli import main\ntry:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    code = e.code\nprint('LOADED', *[m for m in %r if m in sys.modules])\nsys.exit(code)" % (HEAVY,))
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[1], env={**os.environ, **(env or {})})
    assert result.returncode == exit_code, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "LOADED", result.stdout.splitlines()[-1]
    if exit_code == 2:
        assert result.stderr.startswith("dpbench: error: ") and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("variable", ["DPBENCH_THREADS", "OMP_NUM_THREADS"])
def test_a_bad_thread_variable_is_refused_at_once(variable):
    test_help_listing_refusals_and_privacy_load_no_training_stack(
        ["run", "--method", "dpsgd", "--task", "digits"], 2, env={variable: "-2"})


def test_the_catalog_lists_what_the_registry_registers(tmp_path):
    """dpbench.catalog reads the names from the files; it must agree with importing them, or say it cannot tell."""
    from dpbench import catalog, registry

    repo = Path(__file__).resolve().parents[1]
    for folders in ([], [repo / "examples" / "plugins"], [repo / "tests" / "cheaters"]):
        for kind, collect in (("method", registry.methods), ("task", registry.tasks)):
            assert catalog.names(kind, folders) == {name: cls.description for name, cls in collect(folders).items()}
        for name, cls in registry.tasks(folders).items():  # what the refusal of δ ≥ 1/n reads before importing
            stated = None if cls.min_train_examples is None else (cls.min_train_examples, frozenset(cls.options))
            assert catalog.task_size(name, folders) == stated
    assert catalog.task_size("digits", []) == (1437, frozenset({"bias"}))
    dynamic = tmp_path / "dynamic"
    dynamic.mkdir()
    (dynamic / "made.py").write_text("from dpbench.methods.dpsgd import DPSGD\n"
                                     "Made = type('Made', (DPSGD,), {'name': 'made', 'description': 'built by type'})\n"
                                     "class Named(DPSGD):\n    name = 'na' + 'med'\n")
    assert catalog.names("method", [dynamic]) is None  # a name that is not a literal: only importing can tell
    assert set(registry.methods([dynamic])) >= {"made", "named"}
    (dynamic / "made.py").write_text("from dpbench.methods.dpsgd import DPSGD\n"
                                     "Made = type('Made', (DPSGD,), {'name': 'made', 'description': 'by type'})\n")
    assert catalog.names("method", [dynamic]) is None  # a class made by a call
    assert "made" in registry.methods([dynamic])
    unsure = tmp_path / "unsure"
    unsure.mkdir()
    (unsure / "maybe.py").write_text("import sys\nif sys.platform:\n    from dpbench.methods.dpsgd import DPSGD\n\n"
                                     "    class Maybe(DPSGD):\n        name = 'maybe'\n")
    assert catalog.names("method", [unsure]) is None
    assert "maybe" in registry.methods([unsure])


# ---- --secret-seed (issue 31, item 2: a record with its seed is a deterministic function of the data) -----------

def revealing(seeds):
    """The seeds and every stream seed derived from them, as text: none may be written anywhere."""
    from dpbench.privacy import streams

    found = {str(seed) for seed in seeds}
    for seed in seeds:
        found |= {str(streams.derive(seed, purpose)) for purpose in streams.PURPOSES}
        found |= {str(streams.derive(seed, "sampler", epoch)) for epoch in range(3)}
    return found


def written(home):
    """The bytes of every file under ``home`` (the results store, W&B's files and logs, caches)."""
    return {path: path.read_bytes() for path in home.rglob("*") if path.is_file()}


def test_secret_seed_runs_differ_and_write_their_seed_nowhere(capsys, monkeypatch, isolated_home):
    from dpbench.privacy import streams
    from tests.test_wandb import logged

    drawn, draw = [], streams.secret_seed
    monkeypatch.setattr(streams, "secret_seed", lambda: drawn.append(draw()) or drawn[-1])
    monkeypatch.setenv("WANDB_MODE", "offline")
    args = ["run", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--epochs", "2", "--secret-seed",
            "--json"]
    assert main([*args, "--wandb-project", "dpbench-tests"]) == 0
    first, first_log = capsys.readouterr()
    assert main([*args, "--no-wandb"]) == 0
    second, second_log = capsys.readouterr()
    first, second = json.loads(first), json.loads(second)
    assert len(set(drawn)) == 2 and first["seed"] == second["seed"] == "secret"
    assert first["metrics"] != second["metrics"]  # other weights, batches and noise
    config, _, summary = logged(isolated_home)
    assert config["seed"] == "secret" and json.loads(summary["dpbench_record"]) == first
    hidden = revealing(drawn)
    for text in (first_log, second_log, json.dumps([first, second, config, summary])):
        assert not [value for value in hidden if value in text]
    for path, data in written(isolated_home).items():
        assert not [value for value in hidden if value.encode() in data], path
    from dpbench.board import model as board_model

    [table] = board_model.build_tables(store.load())
    assert [cell.n_seeds for cell in table.cells.values()] == [2]  # two secret seeds are two seeds


@pytest.mark.parametrize("args, message", [
    (["--secret-seed", "--seed", "3"], "not allowed with argument"),
    (["--secret-seed", "--checkpoint-dir", "ck"], "--secret-seed keeps no checkpoints"),
    (["--secret-seed", "--method", "output_perturbation"], "does not take --secret-seed"),
])
def test_secret_seed_refusals(refused, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    method = [] if "--method" in args else ["--method", "dpsgd"]
    assert message in refused("run", *method, "--task", "digits", "--epochs", "1", *args)


def test_a_task_subclass_adds_to_its_parents_options_and_defaults(tmp_path):
    """A plugin's subclass of Adult that set ``options`` dropped Adult's ``bias`` and failed with ``KeyError: 'bias'``
    at model build (issue 34): ``options``, ``defaults`` and ``method_defaults`` merge along the class hierarchy, in
    the registry and in what the command line reads before importing (``dpbench.catalog``)."""
    from dpbench import catalog, registry
    from dpbench.tasks.linear import Adult

    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "wider.py").write_text(
        "from dpbench.tasks.linear import Adult\n\n\n"
        "class WiderAdult(Adult):\n"
        "    name = 'wider_adult'\n"
        "    description = 'Adult with one more option (test plugin)'\n"
        "    options = {'extra': 1}\n"
        "    defaults = {'epochs': 7}\n"
        "    method_defaults = {'dpsgd': {'momentum': 0.5}}\n")
    wider = registry.tasks([folder])["wider_adult"]
    assert wider.options == {**Adult.options, "extra": 1} and "bias" in wider.options
    assert wider.defaults == {**Adult.defaults, "epochs": 7}
    assert wider.method_defaults["dpsgd"] == {**Adult.method_defaults.get("dpsgd", {}), "momentum": 0.5}
    assert {key: value for key, value in wider.method_defaults.items() if key != "dpsgd"} == \
        {key: value for key, value in Adult.method_defaults.items() if key != "dpsgd"}
    assert wider(extra=2).settings == {**Adult.options, "extra": 2}
    if Adult.min_train_examples is not None:
        assert catalog.task_size("wider_adult", [folder]) == (Adult.min_train_examples, frozenset(wider.options))
