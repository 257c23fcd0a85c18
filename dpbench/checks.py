"""Checks of a run's request that need no data and no PyTorch: the command line applies them before it imports
the engine (so that bad input is refused at once), and the engine applies them again for every caller."""
from __future__ import annotations

import math
from typing import Any

from dpbench.errors import UsageError

MAX_SEED = 2**63 - 1  # seeds are 63-bit (dpbench.privacy.streams derives 64-bit stream seeds from them)


def check_seed(seed: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UsageError(f"seed must be a whole number from 0 to 2^63 - 1, got {seed}")


def check_budget(epsilon: float | None, noise_multiplier: float | None, delta: float | None) -> None:
    """ε and σ finite and positive, δ in (0, 1), where given."""
    if epsilon is not None and noise_multiplier is not None:
        raise UsageError("give either --epsilon or --noise-multiplier, not both")
    if epsilon is not None and not (math.isfinite(epsilon) and epsilon > 0):
        raise UsageError(f"epsilon must be a finite number > 0, got {epsilon}")
    if noise_multiplier is not None and not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise UsageError(f"noise multiplier must be a finite number > 0, got {noise_multiplier}")
    if delta is not None and not 0 < delta < 1:
        raise UsageError(f"delta must lie in (0, 1), got {delta}")


def check_finite(key: str, value: Any) -> None:
    """A hyperparameter given as a float must be finite (NaN would train on NaN, infinity with infinite noise)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{key} must be a finite number, got {value}")
