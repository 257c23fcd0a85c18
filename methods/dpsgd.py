"""DP-SGD: Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, Algorithm 1."""
import torch

from dpbench.method import Method


class DPSGD(Method):
    """DP-SGD with optional heavy-ball momentum.

    Per step the engine releases g̃ = (Σ_i clip_C(g_i) + N(0, σ²C²I)) / (q·n) over a Poisson batch (Algorithm 1,
    with the noisy sum divided by the *expected* batch size q·n, so that the division does not depend on the
    private batch size); this method takes θ ← θ − η·g̃, or with momentum μ the ``torch.optim.SGD`` update
    v ← μv + g̃, θ ← θ − ηv. ``weight_decay`` λ adds the gradient λθ of an L2 regularizer (λ/2)‖θ‖² after the
    release: it does not depend on the data. ``halve_at`` h ∈ (0, 1) divides η by 2 once h of the planned steps are
    done (Yu et al. 2020, Section 4: "the learning rate of DP-SGD ... is divided by 2 at the middle of training",
    h = 0.5; 0 keeps η constant). Momentum, regularization and the schedule are post-processing and cost no privacy.

    The update is ``torch.optim.SGD``'s (d = g̃ + λθ; v ← μv + d, v = d at the first step; θ ← θ − ηv), written out:
    torch.optim's per-call machinery cost 0.36 ms a step, which dominated batched trials of linear models
    (``dpbench.multiseed``); ``tests/test_engine.py`` checks it step for step against ``torch.optim.SGD``.
    """

    name = "dpsgd"
    description = "DP-SGD (Abadi et al. 2016): per-example clipping, Gaussian noise, SGD step (momentum optional)"
    paper = "https://arxiv.org/abs/1607.00133"
    defaults = {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "halve_at": 0.0}
    search_space = {"lr": {"type": "float", "low": 0.01, "high": 100.0, "log": True},
                    "clip": {"type": "float", "low": 0.1, "high": 10.0, "log": True}}

    def setup(self):
        halve_at = self.hp.get("halve_at", 0.0)  # subclasses with defaults of their own (dpgd) keep η constant
        if not 0 <= halve_at < 1:
            raise ValueError(f"halve_at must lie in [0, 1), got {halve_at}")
        if halve_at and not self.mechanism.steps_per_epoch:
            raise ValueError("halve_at needs the engine's steps per epoch")
        self.velocity, self.steps_taken = None, 0

    @torch.no_grad()
    def step(self, release):
        gradient = release()
        lr, momentum, decay = self.hp["lr"], self.hp["momentum"], self.hp["weight_decay"]
        halve_at = self.hp.get("halve_at", 0.0)
        if halve_at and self.steps_taken >= halve_at * self.hp["epochs"] * self.mechanism.steps_per_epoch:
            lr /= 2
        self.steps_taken += 1
        if decay:
            gradient = [g.add(p, alpha=decay) for g, p in zip(gradient, self.params)]
        if momentum:
            if self.velocity is None:
                self.velocity = [g.clone() for g in gradient]
            else:
                for v, g in zip(self.velocity, gradient):
                    v.mul_(momentum).add_(g)
            gradient = self.velocity
        for param, g in zip(self.params, gradient):
            param.add_(g, alpha=-lr)
