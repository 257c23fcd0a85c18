"""DP-GD: Yu et al., "Gradient Perturbation is Underrated for Differentially Private Convex Optimization", IJCAI 2020."""
from dpbench.methods.dpsgd import DPSGD


class DPGD(DPSGD):
    """Full-batch DP gradient descent (Yu et al., Section 3, gradient perturbation with q = 1).

    Each step releases the clipped gradient sum over the whole training set plus N(0, σ²C²I), divided by n, and
    takes θ ← θ − η·g̃; ``epochs`` is the number of steps T. Yu et al. rely on the loss being L-Lipschitz instead
    of clipping; here clipping at C is applied explicitly, which changes nothing when C bounds every per-example
    gradient norm (unit-norm rows in the tabular tasks) and keeps the sensitivity claim true when it does not.
    """

    name = "dpgd"
    description = "DP-GD (Yu et al. 2020): full-batch gradient descent with Gaussian gradient perturbation"
    defaults = {"lr": 1.0, "momentum": 0.0, "weight_decay": 0.0}
    search_space = {"lr": {"type": "float", "low": 0.01, "high": 10.0, "log": True},
                    "clip": {"type": "float", "low": 0.1, "high": 10.0, "log": True}}
    full_batch = True
