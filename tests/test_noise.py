"""The gradient noise sampler (dpbench/privacy/_philox.c, dpbench/privacy/noise.py): its bits, its numbers, its distribution.

``stream`` below transcribes the specification in ``_philox.c`` in NumPy, operation for operation in float32;
its Philox bits are checked against Random123's known answers and randomgen's implementation, and the compiled
sampler against it bit for bit.
"""
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from dpbench.privacy import noise, streams
from dpbench.privacy.noise import GaussianNoise

REPO = Path(__file__).resolve().parents[1]
fill_normal = noise.fill_normal
F = np.float32


def philox4x32_10(counter, key):
    """Philox4x32-10 of counters (4 arrays of uint32 words) under key (k0, k1): the 4 output words."""
    x0, x1, x2, x3 = (np.asarray(word, dtype=np.uint32) for word in counter)
    k0, k1 = key
    for _ in range(10):
        p0 = x0.astype(np.uint64) * np.uint64(0xD2511F53)
        p1 = x2.astype(np.uint64) * np.uint64(0xCD9E8D57)
        x0, x1, x2, x3 = ((p1 >> np.uint64(32)).astype(np.uint32) ^ x1 ^ np.uint32(k0), p1.astype(np.uint32),
                          (p0 >> np.uint64(32)).astype(np.uint32) ^ x3 ^ np.uint32(k1), p0.astype(np.uint32))
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return x0, x1, x2, x3


def blocks(key, counter, count):
    j = np.arange(count, dtype=np.uint64) + np.uint64(counter)  # counters below 2^64 - count in these tests
    zero = np.zeros(count, dtype=np.uint32)
    return philox4x32_10((j.astype(np.uint32), (j >> np.uint64(32)).astype(np.uint32), zero, zero),
                         (key & 0xFFFFFFFF, key >> 32))


def minus_log_uniform(w):
    u = ((w >> 16).astype(np.int32).astype(F) * F(65536) + ((w & 0xFFFF) + 1).astype(np.int32).astype(F)) \
        * F(2.0**-32)
    bits = u.view(np.uint32)
    exponent = (bits >> 23).astype(np.int32) - 126
    mantissa = (bits & 0x007FFFFF) | 0x3F000000
    below = (mantissa < 0x3F3504F3).astype(np.uint32)
    mantissa = mantissa + (below << 23)
    exponent = exponent - below.astype(np.int32)
    f = mantissa.view(F) - F(1)
    z, e = f * f, exponent.astype(F)
    p = np.full_like(f, F(float.fromhex("0x1.204376p-4")))
    for c in ("-0x1.d7a370p-4", "0x1.de4a34p-4", "-0x1.fcba9ep-4", "0x1.23d37ep-3", "-0x1.555ca0p-3",
              "0x1.999d58p-3", "-0x1.fffff8p-3", "0x1.555554p-2"):
        p = p * f + F(float.fromhex(c))
    y = p * f * z
    y = y - F(float.fromhex("0x1.bd0106p-13")) * e
    y = y - F(0.5) * z
    log_u = f + y
    log_u = log_u + F(float.fromhex("0x1.63p-1")) * e
    return -log_u


def cos_sin_angle(w):
    octant, low = w >> 29, w & 0x1FFFFFFF
    odd = (octant & 1).astype(bool)
    steps = np.where(odd, 0x20000000 - low, low).astype(np.uint32)
    t = steps.astype(np.int32).astype(F) * F(float.fromhex("0x1.921fb6p-30"))
    z = t * t
    s = ((F(float.fromhex("-0x1.9943f2p-13")) * z + F(float.fromhex("0x1.11073cp-7"))) * z
         - F(float.fromhex("0x1.555546p-3"))) * z * t + t
    c = ((F(float.fromhex("0x1.99eb9cp-16")) * z - F(float.fromhex("0x1.6c0c34p-10"))) * z
         + F(float.fromhex("0x1.55554ap-5"))) * z * z - F(0.5) * z + F(1)
    swap = ((octant + 1) >> 1 & 1).astype(bool)
    sin_, cos_ = np.where(swap, c, s), np.where(swap, s, c)
    sin_ = np.where(octant & 4, -sin_, sin_)
    cos_ = np.where((octant + 2) & 4, -cos_, cos_)
    return cos_, sin_


