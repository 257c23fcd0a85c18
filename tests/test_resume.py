"""Crash-safe resume (dpbench/run/checkpoint.py): a run killed and resumed gives the uninterrupted run's record, a kill
while writing a checkpoint or appending to the results store leaves nothing half written, and resuming with other
settings is refused."""
import json
import multiprocessing
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dpbench.cli import main
from dpbench.results import store
from dpbench.run import checkpoint, engine
from dpbench.spec import RunSpec

#: What two runs of the same settings may differ in.
TIMING = {"train_seconds", "created_at", "run_id"}

PLUGIN = textwrap.dedent('''
    """A task that draws from every generator a checkpoint must restore: dropout (the global torch generator),
    augmentation (Task.rng), and a method that draws from NumPy's and Python's global generators."""
    import random

    import numpy as np
    import torch
    from torch import nn

    from dpbench.method import Method, apply_gradient
    from dpbench.task import Classification, TaskData


    class JitteryBlobs(Classification):
        name = "jittery_blobs"
        description = "two Gaussian blobs, dropout and random jitter (tests only)"
        defaults = {"epochs": 3, "batch_size": 50}

        def load_data(self):
            x = torch.randn(250, 5)
            y = (x[:, 0] + 0.5 * torch.randn(250) > 0).long()
            return TaskData(x[:200], y[:200], x[200:], y[200:], data_id="jittery-blobs", preprocessing="none")

        def build_model(self, data):
            self.classes = 2
            return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))

        def augment(self, x):
            return x + 0.1 * torch.randn(x.shape, generator=self.rng("augmentation"))


    class JitterSGD(Method):
        name = "jitter_sgd"
        description = "SGD with a randomly jittered learning rate (tests only)"
        defaults = {"lr": 0.5}

        def setup(self):
            self.optimizer = torch.optim.SGD(self.params, lr=self.hp["lr"], momentum=0.5)

        def step(self, release):
            for group in self.optimizer.param_groups:
                group["lr"] = self.hp["lr"] * (0.5 + np.random.rand() + random.random())
            apply_gradient(self.optimizer, self.params, release())
''')


def comparable(record: dict) -> dict:
    return {key: value for key, value in record.items() if key not in TIMING}


@pytest.fixture
def plugin(tmp_path):
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "jittery.py").write_text(PLUGIN)
    return str(folder)


# ---- resuming from every checkpoint of a run (in this process) -------------------------------------------------

