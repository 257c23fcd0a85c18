"""Multi-process DP training (``dpbench run --devices 2``, dpbench/run/distributed.py) with two real CPU processes under
Lightning's DDP launcher, on adult and on mnist_mlp (issue 18):

* the noise: every rank's release equals rank 0's (one all-reduce), and with every clipped gradient zero (a probe
  method whose per-example transform is 0, as on an empty batch) it is the noise alone, of standard deviation
  σC/B (B = q·n) within 2% — not √2 times it (both ranks drawing) nor 0 (none drawing);
* the sampling: each rank draws only its shard (examples r, r + 2, ...), and every example's inclusion count over
  the run is consistent with the rate q on both shards;
* the accounting: ε and the number of releases equal a one-process run's;
* the model: test accuracy over 5 seeds lies within the spread of 5 one-process runs' (min − 2 sd, max + 2 sd).
"""
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from dpbench.run import engine
from dpbench.spec import RunSpec

REPO = Path(__file__).resolve().parents[1]
SEEDS = range(5)

PLUGIN = textwrap.dedent('''
    """Tasks that record which training examples each rank's clipped sums see, and a probe of the released noise
    (tests/test_distributed.py). The example's index rides on its label: label + classes·index."""
    import os
    from dataclasses import replace

    import torch

    from dpbench.methods.dpsgd import DPSGD
    from dpbench.tasks.linear import Adult
    from dpbench.tasks.mnist import MNISTMLP


    def rank():
        return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


    class Indexed:
        def load_data(self):
            data = super().load_data()
            index = torch.arange(len(data.y_train))
            return replace(data, y_train=data.y_train + self.labels * index, data_id=data.data_id + "-indexed")

        def build_model(self, data):
            return super().build_model(replace(data, y_train=data.y_train % self.labels))

        def per_example_metrics(self, outputs, targets):  # the test set: not recorded
            self.testing = True
            try:
                return super().per_example_metrics(outputs, targets)
            finally:
                self.testing = False

        def per_example_loss(self, outputs, targets):
            folder = os.environ.get("DPBENCH_TEST_INDICES")
            if folder and not getattr(self, "testing", False):
                with open(os.path.join(folder, f"rank{rank()}.txt"), "a") as out:
                    out.write(" ".join(map(str, (targets // self.labels).tolist())) + "\\n")
            return super().per_example_loss(outputs, targets % self.labels)


    class IndexedAdult(Indexed, Adult):
        name = "indexed_adult"
        description = "adult recording the examples each release sees (test task)"
        labels = 2


    class IndexedMLP(Indexed, MNISTMLP):
        name = "indexed_mnist_mlp"
        description = "mnist_mlp recording the examples each release sees (test task)"
        labels = 10


    class NoiseProbe(DPSGD):
        """Zero per-example gradients, so that a release is its noise alone; each rank keeps the first releases."""

        name = "noise_probe"
        description = "writes its releases, of zeroed gradients (test method)"

        def per_example_transform(self, gradients):
            return [0 * g for g in gradients]

        def setup(self):
            super().setup()
            self.written = 0

        def step(self, release):
            flat = torch.cat([g.flatten() for g in release()])
            if self.written < 20:
                folder = os.environ["DPBENCH_TEST_RELEASES"]
                torch.save(flat, os.path.join(folder, f"release{rank()}-{self.written:02d}.pt"))
                self.written += 1
''')


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "indexed.py").write_text(PLUGIN)
    return folder


def dpbench(plugin, record, home, *args) -> dict:
    """``dpbench run ARGS`` in a new process (Lightning starts the other rank); the plugin writes into ``record``."""
    record.mkdir(parents=True, exist_ok=True)
    variable = "DPBENCH_TEST_RELEASES" if "noise_probe" in args else "DPBENCH_TEST_INDICES"
    env = {**os.environ, "DPBENCH_HOME": str(home), "OMP_NUM_THREADS": "1", variable: str(record),
           "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-m", "dpbench", "--plugins", str(plugin), "run", *args, "--json",
                             "--no-wandb"], env=env, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = [line for line in result.stdout.splitlines() if line.startswith("{")]  # rank 0 alone reports
    return json.loads(line)


