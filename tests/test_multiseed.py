"""Seeds trained as one batched computation equal the same seeds trained one by one."""
import functools
from dataclasses import replace

import pytest
import pytorch_lightning as pl
import torch

from dpbench import registry
from dpbench.method import stacked
from dpbench.privacy import correlated
from dpbench.privacy.clipping import clip_factors
from dpbench.privacy.ghost import GhostClipper
from dpbench.privacy.sampling import IndexedTensors, PoissonSampler
from dpbench.results import store
from dpbench.run import multiseed, planning
from dpbench.run.engine import run
from dpbench.run.training import PrivateTraining
from dpbench.spec import RunSpec, resolve_hyperparameters

METHODS = registry.methods([])
_LOCKSTEP = multiseed._lockstep
TASKS = registry.tasks([])


def seeded_run(task_name, method_name, seed, sigma, epochs, **overrides):
    """What engine.run builds for one seed: model, module, sampler. ``method_name``: a registered name or a class."""
    method = METHODS[method_name] if isinstance(method_name, str) else method_name
    hp, _ = resolve_hyperparameters(method, TASKS[task_name], {"epochs": epochs, **overrides})
    pl.seed_everything(seed, verbose=False)
    task = TASKS[task_name]()
    data = task.prepare()
    n, batch_size = data.n_train, hp["batch_size"]
    module = PrivateTraining(task, method, hp, sigma, batch_size, seed)
    per_step = method.releases_per_step
    sampler = PoissonSampler(n, batch_size / n, max(1, round(n / (batch_size * per_step))), per_step, seed)
    return module, sampler, data


def train_alone(module, sampler, data, epochs):
    module.on_fit_start()
    examples = IndexedTensors(data.x_train, data.y_train)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for step, batches in enumerate(sampler):
            module.training_step(examples.__getitems__(batches), step)


@pytest.mark.parametrize("task_name, method_name, overrides", [
    ("digits", "dpsgd", {"momentum": 0.9}),
    ("breast_cancer", "dpadam_bc", {}),
    ("digits", "norm_bound", {}),
    ("digits", "adaclip", {"h2": 1e-3}),  # (g − m)/b, each seed with its own m and b
    ("breast_cancer", "adaclip", {"clip": 0.5}),
    ("digits", "ada_dp", {}),  # two releases per step, the second at the half step θ½
    ("breast_cancer", "ada_dp", {"variant": "paper"}),
    ("breast_cancer", "dpgd", {"batch_size": 455}),  # q = 1: every seed's batch is the whole training set
])
def test_batched_seeds_equal_separate_runs(task_name, method_name, overrides):
    seeds, epochs, sigma = [0, 1, 2], 2, 1.3
    alone = [seeded_run(task_name, method_name, seed, sigma, epochs, **overrides) for seed in seeds]
    for module, sampler, data in alone:
        train_alone(module, sampler, data, epochs)
    batched = [seeded_run(task_name, method_name, seed, sigma, epochs, **overrides) for seed in seeds]
    data = batched[0][2]
    multiseed.train([m for m, _, _ in batched], IndexedTensors(data.x_train, data.y_train),
                    [s for _, s, _ in batched], [epochs] * len(seeds))
    for (one, _, _), (many, _, _) in zip(alone, batched):
        assert (many.releases, many.steps) == (one.releases, one.steps)
        for p, q in zip(one.params(), many.params()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
        assert multiseed.test_metrics(many, data.x_test, data.y_test)["test_accuracy"] == pytest.approx(
            multiseed.test_metrics(one, data.x_test, data.y_test)["test_accuracy"], abs=1.5 / len(data.y_test))
    first = [p.detach() for p in batched[0][0].params()]
    assert not all(torch.equal(a, b) for a, b in zip(first, batched[1][0].params()))  # seeds differ


class LookAhead(METHODS["dpsgd"]):
    """Moves its parameters before asking for its release."""
    name = "look_ahead"

    def step(self, release):
        with torch.no_grad():
            self.params[0].add_(0.01)
        super().step(release)


def test_methods_that_move_parameters_before_their_release_batch_like_separate_runs():
    alone = [seeded_run("digits", LookAhead, seed, 1.0, 1) for seed in (0, 1)]
    for module, sampler, data in alone:
        train_alone(module, sampler, data, 1)
    batched = [seeded_run("digits", LookAhead, seed, 1.0, 1) for seed in (0, 1)]
    data = batched[0][2]
    multiseed.train([m for m, _, _ in batched], IndexedTensors(data.x_train, data.y_train), [s for _, s, _ in batched],
                    [1, 1])
    for (one, _, _), (many, _, _) in zip(alone, batched):
        for p, q in zip(one.params(), many.params()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


def module_for(method_name, model=None):
    task = TASKS["digits"]()
    task.prepare()
    if model is not None:
        task.model = model
    method = METHODS[method_name] if isinstance(method_name, str) else method_name
    hp, _ = resolve_hyperparameters(method, TASKS["digits"], {})
    return PrivateTraining(task, method, hp, 1.0 if method.private else 0.0, 64, 0)


class Squashed(METHODS["dpsgd"]):
    """A per-example transform that is not coordinate-wise affine."""
    name = "squashed"

    def per_example_transform(self, gradients):
        return [torch.tanh(g) for g in gradients]


@pytest.mark.parametrize("method_name, model, message", [
    (Squashed, None, "only coordinate-wise affine per-example transforms"),
    ("dpsgd", torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10)), "not a single"),
])
def test_only_linear_models_and_plain_methods_are_batched(method_name, model, message):
    with pytest.raises(multiseed.NotBatchable, match=message):
        multiseed.check_batchable(module_for(method_name, model))
    for batchable in ("dpsgd", "nonprivate", "adaclip", "ada_dp"):
        multiseed.check_batchable(module_for(batchable))


