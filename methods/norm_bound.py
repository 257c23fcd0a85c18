"""The "norm bound" baseline of Pichapati et al., "AdaCliP: Adaptive Clipping for Private SGD" (2019), Section 6 and
Table 1: private SGD with noise scaled to a proven bound on every per-example gradient norm instead of clipping."""
from dpbench.methods.dpsgd import DPSGD, MOMENTUM


class NormBound(DPSGD):
    """Noisy SGD whose noise is scaled to the task's proven per-example gradient norm bound G.

    The engine sets C = G = ``task.gradient_norm_bound()`` (``clip_to_task_bound``) and releases
    g̃ = (Σ_i g_i + N(0, σ²G²I)) / (q·n); since ‖g_i‖ ≤ G for every example, its clipping at G changes nothing and
    only guards against floating-point rounding. The update is DP-SGD's, θ ← θ − η·g̃ (momentum and weight decay as
    in ``dpsgd``, off by default). A task without such a bound (e.g. ``mnist_mlp``) is refused, and so is ``--clip``.

    The bound. AdaCliP scales its noise to "the maximum ℓ2-norm of the inputs which is 28.0" for MNIST logistic
    regression, i.e. it bounds ‖∇‖ by R = max ‖x‖ = √784. That holds for a binary logistic loss without bias term,
    ∇ = (σ(z) − y)·x. Our linear tasks have a bias and, for more than 2 classes, the softmax cross-entropy (AdaCliP's
    MNIST model is a 10-class classifier, by its ~90% accuracy): the per-example gradient is (σ(z) − y)·(x, 1), of
    norm < √(R² + 1), or (p − e_y) ⊗ (x, 1), of norm ‖p − e_y‖·√(R² + 1) < √2·√(R² + 1), because
    ‖p − e_y‖² = (1 − p_y)² + Σ_{k≠y} p_k² ≤ 2(1 − p_y)². Both bounds are suprema, approached when the logits put
    all the probability on a wrong class. For MNIST softmax regression that is √2·√785 ≈ 39.6, not 28: noise scaled
    to 28 would be a factor 1.41 too small for the gradients that can occur, and the ε claimed for it too small.
    We use the proven bound (``tasks/linear.py``); the task's R comes from the data's construction (unit-norm rows;
    pixels in [0, 1]), never from the data's values.
    """

    name = "norm_bound"
    description = "noisy SGD without clipping: noise scaled to the task's proven gradient norm bound (AdaCliP baseline)"
    paper = "https://arxiv.org/abs/1908.07643"
    clip_to_task_bound = True
    search_space = {"lr": {"type": "float", "low": 0.01, "high": 100.0, "log": True},  # C is the task's bound
                    **MOMENTUM}