@pytest.mark.parametrize("method, task, overrides", [
    ("dpsgd", "breast_cancer", {"epochs": 3, "momentum": "0.9"}),  # momentum buffers in a torch optimizer
    ("ada_dp", "breast_cancer", {"epochs": 2, "adapt_epochs": "1"}),  # two releases per step, η, the schedule
    ("adaclip", "breast_cancer", {"epochs": 2, "batch_size": 128}),  # m and s
    ("bandmf", "breast_cancer", {"epochs": 2, "bands": 4}),  # banded noise's last b − 1 vectors, the cyclic sampler
    ("dpftrl", "breast_cancer", {"epochs": 2, "batch_size": 50}),  # the tree's node noises, restarted every epoch
    ("dpadam_bc", "breast_cancer", {"epochs": 2, "batch_size": 128}),  # Adam's moments and step count
    ("nonprivate", "breast_cancer", {"epochs": 3, "optimizer": "adam", "batch_size": 128}),  # shuffled batches
    ("jitter_sgd", "jittery_blobs", {}),  # dropout, augmentation, NumPy's and Python's generators
])
def test_resuming_from_any_checkpoint_gives_the_uninterrupted_record(tmp_path, monkeypatch, plugin, method, task,
                                                                     overrides):
    """A run checkpointing after every step, then resumed from its checkpoints at every epoch's end, the first and
    last step and three random mid-epoch steps, in turn: every resumed run ends with the record of the run that was
    never interrupted. (Leaving out the noise counter, the method state or the sampler position fails it.)"""
    copies = []
    write = checkpoint.atomic_write

    def keep_copies(path, content):
        write(path, content)
        if path.name == checkpoint.CHECKPOINT:
            copies.append(tmp_path / f"copy{len(copies)}.ckpt")
            shutil.copy(path, copies[-1])

    monkeypatch.setattr(checkpoint, "atomic_write", keep_copies)
    spec = RunSpec(method=method, task=task, noise_multiplier=None if method == "nonprivate" else 1.0,
                   overrides=overrides, plugins=[plugin], progress_bar=False, no_wandb=True,
                   checkpoint_dir=str(tmp_path / "run"), checkpoint_every=1)
    uninterrupted = comparable(engine.run(spec))
    monkeypatch.setattr(checkpoint, "atomic_write", write)
    assert len(copies) == uninterrupted["steps"] >= 8
    # Every epoch's end, the first and the last step, and three random mid-epoch steps (not all: CI time).
    epochs = int(uninterrupted["hyperparameters"]["epochs"])
    per_epoch = uninterrupted["steps"] // epochs
    ends = {per_epoch * (epoch + 1) - 1 for epoch in range(epochs)}
    seed = random.randrange(2**32)
    middle = random.Random(seed).sample(sorted(set(range(len(copies))) - ends - {0}), 3)
    for number in sorted(ends | {0, len(copies) - 1, *middle}):
        copy = copies[number]
        folder = tmp_path / f"resumed{number}"
        folder.mkdir()
        shutil.copy(copy, folder / checkpoint.CHECKPOINT)
        resumed = engine.run(replace(spec, checkpoint_dir=str(folder), resume=True))
        assert comparable(resumed) == uninterrupted, f"resumed after step {number + 1} (sample seed {seed})"


# ---- SIGKILL at a random step, then resume ---------------------------------------------------------------------

class Killer:
    """Runs ``python -m dpbench run ARGS --checkpoint-dir FOLDER`` in a fresh interpreter and SIGKILLs it once a
    checkpoint at or after a random step is written, plus a random delay, so that the kill lands between
    checkpoints (sometimes inside a write). A fresh interpreter, not a fork of this one: a forked child of a process
    whose OpenMP pool has run deadlocks in its first parallel region (libgomp is not fork-safe), which hung CI. It
    inherits this process's environment, so it chooses its threads by the same rule as the in-process runs (the
    resume check compares the count). Watches from a thread, so that the test can compute the uninterrupted run
    meanwhile."""

    def __init__(self, args: list[str], folder: Path, total_steps: int, rng: random.Random):
        self.folder, self.target, self.rng = folder, rng.randint(1, total_steps // 2), rng
        self.log = folder.parent / "killed.stderr"
        argv = [sys.executable, "-m", "dpbench", "run", *args, "--checkpoint-dir", str(folder),
                "--checkpoint-every", str(rng.randint(2, 9)), "--no-wandb"]
        with open(self.log, "w") as err:
            self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        self.thread = threading.Thread(target=self._watch)
        self.thread.start()

    def _watch(self) -> None:
        path, deadline = self.folder / checkpoint.CHECKPOINT, time.monotonic() + 300
        while time.monotonic() < deadline and self.process.poll() is None:
            if path.exists():
                try:
                    steps = checkpoint.load(path)["dpbench"]["ledger"]["steps"]
                except Exception:  # noqa: BLE001 (cannot happen with atomic writes; `left` below checks)
                    steps = 0
                if steps >= self.target:
                    time.sleep(self.rng.uniform(0, 0.02))
                    break
            time.sleep(0.005)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)

    def left(self) -> int:
        """The step of the checkpoint the killed run left behind."""
        self.thread.join()
        self.process.wait(timeout=60)
        error = self.log.read_text(errors="replace")
        assert self.process.returncode == -signal.SIGKILL, f"the run ended before the kill: {error[-2000:]}"
        assert not (self.folder / checkpoint.RECORD).exists()
        return checkpoint.load(self.folder / checkpoint.CHECKPOINT)["dpbench"]["ledger"]["steps"]  # whole, always