@pytest.mark.parametrize("method_name", ["dpsgd", "dpadam_bc", "adaclip", "ada_dp", "nonprivate", "autoclip",
                                         "quantile_clip", "bandmf", "dpftrl"])
def test_runs_with_other_hyperparameters_and_schedules_batch_like_separate_runs(method_name):
    """Tuning trials: other learning rates, clip norms, epochs and batch sizes (other sampling rates and steps per
    epoch) in one lockstep batch, the shorter runs dropping out; the records equal separate runs'. With automatic
    clipping, a moving clip norm and a count release, banded and tree noise too (each run's γ, C_t, count, band or
    tree state its own)."""
    scale = {"dpadam_bc": 0.01, "dpftrl": 0.1}.get(method_name, 1.0)  # Adam's steps are not the gradient's size;
    # DP-FTRL's step is lr times the momentum of the prefix sums
    trials = [{"lr": 0.5 * scale, "epochs": 2, "batch_size": 64}, {"lr": 0.05 * scale, "epochs": 4, "batch_size": 256},
              {"lr": 2.0 * scale, "epochs": 1, "batch_size": 128}]
    if method_name == "autoclip":  # C fixed at 1: each run its own γ
        for trial, gamma in zip(trials, (0.01, 0.1, 1.0)):
            trial["gamma"] = gamma
    elif method_name != "nonprivate":
        for trial, clip in zip(trials, (0.3, 1.0, 3.0)):
            trial["clip"] = clip
    if method_name == "dpsgd":  # runs with and without momentum state in one batched update
        trials[1]["momentum"] = 0.9
    specs = [RunSpec(method=method_name, task="digits", epsilon=2.0 if method_name != "nonprivate" else None,
                     seed=seed, overrides=trial, progress_bar=False, no_wandb=True)
             for seed, trial in enumerate(trials)]
    batched = multiseed.run_batch(specs)
    for spec, record in zip(specs, batched):
        alone = run(replace(spec, append_to_store=False))
        for key in ("epsilon", "noise_multiplier", "sample_rate", "steps", "gradient_evaluations", "hyperparameters",
                    "clip_norms", "count_noise_std", "noise_correlation"):
            assert record.get(key) == alone.get(key), key
        # AdamBC divides by √max(v − Φ, γ′): float-order differences of the batched kernels grow where v − Φ is
        # near γ′ (1.1e-3 relative after one epoch at lr 0.02); the predictions stay the same
        assert record["metrics"]["test_loss"] == pytest.approx(alone["metrics"]["test_loss"], rel=1e-2 if
                                                               method_name == "dpadam_bc" else 1e-3)
        assert record["metrics"]["test_accuracy"] == alone["metrics"]["test_accuracy"]
        assert record["clipping"] == "multiseed" and record["batched_seeds"] == 3


