"""dpadam and dpadam_bc (Tang & Lécuyer 2023, Algorithm 1, equation 3) against hand-computed steps."""
import math

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from dpbench import registry
from dpbench.method import GradientMechanism
from dpbench.methods.dpadam import DPAdam
from dpbench.methods.dpadam_bc import DPAdamBC
from dpbench.privacy.sampling import IndexedTensors, PoissonSampler
from dpbench.run.training import PrivateTraining
from dpbench.spec import resolve_hyperparameters
from dpbench.task import TaskData
from dpbench.tasks.linear import LinearClassification

METHODS = registry.methods([])
LR = 0.01


def one_step(method_class, gradient, mechanism, **hp):
    """The parameter change of the first step of ``method_class`` from θ = 0 along ``gradient``."""
    theta = torch.nn.Parameter(torch.zeros(len(gradient), dtype=torch.float64))
    method = method_class([theta], {**method_class.defaults, "lr": LR, **hp}, mechanism)
    method.step(lambda: [torch.tensor(gradient, dtype=torch.float64)])
    return theta.detach()


# At t = 1, m̂ = g and v̂ = g², whatever β1 and β2.
GRADIENT = [0.3, -0.02, 0.0, 1e-5]


def test_dpadam_bc_first_step_without_noise_is_m_over_sqrt_max_v_gamma_prime():
    # max(g², 1e-8): 0.09, 4e-4, 1e-8, 1e-8 (1e-10 < γ′) -> steps -η·[0.3/0.3, -0.02/0.02, 0/1e-4, 1e-5/1e-4]
    step = one_step(DPAdamBC, GRADIENT, GradientMechanism(0.0, 1.0, 10.0))
    torch.testing.assert_close(step, -LR * torch.tensor([1.0, -1.0, 0.0, 0.1], dtype=torch.float64))


def test_dpadam_bc_first_step_subtracts_the_noise_variance():
    # σC/B = 2 · 0.5 / 10 = 0.1, so Φ = (σC/B)² = 0.01; g² − 0.01 = 0.08, −0.0096, −0.01, −0.01 -> max with γ′.
    # Default γ′ = 0.04·Φ = 4e-4 (√γ′ = 0.02).
    step = one_step(DPAdamBC, GRADIENT, GradientMechanism(2.0, 0.5, 10.0))
    expected = [0.3 / math.sqrt(0.08), -0.02 / 0.02, 0.0, 1e-5 / 0.02]
    torch.testing.assert_close(step, -LR * torch.tensor(expected, dtype=torch.float64))
    # γ′ relative to Φ: ratio 1 gives γ′ = Φ = 0.01 (√γ′ = 0.1); 0.08 > 0.01 keeps the first coordinate unclamped.
    step = one_step(DPAdamBC, GRADIENT, GradientMechanism(2.0, 0.5, 10.0), gamma_prime_ratio=1.0)
    expected = [0.3 / math.sqrt(0.08), -0.02 / 0.1, 0.0, 1e-5 / 0.1]
    torch.testing.assert_close(step, -LR * torch.tensor(expected, dtype=torch.float64))
    # γ′ set absolutely wins over the ratio (the papers' profiles): 1e-8 and 1e-6, also as a --set string.
    for gamma_prime, root in ((1e-8, 1e-4), ("1e-6", 1e-3)):
        step = one_step(DPAdamBC, GRADIENT, GradientMechanism(2.0, 0.5, 10.0), gamma_prime=gamma_prime)
        expected = [0.3 / math.sqrt(0.08), -0.02 / root, 0.0, 1e-5 / root]
        torch.testing.assert_close(step, -LR * torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("hp, message", [({"gamma_prime": "x"}, "must be a number"),
                                         ({"gamma_prime": 0.0}, "must be positive"),
                                         ({"gamma_prime_ratio": -1.0}, "must be positive")])
def test_dpadam_bc_refuses_bad_gamma_prime(hp, message):
    theta = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match=message):
        DPAdamBC([theta], {**DPAdamBC.defaults, **hp}, GradientMechanism(1.0, 1.0, 10.0))


def test_dpadam_first_step_is_m_over_sqrt_v_plus_gamma_and_ignores_the_noise():
    expected = -LR * torch.tensor([0.3 / (0.3 + 1e-8), -0.02 / (0.02 + 1e-8), 0.0, 1e-5 / (1e-5 + 1e-8)],
                                  dtype=torch.float64)
    for mechanism in (GradientMechanism(0.0, 1.0, 10.0), GradientMechanism(2.0, 0.5, 10.0)):
        torch.testing.assert_close(one_step(DPAdam, GRADIENT, mechanism), expected)