def run_json(capsys, *args) -> dict:
    assert main(["run", *args, "--json", "--no-wandb"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method, task, args, steps", [
    ("dpsgd", "adult", ["--epochs", "2", "--batch-size", "1024"], 70),
    ("ada_dp", "adult", ["--epochs", "3", "--batch-size", "1024"], 54),
    ("dpadam_bc", "adult", ["--epochs", "2", "--batch-size", "1024"], 70),
    ("adaclip", "adult", ["--epochs", "2", "--batch-size", "1024"], 70),
    ("dpsgd", "mnist_mlp", ["--epochs", "2"], 40),
])
def test_a_run_killed_at_a_random_step_and_resumed_gives_the_uninterrupted_record(mirror, tmp_path, capsys, method,
                                                                                  task, args, steps):
    args = ["--method", method, "--task", task, "--noise-multiplier", "1.5", "--seed", "3", *args]
    seed, folder = random.randrange(2**32), tmp_path / "checkpoints"
    killer = Killer(args, folder, steps, random.Random(seed))
    uninterrupted = run_json(capsys, *args)  # meanwhile
    left = killer.left()
    assert uninterrupted["steps"] == steps and 0 < left < steps
    resumed = run_json(capsys, *args, "--resume", str(folder))
    assert comparable(resumed) == comparable(uninterrupted), f"kill seed {seed}, resumed after step {left}"
    assert resumed["epsilon"] == uninterrupted["epsilon"] and resumed["metrics"] == uninterrupted["metrics"]


# ---- refusals --------------------------------------------------------------------------------------------------

SHORT_RUN = {"--method": "dpsgd", "--task": "breast_cancer", "--noise-multiplier": "1", "--epochs": "2"}


def arguments(settings: dict) -> list[str]:
    return [part for pair in settings.items() for part in pair]


@pytest.fixture
def finished_run(tmp_path, capsys):
    """A short run with a checkpoint folder: (its arguments, the folder, its record)."""
    folder = tmp_path / "checkpoints"
    record = run_json(capsys, *arguments(SHORT_RUN), "--checkpoint-dir", str(folder))
    return arguments(SHORT_RUN), folder, record


def snapshot(folder: Path) -> dict:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