def test_run_seeds_gives_the_records_of_separate_runs():
    spec = RunSpec(method="dpadam", task="digits", epsilon=1.0, overrides={"epochs": 3}, progress_bar=False,
                   no_wandb=True)
    batched = multiseed.run_seeds(spec, [0, 1])
    for record in batched:
        alone = run(replace(spec, seed=record["seed"]))
        for key in ("epsilon", "noise_multiplier", "sample_rate", "steps", "gradient_evaluations", "hyperparameters",
                    "data_id", "sampler", "accountant"):
            assert record[key] == alone[key], key
        assert record["metrics"]["test_accuracy"] == pytest.approx(alone["metrics"]["test_accuracy"], abs=1.5 / 360)
        assert record["batched_seeds"] == 2 and "batched_seeds" not in alone
    assert len(store.load()) == 4


def test_tasks_with_augmentation_are_not_batched():
    class Augmented(TASKS["digits"]):
        name = "augmented_digits"

        def augment(self, x):
            return x + 0.01 * torch.randn_like(x)

    task = Augmented()
    task.prepare()
    hp, _ = resolve_hyperparameters(METHODS["dpsgd"], Augmented, {})
    with pytest.raises(multiseed.NotBatchable, match="augmentation"):
        multiseed.check_batchable(PrivateTraining(task, METHODS["dpsgd"], hp, 1.0, 64, 0))


def test_many_runs_train_in_groups_that_bound_a_steps_memory(monkeypatch):
    """Runs beyond MAX_PAIRS_PER_STEP (expected rows per step, summed) train in the next group: 80 full-batch
    trials on kddcup99 in one step held 28 million pairs and were killed for memory. A trial's split of the training
    data is one tensor for all trials (80 copies took 13 GB)."""
    from dpbench.tuning.accounting import ValidationSplit

    spec = RunSpec(method="dpsgd", task="breast_cancer", epsilon=1.0, overrides={"epochs": 1, "batch_size": 100},
                   progress_bar=False, no_wandb=True, append_to_store=False)
    monkeypatch.setattr(multiseed, "MAX_PAIRS_PER_STEP", 250)  # two runs of ~100 rows per step per group
    records = multiseed.run_many([replace(spec, seed=seed) for seed in range(5)])
    assert [r["batched_seeds"] for r in records] == [2, 2, 2, 2, 1]
    monkeypatch.setattr(multiseed, "MAX_PAIRS_PER_STEP", 10**9)
    assert [r["metrics"] for r in multiseed.run_many([replace(spec, seed=seed) for seed in (0, 1)])] == \
           [r["metrics"] for r in records[:2]]  # the same pair in a group of its own: the same runs
    task = registry.tasks([])["breast_cancer"]()
    loaded = task.prepare(0)
    split = ValidationSplit(0.1, 0, 0.0, 0)
    (first, held), (second, _) = split.split(loaded), split.split(loaded)
    assert first.x_train is second.x_train and len(first.x_train) + len(held[0]) == loaded.n_train


