"""Batch samplers. The engine owns them: a method only ever sees the noisy gradients they lead to.

Each sampler yields, per training step, a list of ``releases_per_step`` independent batches (tensors of
example indices; a Poisson batch may be empty). Draws depend only on (seed, epoch, position), so runs are
reproducible and a resumed epoch draws the same batches (:meth:`EpochSampler.resume`); each epoch's draws come from
the run's ``sampler`` stream at that epoch (:mod:`dpbench.privacy.streams`), which no other draw of the run shares.
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset, Sampler

from dpbench.data import rows
from dpbench.privacy import streams


def _generator(seed: int, epoch: int) -> torch.Generator:
    return streams.generator(seed, "sampler", epoch)


def _chunk(n: int, sample_rate: float) -> int:
    """Gaps drawn at a time for one batch: enough to pass n but in about one draw in 10⁹ (mean + 6 sd + 16)."""
    expected = n * sample_rate
    return int(expected + 6 * math.sqrt(expected) + 16)


def poisson_batches(n: int, sample_rate: float, count: int, generator: torch.Generator) -> list[torch.Tensor]:
    """``count`` Poisson batches, each the sorted indices of the examples that join it: each of ``n``
    independently with probability q.

    A batch is drawn as the gaps between successive members, which are i.i.d. Geometric(q) on {1, 2, ...}:
    G = ⌊log V / log(1 − q)⌋ + 1 with V uniform on (0, 1] has P(G ≥ k) = (1 − q)^(k−1). This is the same
    distribution as n Bernoulli(q) coins at O(qn) work instead of O(n): at q = 0.007, n = 36,000 (adult) the coins
    were most of a batched training step. Each batch takes chunks of gaps until they pass n; the uniforms of one
    chunk per batch are drawn and transformed at once, and a batch that needs more takes the next chunk of the
    same stream, so the batches are those of ``count`` batches drawn one after the other. When every batch fits in
    its chunk (all but about one draw in 10⁹), all are cumulated at once.
    """
    if sample_rate >= 1:
        return [torch.arange(n) for _ in range(count)]
    if sample_rate <= 0:
        return [torch.arange(0) for _ in range(count)]
    log_keep, chunk = math.log1p(-sample_rate), _chunk(n, sample_rate)

    def draw_gaps(chunks: int) -> torch.Tensor:  # G for `chunks` chunks of the stream, in order
        uniforms = torch.rand(chunks * chunk, generator=generator, dtype=torch.float64)
        return uniforms.neg_().log1p_().div_(log_keep).floor_().long().add_(1)

    gaps, offset, batches = draw_gaps(count), 0, []
    positions = gaps.view(count, chunk).cumsum(1).sub_(1)  # each batch within its own chunk (the rule)
    if bool((positions[:, -1] >= n).all()):
        return [row[:end] for row, end in zip(positions, (positions < n).sum(1).tolist())]
    for _ in range(count):  # some batch needs more than its chunk: the later batches' chunks move on
        members, last = [], -1
        while last < n:
            if offset == len(gaps):  # earlier batches took extra chunks: draw on
                gaps, offset = draw_gaps(1), 0
            positions = gaps[offset:offset + chunk].cumsum(0).add_(last)
            offset += chunk
            members.append(positions)
            last = int(positions[-1])
        batch = torch.cat(members)
        batches.append(batch[: int(torch.searchsorted(batch, n))])
    return batches


def poisson_batch(n: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """One :func:`poisson_batches` batch."""
    return poisson_batches(n, sample_rate, 1, generator)[0]


class EpochSampler(Sampler):
    """An epoch's steps, drawn from the epoch's stream; a resumed run's first epoch starts at a later step."""

    epoch = 0
    position = 0  # the step the epoch's iteration starts at: 0 but in the epoch a run resumes

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.position = 0
        self.epoch = epoch

    def resume(self, epoch: int, position: int) -> None:
        """Iterate epoch ``epoch`` from step ``position`` on (the steps before it were trained before the
        checkpoint); the following epochs whole."""
        self.epoch, self.position = epoch, position

    def __iter__(self):
        return self.steps(self.position)

    def steps(self, start: int):
        raise NotImplementedError


