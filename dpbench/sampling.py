"""Batch samplers. The engine owns them: a method only ever sees the noisy gradients they lead to.

Each sampler yields, per training step, a list of ``releases_per_step`` independent batches (tensors of
example indices; a Poisson batch may be empty). Draws depend only on (seed, epoch, position), so runs are
reproducible and a resumed epoch draws the same batches.
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset, Sampler


def _generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def poisson_batch(n: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """The sorted indices of the examples that join one Poisson batch: each of ``n`` independently with
    probability q.

    Drawn as the gaps between successive members, which are i.i.d. Geometric(q) on {1, 2, ...}:
    G = ⌊log V / log(1 − q)⌋ + 1 with V uniform on (0, 1] has P(G ≥ k) = (1 − q)^(k−1). This is the same
    distribution as n Bernoulli(q) coins at O(qn) work instead of O(n): at q = 0.007, n = 36,000 (adult) the coins
    were most of a batched training step.
    """
    if sample_rate >= 1:
        return torch.arange(n)
    if sample_rate <= 0:
        return torch.arange(0)
    log_keep = math.log1p(-sample_rate)
    expected = n * sample_rate
    chunk = int(expected + 6 * math.sqrt(expected) + 16)  # one chunk of gaps nearly always reaches past n
    members, last = [], -1
    while last < n:
        gaps = torch.floor(torch.log1p(-torch.rand(chunk, generator=generator, dtype=torch.float64)) / log_keep)
        positions = last + torch.cumsum(gaps.long() + 1, 0)
        members.append(positions)
        last = int(positions[-1])
    batch = torch.cat(members)
    return batch[: int(torch.searchsorted(batch, n))]


class PoissonSampler(Sampler):
    """Every example joins every batch independently with probability ``sample_rate`` (q = 1: full batches)."""

    def __init__(self, n: int, sample_rate: float, steps_per_epoch: int, releases_per_step: int, seed: int):
        self.n, self.sample_rate, self.steps_per_epoch = n, sample_rate, steps_per_epoch
        self.releases_per_step, self.seed, self.epoch = releases_per_step, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self):
        generator = _generator(self.seed, self.epoch)
        for _ in range(self.steps_per_epoch):
            yield [poisson_batch(self.n, self.sample_rate, generator) for _ in range(self.releases_per_step)]


class ShuffleSampler(Sampler):
    """Fixed-size batches from a fresh permutation each epoch; the incomplete last batch is dropped."""

    def __init__(self, n: int, batch_size: int, releases_per_step: int, seed: int):
        self.n, self.batch_size, self.releases_per_step, self.seed, self.epoch = n, batch_size, releases_per_step, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // (self.batch_size * self.releases_per_step)

    def __iter__(self):
        order = torch.randperm(self.n, generator=_generator(self.seed, self.epoch))
        size = self.batch_size
        for step in range(len(self)):
            first = step * self.releases_per_step
            yield [order[(first + k) * size : (first + k + 1) * size] for k in range(self.releases_per_step)]


class IndexedTensors(Dataset):
    """In-memory examples that a sampler's lists of index batches select from, empty batches included."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitems__(self, batches: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(self.x[index], self.y[index]) for index in batches]
