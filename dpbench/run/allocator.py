"""Keep memory freed by one training step for the next, instead of returning it to the OS (glibc's malloc only).

A training step on the CPU allocates and frees the same large tensors every step: activations and their gradients,
and for DP the per-example gradients and Gram matrices of the clipping. By default glibc's malloc returns the free
top of its heap to the OS once it exceeds a threshold that grows with use, and serves blocks above a (growing)
threshold from fresh ``mmap`` pages, so a step can page-fault its tens of megabytes in again. On the 5-layer CNN
of ``benchmarks/step_time.py`` (2-core CPU, side by side, docs/benchmarks.md): non-private 175 → 154 ms a step,
DP-SGD 237 → 195 ms.
PyTorch's CPU performance guide recommends swapping in jemalloc or tcmalloc for the same reason; four ``mallopt``
settings get most of it without a preloaded library: blocks up to 32 MiB (glibc's largest mmap threshold) come
from the heap, larger ones too (no ``mmap`` at all), the heap is not trimmed, and every thread allocates from the
one main heap (a sweep's Dask worker trains in a thread of its own, whose own heap served and returned its blocks
anew). PyTorch asks glibc for 64-byte-aligned blocks, which glibc cannot serve from a freed block of exactly the
same size, so a batched step's large tensors (80 tuning trials gather 64 MB of MNIST rows a step) still came from
fresh, page-faulted memory; :func:`huge_pages` sets PyTorch's ``THP_MEM_ALLOC_ENABLE`` (page-aligned blocks,
those of 2 MB and more advised as transparent huge pages where the kernel allows it; PyTorch's CPU tuning guide),
after which they are reused: that gather took 38 ms in fresh pages and 4-5 ms in reused ones. Peak memory is the
heap's high-water mark; the process keeps it until it exits. This changes no result, only speed, and does nothing
where the C library is not glibc. Measured as the sweep runs it (one-cell grids below, 2 workers, from an empty
store): 18 tuned cells (adult, mnist_logreg, kddcup99 × dpsgd, output_perturbation, adaclip × validation,
random-stopping, ε = 1) took 250 s with the two earlier settings, 194 s with these.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -3, -4, -8  # glibc's <malloc.h>
_LARGEST_MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems
_NEVER_TRIM = 2**31 - 1  # an int, as mallopt takes


def huge_pages() -> None:
    """PyTorch's CPU allocator: page-aligned blocks, those of 2 MB and more advised as huge pages. PyTorch reads
    the variable at its first allocation; ``dpbench/__init__.py`` sets it before anything is allocated, and the
    processes a sweep starts inherit it. A value the user set is kept."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def keep_freed_memory() -> bool:
    """Set the four ``mallopt`` options for this process; True if glibc took all four."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):
        return False  # macOS, Windows, musl: other allocators, other options
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _LARGEST_MMAP_THRESHOLD)) and \
        bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)) and \
        bool(libc.mallopt(_M_ARENA_MAX, 1))