class PoissonSampler(EpochSampler):
    """Every example joins every batch independently with probability ``sample_rate`` (q = 1: full batches)."""

    rank, world = 0, 1

    def __init__(self, n: int, sample_rate: float, steps_per_epoch: int, releases_per_step: int, seed: int):
        self.n, self.sample_rate, self.steps_per_epoch = n, sample_rate, steps_per_epoch
        self.releases_per_step, self.seed = releases_per_step, seed

    def __len__(self) -> int:
        return self.steps_per_epoch

    def shard(self, rank: int, world: int) -> None:
        """Draw only the shard of rank ``rank`` of ``world`` (:mod:`dpbench.run.distributed`): the examples rank,
        rank + world, ..., each at the same rate, from the stream ``sampler`` at (epoch, rank); the ranks' batches
        together are a Poisson sample of all n examples."""
        self.rank, self.world = rank, world

    def steps(self, start: int):
        per_step = self.releases_per_step
        count = self.steps_per_epoch * per_step
        if self.world == 1:
            batches = poisson_batches(self.n, self.sample_rate, count, _generator(self.seed, self.epoch))
        else:
            members = torch.arange(self.rank, self.n, self.world)
            stream = streams.generator(self.seed, "sampler", self.epoch, self.rank)
            batches = [members[batch] for batch in poisson_batches(len(members), self.sample_rate, count, stream)]
        for step in range(start, self.steps_per_epoch):
            yield batches[step * per_step:(step + 1) * per_step]


class ShuffleSampler(EpochSampler):
    """Fixed-size batches from a fresh permutation each epoch; the incomplete last batch is dropped."""

    def __init__(self, n: int, batch_size: int, releases_per_step: int, seed: int):
        self.n, self.batch_size, self.releases_per_step, self.seed = n, batch_size, releases_per_step, seed

    def __len__(self) -> int:
        return self.n // (self.batch_size * self.releases_per_step)

    def steps(self, start: int):
        order = torch.randperm(self.n, generator=_generator(self.seed, self.epoch))
        size = self.batch_size
        for step in range(start, len(self)):
            first = step * self.releases_per_step
            yield [order[(first + k) * size : (first + k + 1) * size] for k in range(self.releases_per_step)]


class CyclicSampler(EpochSampler):
    """One random partition of the data into P = ⌊n/B⌋ batches of B examples, drawn once from the run's sampler stream
    (epoch 0's), visited in the same order every epoch (the n − PB examples left over never join a batch).

    The participation schema of banded matrix-factorization noise (:mod:`dpbench.privacy.correlated`): every example
    is in at most one batch per epoch, and its participations are exactly P steps apart, so k = epochs and a b-banded
    strategy needs P ≥ b. No amplification is claimed: the accounting holds for any partition, this one included."""

    def __init__(self, n: int, batch_size: int, seed: int):
        self.n, self.batch_size, self.releases_per_step, self.seed = n, batch_size, 1, seed

    def __len__(self) -> int:
        return self.n // self.batch_size

    def partition(self) -> list[torch.Tensor]:
        order = torch.randperm(self.n, generator=_generator(self.seed, 0))
        return [order[k * self.batch_size:(k + 1) * self.batch_size] for k in range(len(self))]

    def steps(self, start: int):
        batches = self.partition()  # the same every epoch: drawn from epoch 0's stream whatever the epoch
        for step in range(start, len(self)):
            yield [batches[step]]


class IndexedTensors(Dataset):
    """In-memory examples that a sampler's lists of index batches select from, empty batches included."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitems__(self, batches: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(rows.take(self.x, index), self.y[index]) for index in batches]
