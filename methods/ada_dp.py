"""ADADP: Koskela & Honkela, "Learning Rate Adaptation for Federated and Differentially Private Learning"
(AISTATS 2020), Algorithm 2; reference code github.com/DPBayes/ADADP (``MNIST_tests/adadp.py``)."""
import math

import torch

from dpbench.method import Method

VARIANTS = ("paper", "code")


class AdaDP(Method):
    """DP-SGD whose learning rate η adapts by comparing one full step with two half steps (Algorithm 2).

    One step consumes two releases (two independent Poisson batches), so an epoch has n/(2B) steps and the same
    number of noisy gradients, hence the same privacy cost for a given σ, as n/B steps of DP-SGD (Theorem 2)::

        G1 = release() at θ;   θ1 = θ − η·G1;   θ½ = θ − (η/2)·G1
        G2 = release() at θ½;  θ̂ = θ½ − (η/2)·G2
        err = ‖(θ1 − θ̂) / max(1, |θ1|)‖₂                 (equation 6, elementwise, over all parameters)
        η ← min(max(tol/err, α_min), α_max) · η

    The engine's release is the noisy clipped *mean* (sum / B), as in the published code; Algorithm 2 writes the
    sum and notes that dropping |B| only rescales η, so ``lr`` here is the η of the code, not of Algorithm 2.

    ``variant="code"`` (default) does what the published code does (``adadp.py`` ``step1``/``step2``, which the
    paper's experiments ran): the next iterate is θ̂ (the two half steps), or θ unchanged when err > tol
    (Algorithm 1's rejection; both batches are still charged), and η ← min(max(√(tol/err), α_min), α_max)·η,
    updated before the test and kept either way. ``variant="paper"`` follows Algorithm 2 literally: the next
    iterate is the full step θ1 (Algorithm 2 names it θ_{ℓ+1}; θ̂_{ℓ+1} only enters the error estimate, so G2 never
    moves θ), no step is rejected ("In the case of DP learning the algorithm was found to be stable without the
    condition err < tol so we omit it"), and the factor is tol/err without the square root. The algorithm box does
    not say which iterate continues; the code answers θ̂, hence the default.

    ``tol`` defaults to the paper's 1.0 with noise and 0.1 without (σ = 0, tests only); ``lr`` (the initial η)
    defaults to the paper's 0.1 (its text, Section "Comparison of ADADP against DP-Adam"; the published code
    starts at 1e-3, which at ≤ 10% growth per step takes ~48 steps to reach 0.1, too many for short runs).

    Optional schedule (paper, same section): with ``adapt_epochs`` K, adapt during epochs 1..K, then fix
    η_K and, in epoch k > K, take plain SGD steps θ ← θ − η_k·G with η_k = η_K / (1 + ``decay``·(k − K)): one
    step per release, two per engine step, so that no drawn batch is wasted. Epochs are counted as
    step // the engine's steps per epoch (round(n / (2B))). Everything here is post-processing of the releases and
    costs no privacy.
    """

    name = "ada_dp"
    description = "ADADP (Koskela & Honkela 2020): DP-SGD adapting its learning rate from one full vs two half steps"
    paper = "https://arxiv.org/abs/1809.03832"
    defaults = {"lr": 0.1, "tol": None, "alpha_min": 0.9, "alpha_max": 1.1, "variant": "code",
                "adapt_epochs": None, "decay": 0.1}
    releases_per_step = 2
    # lr: the initial η
    search_space = {"lr": {"type": "float", "low": 0.01, "high": 100.0, "log": True},
                    "tol": {"type": "float", "low": 0.1, "high": 10.0, "log": True},
                    "clip": {"type": "float", "low": 0.1, "high": 10.0, "log": True}}

    def setup(self):
        hp = self.hp
        # None-default values arrive from ``--set`` as strings; the parsed values are written back to
        # ``self.hp`` so that the run record shows what was used.
        try:
            if hp["tol"] is None:
                hp["tol"] = 1.0 if self.mechanism.noise_multiplier > 0 else 0.1
            hp["tol"] = float(hp["tol"])
            if hp["adapt_epochs"] is not None:
                hp["adapt_epochs"] = int(hp["adapt_epochs"])
        except ValueError:
            raise ValueError("tol must be a number and adapt_epochs a whole number") from None
        if hp["variant"] not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, not {hp['variant']!r}")
        if not (hp["lr"] > 0 and hp["tol"] > 0):
            raise ValueError(f"lr and tol must be positive, got lr={hp['lr']}, tol={hp['tol']}")
        if not 0 < hp["alpha_min"] <= 1 <= hp["alpha_max"]:
            raise ValueError(f"need 0 < alpha_min <= 1 <= alpha_max, got {hp['alpha_min']}, {hp['alpha_max']}")
        if hp["adapt_epochs"] is not None:
            if hp["adapt_epochs"] < 0 or hp["decay"] < 0:
                raise ValueError("adapt_epochs and decay must be non-negative")
            if not self.mechanism.steps_per_epoch:
                raise ValueError("adapt_epochs needs the engine's steps per epoch")
        self.lr = float(hp["lr"])  # η_ℓ
        self.steps_taken = 0

    def step(self, release):
        epochs_done = (None if self.hp["adapt_epochs"] is None
                       else self.steps_taken // self.mechanism.steps_per_epoch)
        if epochs_done is None or epochs_done < self.hp["adapt_epochs"]:
            self._adaptive_step(release)
        else:
            epoch = epochs_done + 1  # the paper's epoch index k, counted from 1
            lr = self.lr / (1 + self.hp["decay"] * (epoch - self.hp["adapt_epochs"]))
            for _ in range(2):
                gradient = release()
                with torch.no_grad():
                    for param, g in zip(self.params, gradient):
                        param.sub_(lr * g)
        self.steps_taken += 1

    def _adaptive_step(self, release):
        """One iteration of Algorithm 2 (or of the published code for ``variant="code"``)."""
        lr, tol = self.lr, self.hp["tol"]
        theta = [param.detach().clone() for param in self.params]
        g1 = release()
        with torch.no_grad():
            full_step = [t - lr * g for t, g in zip(theta, g1)]
            for param, t, g in zip(self.params, theta, g1):
                param.copy_(t - (lr / 2) * g)  # θ½
        g2 = release()
        with torch.no_grad():
            for param, g in zip(self.params, g2):
                param.sub_((lr / 2) * g)  # θ̂
            err = math.sqrt(sum(float(((f - p) / f.abs().clamp(min=1.0)).square().sum())
                                for f, p in zip(full_step, self.params)))
            ratio = tol / err if err > 0 else math.inf
            if self.hp["variant"] == "code":
                ratio = math.sqrt(ratio)
            self.lr = min(max(ratio, self.hp["alpha_min"]), self.hp["alpha_max"]) * lr
            if self.hp["variant"] == "paper":
                next_iterate = full_step
            elif err > tol:
                next_iterate = theta
            else:
                return  # the parameters already hold θ̂
            for param, value in zip(self.params, next_iterate):
                param.copy_(value)
