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


def _whole(value: Any) -> bool:
    """A Python int (a float such as 64.0 trains, but its record states a float that verify refuses: a fractional
    epochs would undercount a banded run's participations)."""
    return isinstance(value, int) and not isinstance(value, bool)


#: The values a hyperparameter of each of these names may take, whichever method or task it belongs to (a method
#: checks its other ones itself): what it must be, and the test.
RANGES = {
    "lr": ("a number > 0", lambda v: v > 0),
    "clip": ("a number > 0", lambda v: v > 0),
    "momentum": ("a number in [0, 1)", lambda v: 0 <= v < 1),
    "weight_decay": ("a number >= 0", lambda v: v >= 0),
    "epochs": ("a whole number >= 1", lambda v: _whole(v) and v >= 1),
    "batch_size": ("a whole number >= 1", lambda v: _whole(v) and v >= 1),
}


def check_hyperparameter(key: str, value: Any) -> None:
    """``value`` finite and, for a key of :data:`RANGES`, in its range."""
    check_finite(key, value)
    if key in RANGES and isinstance(value, (int, float)):
        kind, valid = RANGES[key]
        if isinstance(value, bool) or not valid(value):
            raise UsageError(f"{key} must be {kind}, got {value!r}")


def check_setting(key: str, text: str) -> None:
    """A ``--set key=value`` of a key in :data:`RANGES`, where the value reads as a number (the engine parses the
    rest as the type of the default it replaces)."""
    if key in RANGES:
        try:
            value = int(text) if text.strip().lstrip("+-").isdigit() else float(text)
        except ValueError:
            return
        check_hyperparameter(key, value)
