"""Every draw of a built-in method's search space is a run the engine accepts.

A draw the engine refuses is a failed trial, and it still counts: in a random-stopping study of K = 1 it is the whole
study, which then releases nothing (output perturbation's η ∈ [0.001, 1] with L ∈ [0.1, 10] broke the stability
condition η ≤ 8/L² in a corner of its space, and with secret search draws `test_sweep`'s random-stopping cell failed
at random). The constraints found so far are monotone in each hyperparameter, so the corners of the float ranges
(with every categorical choice) are where a refused region shows first.
"""
import itertools
from dataclasses import replace

import pytest

from dpbench import registry
from dpbench.errors import UsageError
from dpbench.run import planning
from dpbench.spec import RunSpec
from dpbench.tuning.validation import search_space

METHODS = registry.methods(installed=False)


def _corners(space: dict) -> list[dict]:
    axes = []
    for name, entry in sorted(space.items()):
        values = entry["choices"] if entry["type"] == "categorical" else [entry["low"], entry["high"]]
        axes.append([(name, value) for value in values])
    return [dict(combination) for combination in itertools.product(*axes)]


def _banded(method) -> bool:
    """``bandmf`` refuses batch sizes that leave fewer than b batches per epoch, which depends on the task's n: a wasted
    trial of the uncharged validation track (which searches the batch size), tested in tests/test_correlated.py;
    private modes fix the batch size (``dpbench.tuning.plan.MECHANISM_KEYS``) and refuse such a plan before any
    trial."""
    return getattr(method.correlation({**getattr(method, "defaults", {})}), "bands", 0) > 1


# dpbench tune takes each in a private mode, where a refused draw is a trial that counts
@pytest.mark.parametrize("name", sorted(name for name, method in METHODS.items() if not _banded(method)))
def test_every_corner_of_a_builtin_search_space_is_accepted(name):
    method, task = METHODS[name], registry.tasks(installed=False)["breast_cancer"]
    spec = RunSpec(method=name, task="breast_cancer", epsilon=1.0 if method.private else None, seed=0)
    refused = []
    for corner in _corners(search_space(method, task)):
        try:
            planning.describe_record(replace(spec, overrides=corner))
        except UsageError as error:
            refused.append(f"{corner}: {error}")
    assert not refused, f"{len(refused)} corners refused, e.g. {refused[0]}"
