"""AdaCliP's per-example transform (g − m)/b in closed form, with proven rounding bounds (issue 31, item 8).

The fast clipper (:mod:`dpbench.privacy.ghost`) and the batched seeds (:mod:`dpbench.run.multiseed`) compute the
transformed norms ‖(G_i − M)/S‖ and the clipped sum Σ_i c_i (G_i − M)/S without materializing G_i = g_i a_iᵀ. Both
expansions cancel catastrophically where M ≈ G_i and S is small (AdaCliP's own dynamics drive it there), so each is
evaluated in float64 with the standard bound of its rounding error, and an example (or a run) whose bound is not
small is computed from its materialized gradient instead.
"""
from __future__ import annotations

import torch


def affine_sq_norm_bound(a: torch.Tensor, g: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """An upper bound, in float32, of ‖(g_i a_iᵀ − M) / S‖² for each example i, without materializing g_i a_iᵀ.

    The expansion (g_i²)ᵀR(a_i²) − 2 g_iᵀ(M∘R)a_i + Σ M²R (R = 1/S², coordinate-wise) cancels catastrophically when
    ‖M/S‖ ≫ ‖(G_i − M)/S‖: in float32 an example could be clipped to 12·C (tests/test_ghost.py). Here it is
    evaluated in float64 with the standard bound on its rounding error, γ_k·(t1 + 2·Σ|g||M|R|a| + t3) with
    γ_k = k·u/(1 − k·u), u = 2⁻⁵³ and k ≥ the number of terms in any sum; the bound is added to the value. Where
    it is not below 0.1% of the value, that example's norm is computed from its materialized (g_i a_iᵀ − M)/S
    (float64, in chunks). The float32 result is rounded up. So the clip factor C/max(‖·‖, C) never lets an
    example contribute more than C, up to the rounding of the clipped sum (:func:`affine_clipped_sum`).

    Shapes: a (B, p), g (B, q), M and S (q, p); or batched, one transform per run (:mod:`dpbench.run.multiseed`):
    a (R, B, p), g (R, B, q), M and S (R, q, p), giving (R, B)."""
    a64, g64, shift64 = a.double(), g.double(), shift.double()
    inverse_sq = scale.double().pow(-2)
    t1 = (((a64 * a64) @ inverse_sq.transpose(-2, -1)) * (g64 * g64)).sum(-1)  # sums over p by matrix products
    t2 = ((a64 @ (shift64 * inverse_sq).transpose(-2, -1)) * g64).sum(-1)
    t3 = (shift64 * shift64 * inverse_sq).sum((-2, -1)).unsqueeze(-1)
    t2_abs = ((a.abs() @ (shift.abs() * inverse_sq.float()).transpose(-2, -1)) * g.abs()).sum(-1).double() * (1 + 1e-4)
    transform_size = shift.shape[-2] * shift.shape[-1]  # one run's M
    terms = transform_size + a.shape[-1] + g.shape[-1] + 4
    gamma = terms * 2.0**-53 / (1 - terms * 2.0**-53)
    sq = (t1 - 2 * t2 + t3).clamp_min(0)
    error = gamma * (t1 + 2 * t2_abs + t3)
    examples = sq.shape[-1]  # per run
    flat_sq, flat_error = sq.view(-1), error.view(-1)
    flat_a, flat_g = a64.reshape(-1, a.shape[-1]), g64.reshape(-1, g.shape[-1])
    unresolved = (flat_error > 1e-3 * flat_sq).nonzero().flatten()
    for chunk in unresolved.split(max(1, 2**24 // transform_size)):  # at most ~128 MiB of float64 at a time
        run = chunk // examples if shift.dim() == 3 else slice(None)
        per_example = (flat_g[chunk, :, None] * flat_a[chunk, None, :] - shift64[run]) * inverse_sq[run].sqrt()
        flat_sq[chunk] = per_example.square().flatten(1).sum(1)
        flat_error[chunk] = gamma * flat_sq[chunk]
    return ((sq + error) * (1 + 2.0**-22)).float()


#: Where the proven rounding bound of a closed-form clipped sum exceeds this fraction of the largest example's
#: contribution to it (≤ C/B), the sum is computed from materialized per-example gradients instead.
SUM_TOLERANCE = 1e-7


def affine_clipped_sum(a: torch.Tensor, g: torch.Tensor, factors: torch.Tensor, shift: torch.Tensor,
                       scale: torch.Tensor, sq_norms: torch.Tensor) -> torch.Tensor:
    """Σ_i c_i (g_i a_iᵀ − M) / S = (Σ_i c_i g_i a_iᵀ − (Σ_i c_i)·M) / S, with a rounding error below
    :data:`SUM_TOLERANCE` times max_i c_i·n_i (n_i = √sq_norms_i, the example's transformed norm in these
    parameters, so c_i·n_i ≤ C/B).

    The closed form cancels like the norm's expansion (:func:`affine_sq_norm_bound`): in float32 its error,
    ~2⁻²⁴·(Σ c_i|G_i| + Σ c_i|M|)/S per coordinate, let one example move the sum by 2158·C when M ≈ G_i and S is
    small (tests/test_ghost.py). It is evaluated in float64 (c_i·g_i and g_i a_iᵀ of float32 numbers are exact there)
    with the standard bound of its error, γ_k·(Σ_i c_i|g_i||a_i|ᵀ + (Σ_i c_i)|M|)/S, k = B + 4 terms (the bound's
    norm computed in float32, a sum of non-negative terms, and rounded up by its own relative error, below
    2·(B + q·p + 8)·2⁻²⁴). Where the bound's norm is not below the tolerance, the sum is taken over the
    materialized c_i (G_i − M)/S (float64, in chunks; G_i − M is exact where M is within a factor 2 of G_i, and
    each term's relative error is ≤ γ_3). The sum is returned in float64: the caller adds it to the release's noise
    N and rounds N + sum once, so the float32 rounding is post-processing, not a change of the sum's sensitivity.

    Shapes: a (B, p), g (B, q), factors and sq_norms (B,), M and S (q, p), giving (q, p); or batched, one transform
    per run (:mod:`dpbench.run.multiseed`): a (R, B, p), g (R, B, q), factors and sq_norms (R, B), M and S (R, q, p),
    giving (R, q, p) (padding pairs have c_i = 0)."""
    batched = shift.dim() == 3
    if not batched:
        a, g, factors, shift, scale, sq_norms = (t.unsqueeze(0) for t in (a, g, factors, shift, scale, sq_norms))
    a64, weighted = a.double(), g.double() * factors.double().unsqueeze(-1)
    totals = factors.sum(1, dtype=torch.float64).view(-1, 1, 1)
    value = (weighted.transpose(1, 2) @ a64).sub_(totals * shift).div_(scale)  # float32 M, S promoted exactly
    terms = a.shape[1] + 4
    gamma = terms * 2.0**-53 / (1 - terms * 2.0**-53)
    magnitudes = ((g * factors.unsqueeze(-1)).abs_().transpose(1, 2) @ a.abs()).addcmul_(
        totals.float(), shift.abs()).div_(scale)  # float32: an overflow to inf only sends the run to the exact sum
    rounding = 1 + 2 * (a.shape[1] + shift[0].numel() + 8) * 2.0**-24
    error_norms = gamma * rounding * magnitudes.flatten(1).norm(dim=1)
    # a scale for the tolerance (float32 will do); a dropped example (c_i = 0, its norm perhaps not finite) has none
    contributions = torch.where(factors > 0, factors * sq_norms.clamp_min(0).sqrt(), 0.0)
    largest = contributions.amax(1) if a.shape[1] else contributions.new_zeros(len(a))
    for run in (error_norms > SUM_TOLERANCE * largest).nonzero().flatten().tolist():
        value[run] = 0
        for rows in torch.arange(a.shape[1]).split(max(1, 2**24 // shift[run].numel())):  # ≤ ~128 MiB at a time
            per_example = (g[run, rows].double()[:, :, None] * a64[run, rows, None, :] - shift[run]) / scale[run]
            value[run] += torch.tensordot(factors[run, rows].double(), per_example, dims=1)
    return value if batched else value[0]
