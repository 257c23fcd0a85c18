"""What stands between a run and its record (dpbench/privacy/guards.py): layers that mix examples are refused before
training, and a run whose batches are inconsistent with its record, or whose spent ε exceeds its target, is
refused after it. The wiring tests follow each example index from the sampler to the loss the method's gradient is
computed from, on every path that trains: one run, batched seeds and tuning trials."""
import json
import math
from collections import Counter

import pytest
import torch
from scipy import stats
from torch import nn

from dpbench import catalog, registry
from dpbench.cli import main
from dpbench.errors import UsageError
from dpbench.privacy import guards, sampling
from dpbench.results import store
from dpbench.run import engine, multiseed, planning
from dpbench.spec import RunSpec
from dpbench.tasks.linear import Digits
from dpbench.tuning.accounting import ValidationSplit

# ---- layers that mix examples ------------------------------------------------------------------------------------

PLUGIN_TASKS = """
import torch
from torch import nn
from dpbench.tasks.linear import Digits


class Centre(nn.Module):
    def forward(self, x):
        return x - x.mean(0, keepdim=True)


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return x


class BatchNormDigits(Digits):
    name = "bn_digits"
    description = "digits through BatchNorm1d(affine=False): mixes examples (test plugin)"

    def build_model(self, data):
        linear = super().build_model(data)
        return nn.Sequential(nn.BatchNorm1d(64, affine=False), linear)


class CentredDigits(Digits):
    name = "centred_digits"
    description = "digits centred on the batch mean: mixes examples without buffers (test plugin)"

    def build_model(self, data):
        return nn.Sequential(Centre(), super().build_model(data))


class CountingDigits(Digits):
    name = "counting_digits"
    description = "digits with a buffer changed by every forward pass (test plugin)"

    def build_model(self, data):
        return nn.Sequential(Counting(), super().build_model(data))


class DropoutDigits(Digits):
    name = "dropout_digits"
    description = "digits with dropout and per-example instance norm: neither mixes examples (test plugin)"

    def build_model(self, data):
        return nn.Sequential(nn.Dropout(0.2), nn.Unflatten(1, (1, 64)), nn.InstanceNorm1d(1), nn.Flatten(),
                             super().build_model(data))
"""


@pytest.fixture
def plugin_tasks(tmp_path):
    (tmp_path / "mixing.py").write_text(PLUGIN_TASKS)
    return str(tmp_path)


@pytest.mark.parametrize("task, message", [("bn_digits", "mixes the examples of a batch"),
                                           ("centred_digits", "depends on another example"),
                                           ("counting_digits", "buffers 0.calls change")])
def test_a_model_that_mixes_examples_is_refused(refused, plugin_tasks, task, message):
    """BatchNorm1d(affine=False) gave a sensitivity of 3.1·C under ghost clipping, and its running statistics of
    private batches were saved with the model."""
    assert message in refused("run", "--plugins", plugin_tasks, "--method", "dpsgd", "--task", task, "--epsilon", "1",
                              "--epochs", "1")


def test_dropout_and_instance_norm_are_not_mistaken_for_mixing(plugin_tasks, capsys):
    assert main(["run", "--plugins", plugin_tasks, "--method", "dpsgd", "--task", "dropout_digits", "--epsilon", "1",
                 "--epochs", "1", "--json", "--no-wandb"]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] <= 1


def test_the_check_leaves_the_model_as_it_was():
    task = Digits()
    task.prepare()
    task.model = nn.Sequential(nn.BatchNorm1d(64, track_running_stats=True), task.model)
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    with pytest.raises(UsageError):
        guards.refuse_example_mixing(task, task.data.x_test[:3])
    assert all(torch.equal(before[k], v) for k, v in task.model.state_dict().items())


# ---- the spent-ε guard -------------------------------------------------------------------------------------------

