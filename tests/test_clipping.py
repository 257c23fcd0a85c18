import math

import pytest
import torch
from torch import nn

from dpbench.privacy.clipping import VmapClipper, clip_factors
from dpbench.task import Classification


class TinyMLP(Classification):
    name = "tiny_mlp_for_tests"

    def build_model(self, data):
        self.classes = 3
        return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))


@pytest.fixture
def task():
    torch.manual_seed(0)
    task = TinyMLP()
    task.model = task.build_model(None)
    return task


def loop_gradients(task, x, y):
    """Per-example gradients one backward pass at a time: the definition."""
    grads = []
    for xi, yi in zip(x, y):
        loss = task.per_example_loss(task(xi[None]), yi[None]).sum()
        grads.append(torch.autograd.grad(loss, list(task.model.parameters())))
    return grads


def test_vmap_per_example_gradients_match_the_loop(task):
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    vmapped = list(VmapClipper().per_example_gradients(task, x, y).values())
    for i, expected in enumerate(loop_gradients(task, x, y)):
        for g, e in zip(vmapped, expected):
            torch.testing.assert_close(g[i], e)


@pytest.mark.parametrize("clip", [0.01, 0.3, 1.0, math.inf])
def test_clipped_sum_is_the_sum_of_clipped_gradients_each_within_clip(task, clip):
    x, y = 3 * torch.randn(8, 4), torch.randint(0, 3, (8,))
    total, norms = VmapClipper().clipped_sum(task, x, y, clip)
    expected = [torch.zeros_like(p) for p in task.model.parameters()]
    for i, grads in enumerate(loop_gradients(task, x, y)):
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        assert norms[i] == pytest.approx(norm.item(), rel=1e-5)
        clipped = [g * min(1.0, clip / norm.item()) for g in grads]
        assert torch.sqrt(sum(c.pow(2).sum() for c in clipped)) <= min(clip, norm) * (1 + 1e-6)
        expected = [e + c for e, c in zip(expected, clipped)]
    for t, e in zip(total, expected):
        torch.testing.assert_close(t, e)


def test_every_clipped_gradient_has_norm_at_most_clip(task):
    x, y = 10 * torch.randn(64, 4), torch.randint(0, 3, (64,))
    grads = VmapClipper().per_example_gradients(task, x, y).values()
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads))
    clipped_norms = norms * clip_factors(norms, 0.5)
    assert (norms > 0.5).any() and (clipped_norms <= 0.5 * (1 + 1e-6)).all()


def test_clip_factors_are_scale_times_min_one_c_over_norm():
    norms = torch.tensor([0.0, 0.25, 0.5, 2.0, 8.0])
    expected = 0.1 * torch.minimum(torch.ones(5), 0.5 / norms)
    torch.testing.assert_close(clip_factors(norms, 0.5, scale=0.1), expected)
    torch.testing.assert_close(clip_factors(norms, math.inf, scale=0.1), torch.full((5,), 0.1))
    per_example = torch.tensor([0.5, 0.5, 1.0, 1.0, 4.0])  # one C per example, as for batched seeds
    torch.testing.assert_close(clip_factors(norms, per_example, scale=torch.full((5,), 2.0)),
                               2.0 * torch.minimum(torch.ones(5), per_example / norms))


def test_empty_batch_gives_zero_sum(task):
    total, norms = VmapClipper().clipped_sum(task, torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 1.0)
    assert len(norms) == 0 and all((t == 0).all() for t in total)
