"""Search spaces: the JSON form methods declare (``Method.search_space``) and ``--search-space FILE`` gives, read
into Optuna distributions, and drawn from.

An entry is ``{"type": "float", "low": a, "high": b, "log": true}``, ``{"type": "int", "low": a, "high": b}`` or
``{"type": "categorical", "choices": [...]}``; a space maps hyperparameter names to entries.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import optuna

from dpbench.errors import UsageError
from dpbench.privacy import streams

Space = dict[str, dict[str, Any]]


def distribution(name: str, entry: dict[str, Any]) -> optuna.distributions.BaseDistribution:
    kind = entry.get("type")
    try:
        if kind == "float":
            return optuna.distributions.FloatDistribution(entry["low"], entry["high"], log=entry.get("log", False))
        if kind == "int":
            return optuna.distributions.IntDistribution(entry["low"], entry["high"], log=entry.get("log", False))
        if kind == "categorical":
            return optuna.distributions.CategoricalDistribution(entry["choices"])
    except (KeyError, ValueError, TypeError) as error:
        raise UsageError(f"search space entry {name!r}: {error}") from None
    raise UsageError(f"search space entry {name!r}: type must be float, int or categorical, got {kind!r}")


def distributions(space: Space) -> dict[str, optuna.distributions.BaseDistribution]:
    return {name: distribution(name, entry) for name, entry in space.items()}


def load_search_space(path: str) -> Space:
    try:
        space = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read the search space {path}: {error}") from None
    if not isinstance(space, dict) or not all(isinstance(v, dict) for v in space.values()):
        raise UsageError(f"{path}: a search space is a JSON object of name -> {{type, low, high[, log]}} or "
                         f"{{type: categorical, choices}}")
    return space


def suggest(trial: optuna.Trial, found: dict[str, optuna.distributions.BaseDistribution]) -> dict[str, Any]:
    """The trial's draw of every distribution (its sampler decides how)."""
    params = {}
    for name, dist in found.items():
        if isinstance(dist, optuna.distributions.FloatDistribution):
            params[name] = trial.suggest_float(name, dist.low, dist.high, log=dist.log)
        elif isinstance(dist, optuna.distributions.IntDistribution):
            params[name] = trial.suggest_int(name, dist.low, dist.high, log=dist.log)
        else:
            params[name] = trial.suggest_categorical(name, dist.choices)
    return params


def spread_draws(space: Space, count: int, seed: int, purpose: str) -> list[dict[str, Any]]:
    """``count`` configurations that cover ``space`` evenly: a scrambled Sobol sequence (SciPy's ``qmc.Sobol``, seeded
    from stream ``purpose`` of ``seed``) mapped to each entry — log-uniform or uniform floats, integers, and
    categorical choices in equal shares. The validation track's draws: 16 independent random draws of a space of
    four or five dimensions leave large holes (on adult, 14 of DP-GD's 16 random draws learned nothing), and no
    trial can learn what it is not given. Written here because Optuna's QMCSampler infers its space from finished
    trials, which these draws precede."""
    if not space:
        return [{}] * count
    from scipy.stats import qmc

    names = sorted(space)
    found = distributions(space)
    sobol = qmc.Sobol(len(names), scramble=True, seed=streams.derive(seed, purpose) % 2**32)
    with warnings.catch_warnings():  # a count not a power of 2 (the grid's 16 is) loses Sobol's balance, not its spread
        warnings.filterwarnings("ignore", "The balance properties of Sobol", UserWarning)
        points = sobol.random(count)
    drawn = []
    for point in points:
        params = {}
        for name, u in zip(names, point):
            dist = found[name]
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                params[name] = dist.choices[min(int(u * len(dist.choices)), len(dist.choices) - 1)]
            elif dist.log:
                value = dist.low * (dist.high / dist.low) ** u
                params[name] = min(int(value), dist.high) if isinstance(dist, optuna.distributions.IntDistribution) \
                    else float(value)
            elif isinstance(dist, optuna.distributions.IntDistribution):
                params[name] = min(dist.low + int(u * (dist.high - dist.low + 1)), dist.high)
            else:
                params[name] = float(dist.low + u * (dist.high - dist.low))
        drawn.append({name: params[name] for name in space})
    return drawn


def draws(space: Space, count: int, seed: int, purpose: str) -> list[dict[str, Any]]:
    """``count`` independent draws from ``space`` (Optuna's RandomSampler on stream ``purpose`` of ``seed``)."""
    if not space:
        return [{}] * count
    found = distributions(space)
    sampler = optuna.samplers.RandomSampler(seed=streams.derive(seed, purpose) % 2**32)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(sampler=sampler, direction="maximize")
        return [study.ask(found).params for _ in range(count)]