def test_a_run_spending_more_than_the_tasks_default_target_is_not_recorded(monkeypatch, capsys):
    """The guard compared only with --epsilon: with σ halved and no --epsilon, ε = 2.55 was recorded against the
    task's target 1.0."""
    real = planning.calibrate_noise_multiplier
    monkeypatch.setattr(planning, "calibrate_noise_multiplier", lambda *args: real(*args) / 2)
    code = main(["run", "--method", "dpsgd", "--task", "digits", "--epochs", "2", "--no-wandb"])
    assert code == 2 and "calibration failed" in capsys.readouterr().err  # plan checks it before training
    monkeypatch.setattr(planning, "_meets_target", lambda combined, *args: (combined, (), combined))  # and if not:
    code = main(["run", "--method", "dpsgd", "--task", "digits", "--epochs", "2", "--no-wandb"])
    assert code == 1 and "exceeds the target" in capsys.readouterr().err
    assert store.load() == []


# ---- the sampling guard ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("factor", [2.0, 0.5])
def test_a_sampler_drawing_at_another_rate_than_the_record_is_refused(monkeypatch, capsys, factor):
    """The review's mutation: the Poisson rate wired as 2q (or q/2) while record, calibration and ledger keep q."""
    class Miswired(sampling.PoissonSampler):
        def __init__(self, n, sample_rate, *args):
            super().__init__(n, min(1.0, sample_rate * factor), *args)

    monkeypatch.setattr(planning, "PoissonSampler", Miswired)
    code = main(["run", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--no-wandb"])
    assert code == 1 and "does not draw at the rate" in capsys.readouterr().err
    assert store.load() == []


def test_the_sampling_guard_passes_every_honest_count_and_no_dishonest_one():
    n, q, releases = 1437, 256 / 1437, 180
    counts = stats.binom(n * releases, q).rvs(size=2000, random_state=0)
    for count in counts:
        guards.check_sampling("poisson", q, n, releases, int(count))
    mean, sd = n * releases * q, math.sqrt(n * releases * q * (1 - q))
    for wrong in (round(mean + 12 * sd), round(mean - 12 * sd), round(2 * mean)):
        with pytest.raises(guards.PrivacyCheckFailed):
            guards.check_sampling("poisson", q, n, releases, wrong)
    guards.check_sampling("poisson", 1.0, n, 5, 5 * n)
    guards.check_sampling("shuffle", 64 / n, n, 22, 22 * 64)
    for sampler, rate, count in [("poisson", 1.0, 5 * n - 1), ("shuffle", 64 / n, 22 * 64 + 1)]:
        with pytest.raises(guards.PrivacyCheckFailed):
            guards.check_sampling(sampler, rate, n, 5 if rate == 1.0 else 22, count)


# ---- wiring: the batches the method's gradients are computed from ------------------------------------------------

class IndexedDigits(Digits):
    """Digits whose targets carry each example's index (label + 10·index); the loss sees only the label and records
    the indices of the training examples it is computed on. Test examples get indices from 10⁶ on."""

    name = "indexed_digits"
    description = "digits that record which training examples reach the loss (test task)"
    seen: list[torch.Tensor] = []

    def load_data(self):
        data = super().load_data()
        index = lambda y, start: y + 10 * torch.arange(start, start + len(y))
        return type(data)(data.x_train, index(data.y_train, 0), data.x_test, index(data.y_test, 10**6),
                          "indexed-digits", data.preprocessing)

    def build_model(self, data):
        model = super().build_model(data)
        self.classes = 10
        return model

    def per_example_loss(self, outputs, targets):
        indices = targets // 10
        IndexedDigits.seen.append(indices[indices < 10**6].detach().clone())
        return super().per_example_loss(outputs, targets % 10)

    def per_example_metrics(self, outputs, targets):  # not through per_example_loss: test examples are not recorded
        labels = targets % 10
        return {"accuracy": (outputs.argmax(-1) == labels).float(),
                "loss": nn.functional.cross_entropy(outputs, labels, reduction="none")}


@pytest.fixture
def indexed(monkeypatch):
    real = registry.tasks
    monkeypatch.setattr(registry, "tasks", lambda folders=None: {**real(folders), "indexed_digits": IndexedDigits})
    monkeypatch.setattr(catalog, "names", lambda kind, folders: None)  # the command line asks the registry
    batches = []
    real_iter = sampling.PoissonSampler.__iter__

    def counting(sampler):
        for step in real_iter(sampler):
            batches.extend(step)
            yield step

    monkeypatch.setattr(sampling.PoissonSampler, "__iter__", counting)
    IndexedDigits.seen = []
    return batches


def assert_inclusion_consistent(counts: Counter, examples: list[int], rounds: int, rate: float):
    """Each example's count is Binomial(rounds, rate); the total is Binomial(len(examples)·rounds, rate)."""
    total = sum(counts[i] for i in examples)
    assert set(counts) <= set(examples), "an example outside the training set reached the loss"
    trials = len(examples) * rounds
    assert stats.binom.sf(total - 1, trials, rate) > 1e-6 and stats.binom.cdf(total, trials, rate) > 1e-6, \
        f"{total} inclusions, expected {trials * rate:.0f}"
    per_example = stats.binom(rounds, rate)
    assert all(per_example.sf(counts[i] - 1) > 1e-9 and per_example.cdf(counts[i]) > 1e-9 for i in examples)


FIXED = {"epochs": 10, "batch_size": 256}  # 10 epochs of round(1437 / 256) = 6 steps: 60 releases


def test_one_run_trains_on_batches_at_the_recorded_rate(indexed):
    record = engine.run(RunSpec(method="dpsgd", task="indexed_digits", epsilon=1.0, overrides=FIXED, no_wandb=True,
                                progress_bar=False))
    counts = Counter(torch.cat(IndexedDigits.seen).tolist())
    n, q, releases = record["n_train"], record["sample_rate"], record["gradient_evaluations"]
    assert len(indexed) == releases == 60 and q == pytest.approx(256 / n)
    assert_inclusion_consistent(counts, list(range(n)), releases, q)
    assert sum(len(batch) for batch in indexed) == sum(counts.values())


def test_full_batch_methods_use_every_example_in_every_release(indexed):
    record = engine.run(RunSpec(method="dpgd", task="indexed_digits", epsilon=1.0, overrides={"epochs": 4},
                                no_wandb=True, progress_bar=False))
    counts = Counter(torch.cat(IndexedDigits.seen).tolist())
    assert record["sample_rate"] == 1 and record["gradient_evaluations"] == len(indexed) == 4
    assert counts == Counter({i: 4 for i in range(record["n_train"])})


def test_batched_seeds_train_each_seed_on_batches_at_the_recorded_rate(indexed):
    records = multiseed.run_seeds(RunSpec(method="dpsgd", task="indexed_digits", epsilon=1.0, overrides=FIXED,
                                          no_wandb=True, progress_bar=False), [0, 1, 2])
    counts = Counter(torch.cat(IndexedDigits.seen).tolist())
    n, q = records[0]["n_train"], records[0]["sample_rate"]
    releases = sum(r["gradient_evaluations"] for r in records)
    assert [r["clipping"] for r in records] == ["multiseed"] * 3 and len(indexed) == releases == 3 * 60
    assert_inclusion_consistent(counts, list(range(n)), releases, q)


def test_tuning_trials_train_on_the_training_part_at_the_planned_rate(indexed, capsys):
    assert main(["tune", "--method", "dpsgd", "--task", "indexed_digits", "--epsilon", "2", "--epochs", "3",
                 "--trials", "2", "--mode", "adaptive", "--no-wandb", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    tuned = record["tuning"]
    held_out = ValidationSplit(0.1, 0, 0.0, 0).mask(1437)
    training_part = [i for i in range(1437) if not held_out[i]]
    counts = Counter(torch.cat(IndexedDigits.seen).tolist())
    releases = 2 * tuned["gradient_evaluations"]
    assert len(indexed) == releases and tuned["sample_rate"] == pytest.approx(
        IndexedDigits.defaults["batch_size"] / len(training_part))
    assert_inclusion_consistent(counts, training_part, releases, tuned["sample_rate"])
