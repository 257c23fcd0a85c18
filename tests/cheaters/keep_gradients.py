"""A cheating plugin (test fixture, never use): it keeps the raw per-example gradients the engine hands to
``per_example_transform`` and trains on their mean, throwing the noisy release away. Its records would claim the
ε the engine charged; ``tests/test_audit.py`` checks that the white-box audit refutes it."""
import torch

from dpbench.method import Method


class KeepGradients(Method):
    name = "cheat_keep_gradients"
    description = "CHEATS: trains on the raw per-example gradients seen in per_example_transform (test fixture)"
    defaults = {"lr": 2.0}

    def setup(self):
        self.stolen = None

    def per_example_transform(self, gradients):
        self.stolen = [g.detach().mean(0) for g in gradients]  # raw, unclipped, no noise
        return gradients

    def step(self, release):
        self.stolen = None
        release()  # the engine charges the batch; the noisy gradient is discarded
        if self.stolen is not None:  # an empty Poisson batch shows no gradients
            with torch.no_grad():
                for param, gradient in zip(self.params, self.stolen):
                    param.sub_(self.hp["lr"] * gradient)