def test_a_whole_training_set_batch_is_summed_over_its_distinct_examples_with_their_counts(monkeypatch):
    """DP-GD's batch (every example) is taken as its distinct examples, each clipped gradient weighted by its count:
    the same training as summing over every row, here with 100 examples repeated."""
    data = seeded_run("breast_cancer", "dpgd", 0, 1.3, 2)[2]
    examples = IndexedTensors(torch.cat([data.x_train, data.x_train[:100]]),
                              torch.cat([data.y_train, data.y_train[:100]]))
    distinct = multiseed.distinct_examples
    first, counts = distinct(examples)
    assert len(first) <= len(examples) - 100 and counts.sum() == len(examples) and counts.max() >= 2
    every_row = (torch.arange(len(examples)), torch.ones(len(examples), dtype=examples.x.dtype))
    calls = []

    def trained(grouping):
        monkeypatch.setattr(multiseed, "distinct_examples", lambda d: calls.append(d) or grouping(d))
        runs = [seeded_run("breast_cancer", "dpgd", seed, 1.3, 2, batch_size=455) for seed in (0, 1)]
        samplers = [PoissonSampler(len(examples), 1.0, 1, 1, seed) for seed in (0, 1)]
        multiseed.train([module for module, _, _ in runs], examples, samplers, [2, 2])
        return [p.detach().clone() for module, _, _ in runs for p in module.params()]

    for by_distinct, by_row in zip(trained(distinct), trained(lambda d: every_row)):
        torch.testing.assert_close(by_distinct, by_row, rtol=1e-5, atol=1e-6)
    assert len(calls) == 2  # each training grouped once, on its first whole-set batch


def test_stacked_makes_the_tensors_rows_of_one_tensor_and_is_free_once_they_are():
    params = [torch.nn.Parameter(torch.full((2, 3), float(i))) for i in range(3)]
    rows = stacked(params)
    assert rows.shape == (3, 2, 3) and [float(p.detach()[0, 0]) for p in params] == [0.0, 1.0, 2.0]
    with torch.no_grad():
        rows.add_(1.0)  # an update of the stacked tensor is an update of every parameter
    assert [float(p.detach()[1, 2]) for p in params] == [1.0, 2.0, 3.0]
    assert stacked(params).data_ptr() == rows.data_ptr()  # already rows: no copy
    with torch.no_grad():
        params[1].mul_(0.0)
    assert float(rows[1].abs().sum()) == 0.0
    fewer = stacked(params[:2])  # a subset (a run dropped out) is copied once, then free again
    assert fewer.data_ptr() != rows.data_ptr() and stacked(params[:2]).data_ptr() == fewer.data_ptr()


@pytest.mark.parametrize("method_name, together", [("dpsgd", True), ("dpadam", True), ("dpadam_bc", True),
                                                   ("adaclip", True), ("dpgd", True), ("norm_bound", True),
                                                   ("ada_dp", False), ("nonprivate", False), (LookAhead, False)])
