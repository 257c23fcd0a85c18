"""How many threads PyTorch computes with: dpbench's choice, unless the user makes it (issue 35).

PyTorch starts one thread per core. A step of a small model on a small batch is a few microseconds of work per
operation, which more threads do not divide usefully but do make wait on each other: on a machine that is doing
anything else (another run beside it, a sweep's other worker, someone else's job) such a run slows down many times
over (``benchmarks/threads.py``; README, "Threads"). So the ``dpbench`` command trains with one thread where the
work of a step, trainable parameters × expected batch size, is below :data:`CROSSOVER`, and with one thread per
core (at most ``cap``) above it. Before the model is built (loading and preparing the data) it computes with one.

The user decides instead with ``--threads N``, ``DPBENCH_THREADS=N`` or ``OMP_NUM_THREADS=N`` (in that order).
The count a run trained with is in its record (``threads``). Library callers that do not :func:`configure`
(tests, benchmarks) keep PyTorch's setting. Nothing here imports PyTorch until a count is applied.
"""
from __future__ import annotations

import os

from dpbench.errors import UsageError

VARIABLES = ("DPBENCH_THREADS", "OMP_NUM_THREADS")
MAX_THREADS = 1024
#: Trainable parameters × batch size per step below which more threads do not pay. Issue 35, an idle 2-core machine:
#: mnist_mlp's 269,322 parameters at B = 256 (6.9e7) trained 1.12x faster alone with two threads than with one, and
#: 9x slower beside a second such run (1.05x with one thread each). ``benchmarks/threads.py`` measures it.
CROSSOVER = 3e8

_configured: dict[str, int | None] | None = None  # None: not configured (library use)


def parse(text: str, source: str) -> int:
    """A thread count given as ``text`` by ``source`` (an option or a variable): a whole number 1..1024."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_THREADS:
        raise UsageError(f"{source} must be a whole number of threads from 1 to {MAX_THREADS}, got {text!r}")
    return count


def requested(option: int | None = None) -> tuple[int | None, str]:
    """(count, who asked): ``--threads``, else ``DPBENCH_THREADS``, else ``OMP_NUM_THREADS``; (None, "automatic")
    if none is set. A bad value is refused (UsageError), before anything heavy is imported."""
    if option is not None:
        return parse(str(option), "--threads"), "--threads"
    for variable in VARIABLES:
        if os.environ.get(variable, "").strip():
            return parse(os.environ[variable].strip(), variable), variable
    return None, "automatic"


def configure(option: int | None = None, cap: int | None = None) -> None:
    """Make this process choose its threads as the ``dpbench`` command does: the requested count, or else the
    automatic one with at most ``cap`` threads (default: the cores)."""
    global _configured
    count, _ = requested(option)
    _configured = {"count": count, "cap": cap}


def automatic(parameters: int, batch_size: float, cores: int) -> int:
    """One thread below :data:`CROSSOVER` (parameters × batch size), else ``cores``."""
    return 1 if parameters * batch_size < CROSSOVER else max(1, cores)


def fit(parameters: int | None = None, batch_size: float | None = None) -> None:
    """Set PyTorch's threads for work of this size (None: not known yet, one thread) if :func:`configure`\\ d."""
    if _configured is None:
        return
    count = _configured["count"]
    if count is None:
        cores = _configured["cap"] or os.cpu_count() or 1
        count = 1 if parameters is None or batch_size is None else automatic(parameters, batch_size, cores)
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
