"""Engine-owned correlated noise: banded matrix-factorization (BandMF) noise and binary-tree aggregation (DP-FTRL),
their sensitivities and privacy events.

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
for Differentially Private Model Training", NeurIPS 2024: BSR, for the prefix-sum workload, i.e. their momentum
β = 0; their BSR of momentum SGD's workload has other coefficients). The coefficients are in closed form here,
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

Tree aggregation (:class:`Tree`, :class:`TreeNoise`; Kairouz, McMahan, Song, Thakkar, Thakurta & Xu 2021, "Practical
and Private (Deep) Learning without Sampling or Shuffling", ICML 2021, arXiv:2103.00039, Section 3 and Appendix D for
restarts; the tree mechanism of Dwork et al. 2010 and Chan, Shi & Song 2011). Within an epoch of P steps (the tree
restarts at every epoch, on the same cyclic sampler), each dyadic interval [(i − 1)2^l + 1, i·2^l] of steps is a node
with its own noise ν ~ N(0, σ²C²I), drawn when its last step is released. The noisy prefix sum of steps 1..t is
Σ_{s≤t} g_s + N(t), N(t) the sum of the noises of the dyadic decomposition of [1, t] (one node per set bit of t). The
engine releases the step noise N(t) − N(t − 1): step t creates the node of level j = (trailing zeros of t) and
retires the j nodes of levels 0..j − 1 (the trailing ones of t − 1), so the step's noise is ν_new − Σ ν_retired and
the method's running sum of releases is the tree's prefix sum. One draw per release, as for independent noise.

Privacy of the tree: each example is in one leaf per tree, hence in at most ⌈log2(P + 1)⌉ released nodes, each a
Gaussian mechanism of sensitivity C (replace-special, dp-accounting's relation for this event: one example replaced by
a "zero" one) or 2C (replace-one). dp-accounting's ``SingleEpochTreeAggregationDpEvent(σ, P)`` charges one tree (its
RDP α·⌈log2(P + 1)⌉/(2σ²), with the adaptive analysis of Kairouz et al. Appendix D), composed over the k epochs
(:func:`tree_event`), under ``REPLACE_SPECIAL`` with σ/2 for dpbench's replace-one (``dpbench.privacy.accounting``).
dp-accounting has this event for its RDP accountant only: a tree run is accounted with RDP.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from typing import TYPE_CHECKING

import dp_accounting

# torch is imported where the noise is transformed: dpbench.privacy.accounting imports this module, and the commands
# that only account (``dpbench privacy``) must not load PyTorch (tests/test_cli.py)
if TYPE_CHECKING:
    import torch

#: The correlations the engine implements (``Method.correlation``).
CORRELATIONS = ("banded", "tree")
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


@dataclass(frozen=True)
class Tree:
    """Binary-tree aggregation restarted at every epoch (DP-FTRL)."""

    kind: str = "tree"


def tree() -> Tree:
    """What a method declares (``noise_correlation = tree()``)."""
    return Tree()


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


def depth(steps: int) -> int:
    """⌈log2(P + 1)⌉: the most released nodes of a tree over P steps that hold one leaf (dp-accounting's count)."""
    return math.ceil(math.log2(steps + 1))


def tree_event(noise_multiplier: float, releases: int, releases_per_epoch: int) -> dp_accounting.DpEvent:
    """One ``SingleEpochTreeAggregationDpEvent(σ, P)`` per whole epoch, and one of the steps of a begun epoch."""
    whole, rest = divmod(releases, releases_per_epoch)
    events = ([dp_accounting.SelfComposedDpEvent(
        dp_accounting.SingleEpochTreeAggregationDpEvent(noise_multiplier, releases_per_epoch), whole)] if whole else [])
    events += [dp_accounting.SingleEpochTreeAggregationDpEvent(noise_multiplier, rest)] if rest else []
    if not events:
        return dp_accounting.NoOpDpEvent()
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def check_sampler(bands: int, batches: int) -> None:
    """ValueError unless the partition's P batches are at least b (each example's participations ≥ b apart)."""
    if batches < bands:
        raise ValueError(f"banded noise with b = {bands} bands needs participations at least b steps apart: the "
                         f"cyclic sampler's {batches} batches per epoch are fewer (lower the bands or the batch size)")


def describe(correlation: Banded | Tree, epochs: int, batches: int) -> dict:
    """The record's ``noise_correlation``: what verify recomputes ε from."""
    if isinstance(correlation, Tree):
        return {"kind": "tree", "restarts": "every epoch", "steps_per_tree": batches, "trees": epochs,
                "depth": depth(batches),
                "node_noise": "N(0, (noise_multiplier * clip)^2) per node; step t's noise is N(t) - N(t-1)",
                "event": "SelfComposed(SingleEpochTreeAggregation(sigma, steps_per_tree), trees), REPLACE_SPECIAL; "
                         "sigma/2 under replace-one", "amplification": "none"}
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

    def apply_(self, draw: list[torch.Tensor], position: int = 0) -> list[torch.Tensor]:
        """w_t from the draw z_t, in place (``position``, the release's step in its epoch, is not used)."""
        import torch

        with torch.no_grad():
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


def _popcount(value: int) -> int:
    return bin(value).count("1")


class TreeNoise:
    """The step noise N(t) − N(t − 1) of binary-tree aggregation restarted every ``steps_per_tree`` steps.

    Keeps the noises of the nodes of the current prefix's dyadic decomposition (a stack, highest level first, at
    most ⌈log2(P + 1)⌉). :meth:`apply_` takes the release's draw ν (the new node's noise), the 0-based position of the
    release in its epoch, and overwrites the draw with ν − Σ of the retired nodes' noises."""

    def __init__(self, steps_per_tree: int):
        self.steps_per_tree = steps_per_tree
        self.nodes: list[list[torch.Tensor]] = []
        self.levels: list[int] = []

    def apply_(self, draw: list[torch.Tensor], position: int) -> list[torch.Tensor]:
        import torch

        with torch.no_grad():
            return self._apply(draw, position)

    def _apply(self, draw: list[torch.Tensor], position: int) -> list[torch.Tensor]:
        if position == 0:  # restart: a new tree
            self.nodes, self.levels = [], []
        t = position + 1
        level = (t & -t).bit_length() - 1  # trailing zeros of t
        fresh = [tensor.clone() for tensor in draw]
        for expected in range(level):  # the nodes of levels 0, 1, …, level − 1 are the top of the stack
            if not self.levels or self.levels[-1] != expected:
                raise RuntimeError(f"tree noise out of step with its positions (step {t} of its tree)")
            retired = self.nodes.pop()
            self.levels.pop()
            for tensor, old in zip(draw, retired):
                tensor.sub_(old)
        self.nodes.append(fresh)
        self.levels.append(level)
        if len(self.nodes) != _popcount(t):
            raise RuntimeError(f"tree noise holds {len(self.nodes)} nodes at step {t} of its tree")
        return draw

    def state_dict(self) -> dict:
        return {"steps_per_tree": self.steps_per_tree, "levels": list(self.levels),
                "nodes": [[t.clone() for t in node] for node in self.nodes]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("steps_per_tree") != self.steps_per_tree or len(state.get("nodes", ())) != len(
                state.get("levels", ())):
            raise ValueError(f"the checkpoint's tree-noise state is not of trees of {self.steps_per_tree} steps")
        self.levels = list(state["levels"])
        self.nodes = [[t.clone() for t in node] for node in state["nodes"]]


def noise_state(correlation: Banded | Tree | None, steps_per_epoch: int) -> BandedNoise | TreeNoise | None:
    """The engine's noise transform for ``correlation`` (None: independent noise)."""
    if correlation is None:
        return None
    if isinstance(correlation, Tree):
        return TreeNoise(steps_per_epoch)
    return BandedNoise(correlation.bands)
