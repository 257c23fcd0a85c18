"""dpbench's adaclip and ada_dp, run through the engine (sampling, per-example clipping, noise), against the
independent NumPy transcriptions of the papers in ``benchmarks/transcriptions.py``, step for step: the same batches
and the same noise draws go into both, and every parameter, mean, standard deviation and learning rate must agree."""
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from dpbench import registry
from dpbench.privacy.clipping import VmapClipper
from dpbench.privacy.sampling import IndexedTensors, PoissonSampler
from dpbench.run.training import PrivateTraining
from dpbench.spec import resolve_hyperparameters
from dpbench.task import TaskData
from dpbench.tasks.linear import LinearClassification

_SPEC = importlib.util.spec_from_file_location(
    "transcriptions", Path(__file__).resolve().parents[1] / "benchmarks" / "transcriptions.py")
T = sys.modules.setdefault("transcriptions", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(T)

METHODS = registry.methods([])


class TinyLinear(LinearClassification):
    """40 training rows of unit norm with 4 features, ``classes`` classes, in float64; rows 30-39 repeat 0-9 with
    their features scaled by 5 (norm 5), so that some per-example gradients are large and get clipped."""

    name = "tiny_linear_for_transcription_tests"
    description = "random data for step-by-step checks"
    options = {"bias": True, "classes": 2}

    def __init__(self, bias=True, classes=2):
        self.wanted_classes = classes
        super().__init__(bias=bias)

    def load_data(self):
        generator = torch.Generator().manual_seed(1)
        x = torch.randn(50, 4, generator=generator, dtype=torch.float64)
        x = x / x.norm(dim=1, keepdim=True)
        x[30:40] = 5 * x[:10]
        y = torch.randint(0, self.wanted_classes, (50,), generator=generator)
        y[:self.wanted_classes] = torch.arange(self.wanted_classes)  # every class present
        return TaskData(x[:40], y[:40], x[40:], y[40:], "tiny", "standard normal rows scaled to unit norm")

    def build_model(self, data):
        return super().build_model(data).double()


def engine_run(method, classes, sigma, expected_batch_size, steps, clipper=None, **overrides):
    """Trains through the engine (``clipper`` None: its default, the fast clipping); returns the module, the data,
    the dataset, the batches each step draws and, per release, the standard normal draw z with noise = (σC/B)·z."""
    pl.seed_everything(0, verbose=False)
    task = TinyLinear(classes=classes)
    data = task.prepare()
    hp, _ = resolve_hyperparameters(METHODS[method], TinyLinear, overrides)
    module = PrivateTraining(task, METHODS[method], hp, sigma, expected_batch_size, seed=0, clipper=clipper)
    module.on_fit_start()
    draws = []
    draw_noise = module.draw_noise

    def recording(like):
        noise = draw_noise(like)
        std = module.mechanism.mean_noise_std
        draws.append(np.concatenate([noise[0].numpy(), noise[1].numpy()[:, None]], axis=1) / std)
        return noise

    module.draw_noise = recording
    dataset = IndexedTensors(data.x_train, data.y_train)
    sampler = PoissonSampler(len(dataset), expected_batch_size / len(dataset), steps,
                             METHODS[method].releases_per_step, seed=5)
    steps_drawn = list(sampler)
    return module, data, dataset, steps_drawn, draws


def as_matrix(params):
    """nn.Linear's (weight, bias) as the transcription's W = [weight | bias]."""
    weight, bias = (p.detach().numpy() for p in params)
    return np.concatenate([weight, bias[:, None]], axis=1)


# The fast clipping bounds AdaCliP's transformed norms from above in float32 (dpbench/privacy/ghost.py), so its clip
# factors can be smaller than the exact ones by a relative 1e-7; the reference clipping (torch.func.vmap) is exact.
CLIPPERS = [(None, 1e-5), (VmapClipper(), 1e-9)]


def assert_close(actual, expected, rel):
    """Every entry within ``rel`` times the largest magnitude in ``expected``."""
    assert np.abs(actual - expected).max() <= rel * np.abs(expected).max(), (actual, expected)


@pytest.mark.parametrize("clipper, rel", CLIPPERS, ids=["fast", "reference"])
@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("reading_hp", [
    {"lr": 0.5, "beta1": 0.5, "beta2": 0.5, "h1": 0.01, "h2": 4.0, "clip": 1.0},  # every term moves visibly
    {"lr": 0.5, "h2": 0.01, "clip": 1.0},  # the paper's β1, β2, h1 with the old adult h2
])
def test_adaclip_equals_the_transcription_step_for_step(classes, reading_hp, clipper, rel):
    sigma, batch, steps = 0.8, 8.0, 30
    module, data, dataset, drawn, draws = engine_run("adaclip", classes, sigma, batch, steps, clipper, **reading_hp)
    trace = []
    for step, batches in enumerate(drawn):
        module.training_step(dataset.__getitems__(batches), step)
        method = module.method
        trace.append((as_matrix(module.params()), as_matrix(method.mean), as_matrix(method.std)))
    model = T.LinearModel(data.x_train.numpy(), data.y_train.numpy(), classes)
    hp = {**METHODS["adaclip"].defaults, **reading_hp}
    clipped = []

    def compare(state):
        w, m, s = trace[state.step - 1]
        assert_close(state.w, w, rel)
        assert_close(state.m, m, rel)
        assert_close(state.s, s, rel)
        clipped.append(state.clipped)

    final = T.adaclip(model, [b[0].numpy() for b in drawn], draws, lr=hp["lr"], sigma=sigma,
                      expected_batch_size=batch, clip=hp["clip"], beta1=hp["beta1"], beta2=hp["beta2"], h1=hp["h1"],
                      h2=hp["h2"], reading="per-example", observe=compare)
    assert final.step == steps and len(draws) == steps
    assert sum(clipped) > 0  # the clipping was exercised
    assert np.abs(final.s / math.sqrt(hp["h1"] * hp["h2"]) - 1).max() > 0.1  # s moved from s⁰


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("variant", ["paper", "code"])
def test_ada_dp_equals_the_transcription_step_for_step(classes, variant):
    sigma, batch, steps, tol = 1.2, 8.0, 25, 0.3
    module, data, dataset, drawn, draws = engine_run("ada_dp", classes, sigma, batch, steps, lr=2.0, tol=tol,
                                                     variant=variant)
    trace = []
    for step, batches in enumerate(drawn):
        module.training_step(dataset.__getitems__(batches), step)
        trace.append((as_matrix(module.params()), module.method.lr))
    model = T.LinearModel(data.x_train.numpy(), data.y_train.numpy(), classes)
    errors = []

    def compare(state):
        w, lr = trace[state.step - 1]
        assert_close(state.w, w, 1e-9)
        assert state.lr == pytest.approx(lr, rel=1e-9)
        errors.append(state.err)

    final = T.adadp(model, [index.numpy() for b in drawn for index in b], draws, lr=2.0, sigma=sigma,
                    expected_batch_size=batch, tol=tol, variant=variant, observe=compare)
    assert final.step == steps and len(draws) == 2 * steps
    assert min(errors) < tol < max(errors)  # both sides of the tolerance: with the code's variant, rejections
    if variant == "code":
        assert final.rejected > 0 and final.accepted > 0


def test_transcriptions_refuse_unknown_readings():
    model = T.LinearModel(np.eye(2), np.array([0, 1]))
    with pytest.raises(ValueError, match="reading"):
        T.adaclip(model, [], [], lr=0.1, sigma=1.0, expected_batch_size=1.0, reading="other")
    with pytest.raises(ValueError, match="variant"):
        T.adadp(model, [], [], lr=0.1, sigma=1.0, expected_batch_size=1.0, variant="other")


def test_transcription_gradients_are_the_logistic_and_softmax_gradients():
    x = np.array([[1.0, 0.0], [0.0, 2.0]])
    logistic = T.LinearModel(x, np.array([1, 0]))
    w = np.array([[0.5, -1.0, 0.25]])
    g = logistic.per_example_gradients(w, np.array([0, 1]))
    z = np.array([0.5 + 0.25, -2.0 + 0.25])
    residual = 1 / (1 + np.exp(-z)) - np.array([1, 0])
    np.testing.assert_allclose(g[:, 0, :], residual[:, None] * np.array([[1.0, 0.0, 1.0], [0.0, 2.0, 1.0]]))
    softmax = T.LinearModel(x, np.array([2, 0]), classes=3)
    w3 = np.arange(9.0).reshape(3, 3) / 10
    g3 = softmax.per_example_gradients(w3, np.array([0]))
    logits = w3 @ np.array([1.0, 0.0, 1.0])
    p = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(g3[0], np.outer(p - np.array([0, 0, 1]), [1.0, 0.0, 1.0]))
    assert math.isclose(logistic.accuracy(w, x, np.array([1, 0])), 1.0)
