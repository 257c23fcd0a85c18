"""Per-example gradient clipping behind one small interface.

``clipped_sum(task, x, y, max_norm, transform, scale, into, gamma)`` returns scale · Σ_i t(g_i) · c_i over the
batch (one tensor per trainable parameter; the engine passes scale = 1/B), added in place into ``into`` when given
(the engine passes the release's noise), and the per-example norms ‖t(g_i)‖, where t is the method's per-example
transform (identity for most methods) and c_i the engine's per-example scaling (:func:`clip_factors`): min(1,
C/‖t(g_i)‖) (Abadi et al.'s clipping), or with ``gamma`` = γ > 0 C/(‖t(g_i)‖ + γ) (Bu et al.'s automatic clipping).
Either way every example contributes a vector of norm ≤ C. Methods never call this, and never see the norms. A
faster implementation (ghost norms, book-keeping) replaces :class:`VmapClipper` without touching any method.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import torch
from torch.func import functional_call, grad, vmap

if TYPE_CHECKING:  # a privacy module names the task contract as a type only
    from dpbench.task import Task


@dataclass(frozen=True)
class CoordinateAffine:
    """The per-example transform g ↦ (g − shift) / scale, coordinate by coordinate (AdaCliP's (g − m)/b).

    Callable like any transform; :class:`~dpbench.privacy.ghost.GhostClipper` also recognizes it and computes the
    transformed norms and clipped sum without materializing per-example gradients where a layer allows it."""

    shift: list[torch.Tensor]
    scale: list[torch.Tensor]

    def __call__(self, gradients: list[torch.Tensor]) -> list[torch.Tensor]:
        return [(g - m) / b for g, m, b in zip(gradients, self.shift, self.scale)]

    def check(self) -> None:
        """Raise ValueError unless every shift and scale is finite and every scale positive, as AdaCliP's: the
        clippers divide by the scale, and a zero, infinite or NaN value makes contributions infinite or NaN
        depending on the data, outside what clipping bounds."""
        if not all(bool(t.isfinite().all()) for t in [*self.shift, *self.scale]):
            raise ValueError("is not finite")
        if not all(bool((t > 0).all()) for t in self.scale):
            raise ValueError("has a scale that is not positive")


Transform = Callable[[list[torch.Tensor]], list[torch.Tensor]] | CoordinateAffine


class PerExampleClipper(Protocol):
    name: str  # what a run record's ``clipping`` field says

    def clipped_sum(
        self, task: Task, x: torch.Tensor, y: torch.Tensor, max_norm: float, transform: Transform | None = None,
        scale: float = 1.0, into: list[torch.Tensor] | None = None, gamma: float | None = None,
    ) -> tuple[list[torch.Tensor], torch.Tensor]: ...


#: The smallest γ of automatic clipping. A float32 norm underflows to 0 for gradients below ~1e-19 per coordinate,
#: where C/(0 + γ) scales the true gradient by C/γ: at γ ≥ 1e-6 such an example still adds far less than C, while
#: γ = 1e-30 let one add 1.7e6·C and γ = 1e-50 (0 in float32) made a zero gradient's factor infinite (hostile review
#: of the adaptive clipping, 26 November 2026). Bu et al. use γ = 0.01.
MIN_GAMMA = 1e-6


def check_gamma(gamma: float) -> float:
    """γ of automatic clipping as a float, ValueError unless finite and at least :data:`MIN_GAMMA` (γ = 0 divides 0 by
    0 for a zero gradient; an infinite or NaN γ makes every factor 0 or NaN)."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not math.isfinite(gamma) \
            or gamma < MIN_GAMMA:
        raise ValueError(f"the automatic clipping's gamma must be a finite number of at least {MIN_GAMMA}, "
                         f"got {gamma!r}")
    return float(gamma)


def clip_factors(norms: torch.Tensor, max_norm: float | torch.Tensor, scale: float = 1.0,
                 gamma: float | None = None) -> torch.Tensor:
    """scale · min(1, C/‖g‖) per example (Abadi et al. 2016, Algorithm 1), as scale · C / max(‖g‖, C); scale for
    C = inf. ``max_norm`` may be one C per example. An example whose norm is not finite gets 0: see
    :func:`keep_finite`.

    With ``gamma`` = γ > 0 (a float C only): scale · C/(‖g‖ + γ), Bu et al.'s automatic clipping (AUTO-S, "Automatic
    Clipping: Differentially Private Deep Learning Made Easier and Stronger", 2022, with their R as C): the
    example's contribution C·g/(‖g‖ + γ) has norm C·‖g‖/(‖g‖ + γ) < C, so the release's sensitivity is still C.
    In floating point C/(‖g‖ + γ) is at most C/‖g‖ rounded, as Abadi's C/max(‖g‖, C) is: the same rounding."""
    if gamma is not None:
        if torch.is_tensor(max_norm) or not math.isfinite(max_norm):
            raise ValueError("automatic clipping needs one finite clip norm C")
        factors = (max_norm * scale) / (norms + check_gamma(gamma))
    elif not torch.is_tensor(max_norm):
        if math.isinf(max_norm):
            factors = torch.full_like(norms, scale)
        else:
            factors = (max_norm * scale) / norms.clamp_min(max_norm)
    else:
        ratio = max_norm / torch.maximum(norms, max_norm)
        factors = torch.where(torch.isinf(max_norm), 1.0, ratio) * scale  # C = inf: not clipped (a non-private run)
    return torch.where(norms.isfinite() & factors.isfinite(), factors, 0.0)


def keep_finite(tensors: list[torch.Tensor], examples: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(which examples to keep, ``tensors`` with every row of the others zeroed): an example is dropped where any of
    ``tensors`` (first dimension: the ``examples``) holds a value that is not finite in its rows.

    An example whose gradient overflows or is NaN (its loss overflowed under the current parameters) would make the
    whole release NaN or infinite, noise included: a noise-free bit saying whether it was in the batch, which a
    method (an isolated one chooses the parameters) can aim at one example. So the clippers drop it: its rows are
    zeroed, before any product with its clip factor, and its clip factor is 0 (as :func:`clip_factors` gives an
    example whose norm is not finite), so it contributes nothing, as if clipped to norm 0 (within sensitivity C).
    Sparse and integer tensors (data rows, token ids) pass unchanged."""
    checked = [t for t in tensors if t.is_floating_point() and t.layout == torch.strided]
    kept = torch.ones(examples, dtype=torch.bool, device=checked[0].device if checked else None)
    for t in checked:
        kept &= t.reshape(examples, -1).isfinite().all(1)
    return kept, zero_rows(tensors, kept)


def zero_rows(tensors: list[torch.Tensor], kept: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` (first dimension: the examples) with the rows of the examples not ``kept`` zeroed, new tensors;
    sparse and integer ones unchanged."""
    return [torch.where(kept.view(-1, *[1] * (t.dim() - 1)), t, 0.0)
            if t.is_floating_point() and t.layout == torch.strided else t for t in tensors]


class VmapClipper:
    """Reference implementation: materialize per-example gradients with ``torch.func.vmap``."""

    name = "vmap"

    def per_example_gradients(self, task: Task, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        params = {name: p.detach() for name, p in task.model.named_parameters() if p.requires_grad}
        buffers = dict(task.model.named_buffers())

        def loss_of_one(p, xi, yi):
            outputs = functional_call(task.model, (p, buffers), (xi.unsqueeze(0),))
            return task.per_example_loss(outputs, yi.unsqueeze(0)).sum()

        # randomness="different": each example its own dropout mask, as in a batched forward pass
        return vmap(grad(loss_of_one), in_dims=(None, 0, 0), randomness="different")(params, x, y)

    def clipped_sum(self, task, x, y, max_norm, transform=None, scale=1.0, into=None, gamma=None):
        sums = into if into is not None else [torch.zeros_like(p) for p in task.model.parameters() if p.requires_grad]
        if len(x) == 0:
            return sums, torch.zeros(0, device=x.device)
        grads = list(self.per_example_gradients(task, x, y).values())
        if transform is not None:
            grads = transform(grads)
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads))
        factors = clip_factors(norms, max_norm, scale, gamma)  # 0 where a norm is not finite; then its rows are zeroed
        grads = zero_rows(grads, norms.isfinite())
        for total, g in zip(sums, grads):
            total.add_(torch.einsum("b,b...->...", factors, g))
        return sums, norms
