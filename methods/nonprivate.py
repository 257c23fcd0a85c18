"""Non-private baseline: the reference every private method is compared with."""
import torch

from dpbench.method import Method, apply_gradient


class NonPrivate(Method):
    """Mini-batch SGD (optionally with momentum) or Adam on the exact mean gradient of each shuffled batch.

    No clipping, no noise, no privacy: runs report ``epsilon: null``.
    """

    name = "nonprivate"
    description = "Non-private SGD (momentum optional) or Adam: the reference for the private methods"
    defaults = {"lr": 0.1, "momentum": 0.0, "optimizer": "sgd", "beta1": 0.9, "beta2": 0.999}
    private = False
    default_sampler = "shuffle"
    search_space = {"lr": {"type": "float", "low": 0.01, "high": 100.0, "log": True},
                    "momentum": {"type": "categorical", "choices": [0.0, 0.9]}}

    def setup(self):
        hp = self.hp
        if hp["optimizer"] == "sgd":
            self.optimizer = torch.optim.SGD(self.params, lr=hp["lr"], momentum=hp["momentum"])
        elif hp["optimizer"] == "adam":
            self.optimizer = torch.optim.Adam(self.params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]))
        else:
            raise ValueError(f"optimizer must be 'sgd' or 'adam', not {hp['optimizer']!r}")

    def step(self, release):
        apply_gradient(self.optimizer, self.params, release())
