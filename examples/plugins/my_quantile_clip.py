"""An example plugin: quantile clipping (Andrew et al. 2021, Algorithm 1) written against the public contract only.

The built-in ``quantile_clip`` (``methods/quantile_clip.py``) is the reference; this file shows what a plugin author
declares so that the engine makes and charges the extra release: ``count_release`` (the engine adds, on the
gradient's batch, the count Σ_i (1[‖g_i‖ ≤ C_t] − ½) + N(0, σ_b²) and charges both as one Gaussian, Andrew et al.
Theorem 1), ``count_noise_std`` (σ_b) and ``moves_clip`` with ``next_clip()`` (C_{t+1}, a function of released
values only). The method sees the noisy gradient and the noisy count, never a per-example norm. Use it with
``dpbench run --plugins examples/plugins --method my_quantile_clip --task digits --epsilon 1``.
"""
import math

import torch

from dpbench.method import CountRelease, Method, apply_gradient


class MyQuantileClip(Method):
    """SGD with the clip norm moved toward the ``target_quantile`` of the gradient norms: C ← C·exp(−η_C(b̃ − γ))."""

    name = "my_quantile_clip"
    description = "quantile clipping (Andrew et al. 2021) as an external plugin (example)"
    defaults = {"lr": 0.1, "target_quantile": 0.5, "clip_lr": 0.2}
    moves_clip = True
    count_release = True

    @classmethod
    def count_noise_std(cls, hp, expected_batch_size, noise_multiplier=None):
        # σ_b = m/20, the paper's recommendation, at least 5σ (σ the gradient's; None before it is calibrated)
        return max(expected_batch_size / 20, 5 * (noise_multiplier or 0.0))

    def setup(self):
        self.optimizer = torch.optim.SGD(self.params, lr=self.hp["lr"])
        self.clip_norm = float(self.mechanism.clip)  # C_0: the task's clip norm

    def next_clip(self) -> float:
        return self.clip_norm

    def step(self, release):
        gradient, count = release()
        assert isinstance(count, CountRelease)
        apply_gradient(self.optimizer, self.params, gradient)
        exponent = -self.hp["clip_lr"] * (count.fraction - self.hp["target_quantile"])
        self.clip_norm *= math.exp(max(-700.0, min(700.0, exponent)))
