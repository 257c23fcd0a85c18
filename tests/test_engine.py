"""The engine's training step: releases, noise scale, ledger, and equivalences between methods."""
import math
from dataclasses import replace

import pytest
import pytorch_lightning as pl
import torch

from dpbench import registry
from dpbench.errors import UsageError
from dpbench.method import Method
from dpbench.privacy import streams
from dpbench.privacy.sampling import IndexedTensors, PoissonSampler, ShuffleSampler
from dpbench.run.engine import run
from dpbench.run.training import PrivateTraining
from dpbench.spec import RunSpec, resolve_hyperparameters

METHODS = registry.methods([])
TASKS = registry.tasks([])


def module_for(method, sigma, expected_batch_size, noise="fast", clip=None, **overrides):
    """A training module of ``method`` on digits; ``clip`` is set after resolving (``math.inf``, which users may not
    give, turns clipping off)."""
    pl.seed_everything(0, verbose=False)
    task = TASKS["digits"]()
    data = task.prepare()
    hp, _ = resolve_hyperparameters(METHODS[method], TASKS["digits"], overrides)
    if clip is not None:
        hp["clip"] = clip
    module = PrivateTraining(task, METHODS[method], hp, sigma, expected_batch_size, seed=0, noise=noise)
    module.on_fit_start()
    return module, IndexedTensors(data.x_train, data.y_train)


def params_of(module):
    return [p.detach().clone() for p in module.params()]


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 0.01)])
def test_dpsgd_without_noise_or_clipping_is_sgd_step_for_step(momentum, weight_decay):
    """dpsgd writes torch.optim.SGD's update out (for speed); the non-private baseline uses torch.optim.SGD."""
    batch_size = 32
    dpsgd, data = module_for("dpsgd", 0.0, batch_size, clip=math.inf, lr=0.7, momentum=momentum,
                             weight_decay=weight_decay)
    sgd, _ = module_for("nonprivate", 0.0, batch_size, lr=0.7, momentum=momentum)
    if weight_decay:
        sgd.method.optimizer.param_groups[0]["weight_decay"] = weight_decay
    sampler = ShuffleSampler(len(data), batch_size, releases_per_step=1, seed=1)
    for step, batches in enumerate(sampler):
        dpsgd.training_step(data.__getitems__(batches), step)
        sgd.training_step(data.__getitems__(batches), step)
        for a, b in zip(params_of(dpsgd), params_of(sgd)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert step > 10 and dpsgd.releases == step + 1 and sgd.releases == 0


def test_dpgd_without_noise_or_clipping_is_gradient_descent():
    module, data = module_for("dpgd", 0.0, 1437, clip=math.inf, lr=2.0)
    x, y = data.x, data.y
    theta = [p.detach().clone().requires_grad_() for p in module.params()]
    for step, batches in enumerate(PoissonSampler(len(data), 1.0, 5, 1, seed=0)):
        module.training_step(data.__getitems__(batches), step)
        outputs = torch.nn.functional.linear(x, theta[0], theta[1])
        loss = torch.nn.functional.cross_entropy(outputs, y)
        with torch.no_grad():
            theta = [t - 2.0 * g for t, g in zip(theta, torch.autograd.grad(loss, theta))]
        theta = [t.requires_grad_() for t in theta]
        for a, b in zip(params_of(module), theta):
            torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)


def test_released_noise_has_std_sigma_clip_over_expected_batch_size():
    sigma, clip, expected = 3.0, 0.5, 40.0
    module, data = module_for("dpsgd", sigma, expected, clip=clip)
    empty = (data.x[:0], data.y[:0])
    noise = torch.cat([torch.cat([g.flatten() for g in module.release(*empty)]) for _ in range(50)])
    assert noise.mean().abs() < 0.05 * sigma * clip / expected
    assert noise.std().item() == pytest.approx(sigma * clip / expected, rel=0.03)


def test_release_is_the_noise_plus_the_clipped_sum_over_expected_batch_size():
    sigma, clip, expected = 2.0, 0.5, 40.0
    module, data = module_for("dpsgd", sigma, expected, clip=clip)
    x, y = data.x[:30], data.y[:30]
    released = module.release(x, y)
    module.on_fit_start()  # the noise generator from its seed again
    noise = module.draw_noise(module.params())
    clipped, _ = module.clipper.clipped_sum(module.task, x, y, clip)
    for r, n, c in zip(released, noise, clipped):
        torch.testing.assert_close(r, n + c / expected)
    assert torch.cat([n.flatten() for n in noise]).std().item() == pytest.approx(sigma * clip / expected, rel=0.1)


def test_noise_torch_draws_one_normal_per_parameter_from_the_runs_noise_stream():
    """One ``normal_`` per parameter from a generator on the run's ``gradient-noise`` stream (until ledger version
    2 it was seeded with the run seed itself, the state of the initial weights)."""
    module, _ = module_for("dpsgd", 2.0, 40.0, noise="torch", clip=0.5)
    generator = streams.generator(0, "gradient-noise")
    for drawn, param in zip(module.draw_noise(module.params()), module.params()):
        assert torch.equal(drawn, torch.empty_like(param).normal_(0.0, 2.0 * 0.5 / 40.0, generator=generator))


def test_unknown_noise_sampler_is_refused():
    with pytest.raises(UsageError, match="unknown noise sampler 'bogus'; choose one of fast, torch"):
        run(RunSpec(method="dpsgd", task="digits", noise="bogus"))


class Greedy(Method):
    name = "greedy_for_tests"
    description = "asks for two gradients per step while declaring one"
    releases_per_step = 1

    def step(self, release):
        release()
        release()


