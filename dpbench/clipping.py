"""Per-example gradient clipping behind one small interface.

``clipped_sum(task, x, y, max_norm, transform, scale)`` returns scale · Σ_i t(g_i) · min(1, C/‖t(g_i)‖) over the
batch (one tensor per trainable parameter; the engine passes scale = 1/B) and the per-example norms ‖t(g_i)‖,
where t is the method's per-example transform (identity for most methods). The engine adds the noise; methods
never call this. A faster implementation (ghost norms, book-keeping) replaces :class:`VmapClipper` without
touching any method.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch.func import functional_call, grad, vmap

from dpbench.task import Task


@dataclass(frozen=True)
class CoordinateAffine:
    """The per-example transform g ↦ (g − shift) / scale, coordinate by coordinate (AdaCliP's (g − m)/b).

    Callable like any transform; :class:`~dpbench.ghost.GhostClipper` also recognizes it and computes the
    transformed norms and clipped sum without materializing per-example gradients where a layer allows it."""

    shift: list[torch.Tensor]
    scale: list[torch.Tensor]

    def __call__(self, gradients: list[torch.Tensor]) -> list[torch.Tensor]:
        return [(g - m) / b for g, m, b in zip(gradients, self.shift, self.scale)]


Transform = Callable[[list[torch.Tensor]], list[torch.Tensor]] | CoordinateAffine


class PerExampleClipper(Protocol):
    name: str  # what a run record's ``clipping`` field says

    def clipped_sum(
        self, task: Task, x: torch.Tensor, y: torch.Tensor, max_norm: float, transform: Transform | None = None,
        scale: float = 1.0,
    ) -> tuple[list[torch.Tensor], torch.Tensor]: ...


def clip_factors(norms: torch.Tensor, max_norm: float) -> torch.Tensor:
    """min(1, C/‖g‖) per example (Abadi et al. 2016, Algorithm 1); 1 for C = inf."""
    return torch.clamp(max_norm / (norms + 1e-12), max=1.0)


class VmapClipper:
    """Reference implementation: materialize per-example gradients with ``torch.func.vmap``."""

    name = "vmap"

    def per_example_gradients(self, task: Task, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        params = {name: p.detach() for name, p in task.model.named_parameters() if p.requires_grad}
        buffers = dict(task.model.named_buffers())

        def loss_of_one(p, xi, yi):
            outputs = functional_call(task.model, (p, buffers), (xi.unsqueeze(0),))
            return task.per_example_loss(outputs, yi.unsqueeze(0)).sum()

        return vmap(grad(loss_of_one), in_dims=(None, 0, 0))(params, x, y)

    def clipped_sum(self, task, x, y, max_norm, transform=None, scale=1.0):
        if len(x) == 0:
            zeros = [torch.zeros_like(p) for p in task.model.parameters() if p.requires_grad]
            return zeros, torch.zeros(0, device=x.device)
        grads = list(self.per_example_gradients(task, x, y).values())
        if transform is not None:
            grads = transform(grads)
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads))
        factors = clip_factors(norms, max_norm) * scale
        return [torch.einsum("b,b...->...", factors, g) for g in grads], norms
