import math

import pytest
import torch
from scipy import stats

from dpbench.privacy import sampling
from dpbench.privacy.sampling import IndexedTensors, PoissonSampler, ShuffleSampler, poisson_batch, poisson_batches


@pytest.mark.parametrize("n, q", [(6, 0.3), (5, 0.8), (7, 0.05)])
def test_poisson_batch_draws_every_subset_with_its_bernoulli_probability(n, q):
    """Chi-square test of all 2^n subsets against q^|S| (1 − q)^(n − |S|), and sorted, distinct, in-range indices."""
    generator, draws = torch.Generator().manual_seed(11), 40_000
    counts = torch.zeros(2**n)
    for _ in range(draws):
        batch = poisson_batch(n, q, generator)
        assert batch.tolist() == sorted(set(batch.tolist())) and all(0 <= i < n for i in batch.tolist())
        counts[int((2 ** batch).sum())] += 1
    sizes = torch.tensor([bin(subset).count("1") for subset in range(2**n)])
    expected = draws * q**sizes * (1 - q) ** (n - sizes)
    keep = expected >= 5  # the usual validity condition of the chi-square approximation
    statistic = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    assert stats.chi2.sf(statistic, int(keep.sum()) - 1) > 1e-4
    assert counts[~keep].sum() <= 5 * max(1.0, float(expected[~keep].sum())) + 5


def one_after_another(n, q, count, generator, chunk):
    """Batches drawn one at a time, each drawing its chunks of uniforms as it needs them (the code until 7537aed)."""
    log_keep, batches = math.log1p(-q), []
    for _ in range(count):
        members, last = [], -1
        while last < n:
            gaps = torch.floor(torch.log1p(-torch.rand(chunk, generator=generator, dtype=torch.float64)) / log_keep)
            positions = last + torch.cumsum(gaps.long() + 1, 0)
            members.append(positions)
            last = int(positions[-1])
        batch = torch.cat(members)
        batches.append(batch[: int(torch.searchsorted(batch, n))])
    return batches


@pytest.mark.parametrize("n, q, count, chunk", [
    (36177, 0.007, 141, None), (1437, 0.178, 30, None),  # adult's and digits' epochs
    (50, 0.3, 40, 2), (10, 0.9, 30, 3),  # chunks so short that most batches take several
])
def test_batches_drawn_together_are_the_batches_drawn_one_after_another(n, q, count, chunk, monkeypatch):
    if chunk is not None:
        monkeypatch.setattr(sampling, "_chunk", lambda n, q: chunk)
    together = poisson_batches(n, q, count, torch.Generator().manual_seed(5))
    alone = one_after_another(n, q, count, torch.Generator().manual_seed(5), sampling._chunk(n, q))
    assert len(together) == count and all(torch.equal(a, b) for a, b in zip(together, alone))


def test_poisson_batch_covers_the_whole_range_at_high_rates():
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(poisson_batch(9, 1.0, generator), torch.arange(9))
    assert len(poisson_batch(9, 0.0, generator)) == 0
    last_included = sum(int(poisson_batch(1000, 0.9, generator)[-1]) == 999 for _ in range(400))
    assert last_included / 400 == pytest.approx(0.9, abs=0.05)


def test_poisson_inclusion_rate_and_independence():
    n, q, steps = 2000, 0.05, 400
    sampler = PoissonSampler(n, q, steps, releases_per_step=1, seed=7)
    counts = torch.zeros(n)
    sizes = []
    for (batch,) in sampler:
        counts[batch] += 1
        sizes.append(len(batch))
    sizes = torch.tensor(sizes, dtype=torch.float64)
    # Overall rate within 5 standard errors of q; batch sizes vary as Binomial(n, q).
    assert abs(counts.sum() / (n * steps) - q) < 5 * (q * (1 - q) / (n * steps)) ** 0.5
    assert 0.7 * n * q * (1 - q) < sizes.var() < 1.3 * n * q * (1 - q)
    # Every example's own inclusion count looks Binomial(steps, q): no example is favoured.
    assert 0.7 * steps * q * (1 - q) < counts.var() < 1.3 * steps * q * (1 - q)


def test_poisson_batches_may_be_empty_and_draws_are_reproducible():
    sampler = PoissonSampler(50, 0.002, 200, releases_per_step=2, seed=3)
    draws = list(sampler)
    assert any(len(batch) == 0 for step in draws for batch in step)
    assert all(len(step) == 2 for step in draws)
    again = list(PoissonSampler(50, 0.002, 200, releases_per_step=2, seed=3))
    assert all(torch.equal(a, b) for s, t in zip(draws, again) for a, b in zip(s, t))
    sampler.set_epoch(1)
    assert any(not torch.equal(a, b) for s, t in zip(list(sampler), again) for a, b in zip(s, t))
    x, y = torch.randn(50, 3), torch.arange(50)
    (empty_x, empty_y), _ = IndexedTensors(x, y).__getitems__([torch.tensor([], dtype=torch.long), torch.tensor([4])])
    assert empty_x.shape == (0, 3) and empty_y.shape == (0,)


def test_full_batch_when_rate_is_one():
    assert all(len(batch) == 30 for (batch,) in PoissonSampler(30, 1.0, 5, 1, seed=0))


def test_shuffle_uses_every_example_once_per_epoch():
    sampler = ShuffleSampler(103, 10, releases_per_step=1, seed=0)
    seen = torch.cat([batch for (batch,) in sampler])
    assert len(sampler) == 10 and len(seen) == 100 and len(set(seen.tolist())) == 100