def test_one_release_methods_are_updated_together_and_the_others_step_in_greenlets(monkeypatch, method_name,
                                                                                    together):
    method = METHODS[method_name] if isinstance(method_name, str) else method_name
    assert method.batches_updates() is together
    lockstep = []
    monkeypatch.setattr(multiseed, "_lockstep", lambda *args: lockstep.append(args) or _LOCKSTEP(*args))
    runs = [seeded_run("digits", method, seed, 1.0, 1) for seed in (0, 1)]
    data = runs[0][2]
    multiseed.train([m for m, _, _ in runs], IndexedTensors(data.x_train, data.y_train), [s for _, s, _ in runs],
                    [1, 1])
    assert bool(lockstep) is not together


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("size, divisor", [(4.0, 1e-6), (1000.0, 1e-8)])
def test_adaclip_clipped_sums_of_batched_and_single_runs_move_by_at_most_c_over_b_per_example(size, divisor, seed):
    """Near-duplicate examples with AdaCliP's m at their shared gradient and b = 1e-6 (where the method's own
    update drives them): the float32 closed form (Σ c_i G_i − (Σ c_i)·M)/S let one example move a run's released sum
    (before noise) by 299·C on the batched path and 431·C on the single-run one (inputs of size 4); with inputs of
    size 1000 and b = 1e-8 the float64 closed form is not enough either. Three runs in one batch, on D, D
    without its last example and D with it replaced by another: their sums over B may differ by C/B and 2C/B
    (C = 1), plus the float32 rounding of each noisy sum (here σ = 0), as on the single-run path."""
    batch = 256
    modules = [seeded_run("digits", "adaclip", 0, 0.0, 1, batch_size=batch)[0] for _ in range(3)]
    task = modules[0].task
    generator = torch.Generator().manual_seed(seed)
    base = size * torch.rand(64, generator=generator)
    x = base + 1e-6 * torch.randn(batch + 1, 64, generator=generator) / 8
    x[batch] = 16 * torch.rand(64, generator=generator)
    y = torch.full((batch + 1,), seed + 1)
    with torch.enable_grad():
        logits = task(base[None]).detach().requires_grad_(True)
        g, = torch.autograd.grad(task.per_example_loss(logits, y[:1]).sum(), logits)
    shift, scale = [g.T * base[None], g[0]], [torch.full((10, 64), divisor), torch.full((10,), divisor)]
    for module in modules:
        module.method.mean, module.method.scale = [m.clone() for m in shift], [s.clone() for s in scale]
    rows = [torch.arange(batch), torch.arange(batch - 1), torch.cat([torch.arange(batch - 1), torch.tensor([batch])])]
    released, _ = multiseed._releases(modules, IndexedTensors(x, y), x.square().sum(1) + 1, rows,
                                   torch.ones(3), torch.full((3,), 1 / batch))
    together = [torch.cat([r[run].flatten() for r in released]).double() for run in range(3)]
    alone, exact = [], []
    for chosen in rows:
        into = [torch.zeros_like(p, dtype=torch.float64) for p in modules[0].params()]
        sums, norms = GhostClipper().clipped_sum(task, x[chosen], y[chosen], 1.0, modules[0].current_transform(),
                                                 scale=1 / batch, into=into)
        alone.append(torch.cat([s.flatten() for s in sums]))
        logits = task(x[chosen]).detach().requires_grad_(True)  # the float64 sum of materialized (G_i − M)/S
        with torch.enable_grad():
            g, = torch.autograd.grad(task.per_example_loss(logits, y[chosen]).sum(), logits)
        gradients = [g.double()[:, :, None] * x[chosen].double()[:, None, :], g.double()]
        factors = clip_factors(norms, 1.0, 1 / batch).double()
        exact.append(torch.cat([torch.tensordot(factors, (G - m.double()) / s.double(), dims=1).flatten()
                                for G, m, s in zip(gradients, shift, scale)]))
    for sums, rounding in ((together, 2.0**-24), (alone, 0.0)):
        slack = [rounding * float(sums[0].norm() + other.norm()) for other in sums]
        assert float((sums[0] - sums[1]).norm()) <= (1 + 1e-5) / batch + slack[1]
        assert float((sums[0] - sums[2]).norm()) <= 2 * (1 + 1e-5) / batch + slack[2]
    for one, many, reference in zip(alone, together, exact):  # the batched sum rounded to float32 (σ = 0)
        assert float((many - reference).norm()) <= 1e-6 / batch + 2.0**-24 * float(reference.norm())
        assert float((one - reference).norm()) <= 1e-6 / batch


def batch_spec(**changes):
    return replace(RunSpec(method="dpsgd", task="digits", epsilon=1.0, overrides={"epochs": 1}, progress_bar=False,
                           no_wandb=True, append_to_store=False), **changes)


