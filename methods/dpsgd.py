"""DP-SGD: Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, Algorithm 1."""
import torch

from dpbench.method import Method, per_run, stacked

#: Heavy-ball momentum on or off in the SGD family's search spaces (0.9: the usual value; post-processing, no cost)
MOMENTUM = {"momentum": {"type": "categorical", "choices": [0.0, 0.9]}}


class DPSGD(Method):
    """DP-SGD with optional heavy-ball momentum.

    Per step the engine releases g̃ = (Σ_i clip_C(g_i) + N(0, σ²C²I)) / (q·n) over a Poisson batch (Algorithm 1,
    with the noisy sum divided by the *expected* batch size q·n, so that the division does not depend on the
    private batch size); this method takes θ ← θ − η·g̃, or with momentum μ the ``torch.optim.SGD`` update
    v ← μv + g̃, θ ← θ − ηv. ``weight_decay`` λ adds the gradient λθ of an L2 regularizer (λ/2)‖θ‖² after the
    release: it does not depend on the data. ``halve_at`` h ∈ (0, 1) divides η by 2 once h of the planned steps are
    done (Yu et al. 2020, Section 4: "the learning rate of DP-SGD ... is divided by 2 at the middle of training",
    h = 0.5; 0 keeps η constant). Momentum, regularization and the schedule are post-processing and cost no privacy.

    The update is ``torch.optim.SGD``'s (d = g̃ + λθ; v ← μv + d, v = d at the first step; θ ← θ − ηv), written out
    for many runs at once (:meth:`~dpbench.method.Method.update_together`): torch.optim's per-call machinery cost
    0.36 ms a step, which dominated batched trials of linear models (``dpbench.run.multiseed``);
    ``tests/test_engine.py`` checks it step for step against ``torch.optim.SGD``.
    """

    name = "dpsgd"
    description = "DP-SGD (Abadi et al. 2016): per-example clipping, Gaussian noise, SGD step (momentum optional)"
    paper = "https://arxiv.org/abs/1607.00133"
    defaults = {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "halve_at": 0.0}
    search_space = {"lr": {"type": "float", "low": 0.01, "high": 100.0, "log": True},
                    "clip": {"type": "float", "low": 0.1, "high": 10.0, "log": True}, **MOMENTUM}

    def setup(self):
        halve_at = self.hp.get("halve_at", 0.0)  # subclasses with defaults of their own (dpgd) keep η constant
        if not 0 <= halve_at < 1:
            raise ValueError(f"halve_at must lie in [0, 1), got {halve_at}")
        if halve_at and not self.mechanism.steps_per_epoch:
            raise ValueError("halve_at needs the engine's steps per epoch")
        self.velocity = [torch.zeros_like(p) for p in self.params] if self.hp["momentum"] else []
        self.steps_taken = 0

    def learning_rate(self) -> float:
        """η, halved once ``halve_at`` of the planned steps are done; counts this step."""
        lr, halve_at = self.hp["lr"], self.hp.get("halve_at", 0.0)
        if halve_at and self.steps_taken >= halve_at * self.hp["epochs"] * self.mechanism.steps_per_epoch:
            lr /= 2
        self.steps_taken += 1
        return lr

    @classmethod
    @torch.no_grad()
    def update_together(cls, runs, params, gradients):
        lrs = [run.learning_rate() for run in runs]
        decays = [run.hp["weight_decay"] for run in runs]
        if any(decays):
            gradients = [g + per_run(decays, p) * p for g, p in zip(gradients, params)]
        if any(run.velocity for run in runs):  # v ← μv + d (v = 0 before the first step, so v = d then)
            momenta = [run.hp["momentum"] for run in runs]
            velocity = [stacked([run.velocity[j] if run.velocity else torch.zeros_like(p[0]) for run in runs])
                        for j, p in enumerate(params)]
            for v, g in zip(velocity, gradients):
                v.mul_(per_run(momenta, v)).add_(g)
            gradients = velocity
        for param, g in zip(params, gradients):
            param.addcmul_(per_run(lrs, param), g, value=-1)  # θ ← θ − η·v in one pass