class Lazy(Method):
    name = "lazy_for_tests"
    description = "draws two batches per step but uses only one"
    releases_per_step = 2

    def step(self, release):
        release()


def test_ledger_charges_every_drawn_batch_and_refuses_extra_releases():
    pl.seed_everything(0, verbose=False)
    task = TASKS["digits"]()
    data = task.prepare()
    dataset = IndexedTensors(data.x_train, data.y_train)
    hp = {"clip": 1.0}
    lazy = PrivateTraining(task, Lazy, hp, 1.0, 10.0, seed=0)
    lazy.on_fit_start()
    for step, batches in enumerate(PoissonSampler(len(dataset), 0.01, 3, 2, seed=0)):
        lazy.training_step(dataset.__getitems__(batches), step)
    assert lazy.releases == 6 and lazy.steps == 3
    greedy = PrivateTraining(task, Greedy, hp, 1.0, 10.0, seed=0)
    greedy.on_fit_start()
    with pytest.raises(RuntimeError, match="more than releases_per_step=1"):
        greedy.training_step(dataset.__getitems__(next(iter(PoissonSampler(len(dataset), 0.01, 1, 1, 0)))), 0)


class ProfiledDigits(TASKS["digits"]):
    name = "profiled_digits"
    options = {"tag": "plain"}
    profiles = {"quick": {"epochs": 2, "lr": 0.3, "tag": "quick", "epsilon": 2.0,
                          "methods": {"dpsgd": {"lr": 0.7}}}}


def test_profile_sits_between_the_task_defaults_and_the_command_line():
    dpsgd_hp, dpsgd_options = resolve_hyperparameters(METHODS["dpsgd"], ProfiledDigits, {}, "quick")
    assert (dpsgd_hp["epochs"], dpsgd_hp["lr"]) == (2, 0.7)  # the per-method entry wins over the general one
    nonprivate_hp, _ = resolve_hyperparameters(METHODS["nonprivate"], ProfiledDigits, {}, "quick")
    assert nonprivate_hp["lr"] == 0.3
    cli_hp, _ = resolve_hyperparameters(METHODS["dpsgd"], ProfiledDigits, {"lr": "0.1"}, "quick")
    assert cli_hp["lr"] == 0.1
    assert "epsilon" not in dpsgd_hp  # budget keys are the run's, not hyperparameters
    assert dpsgd_options == {**TASKS["digits"].options, "tag": "quick"}  # options merge with the parent's
    plain_hp, plain_options = resolve_hyperparameters(METHODS["dpsgd"], ProfiledDigits, {})
    assert plain_hp["lr"] == resolve_hyperparameters(METHODS["dpsgd"], TASKS["digits"], {})[0]["lr"]
    assert plain_options == {**TASKS["digits"].options, "tag": "plain"}
    with pytest.raises(UsageError, match="has no profile 'paper'; profiles: quick"):
        resolve_hyperparameters(METHODS["dpsgd"], ProfiledDigits, {}, "paper")


def test_a_profile_s_relation_applies_to_private_methods_only():
    """``--profile yu2020`` sets replace-one neighbours for the private methods; the non-private baseline has no ε and
    ran under the profile without a relation instead of being refused ("takes no --neighbouring")."""
    spec = RunSpec(method="nonprivate", task="breast_cancer", profile="yu2020", overrides={"epochs": 1},
                   progress_bar=False, no_wandb=True, append_to_store=False)
    record = run(spec)
    assert record["neighbouring"] is None and record["epsilon"] is None and record["hyperparameters"]["bias"] is False
    private = run(replace(spec, method="dpsgd", overrides={"epochs": 1}))
    assert private["neighbouring"] == "replace-one" and private["epsilon_target"] == 0.1
    with pytest.raises(UsageError, match="takes no --neighbouring"):  # given on the command line: still refused
        run(replace(spec, neighbouring="replace-one"))


@pytest.mark.parametrize("sampler", ["poisson", "shuffle"])
def test_every_epoch_draws_fresh_batches(sampler, monkeypatch):
    """The accountant assumes independent draws at every step: no epoch may replay an earlier one's batches."""
    drawn = []
    original = IndexedTensors.__getitems__
    monkeypatch.setattr(IndexedTensors, "__getitems__",
                        lambda self, batches: drawn.append([b.tolist() for b in batches]) or original(self, batches))
    record = run(RunSpec(method="dpsgd", task="digits", epsilon=1.0, sampler=sampler, overrides={"epochs": 3},
                         progress_bar=False, no_wandb=True))
    per_epoch = len(drawn) // 3
    assert record["steps"] == len(drawn) == 3 * per_epoch
    epochs = [drawn[e * per_epoch:(e + 1) * per_epoch] for e in range(3)]
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2] and epochs[0] != epochs[2]


@pytest.mark.parametrize("key, value", [("batch_size", 64.0), ("epochs", 2.0), ("epochs", True)])
def test_a_size_given_as_anything_but_an_int_is_refused_before_training(key, value):
    """Review of 27 November: 64.0 trained, and verify (which takes only ints: a fractional epochs undercounted a
    banded run's participations) refused its genuine record."""
    from dpbench.run import planning
    from dpbench.spec import RunSpec

    spec = RunSpec(method="dpsgd", task="digits", epsilon=1.0, overrides={key: value}, progress_bar=False,
                   no_wandb=True, append_to_store=False)
    with pytest.raises(UsageError, match=f"{key} must be a whole number >= 1, got {value!r}"):
        planning.plan(spec)
