"""Synthetic tasks from the seed papers, generated in memory (no download).

``adaclip_regression``: the ℓ2²-regression of Pichapati et al., "AdaCliP: Adaptive Clipping for Private SGD",
Section 3 equation (1) and Section 6, Figure 2. Points x_i = (y_i, 0, …, 0) ∈ R^d with y_i = +1 for i ≤ 500 and
−1 otherwise (n = 1000); θ minimizes Σ_i ‖θ − x_i‖², so θ* = mean of the points = 0, and the metric is the
squared error ‖θ − θ*‖² = ‖θ‖². Only the first coordinate carries information: the per-example gradient is
θ − x_i, whose spread across examples is ±1 in coordinate 1 and 0 elsewhere, which is what lets AdaCliP add
noise to coordinate 1 only (Section 4.3).
"""
import torch
from torch import nn

from dpbench.task import Task, TaskData


#: The largest d: the training set and its copy for testing hold 2·1000·d float32 numbers (0.8 GB at this d).
MAX_DIM = 100_000


class Point(nn.Module):
    """The model is the point θ ∈ R^d itself; its "output" on a data point x is the residual θ − x."""

    def __init__(self, theta: torch.Tensor):
        super().__init__()
        self.theta = nn.Parameter(theta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.theta - x


class AdaCliPRegression(Task):
    """AdaCliP's Figure 2 regression; ``--set dim=d`` chooses d. The defaults are the paper's setting.

    Choices where the paper leaves room (Section 6 and equation (1)):

    * Per-example loss ½‖θ − x_i‖², as in equation (1) ((1/2n)·Σ‖θ − x_i‖²): its gradient is θ − x_i, the
      g^t = θ^t − x^{i_t} of Section 3, whose norm is ≈ μ = 1, the clip threshold the paper uses (Section 4.3:
      "all gradients have the same norm and hence we can set clipping threshold to μ"). Section 6 says "the sum
      of square of distances"; the minimizer, θ* = 0, is the same.
    * θ⁰ ~ N(0, c²I/d) with c = ``init_scale`` (default 1), drawn from the run's seed (Algorithm 1 line 3:
      "Initialize θ⁰ randomly"; the distribution is not given). The 1/d keeps the expected initial error
      E‖θ⁰‖² = c² the same for every d. ``--set init_scale=0`` starts at the optimum θ* = 0, where the error
      after training measures only how far the noise pushes θ away.
    * h2 for ``adaclip`` defaults to 1e-6 here: the paper tunes h2 and does not report it. Among 1e-7, 1e-6, 1e-5,
      1e-4, 1e-2 and 1, in a simulation of Algorithm 1 on this task with one example per step, 1e-6 gave the
      lowest error at d = 1000 (the only d where AdaCliP beats DP-SGD here); ``benchmarks/adaclip_figure2.py``
      shows what the error depends on.
    * The paper's setting — batch size 1, learning rate 0.01, 10 epochs, clip 1.0 — is the default; its noise
      scale σ = 0.1 must be passed as ``--noise-multiplier 0.1`` (a task cannot set σ). With Poisson sampling at
      q = 1/1000 and δ = 1/n², σ = 0.1 implies a very large ε, which the run reports; the paper states σ, not ε.
    """

    name = "adaclip_regression"
    min_train_examples = 1_000  # n_points
    description = "AdaCliP's synthetic regression (Figure 2): x_i = (±1, 0, …, 0) in R^dim, error ‖θ − θ*‖²"
    options = {"dim": 10, "init_scale": 1.0}
    defaults = {"batch_size": 1, "lr": 0.01, "epochs": 10, "clip": 1.0}
    method_defaults = {"adaclip": {"h2": 1e-6}}
    n_points = 1000

    def __init__(self, **options):
        super().__init__(**options)
        if not 1 <= self.settings["dim"] <= MAX_DIM:
            raise ValueError(f"dim must lie in 1..{MAX_DIM:,}, got {self.settings['dim']}")
        if not self.settings["init_scale"] >= 0:
            raise ValueError(f"init_scale must be >= 0, got {self.settings['init_scale']}")

    def load_data(self) -> TaskData:
        dim = self.settings["dim"]
        x = torch.zeros(self.n_points, dim)
        x[: self.n_points // 2, 0] = 1.0
        x[self.n_points // 2:, 0] = -1.0
        targets = torch.zeros(self.n_points)
        return TaskData(
            x_train=x, y_train=targets, x_test=x.clone(), y_test=targets.clone(),
            data_id=f"adaclip-regression-d{dim}",
            preprocessing=(f"generated: x_i = (y_i, 0, ..., 0) in R^{dim}, y_i = +1 for i <= 500, -1 for the other "
                           f"500 (Pichapati et al. 2019, Section 6); targets unused (zeros); the test set is a copy "
                           f"of the training set and the metric ||theta||^2 does not read it"),
        )

    def build_model(self, data: TaskData) -> nn.Module:
        dim = data.x_train.shape[1]
        return Point(self.settings["init_scale"] * torch.randn(dim) / dim**0.5)

    def per_example_loss(self, outputs, targets):
        return 0.5 * outputs.pow(2).sum(-1)

    def per_example_metrics(self, outputs, targets):
        squared_error = self.model.theta.detach().pow(2).sum()  # ‖θ − θ*‖² with θ* = 0, the same for every example
        return {"squared_error": squared_error.expand(len(outputs))}
