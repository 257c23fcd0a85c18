"""AdaCliP (Pichapati et al. 2019, Algorithm 1, equations 4–5) against hand-unrolled references with plain tensors."""
import json
import math

import pytest
import pytorch_lightning as pl
import torch

from dpbench import registry
from dpbench.cli import main
from dpbench.method import GradientMechanism
from dpbench.privacy.clipping import VmapClipper
from dpbench.privacy.sampling import IndexedTensors, PoissonSampler
from dpbench.run.training import PrivateTraining
from dpbench.spec import resolve_hyperparameters

METHODS = registry.methods([])
TASKS = registry.tasks([])
AdaCliP = METHODS["adaclip"]

# Not the paper's values, so that every term of the update moves visibly in two steps.
HP = {"lr": 0.5, "beta1": 0.5, "beta2": 0.5, "h1": 0.25, "h2": 4.0, "clip": 1.0}


def regression_module(sigma, expected_batch_size, dim=2, seed=0, method=AdaCliP, **overrides):
    pl.seed_everything(seed, verbose=False)
    task = TASKS["adaclip_regression"](dim=dim)
    data = task.prepare()
    hp, _ = resolve_hyperparameters(METHODS["adaclip"], TASKS["adaclip_regression"], overrides)
    module = PrivateTraining(task, method, hp, sigma, expected_batch_size, seed=seed)
    module.on_fit_start()
    return module, IndexedTensors(data.x_train, data.y_train)


def clip_to_one(w):
    return w * min(1.0, 1.0 / float(w.norm()))


