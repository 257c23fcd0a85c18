"""norm_bound (AdaCliP's Table 1 baseline): the task's gradient norm bound holds, sets the noise, and is required."""
import json
import math
import textwrap

import pytest
import torch

from dpbench.cli import main
from dpbench.privacy.clipping import VmapClipper
from dpbench.run import planning, training
from dpbench.task import TaskData
from dpbench.tasks.linear import LinearClassification, MNISTLogReg
from dpbench.tasks.mnist import MNISTMLP


def linear_task(classes, max_input_norm, features=6):
    """A LinearClassification with input bound R = ``max_input_norm`` and its model built, in float64."""
    task_class = type("BoundedLinear", (LinearClassification,), {"max_input_norm": max_input_norm})
    task = task_class()
    placeholder = torch.zeros(classes, features)
    task.model = task.build_model(TaskData(placeholder, torch.arange(classes), placeholder, torch.arange(classes),
                                           "none", "none")).double()
    return task


def gradient_norms(task, x, y):
    grads = VmapClipper().per_example_gradients(task, x, y).values()
    return torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads))


def random_rows(n, features, max_norm, generator):
    """Random directions with norms uniform in [0, R], the first quarter exactly R."""
    x = torch.randn(n, features, generator=generator, dtype=torch.float64)
    norms = max_norm * torch.rand(n, 1, generator=generator, dtype=torch.float64)
    norms[: n // 4] = max_norm
    return x / x.norm(dim=1, keepdim=True) * norms


@pytest.mark.parametrize("classes, max_input_norm", [(2, 1.0), (2, 28.0), (10, 1.0), (10, 28.0), (3, 5.0)])
def test_per_example_gradient_norms_never_exceed_the_bound_and_approach_it(classes, max_input_norm):
    task = linear_task(classes, max_input_norm)
    bound = task.gradient_norm_bound()
    # By hand: √(R² + 1) for the logistic loss, √2·√(R² + 1) for the softmax cross-entropy.
    assert bound == pytest.approx(math.sqrt(max_input_norm**2 + 1) * (1 if classes == 2 else math.sqrt(2)))
    generator = torch.Generator().manual_seed(classes)
    features = task.model.in_features
    for weight_scale in (0.0, 1.0, 100.0):  # random models, from θ = 0 to huge logits
        with torch.no_grad():
            for p in task.model.parameters():
                p.copy_(weight_scale * torch.randn(p.shape, generator=generator, dtype=torch.float64))
        x = random_rows(400, features, max_input_norm, generator)
        y = torch.randint(0, classes, (400,), generator=generator)
        assert gradient_norms(task, x, y).max() <= bound * (1 + 1e-12)

    # Adversarial: inputs of norm exactly R, logits of the wrong sign / a wrong class taking all the probability.
    x = random_rows(50, features, max_input_norm, generator)
    x = x / x.norm(dim=1, keepdim=True) * max_input_norm
    norms = []
    with torch.no_grad():
        for xi in x:
            if classes == 2:  # y = 1 and z = −1000·(‖x‖ + 1) / R → σ(z) − y ≈ −1
                task.model.weight.copy_(-1000 * xi / max_input_norm)
                task.model.bias.fill_(-1000.0)
                yi = torch.tensor([1])
            else:  # y = 0 and class 1's logit 1000·(‖x‖ + 1) / R above the others → ‖p − e_y‖ ≈ √2
                task.model.weight.zero_()
                task.model.bias.zero_()
                task.model.weight[1] = 1000 * xi / max_input_norm
                task.model.bias[1] = 1000.0
                yi = torch.tensor([0])
            norms.append(gradient_norms(task, xi.unsqueeze(0), yi))
    norms = torch.cat(norms)
    assert norms.max() <= bound * (1 + 1e-12)
    assert norms.min() >= bound * (1 - 1e-6)  # the bound is tight: no smaller constant would do


def test_mnist_logreg_bound_is_for_pixels_in_0_1():
    assert MNISTLogReg.max_input_norm == torch.ones(784).norm().item() == 28.0
    task = MNISTLogReg()
    task.classes = 10
    assert task.gradient_norm_bound() == pytest.approx(math.sqrt(2) * math.sqrt(28**2 + 1))  # ≈ 39.6, not 28
    assert MNISTMLP().gradient_norm_bound() is None


@pytest.mark.parametrize("task, bound", [("breast_cancer", math.sqrt(2)), ("digits", math.sqrt(2) * math.sqrt(2))])
def test_released_noise_has_std_sigma_times_the_bound_over_expected_batch_size(task, bound, capsys, monkeypatch):
    modules = []

    class Recorded(training.PrivateTraining):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            modules.append(self)

    monkeypatch.setattr(planning, "PrivateTraining", Recorded)
    assert main(["run", "--method", "norm_bound", "--task", task, "--noise-multiplier", "3", "--epochs", "1",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    expected_batch_size = record["sample_rate"] * record["n_train"]
    assert record["hyperparameters"]["clip"] == pytest.approx(bound)
    (module,) = modules
    assert module.method.mechanism.mean_noise_std == pytest.approx(3 * bound / expected_batch_size)
    x, y = module.task.data.x_train[:0], module.task.data.y_train[:0]
    noise = torch.cat([torch.cat([g.flatten() for g in module.release(x, y)]) for _ in range(400)])
    assert noise.std().item() == pytest.approx(3 * bound / expected_batch_size, rel=0.03)


def test_a_task_without_a_gradient_norm_bound_is_refused(tmp_path, refused):
    (tmp_path / "tiny_mlp.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from dpbench.task import Classification, TaskData

        class TinyMLP(Classification):
            name = "tiny_mlp_for_tests"
            description = "a small ReLU network on random data: no gradient norm bound, like mnist_mlp"

            def load_data(self):
                generator = torch.Generator().manual_seed(0)
                x, y = torch.rand(40, 4, generator=generator), torch.randint(0, 3, (40,), generator=generator)
                return TaskData(x[:30], y[:30], x[30:], y[30:], "tiny", "uniform random features")

            def build_model(self, data):
                self.classes = 3
                return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    """))
    err = refused("run", "--plugins", str(tmp_path), "--method", "norm_bound", "--task", "tiny_mlp_for_tests",
                  "--noise-multiplier", "1")
    assert "norm_bound needs a proven bound on per-example gradient norms" in err and "tiny_mlp_for_tests" in err


@pytest.mark.parametrize("clip", [["--clip", "1"], ["--set", "clip=1"]])
def test_a_clip_is_refused(clip, refused):
    err = refused("run", "--method", "norm_bound", "--task", "digits", "--epsilon", "1", *clip)
    assert "norm_bound scales its noise to the task's gradient norm bound: it takes no clip" in err
