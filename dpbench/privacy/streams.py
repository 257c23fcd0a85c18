"""Independent random streams: every source of randomness gets its own seed, derived from (seed, purpose[, index]).

Two uses of one generator state leak one into the other: until ledger version 2 the Poisson sampler of epoch 0
was seeded with the run's seed itself, the same state as the global generator that draws the initial weights, so
the initial weights gave away which examples epoch 0's first batch held. Here a stream's seed is
``numpy.random.SeedSequence(run seed, spawn_key=(purpose code, *index))`` — NumPy's hash-based seed mixing,
meant for exactly this (independent child streams of one seed) — reduced to 64 bits. A purpose is one of
:data:`PURPOSES` (or a task's own, prefixed ``task:``), so two purposes never share a stream, and neither does one
purpose at two indices (epochs, trials).

A seed that must stay secret (the coins of a random-stopping study, Papernot & Steinke's K among them; a run with
``--secret-seed``) comes from the operating system's entropy: :func:`secret_seed`.
"""
from __future__ import annotations

import hashlib
import secrets

import numpy as np
import torch

from dpbench.checks import MAX_SEED

#: Every purpose the engine draws for, with what it drives. Tasks may add their own as ``task:<name>``.
PURPOSES = {
    "init": "the global torch generator while the task builds its model (initial weights)",
    "data": "the global torch generator while the task loads its data (a plugin task's own draws)",
    "training": "the global torch generator during training (dropout; anything a model draws without a generator)",
    "numpy-global": "NumPy's legacy global generator (np.random.*) for the whole run",
    "python-global": "Python's random module for the whole run",
    "sampler": "the batch sampler, one stream per epoch (index: epoch; and rank, in multi-process runs)",
    "gradient-noise": "the Gaussian noise of the gradient releases (the Philox key, or PyTorch's generator)",
    "augmentation": "a task's random data augmentation (Task.rng)",
    "dp-pca": "the noise of a task's DP-PCA release",
    "release-permutation": "output perturbation's permutation of the training rows",
    "output-noise": "the output noise of output perturbation and AMP",
    "objective-noise": "AMP's noise on the linear term of the objective",
    "tuning-k": "the number of trials K of a random-stopping study (of the study's secret)",
    "tuning-split": "the coins that hold out a study's validation part (of its public split seed)",
    "tuning-trial": "a trial's run seed (of the study's secret; index: trial number)",
    "tuning-search": "a trial's hyperparameter draw (of the study's secret; index: trial number)",
    "score-noise": "the noise on a trial's validation count (of the study's secret; index: trial number)",
    "validation-split": "the validation track's held-out part of the training data",
    "federated-split": "which images a federated run assigns at random to which client (dpbench.federated.experiment)",
    "client-batches": "a federated run's local batches: every client's permutation of its data (index: round)",
    "validation-search": "the validation track's draws of configurations",
    "validation-trial": "a validation-track trial's run seed (index: trial number)",
    "audit-inclusion": "the audit's coin per canary: in the training data with probability 1/2 (dpbench.trust.audit)",
    "audit-canaries": "the audit's canary rows and their wrong labels (dpbench.trust.canaries)",
}


def _code(purpose: str) -> int:
    if purpose not in PURPOSES and not purpose.startswith("task:"):
        raise ValueError(f"unknown random stream purpose {purpose!r}; add it to dpbench.privacy.streams.PURPOSES")
    return int.from_bytes(hashlib.sha256(purpose.encode()).digest()[:4], "little")


def secret_seed() -> int:
    """A run or study seed (0 ≤ seed ≤ 2⁶³ − 1) from the operating system's entropy (``secrets``): a function of
    nothing published."""
    return secrets.randbelow(MAX_SEED + 1)


def derive(seed: int, purpose: str, *index: int) -> int:
    """The 64-bit seed of stream ``purpose`` (at ``index``) of run seed ``seed`` (0 ≤ seed ≤ 2⁶³ − 1)."""
    if not 0 <= seed <= MAX_SEED or any(i < 0 for i in index):
        raise ValueError(f"seeds and indices must be non-negative integers below 2^63, got {seed}, {index}")
    words = np.random.SeedSequence(seed, spawn_key=(_code(purpose), *index)).generate_state(2, np.uint32)
    return int(words[0]) | int(words[1]) << 32


def child_seed(seed: int, purpose: str, *index: int) -> int:
    """A run seed (63 bits, as ``dpbench run --seed`` takes) for a run made on behalf of ``seed`` (a tuning trial)."""
    return derive(seed, purpose, *index) >> 1


def generator(seed: int, purpose: str, *index: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator on the stream ``purpose`` (at ``index``) of ``seed``."""
    return torch.Generator(device=device).manual_seed(derive(seed, purpose, *index))


def numpy_generator(seed: int, purpose: str, *index: int) -> np.random.Generator:
    """A NumPy generator on the stream ``purpose`` (at ``index``) of ``seed``."""
    return np.random.default_rng(derive(seed, purpose, *index))


def seed_globals(seed: int, purpose: str) -> None:
    """Seed torch's global generator with stream ``purpose`` of ``seed`` (e.g. ``init`` before a model is built)."""
    torch.manual_seed(derive(seed, purpose))


def seed_run(seed: int) -> None:
    """NumPy's and Python's global generators on their own streams, for code that draws from them unasked."""
    import random

    random.seed(derive(seed, "python-global"))
    np.random.seed(derive(seed, "numpy-global") % 2**32)