@pytest.mark.parametrize("change, message", [
    ({"--seed": "1"}, "differs in seed"),
    ({"--epochs": "3"}, "hyperparameters"),
    ({"--set": "momentum=0.5"}, "hyperparameters"),
    ({"--noise-multiplier": "2"}, "noise_multiplier"),
    ({"--clipping": "reference"}, "differs in clipping"),
])
def test_resuming_with_other_settings_is_refused(finished_run, capsys, change, message):
    _, folder, _ = finished_run
    (folder / checkpoint.RECORD).unlink()  # as if killed after the last checkpoint: a resume would go on
    before, stored = snapshot(folder), store.load()
    assert main(["run", *arguments(SHORT_RUN | change), "--resume", str(folder), "--no-wandb"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("dpbench: error: the checkpoint in") and "\n" not in error and message in error, error
    assert snapshot(folder) == before and store.load() == stored


def test_resuming_a_finished_run_with_other_settings_is_refused(finished_run, capsys):
    args, folder, _ = finished_run
    assert main(["run", *args, "--seed", "2", "--resume", str(folder)]) == 2
    assert "differs in seed" in capsys.readouterr().err


def test_resuming_a_finished_run_returns_its_record_and_stores_it_once(finished_run, capsys):
    args, folder, record = finished_run
    assert run_json(capsys, *args, "--resume", str(folder)) == record
    assert [r["run_id"] for r in store.load()] == [record["run_id"]]
    store.default_path().unlink()  # killed after keeping the record beside its checkpoint, before storing it
    assert run_json(capsys, *args, "--resume", str(folder)) == record
    assert [r["run_id"] for r in store.load()] == [record["run_id"]]


def test_resuming_from_the_last_checkpoint_finishes_the_same_record(finished_run, capsys):
    args, folder, record = finished_run
    (folder / checkpoint.RECORD).unlink()
    assert comparable(run_json(capsys, *args, "--resume", str(folder))) == comparable(record)


@pytest.mark.parametrize("how, message", [
    ("fresh run into a used folder", "already holds a run's checkpoint"),
    ("resume from an empty folder", "no checkpoint to resume"),
    ("resume from a corrupt checkpoint", "cannot read the checkpoint"),
    ("two folders", "--resume continues writing checkpoints to its own folder"),
])
def test_bad_checkpoint_folders_are_refused(finished_run, tmp_path, refused, how, message):
    args, folder, _ = finished_run
    store.default_path().unlink()  # `refused` checks that no store is written
    if how == "fresh run into a used folder":
        extra = ["--checkpoint-dir", str(folder)]
    elif how == "resume from an empty folder":
        (tmp_path / "empty").mkdir()
        extra = ["--resume", str(tmp_path / "empty")]
    elif how == "resume from a corrupt checkpoint":
        (folder / checkpoint.RECORD).unlink()
        (folder / checkpoint.CHECKPOINT).write_bytes(b"not a checkpoint")
        extra = ["--resume", str(folder)]
    else:
        extra = ["--resume", str(folder), "--checkpoint-dir", str(tmp_path / "other")]
    assert message in refused("run", *args, *extra)


@pytest.mark.parametrize("entry, change", [("releases", -1), ("sampled", -7), ("steps", -1)])
def test_a_checkpoint_with_an_edited_ledger_is_refused(finished_run, refused, entry, change):
    """Issue 31, item 4: the ledger must be what the checkpoint's position implies (steps: Lightning's progress;
    releases: k per step; sampled: the sampler's batches of those steps), or the resumed record charges less."""
    args, folder, record = finished_run
    (folder / checkpoint.RECORD).unlink()
    saved = checkpoint.load(folder / checkpoint.CHECKPOINT)
    ledger = saved["dpbench"]["ledger"]
    assert ledger["releases"] == ledger["steps"] == record["gradient_evaluations"]
    ledger[entry] += change
    torch.save(saved, folder / checkpoint.CHECKPOINT)
    store.default_path().unlink()  # `refused` checks that no store is written
    message = refused("run", *args, "--resume", str(folder))
    assert "has a ledger its position does not imply" in message and f"{entry} {ledger[entry]}, not " in message


def test_a_checkpoint_with_a_rewound_noise_counter_is_refused(finished_run, refused):
    """The review's attack: only the Philox counter set back to 0, so the resumed steps would draw the first steps'
    noise again (two releases with the same noise: their difference has none)."""
    args, folder, record = finished_run
    (folder / checkpoint.RECORD).unlink()
    saved = checkpoint.load(folder / checkpoint.CHECKPOINT)
    counter = saved["dpbench"]["noise"]["counter"]
    assert counter > 0
    saved["dpbench"]["noise"]["counter"] = 0
    torch.save(saved, folder / checkpoint.CHECKPOINT)
    store.default_path().unlink()  # `refused` checks that no store is written
    message = refused("run", *args, "--resume", str(folder))
    assert f"noise counter 0, not {counter}" in message


@pytest.mark.parametrize("method, extra, part", [
    ("bandmf", ["--set", "bands=4"], "history"),  # the band: the last b − 1 noise vectors w
    ("dpftrl", ["--batch-size", "50"], "nodes"),  # the tree: the current prefix's node noises
])
def test_a_checkpoint_with_an_edited_correlated_noise_state_is_refused(tmp_path, capsys, refused, method, extra,
                                                                         part):
    """Issue 31's review: the counts of the band's vectors and of the tree's nodes were checked, not their values; a
    band edited to cancel z_t would release later gradients with less noise than the record charges. The state is
    replayed from the noise stream and compared; one number changed is refused, the unedited state resumes."""
    args = ["--method", method, "--task", "breast_cancer", "--noise-multiplier", "1", "--epochs", "2", *extra]
    folder = tmp_path / "checkpoints"
    record = run_json(capsys, *args, "--checkpoint-dir", str(folder))
    (folder / checkpoint.RECORD).unlink()
    saved = checkpoint.load(folder / checkpoint.CHECKPOINT)
    kept = saved["dpbench"]["correlated"][part]
    assert kept, "the run ends with a non-empty band or tree"
    torch.save(saved, folder / checkpoint.CHECKPOINT)  # unedited: resumes to the same record
    assert comparable(run_json(capsys, *args, "--resume", str(folder))) == comparable(record)
    (folder / checkpoint.RECORD).unlink()
    kept[0][0].view(-1)[0] += 1e-3  # one coordinate of one vector
    torch.save(saved, folder / checkpoint.CHECKPOINT)
    store.default_path().unlink()  # `refused` checks that no store is written
    message = refused("run", *args, "--resume", str(folder))
    assert "correlated-noise state is not what the run's noise stream drew" in message


def test_a_method_whose_state_cannot_be_captured_is_refused_before_training(tmp_path, refused):
    (tmp_path / "opaque.py").write_text(textwrap.dedent('''
        import collections
        from dpbench.methods.dpsgd import DPSGD

        class Opaque(DPSGD):
            name = "opaque_sgd"
            description = "DP-SGD keeping a deque (tests only)"

            def setup(self):
                super().setup()
                self.history = collections.deque(maxlen=3)
    '''))
    error = refused("run", "--plugins", str(tmp_path), "--method", "opaque_sgd", "--task", "breast_cancer",
                    "--noise-multiplier", "1", "--checkpoint-dir", str(tmp_path / "checkpoints"))
    assert "history is a deque" in error and not (tmp_path / "checkpoints").exists()


# ---- kills while writing ---------------------------------------------------------------------------------------

def _write_then_die(path: str, die_in: str) -> None:
    def content(file):
        file.write(b"B" * 500_000)
        if die_in == "write":
            os.kill(os.getpid(), signal.SIGKILL)

    if die_in == "fsync":
        os.fsync = lambda descriptor: os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.atomic_write(Path(path), content)


@pytest.mark.parametrize("die_in", ["write", "fsync"])
def test_a_kill_while_writing_a_checkpoint_leaves_the_previous_one(tmp_path, die_in):
    path = tmp_path / checkpoint.CHECKPOINT
    checkpoint.atomic_write(path, lambda file: file.write(b"A" * 1000))
    child = multiprocessing.get_context("fork").Process(target=_write_then_die, args=(str(path), die_in))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL
    assert path.read_bytes() == b"A" * 1000


def _append_forever(path: str, start: int) -> None:
    for number in range(start, 10**9):
        record = {"task": "t", "method": "m", "data_id": "d", "created_at": f"{number:012d}", "number": number,
                  "padding": "x" * 200_000}
        record["run_id"] = store.content_id(record)
        store.append(record, Path(path))


def test_a_process_killed_while_appending_to_the_store_leaves_no_half_record(tmp_path):
    """Five times: a process appending 200 kB records as fast as it can is SIGKILLed at a random moment; the store
    then opens, passes SQLite's integrity check and holds whole records 0, 1, ..., k in order."""
    path, rng, count = tmp_path / "results.sqlite", random.Random(), 0
    for _ in range(5):
        child = multiprocessing.get_context("fork").Process(target=_append_forever, args=(str(path), count))
        child.start()
        time.sleep(rng.uniform(0.2, 1.0))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        with sqlite3.connect(path) as connection:
            assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        loaded = store.load(path)
        assert [record["number"] for record in loaded] == list(range(len(loaded)))
        assert all(store.content_id(record) == record["run_id"] for record in loaded)
        assert len(loaded) > count  # the child appended between two kills
        count = len(loaded)
