"""DP-Adam: Adam on the privatized gradient, the biased baseline ("DP-Adam-Biased") of Tang & Lécuyer, "DP-Adam:
Correcting DP Bias in Adam's Second Moment Estimation" (2023), Section 2; ``dpadam_bc`` holds their correction."""
import torch

from dpbench.method import Method


class DPAdam(Method):
    """Adam (Kingma & Ba 2014) on the engine's noisy clipped gradient g̃, as in Tang & Lécuyer, Section 2:

        m ← β1·m + (1 − β1)·g̃,   v ← β2·v + (1 − β2)·g̃²,   m̂ = m / (1 − β1^t),   v̂ = v / (1 − β2^t),
        θ ← θ − η·m̂ / (√v̂ + γ),

    with t the number of steps taken (1 at the first), m = v = 0 at the start, and γ = ``gamma`` (1e-8). This is
    ``torch.optim.Adam`` without weight decay, written out so that ``dpadam_bc`` differs only in
    :meth:`denominator`. Defaults β1 = 0.9, β2 = 0.999 as in the authors' code and the paper's SNLI analysis
    (Section 3; its β ablation calls β2 = 0.99 the default; we follow the code). Default η = 1e-3: the paper's
    CIFAR10 setting (its SNLI setting is 0.01); tasks set their own η in ``method_defaults``.
    Post-processing of the releases: no extra privacy cost.
    """

    name = "dpadam"
    description = "DP-Adam (Tang & Lécuyer 2023, biased baseline): Adam on the noisy clipped gradient"
    paper = "https://arxiv.org/abs/2304.11208"
    defaults = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "gamma": 1e-8}
    # The paper tunes η and γ (Section 3, "we tune the learning rate, as well as γ or γ′").
    search_space = {"lr": {"type": "float", "low": 0.0001, "high": 1.0, "log": True},
                    "gamma": {"type": "float", "low": 1e-10, "high": 1e-2, "log": True},
                    "clip": {"type": "float", "low": 0.1, "high": 10.0, "log": True}}

    def setup(self):
        for key in ("beta1", "beta2"):
            if not 0 <= self.hp[key] < 1:
                raise ValueError(f"{key} must lie in [0, 1), got {self.hp[key]}")
        self.steps_taken = 0
        self.first_moments = [torch.zeros_like(p) for p in self.params]
        self.second_moments = [torch.zeros_like(p) for p in self.params]

    def denominator(self, second_moment_hat: torch.Tensor) -> torch.Tensor:
        """√v̂ + γ (Adam's update direction m̂ / (√v̂ + γ))."""
        return second_moment_hat.sqrt() + self.hp["gamma"]

    @torch.no_grad()
    def step(self, release):
        gradient = release()
        self.steps_taken += 1
        beta1, beta2, t = self.hp["beta1"], self.hp["beta2"], self.steps_taken
        for param, g, m, v in zip(self.params, gradient, self.first_moments, self.second_moments):
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            m_hat = m / (1 - beta1**t)
            v_hat = v / (1 - beta2**t)
            param.sub_(self.hp["lr"] * m_hat / self.denominator(v_hat))