def alone(plugin, record, monkeypatch, method, task, seed, args) -> dict:
    """The same run in one process (this one: no interpreter to start)."""
    record.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("DPBENCH_TEST_INDICES", str(record))
    overrides = {"epochs": int(args[1]), "batch_size": int(args[3])}
    return engine.run(RunSpec(method=method, task=task, noise_multiplier=1.5, seed=seed, overrides=overrides,
                              plugins=[str(plugin)], progress_bar=False, no_wandb=True))


TASKS = {"adult": ("indexed_adult", ["--epochs", "2", "--batch-size", "1024"]),
         "mnist_mlp": ("indexed_mnist_mlp", ["--epochs", "2", "--batch-size", "256"])}


@pytest.mark.parametrize("name", TASKS)
def test_two_processes_release_one_noise_sample_each_shard_and_account_once(name, plugin, tmp_path, mirror,
                                                                               monkeypatch):
    task, args = TASKS[name]
    common = ["--task", task, "--noise-multiplier", "1.5", *args]

    # The noise alone: both ranks hold the same release, of standard deviation σC/B.
    probe = dpbench(plugin, tmp_path / "probe", tmp_path / "home", "--method", "noise_probe", "--devices", "2",
                    *common)
    releases = {rank: [torch.load(path).numpy() for path in sorted((tmp_path / "probe").glob(f"release{rank}-*.pt"))]
                for rank in (0, 1)}
    assert len(releases[0]) == len(releases[1]) >= 10
    for mine, theirs in zip(releases[0], releases[1]):
        np.testing.assert_array_equal(mine, theirs)
    noise = np.concatenate(releases[0])
    expected = probe["noise_multiplier"] * probe["hyperparameters"]["clip"] / (probe["sample_rate"] * probe["n_train"])
    assert probe["world_size"] == 2 and abs(noise.std() / expected - 1) < 0.02, (noise.std(), expected)

    # Five seeds on two processes, five on one: shards, rates, ε and accuracy.
    multi, single = [], []
    for seed in SEEDS:
        folder = tmp_path / f"multi{seed}"
        multi.append(dpbench(plugin, folder, tmp_path / "home", "--method", "dpsgd", "--devices", "2",
                             "--seed", str(seed), *common))
        lines = {rank: (folder / f"rank{rank}.txt").read_text().splitlines() for rank in (0, 1)}
        assert len(lines[0]) == len(lines[1]) == multi[-1]["gradient_evaluations"]  # one per release, each rank
        n, q, releases = multi[-1]["n_train"], multi[-1]["sample_rate"], multi[-1]["gradient_evaluations"]
        for rank in (0, 1):
            seen = Counter(int(i) for line in lines[rank] for i in line.split())
            assert all(i % 2 == rank for i in seen)  # its own shard only
            shard = range(rank, n, 2)
            counts = np.array([seen[i] for i in shard])
            # Each count is Binomial(releases, q): the shard's total and the spread of the counts.
            total, mean = counts.sum(), len(shard) * releases * q
            assert abs(total - mean) < 6 * np.sqrt(mean * (1 - q)), (rank, total, mean)
            chi2 = ((counts - releases * q) ** 2 / (releases * q * (1 - q))).sum()
            assert stats.chi2.sf(chi2, len(shard)) > 1e-6 and stats.chi2.cdf(chi2, len(shard)) > 1e-6, chi2
        single.append(alone(plugin, tmp_path / f"single{seed}", monkeypatch, "dpsgd", task, seed, args))
        assert "world_size" not in single[-1]
        assert multi[-1]["epsilon"] == single[-1]["epsilon"]
        assert multi[-1]["gradient_evaluations"] == single[-1]["gradient_evaluations"]
    accuracy = {kind: np.array([r["metrics"]["test_accuracy"] for r in runs])
                for kind, runs in (("multi", multi), ("single", single))}
    low = accuracy["single"].min() - 2 * accuracy["single"].std(ddof=1)
    high = accuracy["single"].max() + 2 * accuracy["single"].std(ddof=1)
    assert ((low <= accuracy["multi"]) & (accuracy["multi"] <= high)).all(), accuracy