@pytest.mark.parametrize("other, message", [
    ({"method": "dpadam"}, "share the method and the task"),
    ({"task": "breast_cancer"}, "share the method and the task"),
    ({"clipping": "reference"}, "only the fast clipping path"),
    ({"overrides": {"epochs": 1, "bias": False}}, "models differ"),  # a model without bias: its sum was dropped
])
def test_batched_runs_that_differ_in_one_respect_are_refused(other, message):
    """Runs that differ from the first in one respect only (and in the seed): not trained together."""
    with pytest.raises(multiseed.NotBatchable, match=message):
        multiseed.run_batch([batch_spec(), batch_spec(seed=1, **other)])


def test_release_methods_are_not_batched():
    specs = [batch_spec(method="output_perturbation", overrides={}, seed=seed) for seed in (0, 1)]
    with pytest.raises(multiseed.NotBatchable, match="releases through dpbench.release.mechanisms"):
        multiseed.run_batch(specs)


@pytest.mark.parametrize("part", ["inputs", "labels"])
def test_runs_whose_training_data_differ_are_not_batched(monkeypatch, part):
    """A task whose training inputs, or only its labels, depend on the run seed: two seeds' runs have different data
    (batched, both trained on the first run's; the labels were not compared)."""
    digits = TASKS["digits"]
    loaded = digits.load_data

    def seeded(self):  # the global generator is on the run seed's data stream here (Task.prepare)
        data = loaded()
        if part == "labels":
            return replace(data, y_train=data.y_train[torch.randperm(len(data.y_train))])
        return replace(data, x_train=data.x_train + 0.01 * torch.randn_like(data.x_train))

    monkeypatch.setattr(digits, "load_data", seeded)
    with pytest.raises(multiseed.NotBatchable, match="training data differ"):
        multiseed.run_batch([batch_spec(), batch_spec(seed=1)])


def test_sparse_inputs_are_not_batched():
    module = module_for("dpsgd")
    module.task.data = replace(module.task.data, x_train=module.task.data.x_train.to_sparse())
    with pytest.raises(multiseed.NotBatchable, match="sparse inputs"):
        multiseed.check_batchable(module)


@pytest.mark.parametrize("methods, message", [
    ((Squashed, Squashed), "became other than coordinate-wise affine"),  # a transform changed during training
    (("dpsgd", "adaclip"), "some runs transform"),
])
def test_a_step_whose_transforms_the_closed_form_does_not_cover_is_refused(methods, message):
    modules = [module_for(method) for method in methods]
    data = modules[0].task.data
    examples = IndexedTensors(data.x_train, data.y_train)
    with pytest.raises(multiseed.NotBatchable, match=message):
        multiseed._releases(modules, examples, data.x_train.square().sum(1) + 1, [torch.arange(8)] * 2,
                            torch.ones(2), torch.full((2,), 1 / 64))


def test_a_refused_run_among_many_keeps_its_reason():
    """A refused spec's record is None and its UsageError is kept: a tuning trial refused in a batch of studies
    failed with "the engine refused the trial's settings" and no word of why (test_sweep's random-stopping cell)."""
    good = RunSpec(method="output_perturbation", task="breast_cancer", epsilon=1.0, seed=0, progress_bar=False,
                   no_wandb=True, append_to_store=False)
    bad = replace(good, overrides={"lr": 1.0, "input_norm": 10.0})  # η > 2/β = 0.08
    refusals = {}
    records = multiseed.run_many([good, bad], refusals=refusals)
    assert records[0] is not None and records[1] is None
    assert list(refusals) == [1] and "the convex variant's bound needs 0 < lr ≤ 2/β = 0.08" in str(refusals[1])


