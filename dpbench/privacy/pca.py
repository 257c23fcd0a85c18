"""Differentially private PCA by the Gaussian mechanism on the covariance of unit-normalized rows.

Abadi et al., "Deep Learning with Differential Privacy" (CCS 2016), the DP-PCA of their MNIST model, as their
published code does it (tensorflow/models, ``differential_privacy/dp_sgd/dp_optimizer/dp_pca.py``,
``ComputeDPPrincipalProjection``, called from ``dp_mnist.py`` on all 60,000 training images):

1. divide each row x_i by its L2 norm, so that ‖x_i x_iᵀ‖_F = ‖x_i‖² ≤ 1;
2. A = Σ_i x_i x_iᵀ (no centering), which moves by at most 1 in Frobenius norm when one row is added or removed;
3. add i.i.d. N(0, σ_p²) to each of the d² entries of A (the Gaussian mechanism with sensitivity 1, i.e.
   ``GaussianDpEvent(σ_p)`` under add/remove-one neighbours), then symmetrize, Â = (A + E + (A + E)ᵀ)/2
   (post-processing; the symmetric noise (E + Eᵀ)/2 has variance σ_p² on the diagonal and σ_p²/2 off it);
4. release the eigenvectors of the k largest eigenvalues of Â as the columns of a d × k projection.

Readings: the paper's text samples a random subset of the training examples for the PCA; the code (and this
module) uses every row given, so no amplification by subsampling is claimed. A zero row stays zero (its
"normalized" form contributes nothing), which keeps the sensitivity at most 1. Eigenvectors are returned with the
signs ``torch.linalg.eigh`` gives; any sign is a function of Â, so the release is the same mechanism.
"""
from __future__ import annotations

import dp_accounting
import torch

from dpbench.privacy.accounting import DataRelease


def noisy_covariance(x: torch.Tensor, noise_multiplier: float,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Â = Σ_i x̂_i x̂_iᵀ + (E + Eᵀ)/2 in float64, x̂_i = x_i/‖x_i‖, E_jk ~ N(0, σ_p²) i.i.d. (steps 1–3 above).

    ``generator`` None draws from torch's global generator (which the engine seeds before ``Task.prepare``)."""
    rows = x.to(torch.float64)
    rows = rows / rows.norm(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float64).tiny)
    covariance = rows.T @ rows
    covariance = (covariance + covariance.T) / 2  # BLAS need not return xᵀx exactly symmetric (MKL on AMD does not)
    if noise_multiplier == 0:
        return covariance
    dims = covariance.shape[0]
    noise = noise_multiplier * torch.randn(dims, dims, generator=generator, dtype=torch.float64)
    return covariance + (noise + noise.T) / 2


def dp_pca(x: torch.Tensor, k: int, noise_multiplier: float,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, DataRelease]:
    """The d × k projection onto the top-k eigenvectors of :func:`noisy_covariance` (orthonormal columns, float32),
    and the release to charge: ``GaussianDpEvent(σ_p)`` (``NonPrivateDpEvent`` for σ_p = 0, i.e. ε = ∞)."""
    if not 0 < k <= x.shape[1]:
        raise ValueError(f"the PCA dimension must lie in 1..{x.shape[1]}, got {k}")
    if not noise_multiplier >= 0:
        raise ValueError(f"the PCA noise multiplier must be >= 0, got {noise_multiplier}")
    eigenvalues, eigenvectors = torch.linalg.eigh(noisy_covariance(x, noise_multiplier, generator))
    top = eigenvalues.argsort(descending=True)[:k]
    projection = eigenvectors[:, top].to(torch.float32)
    description = (f"DP-PCA (Abadi et al. 2016): top {k} eigenvectors of Σ x̂x̂ᵀ over the {len(x):,} unit-normalized "
                   f"training rows + symmetrized N(0, σ_p²) noise, σ_p = {noise_multiplier:g} (sensitivity 1)")
    return projection, DataRelease(description, release_event(noise_multiplier))


def release_event(noise_multiplier: float) -> dp_accounting.DpEvent:
    """What :func:`dp_pca` with noise multiplier σ_p releases: ``GaussianDpEvent(σ_p)`` (sensitivity 1),
    ``NonPrivateDpEvent`` for σ_p = 0."""
    if noise_multiplier > 0:
        return dp_accounting.GaussianDpEvent(noise_multiplier)
    return dp_accounting.NonPrivateDpEvent()
