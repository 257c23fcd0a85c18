"""AdaCliP: Pichapati et al., "AdaCliP: Adaptive Clipping for Private SGD", 2019, Algorithm 1, equations (4)–(5).

Not Opacus's ``AdaClipDPOptimizer``, which adapts one clipping norm to a quantile of gradient norms (Andrew et al.).
"""
import math

import torch

from dpbench.method import Method, per_run, stacked
from dpbench.privacy.clipping import CoordinateAffine


class AdaCliP(Method):
    """Coordinate-wise adaptive clipping: clip (g − m)/b to norm 1, add noise, release b ⊙ w̄ + m.

    State per coordinate: a mean estimate m (m⁰ = 0) and a standard-deviation estimate s (s⁰ = √(h1·h2)).
    Each step, with b_i = √s_i · √(Σ_j s_j) (Algorithm 1 line 6, Theorem 1 with γ = 1), Σ over all coordinates
    of all parameters:

    1. the engine releases w̄ = (Σ_k clip_C((g_k − m)/b) + N(0, σ²C²I)) / B over a Poisson batch of expected size B
       (:meth:`per_example_transform` is the (g − m)/b; sensitivity C = 1 by default);
    2. g̃ = b ⊙ w̄ + m and θ ← θ − η·g̃ (lines 11–14);
    3. v = clamp(B·((g̃ − m)² − b²·σ²_mean), h1, h2) with σ_mean = σC/B the noise standard deviation of w̄, so that
       b²σ²_mean is the noise variance of g̃; s² ← β2·s² + (1 − β2)·v (equation 5); m ← β1·m + (1 − β1)·g̃
       (equation 4). b is then recomputed for the next step.

    Privacy: the transform depends only on m and s, which are computed from earlier releases (post-processing),
    so every release is a subsampled Gaussian mechanism on a sum of per-example vectors of norm ≤ C, charged
    by the engine's accountant. The paper adds noise to each example's transformed gradient and calls it
    "essentially equivalent" to noise on the mean; here the noise is added once, to the sum.

    Readings taken where the paper is ambiguous:

    * s is a standard deviation: Theorem 1 defines s_i = √E(g_i − Eg_i)², and equation (5) updates (s_i)².
      s⁰ = √(h1·h2) is used as written, as the initial standard deviation (so s⁰² = h1·h2, below h1 when h2 < 1).
      h1 and h2 bound each variance sample v, not s. (A public implementation treats s as a variance, i.e.
      b_i = √var_i·√Σ var_j; that does not minimize the noise in Theorem 1 and is not what equation (5) says.)
    * The m in (g̃ − m)² of equation (5) is the mean used in this step's transform (m^t, before equation (4)
      updates it): the derivation above equation (5) needs m independent of this step's noise, and then
      g̃ − m = b ⊙ w̄ exactly. Using the updated m multiplies (g̃ − m)² by β1² = 0.98.
    * Batch size: the paper derives equation (5) for one example per step. With a batch, (g̃ − m) − noise is a
      batch mean, whose variance is the per-example variance divided by B, but b must scale the per-example
      gradients (the clipping is per example, equation 2). The noise-corrected square is therefore multiplied by
      B, which is the paper's rule for B = 1. Without clipping, a Poisson batch gives B·E[((g̃ − m) − noise)²] =
      (1 − q)·E_k(g_k − m)² + B·(ḡ − m)², so the estimate carries an extra (B − q)·(ḡ − m)², the squared error of
      the mean estimate, which is small once m has caught up with the gradient mean (and misses q·Var(g)).
    * The clip C (hyperparameter ``clip``, 1 by default and in Algorithm 1) plays the role of 1/√γ in Theorem 1:
      clipping (g − m)/b at C is clipping (g − m)/(Cb) at 1.
    * Equation (5) clamps every sample v before averaging, as written.

    Consequences of the equations as written, measured on the Figure 2 regression (``adaclip_regression``,
    ``benchmarks/adaclip_figure2.py``), where the paper's flat error curve is not reproduced:

    * The clamp at h1 keeps only the positive part of the noise-corrected square, so a coordinate that carries
      only noise still gets E[v_i] ≈ 0.48·σ²C²·b_i²/B (0.48 = E[(N² − 1)₊]). With b_i² = s_i·Σ_j s_j, the d − 1
      noise-only coordinates of the regression settle at a small s only while (d − 1)·0.48·σ²C²/B < 1 (d ≲ 200
      at σ = 0.1, B = 1); beyond that their s grows until h2 caps it.
    * s⁰ = √(h1·h2) is tiny for the paper's h1 = 1e-12, so b starts tiny and every example is clipped. While
      every example is clipped, v_i ≈ b_i²·ŵ_i² with ‖ŵ‖ = 1, which does not grow the overall scale of s (exactly
      so when all s_i are equal): b grows only slowly and θ moves slowly (on the regression with d = 10, for the
      whole run).
    * With Poisson batches the number of examples per step varies; while clipping is active, s then shrinks on
      average in log scale (β2 = 0.9 forgets within ~10 steps) and collapses. The paper samples exactly B users.

    Cost: (g − m)/b is coordinate-wise affine (:class:`~dpbench.privacy.clipping.CoordinateAffine`), so for a Linear
    layer with one input a per example, ‖(g aᵀ − M)/S‖² = (g²)ᵀR(a²) − 2gᵀ(M∘R)a + Σ M²R with R = 1/S² needs no
    per-example gradient (``dpbench/privacy/ghost.py``; also LayerNorm/GroupNorm, whose per-example gradients are small).
    A convolution, an embedding or a Linear layer on a sequence sums T outer products per example, and the
    weighted norm Σ_jk R_jk (Σ_t g_tj a_tk)² then costs T²·p·q without them, more than materializing the
    per-example gradients (T·p·q): models with such layers run on the reference (vmap) path, with a warning.

    ``h2`` is the one hyperparameter the paper tunes ("h1 and h2 are small constants", "We only tune h2"; no value
    is given); β1 = 0.99, β2 = 0.9, h1 = 1e-12 are its fixed values. h2 caps every variance sample, so s_i ≤ √h2.
    Default h2 = 1/d, d the number of trained coordinates: with every coordinate at the cap, b_i = √(d·h2) = 1 and
    the noise of g̃, σC·b/B, is DP-SGD's at the same clip C; below the cap Theorem 1's b only lowers it
    ((Σ_i s_i)² ≤ d²·h2 = d). A larger cap lets AdaCliP add up to d·h2 times DP-SGD's noise variance (h2 = 1: 105
    times on adult). ``--set h2=…`` sets it absolutely (``adaclip_regression`` sets 1e-6).

    Majority-class collapse on adult (a property of the published algorithm, not a transcription defect): measured with
    the independent NumPy transcription (``benchmarks/root_causes.py``, which reproduces dpbench's 0.7533), and at σ = 0
    as well, so the noise estimate is not the cause. Theorem 1's b makes E‖(g − m)/b‖² ≈ 1 (the transcription's Σ_i
    v_i/b_i² stays at 0.88–1.12), so the examples with the largest gradients are clipped; on adult these are the
    misclassified minority positives (at the end of 12 of 13 collapsed runs 100% of positives are clipped, 0.4–30% of
    negatives). The clipped mean then no longer follows the gradient in the bias: at the collapsed model the noise-free
    expected g̃ of the bias is −0.002 to +0.021 (≈ 0 or the wrong sign) where the true gradient is −0.072 to −0.231, so
    nothing moves the model back; m, an average of g̃, inherits that bias. Only when the clamp at h1 keeps every s at
    the cap √h2 (the positive part of the noise correction adds κ = E[(N² − 1)₊]·d·σ²C²/B ≈ 0.48·d·σ²C²/B to Σ_i
    v_i/b_i², κ > 1 for σ > 2.25 on adult) and √(d·h2) exceeds the gradients' scale is nothing clipped: that is why h2 =
    1 escaped the collapse at ε ≤ 0.5 (b ≈ 5.6, none clipped, DP-SGD with ~30 times the noise variance) and h2 = 1/d
    does not.
    """

    name = "adaclip"
    description = "AdaCliP (Pichapati et al. 2019): per-coordinate adaptive clipping (g − m)/b, noise, rescale, SGD"
    paper = "https://arxiv.org/abs/1908.07643"
    defaults = {"lr": 0.1, "beta1": 0.99, "beta2": 0.9, "h1": 1e-12, "h2": None}
    # h2: the paper's tuned hyperparameter (1/d for d from 1 to 10⁶)
    # h1 up to 1e-6, the lowest h2, so that every draw has h1 ≤ h2
    search_space = {"lr": {"type": "float", "low": 0.01, "high": 100.0, "log": True},
                    "h1": {"type": "float", "low": 1e-12, "high": 1e-06, "log": True},
                    "h2": {"type": "float", "low": 1e-06, "high": 1.0, "log": True},
                    "clip": {"type": "float", "low": 0.1, "high": 10.0, "log": True}}

    def setup(self):
        hp = self.hp
        for key in ("beta1", "beta2"):
            if not 0 <= hp[key] < 1:
                raise ValueError(f"{key} must lie in [0, 1), got {hp[key]}")
        try:  # a None default arrives from ``--set`` as a string
            self.h2 = 1 / sum(p.numel() for p in self.params) if hp["h2"] is None else float(hp["h2"])
        except ValueError:
            raise ValueError(f"h2 must be a number, got {hp['h2']!r}") from None
        if not 0 < hp["h1"] <= self.h2:
            raise ValueError(f"need 0 < h1 <= h2, got h1={hp['h1']}, h2={self.h2}")
        self.mean = [torch.zeros_like(p, requires_grad=False) for p in self.params]
        self.std = [torch.full_like(p, math.sqrt(hp["h1"] * self.h2), requires_grad=False) for p in self.params]
        self.scale = self._scale()

    def _scale(self) -> list[torch.Tensor]:
        """b_i = √s_i · √(Σ_j s_j) over every coordinate of every parameter (Algorithm 1, line 6)."""
        return [b[0] for b in self._scales([s.unsqueeze(0) for s in self.std])]

    @staticmethod
    def _scales(stds: list[torch.Tensor]) -> list[torch.Tensor]:
        """:meth:`_scale` of every run, the runs' s stacked (S, *shape) per parameter."""
        total = sum(s.flatten(1).sum(1) for s in stds).sqrt()
        return [s.sqrt() * total.view(-1, *[1] * (s.dim() - 1)) for s in stds]

    @property
    def per_example_transform(self) -> CoordinateAffine:
        """(g − m)/b (Algorithm 1, line 7), in the form the fast clipper computes without per-example gradients
        on linear layers (``dpbench/privacy/ghost.py``); convolutions and embeddings fall back to materializing them."""
        return CoordinateAffine(self.mean, self.scale)

    @classmethod
    @torch.no_grad()
    def update_together(cls, runs, params, released):
        lr, beta1, beta2, h1 = ([run.hp[key] for run in runs] for key in ("lr", "beta1", "beta2", "h1"))
        rest1, rest2 = [1 - b for b in beta1], [1 - b for b in beta2]
        h2 = [run.h2 for run in runs]
        batch = [run.mechanism.expected_batch_size for run in runs]
        noise_var = [run.mechanism.mean_noise_std ** 2 for run in runs]
        means, stds, scales = ([stacked([getattr(run, name)[j] for run in runs]) for j in range(len(params))]
                               for name in ("mean", "std", "scale"))
        for param, w_bar, m, b, s in zip(params, released, means, scales, stds):
            g_tilde = b * w_bar + m
            param.sub_(per_run(lr, m) * g_tilde)
            centred = g_tilde - m
            v = torch.clamp(per_run(batch, m) * (centred**2 - b**2 * per_run(noise_var, m)), min=per_run(h1, m),
                            max=per_run(h2, m))
            s.copy_(torch.sqrt(per_run(beta2, m) * s**2 + per_run(rest2, m) * v))
            m.mul_(per_run(beta1, m)).add_(per_run(rest1, m) * g_tilde)
        for b, new in zip(scales, cls._scales(stds)):
            b.copy_(new)