def stream(key, counter, n, std):
    """The first n numbers of the sampler's stream from ``counter`` under ``key``, as _philox.c specifies."""
    count = -(-n // 4)
    w0, w1, w2, w3 = blocks(key, counter, count)
    out = np.empty((count, 4), dtype=F)
    for radius_word, angle_word, column in ((w0, w1, 0), (w2, w3, 2)):
        r = np.sqrt(F(2) * minus_log_uniform(radius_word)) * F(std)
        cos_, sin_ = cos_sin_angle(angle_word)
        out[:, column], out[:, column + 1] = r * cos_, r * sin_
    return out.reshape(-1)[:n]


def test_the_extension_is_built():
    assert fill_normal is not None, "dpbench.privacy._philox was not built: install with a C compiler (pip install -e .)"


@pytest.mark.parametrize(("counter", "key", "expected"), [  # Random123's kat_vectors for philox4x32_10
    ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
])
def test_philox_matches_random123_known_answers(counter, key, expected):
    words = philox4x32_10([np.array([c], dtype=np.uint32) for c in counter], key)
    assert tuple(int(w[0]) for w in words) == expected


@pytest.mark.parametrize(("key", "counter"), [(0, 0), (7, 2**32 - 3), (0xDEADBEEF12345678, 123_456_789)])
def test_philox_blocks_match_randomgen(key, counter):
    from randomgen import Philox

    generator = Philox(key=key, counter=(counter - 1) % 2**128, number=4, width=32)  # it counts up, then generates
    words = np.stack(blocks(key, counter, 100), axis=1).reshape(-1)
    assert np.array_equal(words, generator.random_raw(400).astype(np.uint32))


@pytest.mark.parametrize("n", [1, 3, 4, 5, 255, 256, 257, 1023, 4096, 10_007])
@pytest.mark.parametrize(("key", "counter"), [(0, 0), (1, 5), (2**64 - 1, 2**32 - 40), (987654321, 2**40 + 17)])
def test_compiled_sampler_equals_the_specification_bit_for_bit(n, key, counter):
    out = np.full(n, np.nan, dtype=F)
    fill_normal(out, key, counter, 0.37)
    assert np.array_equal(out.view(np.uint32), stream(key, counter, n, 0.37).view(np.uint32))


def test_numbers_are_box_muller_of_the_bits_to_float32_accuracy():
    """Against float64 Box–Muller of the same words, with u rounded to float32 as specified: within 2 ulps of the
    radius (measured: 1.41 over 4M numbers). The rounding of u is the only coarser step; it moves radii below
    ~0.01 by up to 2^-24/r, as 24-bit uniforms do in PyTorch's sampler."""
    n = 400_000
    out = np.empty(n, dtype=F)
    fill_normal(out, 42, 0, 1.0)
    w0, w1, w2, w3 = blocks(42, 0, n // 4)
    exact, radius = np.empty((n // 4, 4)), np.empty((n // 4, 4))
    for radius_word, angle_word, column in ((w0, w1, 0), (w2, w3, 2)):
        u = (radius_word.astype(np.float64) + 1).astype(F).astype(np.float64) / 2**32
        r, theta = np.sqrt(-2 * np.log(u)), 2 * np.pi * angle_word.astype(np.float64) / 2**32
        exact[:, column], exact[:, column + 1] = r * np.cos(theta), r * np.sin(theta)
        radius[:, column] = radius[:, column + 1] = r
    ulps = np.abs(out - exact.reshape(-1)) / (2.0**-23 * np.maximum(radius.reshape(-1), 2.0**-10))
    assert ulps.max() < 2


def test_extremes_of_the_radius():
    """u = 2^-32 gives the largest radius √(64 ln 2) = 6.660, u = 1 gives 0."""
    words = np.array([0, 2**32 - 1, 2**31], dtype=np.uint32)
    assert minus_log_uniform(words) == pytest.approx([32 * math.log(2), 0.0, math.log(2)], rel=1e-6, abs=1e-7)


def test_distribution_is_standard_normal():
    n = 4_000_000
    out = np.empty(n, dtype=F)
    fill_normal(out, 2024, 0, 1.0)
    assert stats.kstest(out, "norm").pvalue > 1e-3
    for lane in range(4):  # each of a block's four positions, and the pairs sharing a radius, are N(0, 1)
        values = out[lane::4].astype(np.float64)
        assert abs(values.mean()) < 5 / math.sqrt(n / 4)
        assert values.var() == pytest.approx(1.0, abs=5 * math.sqrt(2 / (n / 4)))
    pairs = out.reshape(-1, 2).astype(np.float64)
    assert abs(np.corrcoef(pairs.T)[0, 1]) < 5 / math.sqrt(n / 2)
    assert abs(np.corrcoef((pairs**2).T)[0, 1]) < 5 / math.sqrt(n / 2)  # independent, not just uncorrelated
    assert stats.kurtosis(out) == pytest.approx(0.0, abs=0.02)
    assert np.abs(out).max() <= math.sqrt(64 * math.log(2)) * (1 + 1e-6)


@pytest.mark.parametrize("level", ["x86-64", "x86-64-v3", "x86-64-v4"])
def test_every_instruction_set_gives_the_same_numbers(level, tmp_path):
    """The installed module runs the copy its CPU supports; each copy, built alone, gives the specified bits."""
    if sys.version_info < (3, 11):
        pytest.skip("benchmarks/noise_time.py reads pyproject.toml with tomllib (Python 3.11)")
    spec = importlib.util.spec_from_file_location("noise_time", REPO / "benchmarks" / "noise_time.py")
    noise_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noise_time)
    if not noise_time.supported(level):
        pytest.skip(f"this CPU cannot run {level} code")
    built = noise_time.build(level, tmp_path)
    out = np.empty(4099, dtype=F)
    built.fill_normal(out, 2**63 + 12345, 2**32 - 7, 0.5)
    assert np.array_equal(out.view(np.uint32), stream(2**63 + 12345, 2**32 - 7, 4099, 0.5).view(np.uint32))


def test_a_stream_continues_where_the_last_draw_ended():
    sampler = GaussianNoise(seed=5)
    key = streams.derive(5, "gradient-noise")  # the run's own noise stream
    first, second = sampler.fill_(torch.empty(10), 2.0), sampler.fill_(torch.empty(3, 7), 2.0)
    assert np.array_equal(first.numpy(), stream(key, 0, 10, 2.0))  # 10 numbers use three blocks
    assert np.array_equal(second.flatten().numpy(), stream(key, 3, 21, 2.0))
    assert sampler.counter == 3 + 6


def test_other_dtypes_and_layouts_get_the_same_float32_numbers():
    expected = stream(streams.derive(11, "gradient-noise"), 0, 12, 1.5)
    as_double = GaussianNoise(seed=11).fill_(torch.empty(3, 4, dtype=torch.float64), 1.5)
    assert np.array_equal(as_double.flatten().numpy(), expected.astype(np.float64))
    transposed = GaussianNoise(seed=11).fill_(torch.empty(4, 3).T, 1.5)
    assert np.array_equal(transposed.flatten().numpy(), expected)


def test_without_the_extension_pytorch_draws_and_records_say_so(monkeypatch):
    monkeypatch.setattr(noise, "fill_normal", None)
    with pytest.warns(UserWarning, match="not built"):
        sampler = GaussianNoise(seed=3)
    assert sampler.name == "torch normal_ (cpu)"
    drawn = sampler.fill_(torch.empty(1000), 2.0)
    assert torch.equal(drawn, torch.empty(1000).normal_(0, 2.0, generator=streams.generator(3, "gradient-noise")))


def test_refuses_buffers_that_are_not_float32():
    with pytest.raises(TypeError, match="float32"):
        fill_normal(np.empty(8, dtype=np.float64), 0, 0, 1.0)
    with pytest.raises(ValueError, match="contiguous"):
        fill_normal(np.empty(8, dtype=F)[::2], 0, 0, 1.0)
