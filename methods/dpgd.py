"""DP-GD: Yu et al., "Gradient Perturbation is Underrated for Differentially Private Convex Optimization", IJCAI 2020."""
from dpbench.methods.dpsgd import DPSGD, MOMENTUM


class DPGD(DPSGD):
    """Full-batch DP gradient descent (Yu et al., Section 3, gradient perturbation with q = 1).

    Each step releases the clipped gradient sum over the whole training set plus N(0, σ²C²I), divided by n, and
    takes θ ← θ − η·g̃ (plus the regularizer's λθ with ``weight_decay`` λ); ``epochs`` is the number of steps T.
    As in Yu et al. (Section 4: "We ensure each loss function is Lipschitz by clipping individual gradient",
    threshold 1), every per-example gradient is clipped to C.
    """

    name = "dpgd"
    description = "DP-GD (Yu et al. 2020): full-batch gradient descent with Gaussian gradient perturbation"
    paper = "https://arxiv.org/abs/1911.11363"
    defaults = {"lr": 1.0, "momentum": 0.0, "weight_decay": 0.0}
    search_space = {"lr": {"type": "float", "low": 0.01, "high": 100.0, "log": True},
                    "clip": {"type": "float", "low": 0.1, "high": 10.0, "log": True}, **MOMENTUM}
    full_batch = True