@pytest.mark.parametrize("method_name", ["quantile_clip", "autoclip", "bandmf", "dpftrl"])
def test_consecutive_batched_releases_are_the_engines(method_name):
    """Three releases of one run, by the engine (PrivateTraining.release) and by the batched closed form, from the
    same noise stream: the same noisy gradients and the same counts, with C_t moved between releases (its noise
    σC_t/B), a training example whose gradient is not finite (dropped from the sum; counted above C) and the band or
    tree state carried from release to release."""
    spec = RunSpec(method=method_name, task="digits", epsilon=1.0, overrides={"epochs": 1}, progress_bar=False,
                   no_wandb=True, append_to_store=False)
    alone, together = (planning.plan(spec).module() for _ in range(2))
    for module in (alone, together):
        module.on_fit_start()
    data = alone.task.data
    x = data.x_train.clone()
    x[3] = 1e25  # its squared norm overflows float32: a gradient norm that is not finite
    examples = IndexedTensors(x, data.y_train)
    input_sq = x.square().sum(1) + 1
    clip, scale = alone.hp["clip"], 1 / alone.expected_batch_size
    for step, moved in enumerate((None, 2.5, 0.4)):
        if method_name == "quantile_clip":  # the method's C_t (a public function of earlier counts)
            for module in (alone, together):
                module.method.clip_norm = moved if moved is not None else module.method.clip_norm
        batch = torch.arange(step * 30, step * 30 + 50)
        expected = alone.release(x.index_select(0, batch), data.y_train.index_select(0, batch))
        alone.steps += 1
        noisy, counted = multiseed._releases([together], examples, input_sq, [batch], torch.tensor([clip]),
                                             torch.tensor([scale]), positions=[step])
        gradients = expected[0] if method_name == "quantile_clip" else expected
        for mine, theirs in zip(gradients, noisy):
            torch.testing.assert_close(theirs[0], mine, rtol=1e-5, atol=1e-6)
        if method_name == "quantile_clip":
            assert counted == [expected[1]]
        else:
            assert counted is None


class SkipsOddSteps(METHODS["dpftrl"]):
    """Leaves the release of every other step unasked (the contract allows it)."""
    name = "skips_odd_steps"
    calls = 0

    def step(self, release):
        self.calls += 1
        if self.calls % 2 == 0:
            super().step(release)


