"""DP-SGD: Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, Algorithm 1."""
import torch

from dpbench.method import Method, apply_gradient


class DPSGD(Method):
    """DP-SGD with optional heavy-ball momentum.

    Per step the engine releases g̃ = (Σ_i clip_C(g_i) + N(0, σ²C²I)) / (q·n) over a Poisson batch (Algorithm 1,
    with the noisy sum divided by the *expected* batch size q·n, so that the division does not depend on the
    private batch size); this method takes θ ← θ − η·g̃, or with momentum μ the ``torch.optim.SGD`` update
    v ← μv + g̃, θ ← θ − ηv. ``weight_decay`` λ adds the gradient λθ of an L2 regularizer (λ/2)‖θ‖² after the
    release: it does not depend on the data. Momentum and regularization are post-processing and cost no privacy.
    """

    name = "dpsgd"
    description = "DP-SGD (Abadi et al. 2016): per-example clipping, Gaussian noise, SGD step (momentum optional)"
    defaults = {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}
    search_space = {"lr": {"type": "float", "low": 0.01, "high": 10.0, "log": True},
                    "clip": {"type": "float", "low": 0.1, "high": 10.0, "log": True}}

    def setup(self):
        self.optimizer = torch.optim.SGD(self.params, lr=self.hp["lr"], momentum=self.hp["momentum"],
                                         weight_decay=self.hp["weight_decay"])

    def step(self, release):
        apply_gradient(self.optimizer, self.params, release())
