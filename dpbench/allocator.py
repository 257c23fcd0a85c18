"""Keep memory freed by one training step for the next, instead of returning it to the OS (glibc's malloc only).

A training step on the CPU allocates and frees the same large tensors every step: activations and their gradients,
and for DP the per-example gradients and Gram matrices of the clipping. By default glibc's malloc returns the free
top of its heap to the OS once it exceeds a threshold that grows with use, and serves blocks above a (growing)
threshold from fresh ``mmap`` pages, so a step can page-fault its tens of megabytes in again. On the 5-layer CNN
of ``benchmarks/step_time.py`` (2-core CPU, side by side, BENCHMARKS.md): non-private 175 → 154 ms a step,
DP-SGD 237 → 195 ms.
PyTorch's CPU performance guide recommends swapping in jemalloc or tcmalloc for the same reason; three ``mallopt``
settings get this without a preloaded library: blocks up to 32 MiB (glibc's largest mmap threshold) come from the
heap, larger ones too (no ``mmap`` at all: a batched step of 80 tuning trials gathers 64 MB of MNIST rows, which
``index_select`` wrote into fresh pages in 38 ms and into reused ones in 5 ms), and the heap is not trimmed. Peak
memory is the heap's high-water mark; the process keeps it until it exits. This changes no result, only speed, and
does nothing where the C library is not glibc. (One tuned cell, one thread, mnist_logreg norm_bound random-stopping
ε = 1: 17.0 → 10.2 s.)
"""
from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # glibc's <malloc.h>
_LARGEST_MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems
_NEVER_TRIM = 2**31 - 1  # an int, as mallopt takes


def keep_freed_memory() -> bool:
    """Set the three ``mallopt`` options for this process; True if glibc took all three."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):
        return False  # macOS, Windows, musl: other allocators, other options
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _LARGEST_MMAP_THRESHOLD)) and \
        bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))
