"""BandMF: SGD with momentum on gradients released with banded matrix-factorization noise. Choquette-Choo, McMahan,
Rush & Thakurta, "Multi-Epoch Matrix Factorization Mechanisms for Private Machine Learning", ICML 2023
(arXiv:2211.06530); Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta & Xu, "(Amplified) Banded Matrix
Factorization: A unified approach to private training", NeurIPS 2023 (arXiv:2306.08153); the banded square-root
strategy of Kalinin & Lampert, "Banded Square Root Matrix Factorization for Differentially Private Model Training",
NeurIPS 2024."""
from dpbench.methods.dpsgd import DPSGD
from dpbench.privacy.correlated import banded


class BandMF(DPSGD):
    """Momentum SGD on the engine's banded-noise releases.

    Per step t the engine releases, for the t-th batch of its cyclic sampler (one random partition of the data into
    P = ⌊n/B⌋ batches of B examples, the same order every epoch),

        ĝ_t = (Σ_{i ∈ batch t} clip_C(g_i) + w_t) / B,   w = C⁻¹z,  z_t ~ N(0, σ²C²I) i.i.d.,

    with C the b-banded lower-triangular Toeplitz strategy whose coefficients are those of (1 − x)^(−1/2) truncated to
    b bands (``dpbench.privacy.correlated``; w_t = z_t − Σ_{j=1}^{b−1} c_j w_{t−j}); this is the matrix mechanism
    Ĝ = G + C⁻¹Z of Denisov et al. 2022 and Choquette-Choo et al. 2023 with the workload's noise B·C⁻¹Z reached by
    post-processing. This method turns ĝ_t into heavy-ball momentum SGD, the optimizer of the papers' experiments
    (SGD with momentum and a learning-rate cooldown; β = 0.95 is the value we take from them, not re-checked against
    the papers' tables here):

        m_t = β m_{t−1} + ĝ_t,   θ_{t+1} = θ_t − η m_t

    (``torch.optim.SGD``'s momentum with dampening 0, m_0 = ĝ_0; ``dpsgd``'s update, written for many runs at once).
    The momentum and the learning rate are post-processing: they cost no privacy. Privacy: the whole run is one
    Gaussian mechanism of noise multiplier σ/(√k·‖c‖), k = epochs, ‖c‖ = (Σ_{j<b} c_j²)^(1/2), under replace-one
    neighbours (``dpbench.privacy.accounting``, ``sampler: "cyclic"``; no amplification by sampling claimed).

    Readings taken where the papers leave a choice or this setting differs:

    * The strategy is the banded square root of the prefix-sum workload in closed form (Kalinin & Lampert's BSR with
      β = 0: their BSR for momentum SGD is the square root of the momentum workload, other coefficients; the
      sensitivity is computed for the C used, so this choice costs utility, not privacy), not the numerically optimized
      banded strategies of Choquette-Choo et al. 2023 (which optimize C for the momentum workload and the number of
      steps); b = ``bands`` (default 4; b = 1 is DP-SGD with independent noise on the cyclic batches).
    * The papers' workload includes momentum and a learning-rate cooldown; here the momentum is the method's
      (post-processing) and η is constant (no cooldown).
    * Participation: b-min-separation realized as fixed-order epochs ((k, P)-participation, P ≥ b) without
      amplification, not the amplified cyclic-Poisson variant of the banded-MF paper.
    * Defaults (not tuned here): β = 0.95 (``momentum``), η = 0.005 (``lr``), so that
      the long-run step η/(1 − β) is DP-SGD's default 0.1.
    """

    name = "bandmf"
    description = ("SGD with momentum on gradients with banded matrix-factorization noise (square-root strategy, "
                   "b bands; Choquette-Choo et al. 2023, Kalinin & Lampert 2024)")
    paper = "https://arxiv.org/abs/2306.08153"
    defaults = {**DPSGD.defaults, "lr": 0.005, "momentum": 0.95, "bands": 4}
    search_space = {"lr": {"type": "float", "low": 0.0005, "high": 5.0, "log": True}}
    default_sampler = "cyclic"

    @classmethod
    def correlation(cls, hp):
        return banded(hp["bands"])