def test_a_skipped_release_forms_its_correlated_noise_in_a_batch_as_alone():
    """A step whose release the method skipped still draws z_t and forms w_t (the tree's node noise): batched as
    alone, else every later release's noise is shifted. The third run has independent noise (a plugin's correlation
    may depend on its hyperparameters): it draws nothing for a skipped release, in the batch as alone."""

    def made(seed):
        hp, _ = resolve_hyperparameters(SkipsOddSteps, TASKS["digits"], {"epochs": 2, "batch_size": 256})
        task = TASKS["digits"]()
        data = task.prepare()
        steps_per_epoch = max(1, round(data.n_train / 256))
        module = PrivateTraining(task, SkipsOddSteps, hp, 1.0, 256, seed, steps_per_epoch=steps_per_epoch,
                                 correlation=correlated.tree() if seed < 2 else None)
        return module, PoissonSampler(data.n_train, 256 / data.n_train, steps_per_epoch, 1, seed), data

    epochs = [1, 2, 3]  # the shorter runs drop out first: the later steps' runs are not the batch's first ones
    alone = [made(seed) for seed in (0, 1, 2)]
    for (module, sampler, data), count in zip(alone, epochs):
        train_alone(module, sampler, data, count)
    batched = [made(seed) for seed in (0, 1, 2)]
    data = batched[0][2]
    multiseed.train([m for m, _, _ in batched], IndexedTensors(data.x_train, data.y_train), [s for _, s, _ in batched],
                    epochs)
    for (one, _, _), (many, _, _) in zip(alone, batched):
        assert (many.releases, many.steps) == (one.releases, one.steps)
        assert one.noise.state_dict()["counter"] == many.noise.state_dict()["counter"]
        for p, q in zip(one.params(), many.params()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


def test_an_example_whose_loss_overflowed_is_counted_above_c_in_a_batch_as_alone():
    """The engine drops an example whose gradient is not finite and counts it above C (−½); the batched count did too
    only by way of its norm (an overflowed loss zeroes the output gradient, whose norm is then 0 ≤ C: +½)."""
    spec = RunSpec(method="quantile_clip", task="digits", epsilon=1.0, overrides={"epochs": 1}, progress_bar=False,
                   no_wandb=True, append_to_store=False)
    alone, together = (planning.plan(spec).module() for _ in range(2))
    generator = torch.Generator().manual_seed(2)
    x = torch.rand(65, 64, generator=generator)
    direction = torch.nn.functional.normalize(torch.rand(64, generator=generator), dim=0)
    x[64] = 1000 * direction
    y = torch.randint(0, 10, (65,), generator=generator)
    for module in (alone, together):
        module.on_fit_start()
        module.method.clip_norm = 100.0  # every finite example below C
        with torch.no_grad():
            module.task.model.weight[0] = 1e36 * direction  # example 64's logit overflows
    gradient, count = alone.release(x, y)
    assert all(bool(t.isfinite().all()) for t in gradient)
    _, counted = multiseed._releases([together], IndexedTensors(x, y), x.square().sum(1) + 1, [torch.arange(65)],
                                     torch.tensor([1.0]), torch.tensor([1 / alone.expected_batch_size]))
    assert counted == [count]
    assert count.noisy_sum < 32.5 - 0.5 + 10  # 64 below and one above: (64 − 1)/2, not 65/2, up to the noise


@pytest.mark.parametrize("method_name", ["quantile_clip", "autoclip"])
def test_a_whole_set_batch_of_repeated_examples_releases_as_alone(method_name):
    """A batch of the whole training set is taken as its distinct examples, each weighted by its multiplicity
    (distinct_examples): two runs' gradients and counts equal the engine's, with 200 copies of one example and one
    whose norm is not finite."""
    spec = RunSpec(method=method_name, task="digits", epsilon=1.0, overrides={"epochs": 1}, progress_bar=False,
                   no_wandb=True, append_to_store=False)
    alone, first, second = (planning.plan(spec).module() for _ in range(3))
    for module in (alone, first, second):
        module.on_fit_start()
    second.noise = type(second.noise)(7)  # another run's stream
    data = alone.task.data
    x, y = data.x_train.clone(), data.y_train.clone()
    x[1:200], y[1:200] = x[0], y[0]
    x[300] = 1e25
    examples = IndexedTensors(x, y)
    whole = functools.cache(lambda: multiseed.distinct_examples(examples))
    assert len(whole()[0]) == len(x) - 199
    if method_name == "quantile_clip":
        for module in (alone, first, second):
            module.method.clip_norm = 0.05  # some examples above C, some below
    everyone = torch.arange(len(x))
    expected = alone.release(x, y)
    noisy, counted = multiseed._releases([first, second], examples, x.square().sum(1) + 1, [everyone, everyone],
                                         torch.tensor([alone.hp["clip"]] * 2),
                                         torch.tensor([1 / alone.expected_batch_size] * 2), whole)
    gradients = expected[0] if method_name == "quantile_clip" else expected
    # one example weighted by its 200 copies against 200 float32 additions of it: rounding up to ~200 ulps of the
    # term (1e-5 relative passed on one machine and failed on another, 2.3e-5 on autoclip's, 28 November 2026)
    rounding = 4 * 200 * torch.finfo(torch.float32).eps
    for mine, theirs in zip(gradients, noisy):
        torch.testing.assert_close(theirs[0], mine, rtol=rounding, atol=1e-6)
        assert not torch.allclose(theirs[1], mine)  # the second run's own noise
    if method_name == "quantile_clip":
        assert counted[0] == expected[1] and counted[1] != expected[1]
