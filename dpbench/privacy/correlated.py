"""Engine-owned correlated noise: banded matrix-factorization (BandMF) noise, its sensitivity and its privacy event.

The mechanism (matrix factorization, Denisov, McMahan, Rush, Smith & Thakurta 2022, "Improved Differential Privacy for
SGD via Optimal Private Linear Operators on Adaptive Streams", NeurIPS 2022; Choquette-Choo, McMahan, Rush &
Thakurta 2023, "Multi-Epoch Matrix Factorization Mechanisms for Private Machine Learning", ICML 2023). Write the
T steps' clipped gradient sums as the rows of G (T × d). A strategy matrix C (T × T, lower triangular, invertible)
defines the release

    Ĝ = G + C⁻¹Z,    Z ∈ R^{T×d} with i.i.d. N(0, σ²C_clip²) entries,

i.e. the method receives at step t the row ĝ_t = g_t + w_t with w = C⁻¹Z. Since CĜ = CG + Z, Ĝ is post-processing of
the Gaussian mechanism G ↦ CG + Z, whose L2 sensitivity under the participation schema of the sampler is
Δ = sup ‖C(G − G')‖_F over neighbouring G, G'. With adaptively chosen gradients the same guarantee holds for a
lower-triangular C and Gaussian noise (Denisov et al. 2022, Theorem 2.1: the adaptive stream mechanism is as private
as the non-adaptive one with the same sensitivity).

Banded square-root strategy (:func:`coefficients`). C is lower-triangular Toeplitz with first column (c_0, …, c_{b−1},
0, …): the coefficients of the power series of (1 − x)^(−1/2), c_0 = 1, c_j = c_{j−1}(2j − 1)/(2j) = binom(2j, j)/4^j,
truncated to b bands. Untruncated, C·C = A, the prefix-sum matrix (lower-triangular ones), because
((1 − x)^(−1/2))² = (1 − x)^(−1) = Σ x^j: the square-root factorization of Fichtenberger, Henzinger & Upadhyay 2023
("Constant matters: fine-grained error bound on differentially private continual observation", ICML 2023);
truncated to b bands it is the banded square root of Kalinin & Lampert 2024 ("Banded Square Root Matrix Factorization
for Differentially Private Model Training", NeurIPS 2024, Section 3, BSR). The coefficients are in closed form here,
not optimized (Choquette-Choo et al.'s banded strategies are optimized numerically; this is not that). b = 1 is
C = I: independent noise, DP-SGD's.

Noise (:class:`BandedNoise`): w = C⁻¹z by forward substitution, w_t = z_t − Σ_{j=1}^{b−1} c_j w_{t−j} (c_0 = 1), which
needs the last b − 1 vectors w only; z_t is the run's next draw from its gradient-noise stream (one draw of the
model's size per release, as for independent noise).

Participation (``dpbench.privacy.sampling.CyclicSampler``): the (k, P)-participation of Choquette-Choo et al. 2023
(multi-epoch MF, Section 2: P batches visited in a fixed order every epoch, k epochs), a case of b-min-separated
participation whenever P ≥ b (Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta & Xu 2023, "(Amplified) Banded
Matrix Factorization: A unified approach to private training", NeurIPS 2023, arXiv:2306.08153): one random
partition of the data into P ≥ b batches of B examples (from the run's sampler stream; the n − PB left over never
participate), visited in the same order every epoch, so each example participates in k = epochs steps, P apart. The
partition is treated as public: no amplification is claimed from its secrecy.

Sensitivity (:func:`sensitivity`). The contributions of one example at steps i_1 < … < i_k are rows of G − G' of norm
≤ C_clip (zero-out; under replace-one ≤ 2C_clip, which the accountant's relation adds). Column i of C is supported on
rows i … i + b − 1; participations ≥ b apart touch columns with disjoint supports, so the cross terms of
‖C(G − G')‖_F² = Σ_{i,j} ⟨C[:, i], C[:, j]⟩⟨Δ_i, Δ_j⟩ vanish and Δ² ≤ Σ_m ‖C[:, i_m]‖² C_clip² ≤ k·max_i ‖C[:, i]‖²·C_clip²,
with max_i ‖C[:, i]‖ = ‖(c_0, …, c_{b−1})‖ (a full column; the last b − 1 columns are cut by the end of training,
so the bound is ≥ their norm). This is the banded-sensitivity computation of Choquette-Choo et al. 2023 (banded MF):
with columns ≥ b apart orthogonal, Δ² is the largest sum of diag(CᵀC) over a participation pattern (their Algorithm 3,
VecSens, on diag(CᵀC); ``jax_privacy.matrix_factorization.sensitivity.get_sensitivity_banded``), bounded here by k times
its largest entry. ``tests/test_correlated.py`` checks it by brute force over every pattern of small cases.

Privacy event (:func:`banded_event`): one Gaussian mechanism of noise multiplier σ/(Δ/C_clip) = σ/(√k·‖c‖), under
the run's relation (replace-one: the accountant doubles the sensitivity), no amplification claimed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting
import torch

#: The correlations the engine implements (``Method.correlation``).
CORRELATIONS = ("banded",)
#: The sampler that realizes the participation schema the banded analysis assumes.
SAMPLER = "cyclic"


@dataclass(frozen=True)
class Banded:
    """b-banded lower-triangular Toeplitz strategy C with the square root of the prefix-sum matrix's coefficients."""

    bands: int
    kind: str = "banded"

    def __post_init__(self):
        if isinstance(self.bands, bool) or not isinstance(self.bands, int) or not 1 <= self.bands <= 100_000:
            raise ValueError(f"a banded noise correlation takes a whole number of bands from 1 to 100000, got "
                             f"{self.bands!r}")