def test_per_example_transform_is_centred_and_scaled_over_all_parameters():
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1, 1))]
    method = AdaCliP(params, dict(HP), GradientMechanism(1.0, 1.0, 4.0))
    method.mean = [torch.tensor([1.0, -1.0]), torch.tensor([[0.5]])]
    method.std = [torch.tensor([4.0, 1.0]), torch.tensor([[4.0]])]
    method.scale = method._scale()
    # b_i = √s_i · √(Σ_j s_j) with Σ_j s_j = 9 over both parameters: b = (6, 3, 6).
    gradients = [torch.tensor([[7.0, 2.0], [1.0, -1.0]]), torch.tensor([[[3.5]], [[-5.5]]])]
    w = method.per_example_transform(gradients)
    torch.testing.assert_close(w[0], torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(w[1], torch.tensor([[[0.5]], [[-1.0]]]))


def test_initial_state_follows_algorithm_1():
    params = [torch.nn.Parameter(torch.zeros(3))]
    method = AdaCliP(params, dict(HP), GradientMechanism(1.0, 1.0, 1.0))
    torch.testing.assert_close(method.mean[0], torch.zeros(3))
    torch.testing.assert_close(method.std[0], torch.full((3,), 1.0))  # √(h1·h2) = √(0.25·4)
    torch.testing.assert_close(method.scale[0], torch.full((3,), math.sqrt(3.0)))  # √1 · √3


def test_engine_clips_the_transformed_gradient_to_norm_one():
    module, data = regression_module(0.0, 2.0, **HP)
    method = module.method
    method.mean = [torch.tensor([0.1, 0.2])]
    method.std = [torch.tensor([0.5, 0.5])]  # b = √0.5 · √1 = 0.7071 in both coordinates
    method.scale = method._scale()
    with torch.no_grad():
        module.params()[0].copy_(torch.tensor([0.6, 0.2]))
    (x, y), = data.__getitems__([torch.tensor([0, 999])])  # x = (1, 0) and (−1, 0)
    # (θ − x − m)/b = (−0.5, 0)/0.7071 (norm 0.71, kept) and (1.5, 0)/0.7071 (norm 2.12, clipped to (1, 0)).
    by_hand = (torch.tensor([-0.5 / math.sqrt(0.5), 0.0]) + torch.tensor([1.0, 0.0])) / 2.0
    (released,) = module.release(x, y)
    torch.testing.assert_close(released, by_hand)


def test_first_two_steps_by_hand_without_noise():
    """Two steps through the engine (σ = 0, expected batch size 2), against the algorithm unrolled by hand."""
    module, data = regression_module(0.0, 2.0, **HP)
    theta = module.params()[0].detach().clone()
    m, s = torch.zeros(2), torch.full((2,), 1.0)
    lr, beta1, beta2, h1, h2, B = 0.5, 0.5, 0.5, 0.25, 4.0, 2.0
    for step, indices in enumerate([torch.tensor([0, 1, 600]), torch.tensor([700])]):
        (x, y), = data.__getitems__([indices])
        b = s.sqrt() * s.sum().sqrt()
        w_bar = sum(clip_to_one((theta - xi - m) / b) for xi in x) / B
        g_tilde = b * w_bar + m
        theta = theta - lr * g_tilde
        v = (B * (g_tilde - m) ** 2).clamp(h1, h2)  # σ = 0: nothing to subtract
        s = (beta2 * s**2 + (1 - beta2) * v).sqrt()
        m = beta1 * m + (1 - beta1) * g_tilde
        module.training_step([(x, y)], step)
        torch.testing.assert_close(module.params()[0].detach(), theta)
        torch.testing.assert_close(module.method.mean[0], m)
        torch.testing.assert_close(module.method.std[0], s)
        torch.testing.assert_close(module.method.scale[0], s.sqrt() * s.sum().sqrt())
    assert not torch.allclose(s, torch.full((2,), 1.0)) and not torch.allclose(m, torch.zeros(2))


def test_first_two_steps_by_hand_with_noise():
    """σ > 0: the release is built by hand with fixed noise; the variance correction uses σ_mean = σC/B."""
    sigma, clip, B = 0.7, 1.5, 2.0
    theta = torch.tensor([0.3, -0.2, 0.1])
    param = torch.nn.Parameter(theta.clone())
    method = AdaCliP([param], dict(HP), GradientMechanism(sigma, clip, B))
    lr, beta1, beta2, h1, h2 = 0.5, 0.5, 0.5, 0.25, 4.0
    m, s = torch.zeros(3), torch.full((3,), 1.0)
    points = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    noises = [torch.tensor([0.4, -1.1, 0.3]), torch.tensor([-0.8, 0.5, 1.9])]
    for noise in noises:
        b = s.sqrt() * s.sum().sqrt()
        gradients = [param.detach() - points]  # per-example gradients θ − x_k of ½‖θ − x_k‖²
        transformed = method.per_example_transform(gradients)[0]
        clipped = [wk * min(1.0, clip / float(wk.norm())) for wk in transformed]
        released = (sum(clipped) + sigma * clip * noise) / B

        wk_by_hand = (theta - points - m) / b
        torch.testing.assert_close(transformed, wk_by_hand)
        w_bar = (sum(wk * min(1.0, clip / float(wk.norm())) for wk in wk_by_hand) + sigma * clip * noise) / B
        g_tilde = b * w_bar + m
        theta = theta - lr * g_tilde
        v = (B * ((g_tilde - m) ** 2 - b**2 * (sigma * clip / B) ** 2)).clamp(h1, h2)
        s = (beta2 * s**2 + (1 - beta2) * v).sqrt()
        m = beta1 * m + (1 - beta1) * g_tilde

        method.step(lambda: [released])
        torch.testing.assert_close(param.detach(), theta)
        torch.testing.assert_close(method.mean[0], m)
        torch.testing.assert_close(method.std[0], s)
    # The correction was active: some coordinate's v fell below the raw square.
    assert float(s.min()) < 1.0


class PinnedAdaCliP(AdaCliP):
    """AdaCliP with its state held at m = 0 and b = 1 (s_i = 1/√d), to compare with DP-SGD."""

    def setup(self):
        super().setup()
        self.pin()

    def pin(self):
        dim = sum(p.numel() for p in self.params)
        self.mean = [torch.zeros_like(p) for p in self.params]
        self.std = [torch.full_like(p, 1 / math.sqrt(dim)) for p in self.params]
        self.scale = self._scale()

    def step(self, release):
        super().step(release)
        self.pin()


def test_with_m_zero_and_b_one_it_is_dpsgd_step_for_step():
    sigma, rate = 0.8, 0.01
    adaclip, data = regression_module(sigma, 10.0, dim=4, seed=3, method=PinnedAdaCliP, lr=0.2)
    pl.seed_everything(3, verbose=False)
    task = TASKS["adaclip_regression"](dim=4)
    task.prepare()
    hp, _ = resolve_hyperparameters(METHODS["dpsgd"], TASKS["adaclip_regression"], {"lr": 0.2})
    dpsgd = PrivateTraining(task, METHODS["dpsgd"], hp, sigma, 10.0, seed=3, clipper=VmapClipper())
    dpsgd.on_fit_start()
    torch.testing.assert_close(adaclip.method.scale[0], torch.ones(4))
    start = adaclip.params()[0].detach().clone()
    for step, batches in enumerate(PoissonSampler(len(data), rate, 30, 1, seed=3)):
        adaclip.training_step(data.__getitems__(batches), step)
        dpsgd.training_step(data.__getitems__(batches), step)
        torch.testing.assert_close(adaclip.params()[0].detach(), dpsgd.params()[0].detach())
    assert not torch.allclose(adaclip.params()[0].detach(), start)


def test_with_a_batch_s_estimates_the_per_example_standard_deviation():
    """Batch adaptation: B·((g̃ − m)² − b²σ²_mean) estimates the per-example variance, not that of a batch mean.

    With lr = 1e-12 (0 is refused), θ stays at θ⁰ to 1e-9; across examples g_1 = θ_1 − y has standard deviation 1
    and the other coordinates 0. With B = 50 the variance of a batch mean is 1/50; s_1 must settle near 1, not near
    1/√50 = 0.14.
    """
    module, data = regression_module(0.5, 50.0, dim=3, seed=1, lr=1e-12, h2=100.0, clip=3.0)
    s_first = []
    for step, batches in enumerate(PoissonSampler(len(data), 0.05, 800, 1, seed=1)):
        module.training_step(data.__getitems__(batches), step)
        if step >= 400:
            s_first.append(float(module.method.std[0][0]) ** 2)
    assert 0.8 < sum(s_first) / len(s_first) < 1.25
    assert float(module.method.std[0][1:].max()) < 0.1


def test_adaclip_regression_runs_end_to_end(capsys):
    # σ = 1, not the paper's 0.1: accounting 200 steps at σ = 0.1 took 78 s of the test suite (a PLD of tiny σ)
    args = ["run", "--method", "adaclip", "--task", "adaclip_regression", "--noise-multiplier", "1",
            "--epochs", "2", "--batch-size", "10", "--set", "dim=5", "--set", "h2=1e-4", "--json"]
    assert main(args) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["data_id"] == "adaclip-regression-d5" and record["n_train"] == 1000
    assert record["hyperparameters"] | {"dim": 5, "h2": 1e-4, "lr": 0.01, "clip": 1.0} == record["hyperparameters"]
    assert record["steps"] == 200 and record["noise_multiplier"] == 1.0
    assert math.isfinite(record["metrics"]["test_squared_error"]) and record["metrics"]["test_squared_error"] >= 0


def test_bad_h2_is_refused(capsys):
    # the refusal comes at the method's setup, after the accounting: 10,000 steps at σ = 0.1 took 100 s of it
    args = ["run", "--method", "adaclip", "--task", "adaclip_regression", "--noise-multiplier", "1", "--epochs", "1",
            "--batch-size", "10", "--set", "h2=1e-13"]
    assert main(args) == 2
    assert "h1 <= h2" in capsys.readouterr().err


def test_squared_error_metric_is_the_distance_to_the_optimum():
    pl.seed_everything(0, verbose=False)
    task = TASKS["adaclip_regression"](dim=3)
    data = task.prepare()
    assert torch.equal(data.x_train.mean(0), torch.zeros(3))  # θ* = mean of the points = 0
    with torch.no_grad():
        task.model.theta.copy_(torch.tensor([1.0, 2.0, -2.0]))
    metrics = task.per_example_metrics(task(data.x_test[:4]), data.y_test[:4])
    torch.testing.assert_close(metrics["squared_error"], torch.full((4,), 9.0))
    losses = task.per_example_loss(task(data.x_test[[0, 999]]), data.y_test[[0, 999]])
    torch.testing.assert_close(losses, torch.tensor([0.5 * (0 + 4 + 4), 0.5 * (4 + 4 + 4)]))


def test_initial_point_is_random_with_expected_error_init_scale_squared():
    errors = []
    for seed in range(200):  # each seed's own init stream
        task = TASKS["adaclip_regression"](dim=50, init_scale=2.0)
        task.prepare(seed)
        errors.append(float(task.model.theta.detach().pow(2).sum()))
    assert sum(errors) / len(errors) == pytest.approx(4.0, rel=0.05)
    at_optimum = TASKS["adaclip_regression"](dim=5, init_scale=0.0)
    at_optimum.prepare()
    assert torch.equal(at_optimum.model.theta.detach(), torch.zeros(5))


def test_default_h2_is_one_over_the_number_of_coordinates_and_caps_each_variance_sample():
    """Default h2 = 1/d (d = 4 here, h2 = 0.25): s⁰ = √(h1·h2), and one step (σ = 0, B = 1) clamps v at 0.25.
    The old default h2 = 1 gives s⁰ = 1e-6 and would leave v = 1 in the first coordinate (s = 1, not √0.925)."""
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(1))]
    method = AdaCliP(params, dict(AdaCliP.defaults, clip=1.0), GradientMechanism(0.0, 1.0, 1.0))
    torch.testing.assert_close(method.std[0], torch.full((3,), math.sqrt(1e-12 * 0.25)))
    method.std = [torch.ones(3), torch.ones(1)]  # b_i = √1 · √4 = 2
    method.scale = method._scale()
    method.step(lambda: [torch.tensor([1.0, 0.1, 0.0]), torch.tensor([0.0])])  # w̄: g̃ = 2·w̄ = (2, 0.2, 0 | 0)
    torch.testing.assert_close(params[0].detach(), -0.1 * torch.tensor([2.0, 0.2, 0.0]))  # lr 0.1
    # v = clamp(g̃², 1e-12, 0.25) = (0.25, 0.04, 1e-12 | 1e-12); s² = 0.9·1 + 0.1·v
    expected = torch.sqrt(0.9 + 0.1 * torch.tensor([0.25, 0.04, 1e-12, 1e-12]))
    torch.testing.assert_close(torch.cat([method.std[0], method.std[1]]), expected)
    assert method.h2 == 0.25
    assert "h1" in AdaCliP.search_space and "h2" in AdaCliP.search_space  # the paper's constants are searched
    assert AdaCliP.search_space["h1"]["high"] <= AdaCliP.search_space["h2"]["low"]  # every draw has h1 ≤ h2


def test_h2_from_the_command_line_is_parsed_and_used():
    params = [torch.nn.Parameter(torch.zeros(2))]
    method = AdaCliP(params, dict(AdaCliP.defaults, clip=1.0, h2="0.5"), GradientMechanism(0.0, 1.0, 1.0))
    assert method.h2 == 0.5
    with pytest.raises(ValueError, match="h2 must be a number"):
        AdaCliP(params, dict(AdaCliP.defaults, clip=1.0, h2="big"), GradientMechanism(0.0, 1.0, 1.0))
