"""Automatic clipping: Bu, Wang, Zha & Karypis, "Automatic Clipping: Differentially Private Deep Learning Made Easier
and Stronger", NeurIPS 2023 (arXiv:2206.07136, 2022): DP-SGD with the per-example normalization AUTO-S."""
from dpbench.methods.dpsgd import DPSGD, MOMENTUM


class AutoClip(DPSGD):
    """DP-SGD with every per-example gradient normalized instead of clipped: g_i ↦ C·g_i/(‖g_i‖ + γ) (AUTO-S).

    Per step the engine releases g̃ = (Σ_i C·g_i/(‖g_i‖ + γ) + N(0, σ²C²I)) / B over a Poisson batch of expected size
    B, and this method takes DP-SGD's step θ ← θ − η·g̃ (momentum, weight decay and the halving schedule as
    ``dpsgd``). Each contribution has norm C·‖g_i‖/(‖g_i‖ + γ) < C, so the release is DP-SGD's Gaussian mechanism of
    sensitivity C and is charged exactly as DP-SGD's (no new accounting).

    The scaling is the engine's (``clipping = "automatic"``, ``dpbench.privacy.clipping.clip_factors``), computed from
    the per-example norms the fast clipper (``dpbench/privacy/ghost.py``) already computes, in its exact mode (norms
    that cannot cancel: C/(‖g‖ + γ) scales up an underestimated norm, where min(1, C/‖g‖) only fails to clip), and the
    method never sees a norm. It is not a ``per_example_transform``, which would materialize every per-example
    gradient of every layer.

    Readings taken:

    * C is fixed at 1 (``fixed_clip``; ``--set clip`` is refused): the paper shows that with automatic clipping R
      (here C) only rescales the update, so that for SGD only the product ηR matters, and sets R = 1.
    * γ = 0.01 (``gamma``), the paper's stability constant for AUTO-S. γ must be finite and positive (γ = 0, AUTO-V,
      divides 0 by 0 for a zero gradient).
    * Learning rate: the paper's convention relates automatic clipping with R = 1 and rate η to Abadi's clipping with
      norm R' and rate η/R' when every example is clipped (both then step along Σ_i g_i/‖g_i‖). The default η is
      therefore DP-SGD's default rate times its clip norm on each task (0.1 × 1 here; the tasks' ``method_defaults``
      set ``autoclip`` where their DP-SGD defaults differ); nothing here is tuned.
    * That equivalence needs every example clipped, which DP-SGD at C = 1 on the linear tasks does not do (their
      gradients have norm ≤ √2·|σ(z) − y|). On binary linear tasks the rate is instead η = 1/β of the loss AUTO-S
      descends, β = ¼√(R² + 1) (``tasks/linear.py``, ``autoclip_defaults``; 2√2 on adult): with η = 0.1 adult sat at
      the majority rate 0.7533 at ε = 1, 2 and 8, and at σ = 0 as well (the bias reaches the constant solution
      ≈ −4.5 within the first epoch, ‖θ‖ reaches 9.6 where the minimizer of the normalized loss needs ≈ 30–50).
    """

    name = "autoclip"
    description = "DP-SGD with automatic clipping C·g/(‖g‖ + γ), AUTO-S (Bu et al. 2022), C = 1"
    paper = "https://arxiv.org/abs/2206.07136"
    defaults = {**DPSGD.defaults, "gamma": 0.01}
    search_space = {"lr": {"type": "float", "low": 0.01, "high": 100.0, "log": True}, **MOMENTUM}
    clipping = "automatic"
    fixed_clip = 1.0