def banded(bands: int) -> Banded:
    """What a method declares (``noise_correlation = banded(b)``, or from :meth:`Method.correlation`)."""
    return Banded(bands)


def coefficients(bands: int) -> list[float]:
    """(c_0, …, c_{b−1}): c_0 = 1, c_j = c_{j−1}(2j − 1)/(2j), the power series of (1 − x)^(−1/2) truncated (float64)."""
    values = [1.0]
    for j in range(1, bands):
        values.append(values[-1] * (2 * j - 1) / (2 * j))
    return values


def column_norm(bands: int) -> float:
    """max_i ‖C[:, i]‖ = ‖(c_0, …, c_{b−1})‖ of the b-banded square-root strategy."""
    return math.sqrt(math.fsum(c * c for c in coefficients(bands)))


def sensitivity(bands: int, participations: int) -> float:
    """Δ/C_clip = √k·max_i ‖C[:, i]‖ for k participations at least b apart (zero-out; see the module docstring)."""
    if participations < 0:
        raise ValueError(f"participations must be non-negative, got {participations}")
    return math.sqrt(participations) * column_norm(bands)


def participations(releases: int, releases_per_epoch: int) -> int:
    """k: the epochs begun in ``releases`` releases of the cyclic sampler (each example is in one batch per epoch)."""
    return -(-releases // releases_per_epoch)


def banded_event(noise_multiplier: float, bands: int, releases: int, releases_per_epoch: int) -> dp_accounting.DpEvent:
    """The whole run's event: ``GaussianDpEvent(σ/(√k·‖c‖))`` (one Gaussian mechanism on CG + Z, no amplification)."""
    k = participations(releases, releases_per_epoch)
    if k == 0:
        return dp_accounting.NoOpDpEvent()
    return dp_accounting.GaussianDpEvent(noise_multiplier / sensitivity(bands, k))


def check_sampler(bands: int, batches: int) -> None:
    """ValueError unless the partition's P batches are at least b (each example's participations ≥ b apart)."""
    if batches < bands:
        raise ValueError(f"banded noise with b = {bands} bands needs participations at least b steps apart: the "
                         f"cyclic sampler's {batches} batches per epoch are fewer (lower the bands or the batch size)")


def describe(correlation: Banded, epochs: int, batches: int) -> dict:
    """The record's ``noise_correlation``: what verify recomputes ε from."""
    return {"kind": correlation.kind, "bands": correlation.bands,
            "coefficients": "c_0 = 1, c_j = c_(j-1)(2j-1)/(2j) for j < bands: (1-x)^(-1/2) truncated to b bands "
                            "(square root of the prefix-sum matrix)",
            "coefficient_values": coefficients(correlation.bands),
            "participations": epochs, "min_separation": batches,
            "sensitivity": sensitivity(correlation.bands, epochs),
            "sensitivity_means": "sqrt(participations) * max column norm of C, times the clip norm under zero-out; "
                                 "the accountant's relation doubles it under replace-one",
            "amplification": "none"}


class BandedNoise:
    """w = C⁻¹z by forward substitution, w_t = z_t − Σ_{j=1}^{b−1} c_j w_{t−j}, keeping the last b − 1 w's.

    :meth:`apply_` overwrites the draw z (a list of tensors, one per parameter) with w in place, so that the clipped
    sum is then added into it as into independent noise. The history is the run's state (checkpointed with the
    noise stream's position: :meth:`state_dict`)."""

    def __init__(self, bands: int):
        self.bands = bands
        self.coefficients = coefficients(bands)
        self.history: list[list[torch.Tensor]] = []  # w_{t−1}, w_{t−2}, …, at most b − 1 of them

    @torch.no_grad()
    def apply_(self, draw: list[torch.Tensor]) -> list[torch.Tensor]:
        for j, previous in enumerate(self.history, 1):
            for tensor, old in zip(draw, previous):
                tensor.sub_(old, alpha=self.coefficients[j])
        if self.bands > 1:
            self.history = [[t.clone() for t in draw], *self.history][: self.bands - 1]
        return draw

    def state_dict(self) -> dict:
        return {"bands": self.bands, "history": [[t.clone() for t in w] for w in self.history]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("bands") != self.bands or len(state.get("history", ())) > self.bands - 1:
            raise ValueError(f"the checkpoint's correlated-noise state is not of {self.bands} bands")
        self.history = [[t.clone() for t in w] for w in state["history"]]