class TinySoftmax(LinearClassification):
    """Softmax regression on 40 random unit-norm rows with 3 features and 3 classes, in float64."""

    name = "tiny_softmax_for_tests"
    description = "random data for step-by-step checks"

    def load_data(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(50, 3, generator=generator, dtype=torch.float64)
        x = x / x.norm(dim=1, keepdim=True)
        y = torch.randint(0, 3, (50,), generator=generator)
        return TaskData(x[:40], y[:40], x[40:], y[40:], "tiny", "standard normal rows scaled to unit norm")

    def build_model(self, data):
        return super().build_model(data).double()


def train_recording_releases(method, sigma, clip, expected_batch_size, steps, **overrides):
    """Runs ``steps`` engine steps of ``method`` on TinySoftmax; returns the initial parameters, the released
    gradients the method received and the parameters after each step."""
    pl.seed_everything(0, verbose=False)
    task = TinySoftmax()
    data = task.prepare()
    hp, _ = resolve_hyperparameters(METHODS[method], TinySoftmax, {"clip": clip, **overrides})
    module = PrivateTraining(task, METHODS[method], hp, sigma, expected_batch_size, seed=0)
    module.on_fit_start()
    dataset = IndexedTensors(data.x_train, data.y_train)
    initial = [p.detach().clone() for p in module.params()]
    releases, trajectory = [], []
    step_of_method = module.method.step

    def recording_step(release):
        def recorded_release():
            gradient = release()
            releases.append([g.clone() for g in gradient])
            return gradient
        step_of_method(recorded_release)

    module.method.step = recording_step
    sampler = PoissonSampler(len(dataset), expected_batch_size / len(dataset), steps, 1, seed=3)
    for step, batches in enumerate(sampler):
        module.training_step(dataset.__getitems__(batches), step)
        trajectory.append([p.detach().clone() for p in module.params()])
    assert len(releases) == len(trajectory) == steps
    return initial, releases, trajectory


@pytest.mark.parametrize("sigma, setting", [(0.0, {}), (1.5, {}), (1.5, {"gamma_prime": 1e-8})])
def test_dpadam_bc_step_for_step_against_a_hand_written_reference(sigma, setting):
    clip, expected_batch_size, lr = 0.4, 8.0, 0.05
    initial, releases, trajectory = train_recording_releases(
        "dpadam_bc", sigma, clip, expected_batch_size, steps=25, lr=lr, **setting)
    noise_variance = (sigma * clip / expected_batch_size) ** 2  # (σC/B)², B the expected batch size
    # γ′: set absolutely, else 0.04·(σC/B)², else (σ = 0) 1e-8
    gamma_prime = setting.get("gamma_prime", 0.04 * noise_variance if sigma > 0 else 1e-8)
    theta = [p.clone() for p in initial]
    m = [torch.zeros_like(p) for p in theta]
    v = [torch.zeros_like(p) for p in theta]
    clamped = corrected = 0
    for t, (gradient, after) in enumerate(zip(releases, trajectory), start=1):
        for i, g in enumerate(gradient):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            m_hat, v_hat = m[i] / (1 - 0.9**t), v[i] / (1 - 0.999**t)
            corrected_v = v_hat - noise_variance
            clamped += int((corrected_v < gamma_prime).sum())
            corrected += int((corrected_v >= gamma_prime).sum())
            theta[i] = theta[i] - lr * m_hat / torch.sqrt(torch.clamp(corrected_v, min=gamma_prime))
        for a, b in zip(after, theta):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert corrected > 0
    if sigma > 0:  # the noise variance pushes some coordinates below γ′: the max is exercised too
        assert clamped > 0


def test_dpadam_is_torch_adam_step_for_step_on_noisy_releases():
    initial, releases, trajectory = train_recording_releases("dpadam", 1.5, 0.4, 8.0, steps=25, lr=0.05)
    theta = [p.clone().requires_grad_() for p in initial]
    adam = torch.optim.Adam(theta, lr=0.05, betas=(0.9, 0.999), eps=1e-8)
    for gradient, after in zip(releases, trajectory):
        for p, g in zip(theta, gradient):
            p.grad = g
        adam.step()
        for a, b in zip(after, theta):
            torch.testing.assert_close(a, b.detach(), rtol=1e-9, atol=1e-12)


def test_betas_outside_0_1_are_refused():
    theta = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="beta2 must lie in"):
        DPAdamBC([theta], {**DPAdamBC.defaults, "beta2": 1.0}, GradientMechanism(1.0, 1.0, 10.0))


@pytest.mark.parametrize("classes", [2, 3])
def test_dpadam_equals_the_numpy_transcription_step_for_step(classes):
    """benchmarks/transcriptions.py's dpadam (written from the paper, no dpbench) and the engine's dpadam, from the
    same batches and noise draws, agree on every iterate: the transcription's root-cause runs
    (benchmarks/root_causes.py --dpadam) measure dpbench's algorithm."""
    from tests.test_adaptive_clipping import batches, module_for
    from tests.test_transcriptions import T, as_matrix, assert_close

    sigma, batch, steps, lr, clip = 1.2, 8.0, 30, 0.05, 0.3
    module, data, dataset, draws = module_for(DPAdam, sigma, batch, classes, lr=lr, clip=clip)
    drawn = batches(len(dataset), batch, steps)
    trace = []
    for step, index in enumerate(drawn):
        module.training_step([dataset.__getitems__([index])[0]], step)
        trace.append(as_matrix(module.params()))
    assert len(draws) == 2 * steps  # weight, bias per release
    noises = [np.concatenate([w.reshape(-1, 4) / sw, (b / sb)[:, None]], axis=1)
              for (w, sw), (b, sb) in zip(draws[::2], draws[1::2])]
    model = T.LinearModel(data.x_train.numpy(), data.y_train.numpy(), classes)

    def compare(state):
        assert_close(state.w, trace[state.step - 1], 1e-9)

    final = T.dpadam(model, [b.numpy() for b in drawn], noises, lr=lr, sigma=sigma, expected_batch_size=batch,
                     clip=clip, observe=compare)
    assert final.step == steps and np.abs(final.w).max() > 0.1  # it moved
