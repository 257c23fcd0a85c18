"""Independent NumPy transcriptions of AdaCliP and ADADP on a linear model, written from the papers, not from dpbench.

Nothing here imports dpbench or torch: the transcriptions read the same data arrays (rows x, labels y) and, for the
step-for-step checks in ``tests/test_transcriptions.py``, the same batches and noise draws; for the measurements of
``benchmarks/root_causes.py`` they draw their own Poisson batches and Gaussian noise with NumPy.

Model: logistic regression (2 classes) or softmax regression (more) with a bias, parameters one matrix
W = [weights | bias] of shape (K, d + 1) (K = 1 for 2 classes), all zero at the start. Per-example gradient
(σ(z) − y)·(x, 1) (logistic) or (p − e_y) ⊗ (x, 1) (softmax). A release is the Gaussian mechanism on a clipped sum
divided by the expected batch size B = q·n: (Σ_k clip_C(t_k) + σC·z) / B with z ~ N(0, I).

* :func:`adaclip`: Pichapati et al. 2019, Algorithm 1 with equations (4) and (5), with b_i = √s_i·√Σ_j s_j
  (line 6), w_k = (g_k − m)/b clipped to norm C, g̃ = b ⊙ w̄ + m (lines 11–13), θ ← θ − η g̃ (line 14),
  m ← β1 m + (1 − β1) g̃ (4) and (s_i)² ← β2 (s_i)² + (1 − β2) min(max(v_i, h1), h2) (5). Equation (5) is derived for
  one example per step; with a batch ``reading`` chooses v (see :data:`ADACLIP_READINGS`).
* :func:`adadp`: Koskela & Honkela 2020, Algorithm 2 (``variant="paper"``: next iterate θ_{ℓ+1} = θ − ηG1, no
  rejection, η ← min(max(tol/err, α_min), α_max)·η) and the published code (``variant="code"``,
  github.com/DPBayes/ADADP ``adadp.py``: next iterate θ̂ = θ − (η/2)G1 − (η/2)G2, restored to θ when err > tol,
  η ← min(max(√(tol/err), α_min), α_max)·η, updated before the test), with err = ‖(θ1 − θ̂)/max(1, |θ1|)‖₂ (eq. 6).
* :func:`quantile_clip`: Andrew et al. 2021, Algorithm 1 with one example per "client": g̃ = (Σ_k clip_{C_t}(g_k) +
  σC_t·z)/B, θ ← θ − η g̃, the centred count S = Σ_k (1[‖g_k‖ ≤ C_t] − ½) + σ_b·z_b, b̃ = S/B + ½,
  C_{t+1} = C_t·exp(−η_C (b̃ − γ)).
* :func:`dpadam`: Tang & Lécuyer 2023, Section 2 (DP-Adam, their biased baseline): Adam (Kingma & Ba 2014,
  Algorithm 1) on g̃ = (Σ_k clip_C(g_k) + σC·z)/B: m ← β1 m + (1 − β1) g̃, v ← β2 v + (1 − β2) g̃²,
  θ ← θ − η (m/(1 − β1^t)) / (√(v/(1 − β2^t)) + γ).
* :func:`autoclip`: Bu et al. 2022, AUTO-S: g̃ = (Σ_k C·g_k/(‖g_k‖ + γ) + σC·z)/B, θ ← θ − η g̃.
* :func:`bandmf`: banded matrix-factorization noise (Choquette-Choo et al. 2023; Kalinin & Lampert 2024's banded square
  root): the strategy C, b-banded lower-triangular Toeplitz with c_j = binom(2j, j)/4^j, built as a T × T matrix; the
  noise of all T releases at once, W = C⁻¹Z (``numpy.linalg.solve``); ĝ_t = (Σ_k clip_C(g_k) + σC·W_t)/B,
  m ← βm + ĝ, θ ← θ − ηm.
* :func:`dpftrl`: Kairouz et al. 2021, Algorithm 1 with momentum: the noisy prefix sum of a tree restarted every
  epoch, Ŝ_t = (Σ_{s≤t} clip_C sums + σC·(N(t) + the last prefix noise of every earlier tree))/B, with N(t) the sum of
  the noises of the dyadic intervals of [1, t] (the interval ending at step e has the noise z_e drawn at step e);
  m ← βm + Ŝ_t, θ = θ_0 − ηm.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

#: How v of equation (5) is formed with a batch of expected size B, the noise of w̄ having standard deviation σC/B:
#: "per-example": v = B·((g̃ − m)² − b²(σC/B)²), an estimate of the per-example variance (the scale b must match,
#: because the clipping is per example); "batch-mean": v = (g̃ − m)² − b²(σC/B)², equation (5) applied to the
#: batch mean g̃ as Algorithm 1 line 13 defines it (an estimate of the variance of a mean of B gradients).
ADACLIP_READINGS = ("per-example", "batch-mean")
ADADP_VARIANTS = ("paper", "code")


class LinearModel:
    """Rows x (n, d) with labels y (n,) in 0..K−1; gradients of the logistic / softmax loss of W (K', d + 1)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, classes: int | None = None):
        self.x = np.asarray(x, dtype=np.float64)
        self.y = np.asarray(y, dtype=np.int64)
        self.classes = int(classes if classes is not None else self.y.max() + 1)
        self.outputs = 1 if self.classes == 2 else self.classes

    def zeros(self) -> np.ndarray:
        return np.zeros((self.outputs, self.x.shape[1] + 1))

    def rows(self, index: np.ndarray) -> np.ndarray:
        x = self.x[index]
        return np.hstack([x, np.ones((len(x), 1))])

    def per_example_gradients(self, w: np.ndarray, index: np.ndarray) -> np.ndarray:
        """(len(index), K', d + 1): the gradient of each example's loss."""
        rows, y = self.rows(index), self.y[index]
        z = rows @ w.T
        if self.classes == 2:
            residual = 1 / (1 + np.exp(-z[:, 0])) - y
            return residual[:, None, None] * rows[:, None, :]
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        return p[:, :, None] * rows[:, None, :]

    def accuracy(self, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        rows = np.hstack([np.asarray(x, dtype=np.float64), np.ones((len(x), 1))])
        z = rows @ w.T
        predicted = (z[:, 0] > 0).astype(np.int64) if self.classes == 2 else z.argmax(axis=1)
        return float((predicted == np.asarray(y)).mean())


def clipped_sum(vectors: np.ndarray, clip: float) -> tuple[np.ndarray, int]:
    """Σ_k v_k·min(1, C/‖v_k‖) over the first axis, and how many of the v_k were scaled down."""
    flat = vectors.reshape(len(vectors), -1)
    norms = np.sqrt((flat**2).sum(axis=1))
    factors = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    return (flat * factors[:, None]).sum(axis=0).reshape(vectors.shape[1:]), int((norms > clip).sum())


def poisson_batches(n: int, rate: float, count: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """``count`` batches, each holding every index independently with probability ``rate``."""
    for _ in range(count):
        yield np.flatnonzero(rng.random(n) < rate)


def gaussian(shape: tuple[int, ...], rng: np.random.Generator) -> Iterator[np.ndarray]:
    while True:
        yield rng.standard_normal(shape)


@dataclass
class AdaCliPState:
    w: np.ndarray  # θ
    m: np.ndarray  # mean estimate
    s: np.ndarray  # standard-deviation estimate
    step: int = 0
    clipped: int = 0  # examples clipped in the last step
    examples: int = 0  # examples in the last step
    g_tilde: np.ndarray | None = None
    v: np.ndarray | None = None

    @property
    def b(self) -> np.ndarray:
        return np.sqrt(self.s) * np.sqrt(self.s.sum())


def adaclip(model: LinearModel, batches: Iterable[np.ndarray], noises: Iterable[np.ndarray], *, lr: float,
            sigma: float, expected_batch_size: float, clip: float = 1.0, beta1: float = 0.99, beta2: float = 0.9,
            h1: float = 1e-12, h2: float = 1.0, reading: str = "per-example",
            observe: Callable[[AdaCliPState], None] | None = None) -> AdaCliPState:
    """AdaCliP (Algorithm 1, equations 4–5) over the given batches (index arrays) and standard normal noises."""
    if reading not in ADACLIP_READINGS:
        raise ValueError(f"reading must be one of {ADACLIP_READINGS}")
    w = model.zeros()
    state = AdaCliPState(w=w, m=np.zeros_like(w), s=np.full_like(w, np.sqrt(h1 * h2)))  # line 2
    big_b = expected_batch_size
    noise_var = (sigma * clip / big_b) ** 2  # variance of each coordinate of the noise of w̄
    for index, z in zip(batches, noises):
        b = state.b  # line 6
        transformed = (model.per_example_gradients(state.w, index) - state.m) / b  # (g − m)/b, Section 4.1
        total, state.clipped = clipped_sum(transformed, clip)
        w_bar = (total + sigma * clip * z) / big_b
        g_tilde = b * w_bar + state.m  # lines 11–13
        state.w = state.w - lr * g_tilde  # line 14
        centred_sq = (g_tilde - state.m) ** 2 - b**2 * noise_var  # (g̃ − m^t)² − b²σ², m^t before (4)
        v = big_b * centred_sq if reading == "per-example" else centred_sq
        v = np.minimum(np.maximum(v, h1), h2)
        state.s = np.sqrt(beta2 * state.s**2 + (1 - beta2) * v)  # (5)
        state.m = beta1 * state.m + (1 - beta1) * g_tilde  # (4)
        state.g_tilde, state.v, state.examples = g_tilde, v, len(index)
        state.step += 1
        if observe is not None:
            observe(state)
    return state


@dataclass
class AdaDPState:
    w: np.ndarray
    lr: float
    step: int = 0
    err: float = float("nan")
    accepted: int = 0
    rejected: int = 0
    noise_err: float = float("nan")  # the part of err due to the two releases' noise alone


def adadp(model: LinearModel, batches: Iterable[np.ndarray], noises: Iterable[np.ndarray], *, lr: float,
          sigma: float, expected_batch_size: float, clip: float = 1.0, tol: float = 1.0, alpha_min: float = 0.9,
          alpha_max: float = 1.1, variant: str = "code",
          observe: Callable[[AdaDPState], None] | None = None) -> AdaDPState:
    """ADADP (Algorithm 2, or the published code's variant): each step takes two batches and two noises."""
    if variant not in ADADP_VARIANTS:
        raise ValueError(f"variant must be one of {ADADP_VARIANTS}")
    state = AdaDPState(w=model.zeros(), lr=lr)
    batches, noises = iter(batches), iter(noises)

    def release(w: np.ndarray, index: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        total, _ = clipped_sum(model.per_example_gradients(w, index), clip)
        return (total + sigma * clip * z) / expected_batch_size, sigma * clip * z / expected_batch_size

    for index1, z1 in zip(batches, noises):
        index2, z2 = next(batches), next(noises)
        eta, theta = state.lr, state.w
        g1, n1 = release(theta, index1, z1)
        theta_1 = theta - eta * g1  # one Euler step
        theta_half = theta - eta / 2 * g1
        g2, n2 = release(theta_half, index2, z2)
        theta_hat = theta_half - eta / 2 * g2
        denominator = np.maximum(1.0, np.abs(theta_1))
        state.err = float(np.sqrt((((theta_1 - theta_hat) / denominator) ** 2).sum()))  # ‖err(θ1, θ̂)‖₂, eq. 6
        state.noise_err = float(np.sqrt(((eta / 2 * (n1 - n2) / denominator) ** 2).sum()))
        ratio = tol / state.err if state.err > 0 else np.inf
        factor = ratio if variant == "paper" else np.sqrt(ratio)
        state.lr = min(max(factor, alpha_min), alpha_max) * eta
        if variant == "paper":
            state.w = theta_1
        elif state.err > tol:
            state.w, state.rejected = theta, state.rejected + 1
        else:
            state.w, state.accepted = theta_hat, state.accepted + 1
        state.step += 1
        if observe is not None:
            observe(state)
    return state


@dataclass
class QuantileClipState:
    w: np.ndarray
    clip: float  # C_t, the clip norm of the next release
    step: int = 0
    count: float = float("nan")  # S of the last step (noisy, centred)
    unclipped: float = float("nan")  # b̃ of the last step
    clips: list[float] | None = None  # the clip norm of every release so far


def quantile_clip(model: LinearModel, batches: Iterable[np.ndarray], noises: Iterable[np.ndarray],
                  count_noises: Iterable[float], *, lr: float, sigma: float, expected_batch_size: float, clip: float,
                  count_std: float, target_quantile: float = 0.5, clip_lr: float = 0.2,
                  observe: Callable[[QuantileClipState], None] | None = None) -> QuantileClipState:
    """DP-SGD with Andrew et al.'s geometric clip update (Algorithm 1), from the initial clip ``clip``: each step takes
    a batch, a standard normal draw z for the gradient and one z_b for the count."""
    state = QuantileClipState(w=model.zeros(), clip=clip, clips=[])
    big_b = expected_batch_size
    for index, z, z_b in zip(batches, noises, count_noises):
        c_t = state.clip
        state.clips.append(c_t)
        gradients = model.per_example_gradients(state.w, index)
        total, _ = clipped_sum(gradients, c_t)
        norms = np.sqrt((gradients.reshape(len(index), -1) ** 2).sum(axis=1))
        state.w = state.w - lr * (total + sigma * c_t * z) / big_b
        # the release on dpbench's grid of 2⁻¹⁰ (rounding is post-processing; dpbench/run/training.py says why)
        state.count = round(float((norms <= c_t).sum() - len(index) / 2 + count_std * z_b) / 2.0**-10) * 2.0**-10
        state.unclipped = state.count / big_b + 0.5
        state.clip = c_t * np.exp(-clip_lr * (state.unclipped - target_quantile))
        state.step += 1
        if observe is not None:
            observe(state)
    return state


@dataclass
class AdamState:
    w: np.ndarray
    m: np.ndarray
    v: np.ndarray
    step: int = 0


def dpadam(model: LinearModel, batches: Iterable[np.ndarray], noises: Iterable[np.ndarray], *, lr: float,
           sigma: float, expected_batch_size: float, clip: float, beta1: float = 0.9, beta2: float = 0.999,
           gamma: float = 1e-8, observe: Callable[[AdamState], None] | None = None) -> AdamState:
    """DP-Adam: each step takes a batch and a standard normal draw z for its release."""
    w = model.zeros()
    state = AdamState(w=w, m=np.zeros_like(w), v=np.zeros_like(w))
    for index, z in zip(batches, noises):
        total, _ = clipped_sum(model.per_example_gradients(state.w, index), clip)
        released = (total + sigma * clip * z) / expected_batch_size
        state.step += 1
        state.m = beta1 * state.m + (1 - beta1) * released
        state.v = beta2 * state.v + (1 - beta2) * released**2
        m_hat, v_hat = state.m / (1 - beta1**state.step), state.v / (1 - beta2**state.step)
        state.w = state.w - lr * m_hat / (np.sqrt(v_hat) + gamma)
        if observe is not None:
            observe(state)
    return state


def autoclip(model: LinearModel, batches: Iterable[np.ndarray], noises: Iterable[np.ndarray], *, lr: float,
             sigma: float, expected_batch_size: float, gamma: float = 0.01, clip: float = 1.0,
             observe: Callable[[np.ndarray, int], None] | None = None) -> np.ndarray:
    """DP-SGD with AUTO-S normalization: every per-example gradient scaled by C/(‖g_k‖ + γ); returns θ."""
    w = model.zeros()
    for step, (index, z) in enumerate(zip(batches, noises), 1):
        gradients = model.per_example_gradients(w, index)
        norms = np.sqrt((gradients.reshape(len(index), -1) ** 2).sum(axis=1))
        total = (gradients * (clip / (norms + gamma))[:, None, None]).sum(axis=0)
        w = w - lr * (total + sigma * clip * z) / expected_batch_size
        if observe is not None:
            observe(w, step)
    return w


def banded_strategy(steps: int, bands: int) -> np.ndarray:
    """The T × T lower-triangular Toeplitz matrix with c_j = binom(2j, j)/4^j on its j-th subdiagonal, j < b."""
    from math import comb

    matrix = np.zeros((steps, steps))
    for j in range(min(bands, steps)):
        matrix += np.eye(steps, k=-j) * (comb(2 * j, j) / 4**j)
    return matrix


def bandmf(model: LinearModel, batches: list[np.ndarray], noises: list[np.ndarray], *, lr: float, momentum: float,
           sigma: float, expected_batch_size: float, clip: float, bands: int,
           observe: Callable[[np.ndarray, int], None] | None = None) -> np.ndarray:
    """Momentum SGD on releases with banded matrix-factorization noise, given the T standard normal draws z_t (each
    shaped like W): the noise of release t is σC·(C⁻¹Z)_t, computed for all T at once; returns θ."""
    steps = len(batches)
    z = np.stack([np.asarray(n, dtype=np.float64).reshape(-1) for n in noises[:steps]])
    correlated = np.linalg.solve(banded_strategy(steps, bands), z)  # W = C⁻¹Z, row t the noise of release t
    w, velocity = model.zeros(), None
    for step, index in enumerate(batches):
        total, _ = clipped_sum(model.per_example_gradients(w, index), clip)
        release = (total + sigma * clip * correlated[step].reshape(w.shape)) / expected_batch_size
        velocity = release if velocity is None else momentum * velocity + release
        w = w - lr * velocity
        if observe is not None:
            observe(w, step + 1)
    return w


def dyadic_ends(t: int) -> list[int]:
    """The last steps of the dyadic intervals that make up [1, t]: one per set bit of t, highest first."""
    ends, start = [], 0
    for bit in reversed(range(t.bit_length())):
        if t >> bit & 1:
            start += 1 << bit
            ends.append(start)
    return ends


def dpftrl(model: LinearModel, batches: list[np.ndarray], noises: list[np.ndarray], *, lr: float, momentum: float,
           sigma: float, expected_batch_size: float, clip: float, steps_per_tree: int,
           observe: Callable[[np.ndarray, int], None] | None = None) -> np.ndarray:
    """DP-FTRL with momentum on a tree restarted every ``steps_per_tree`` steps; ``noises[t]`` is the standard normal
    draw of the node that ends at step t (0-based, shaped like W); returns θ."""
    w0 = model.zeros()
    w, velocity, gradients, earlier_trees = w0.copy(), np.zeros_like(w0), np.zeros_like(w0), np.zeros_like(w0)
    for step, index in enumerate(batches):
        tree_start, t = step - step % steps_per_tree, step % steps_per_tree + 1
        total, _ = clipped_sum(model.per_example_gradients(w, index), clip)
        gradients = gradients + total
        tree_noise = sum(np.asarray(noises[tree_start + end - 1]).reshape(w0.shape) for end in dyadic_ends(t))
        prefix = (gradients + sigma * clip * (earlier_trees + tree_noise)) / expected_batch_size
        velocity = momentum * velocity + prefix
        w = w0 - lr * velocity
        if t == steps_per_tree:
            earlier_trees = earlier_trees + tree_noise
        if observe is not None:
            observe(w, step + 1)
    return w
