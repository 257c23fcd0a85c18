"""ADADP (Koskela & Honkela 2020, Algorithm 2): iterations by hand, η bounds, two releases per step, schedule."""
import json
import math

import pytest
import pytorch_lightning as pl
import torch

from dpbench import registry
from dpbench.cli import main
from dpbench.method import GradientMechanism
from dpbench.privacy.sampling import IndexedTensors, PoissonSampler
from dpbench.run.training import PrivateTraining
from dpbench.spec import resolve_hyperparameters

AdaDP = registry.methods([])["ada_dp"]
NOISY = GradientMechanism(noise_multiplier=1.0, clip=1.0, expected_batch_size=10.0)
BY_EPOCH = GradientMechanism(noise_multiplier=1.0, clip=1.0, expected_batch_size=10.0, steps_per_epoch=2)


def method_on(theta, noise=NOISY, **hyperparameters):
    params = [torch.nn.Parameter(t.clone()) for t in theta]
    return AdaDP(params, {**AdaDP.defaults, **hyperparameters}, noise), params


class ScriptedReleases:
    """Stands in for the engine's release: returns given gradients and records where each was asked for."""

    def __init__(self, params, gradients):
        self.params, self.gradients, self.asked_at = params, iter(gradients), []

    def __call__(self):
        self.asked_at.append([p.detach().clone() for p in self.params])
        return next(self.gradients)


def assert_all_close(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a.detach(), e, rtol=1e-6, atol=1e-7)


# θ = (w, b) with w = (3, 0.5), b = (−2); η = 0.1. Worked by hand:
# θ1 = θ − ηG1 = ((2.8, 0.4), (−2.4));  θ½ = θ − (η/2)G1 = ((2.9, 0.45), (−2.2));  θ̂ = θ½ − (η/2)G2 = ((2.85, 0.5), (−2.3))
# θ1 − θ̂ = ((−0.05, −0.1), (−0.1));  err² = (0.05/2.8)² + (0.1/1)² + (0.1/2.4)² = 0.0120549...
THETA = [torch.tensor([3.0, 0.5]), torch.tensor([-2.0])]
G1 = [torch.tensor([2.0, 1.0]), torch.tensor([4.0])]
G2 = [torch.tensor([1.0, -1.0]), torch.tensor([2.0])]
THETA_1 = [torch.tensor([2.8, 0.4]), torch.tensor([-2.4])]
THETA_HALF = [torch.tensor([2.9, 0.45]), torch.tensor([-2.2])]
THETA_HAT = [torch.tensor([2.85, 0.5]), torch.tensor([-2.3])]
ERR = math.sqrt((0.05 / 2.8) ** 2 + 0.1**2 + (0.1 / 2.4) ** 2)


def test_the_hand_worked_error_is_right():
    assert ERR == pytest.approx(0.1097952, abs=1e-7)


@pytest.mark.parametrize("variant, tol, new_lr, new_theta", [
    ("paper", 0.1, 0.1 * 0.1 / ERR, THETA_1),  # tol/err = 0.911 inside [0.9, 1.1]; next iterate θ1
    ("paper", 0.12, 0.1 * 0.12 / ERR, THETA_1),  # err < tol changes nothing in the paper's variant
    ("code", 0.1, 0.1 * math.sqrt(0.1 / ERR), THETA),  # √(tol/err); err > tol: step rejected, θ kept
    ("code", 0.12, 0.1 * math.sqrt(0.12 / ERR), THETA_HAT),  # err < tol: accepted, next iterate θ̂
])
def test_one_iteration_by_hand(variant, tol, new_lr, new_theta):
    method, params = method_on(THETA, lr=0.1, tol=tol, variant=variant)
    releases = ScriptedReleases(params, [G1, G2])
    method.step(releases)
    assert len(releases.asked_at) == 2
    assert_all_close(releases.asked_at[0], THETA)  # G1 at θ
    assert_all_close(releases.asked_at[1], THETA_HALF)  # G2 at θ½
    assert method.lr == pytest.approx(new_lr, rel=1e-6)
    assert_all_close(params, new_theta)


def reference_iteration(theta, g1, g2, lr, tol, variant):
    """Algorithm 2 unrolled with plain tensors: returns (point G2 is taken at, next iterate, next η)."""
    theta_1 = [t - lr * g for t, g in zip(theta, g1)]
    theta_half = [t - lr / 2 * g for t, g in zip(theta, g1)]
    theta_hat = [t - lr / 2 * g for t, g in zip(theta_half, g2)]
    err = torch.cat([((a - b) / torch.clamp(a.abs(), min=1.0)).flatten() for a, b in zip(theta_1, theta_hat)]).norm()
    factor = float(tol / err) if variant == "paper" else math.sqrt(float(tol / err))
    new_lr = min(max(factor, 0.9), 1.1) * lr
    if variant == "paper":
        return theta_half, theta_1, new_lr
    return theta_half, (theta if err > tol else theta_hat), new_lr


@pytest.mark.parametrize("variant", ["paper", "code"])
def test_two_iterations_against_plain_tensors(variant):
    generator = torch.Generator().manual_seed(3)
    theta = [torch.randn(2, 3, generator=generator) * 2, torch.randn(2, generator=generator)]
    gradients = [[torch.randn(t.shape, generator=generator) for t in theta] for _ in range(4)]
    lr, tol = 0.3, 0.4
    method, params = method_on(theta, lr=lr, tol=tol, variant=variant)
    releases = ScriptedReleases(params, gradients)
    for iteration in range(2):
        g1, g2 = gradients[2 * iteration], gradients[2 * iteration + 1]
        theta_half, theta, lr = reference_iteration(theta, g1, g2, lr, tol, variant)
        method.step(releases)
        assert_all_close(releases.asked_at[-1], theta_half)
        assert_all_close(params, theta)
        assert method.lr == pytest.approx(lr, rel=1e-6)
    assert len(releases.asked_at) == 4


@pytest.mark.parametrize("variant", ["paper", "code"])
def test_learning_rate_factor_stays_within_alpha_bounds(variant):
    generator = torch.Generator().manual_seed(0)
    for scale in [0.0, 1e-6, 1e-2, 1.0, 1e2, 1e6]:
        for _ in range(5):
            g1 = [torch.randn(4, generator=generator)]
            g2 = [g1[0] + scale * torch.randn(4, generator=generator)]
            method, params = method_on([torch.randn(4, generator=generator)], lr=0.5, variant=variant,
                                       alpha_min=0.8, alpha_max=1.25)
            method.step(ScriptedReleases(params, [g1, g2]))
            assert 0.8 * 0.5 <= method.lr <= 1.25 * 0.5
            if scale == 0.0:  # G1 = G2: θ1 = θ̂, err = 0, the factor is clipped to α_max
                assert method.lr == 1.25 * 0.5
            if scale == 1e6:  # err ≫ tol: clipped to α_min
                assert method.lr == pytest.approx(0.8 * 0.5)


def test_default_tol_depends_on_noise_and_command_line_values_are_parsed():
    assert method_on(THETA)[0].hp["tol"] == 1.0
    assert method_on(THETA, noise=GradientMechanism(0.0, 1.0, 10.0))[0].hp["tol"] == 0.1
    method = method_on(THETA, noise=BY_EPOCH, tol="0.25", adapt_epochs="3")[0]
    assert (method.hp["tol"], method.hp["adapt_epochs"]) == (0.25, 3)
    with pytest.raises(ValueError, match="steps per epoch"):
        method_on(THETA, adapt_epochs=3)
    with pytest.raises(ValueError, match="variant"):
        method_on(THETA, variant="papr")


def test_schedule_adapts_for_k_epochs_then_decays_per_epoch():
    """adapt_epochs K = 1 with 2 steps per epoch: steps 0-1 adapt; then epoch k uses η_K / (1 + 0.1 (k − 1))."""
    theta = [torch.tensor([0.5, -0.25])]
    ones, halves = [torch.tensor([1.0, 1.0])], [torch.tensor([0.5, -0.5])]
    method, params = method_on(theta, noise=BY_EPOCH, lr=0.2, tol=0.1, adapt_epochs=1)
    releases = ScriptedReleases(params, [ones, halves] * 6)
    for _ in range(2):
        method.step(releases)
    lr_k = method.lr  # η_K
    expected = params[0].detach().clone()
    for epoch in (2, 3):  # each step: two SGD steps, one per release, the second at the point after the first
        for _ in range(2):
            lr = lr_k / (1 + 0.1 * (epoch - 1))
            method.step(releases)
            assert_all_close(releases.asked_at[-1], [expected - lr * ones[0]])
            expected = expected - lr * ones[0] - lr * halves[0]
            assert_all_close(params, [expected])
    assert method.lr == lr_k and len(releases.asked_at) == 12


def test_each_step_asks_the_engine_for_exactly_two_releases_and_the_ledger_charges_both():
    pl.seed_everything(0, verbose=False)
    task_class = registry.tasks([])["digits"]
    task = task_class()
    data = task.prepare()
    hp, _ = resolve_hyperparameters(AdaDP, task_class, {})
    module = PrivateTraining(task, AdaDP, hp, 1.0, 50.0, seed=0)
    module.on_fit_start()
    engine_release, asked = module.release, []
    module.release = lambda x, y: asked.append(len(y)) or engine_release(x, y)
    before = [p.detach().clone() for p in module.params()]
    dataset = IndexedTensors(data.x_train, data.y_train)
    for step, batches in enumerate(PoissonSampler(len(dataset), 50 / len(dataset), 4, AdaDP.releases_per_step, 0)):
        module.training_step(dataset.__getitems__(batches), step)
    assert module.steps == 4 and len(asked) == 8 and module.releases == 8
    assert all(not torch.equal(a, b) for a, b in zip(before, module.params()))


def run_json(capsys, *args):
    assert main(["run", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_digits_at_epsilon_1_takes_half_the_steps_of_dpsgd_for_the_same_releases(capsys):
    common = ("--task", "digits", "--epsilon", "1", "--epochs", "30", "--batch-size", "256")
    ada_dp = run_json(capsys, "--method", "ada_dp", *common)
    dpsgd = run_json(capsys, "--method", "dpsgd", *common)
    assert ada_dp["steps"] * 2 == dpsgd["steps"] == 30 * round(1437 / 256)
    assert ada_dp["gradient_evaluations"] == dpsgd["gradient_evaluations"] == 2 * ada_dp["steps"]
    assert ada_dp["noise_multiplier"] == pytest.approx(dpsgd["noise_multiplier"], rel=0.01)
    assert 0.99 < ada_dp["epsilon"] <= 1.0


def test_default_variant_is_the_published_code():
    """Defaults: the code's variant. With tol = 0.12 > err, the next iterate is θ̂ and η grows by √(tol/err) (the
    literal Algorithm 2 would continue from θ1 with tol/err)."""
    assert AdaDP.defaults["variant"] == "code"
    method, params = method_on(THETA, lr=0.1, tol=0.12)
    method.step(ScriptedReleases(params, [G1, G2]))
    assert method.lr == pytest.approx(0.1 * math.sqrt(0.12 / ERR), rel=1e-6)
    assert_all_close(params, THETA_HAT)
