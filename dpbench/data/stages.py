"""Progress of a run that prepares in stages (issue 17): the ``cifar10`` task's first run decodes the images,
pretrains convolutions, extracts features and only then trains privately. Each stage's bar is labelled
``stage k/n`` and shows, besides its own ETA, an estimate for all the stages left (``all ≈ m:ss``).

The estimate converts each stage's work into one unit, a forward pass of one image through the network being prepared,
with fixed relative costs (``COST``, measured once on a 2-core CPU: decoding a 32x32 JPEG took 0.11 ms, a forward pass
0.9 ms, a pretraining step 1.2 ms per image with augmentation), and divides the units left by the rate measured so far
in this run. It is an estimate, labelled as one; the private training stage, last, has Lightning's own bar, whose ETA is
then the run's.

A stage that a cache makes unnecessary is not planned. Code that can run inside a plan or alone (e.g. a dataset
loader) names its stage with :func:`label` and reports work with :func:`advance`; both do nothing outside a plan.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

#: Relative cost of one item of work, in forward passes of one image (see the module docstring).
COST = {"decode": 0.12, "forward": 1.0, "train": 1.3}


@dataclass
class Plan:
    """Stages in order: ``(name, items, kind)`` with ``kind`` a key of ``COST``; the final training stage is
    named by ``training`` (its cost is not estimated here)."""
    stages: list[tuple[str, int, str]]
    training: str = "private training"
    started: float = field(default_factory=time.perf_counter)
    done_units: float = 0.0  # over all stages so far
    current: int = 0  # index of the stage under way
    done_units_in_current: float = 0.0

    @property
    def count(self) -> int:
        return len(self.stages) + 1

    def drop(self, name: str) -> None:
        """Remove a stage found unnecessary (cached) once the data it depends on is known."""
        names = [stage[0] for stage in self.stages]
        if name in names and names.index(name) >= self.current:
            del self.stages[names.index(name)]

    def units_left(self) -> float:
        left = sum(items * COST[kind] for _, items, kind in self.stages[self.current:])
        return max(0.0, left - self.done_units_in_current)

    def eta(self) -> str:
        elapsed = time.perf_counter() - self.started
        if self.done_units <= 0 or elapsed <= 0:
            return "all ≈ ?"
        seconds = self.units_left() * elapsed / self.done_units
        return f"all ≈ {int(seconds // 60)}:{int(seconds % 60):02d}"


_ACTIVE: contextvars.ContextVar[Plan | None] = contextvars.ContextVar("dpbench_stages", default=None)


@contextlib.contextmanager
def planned(stages: list[tuple[str, int, str]], training: str = "private training") -> Iterator[Plan]:
    """Run the preparation stages under a plan; on leaving, announce the training stage (``stage n/n``)."""
    plan = Plan([stage for stage in stages if stage[1] > 0], training)
    token = _ACTIVE.set(plan)
    try:
        yield plan
    finally:
        _ACTIVE.reset(token)
    if plan.stages:
        print(f"stage {plan.count}/{plan.count}: {training}", file=sys.stderr, flush=True)


def label(name: str) -> str:
    """``name`` as the bar of the current stage shows it: ``stage k/n: name`` inside a plan, ``name`` outside.
    Naming another stage than the current one moves the plan to it."""
    plan = _ACTIVE.get()
    if plan is None:
        return name
    for index, (stage, _, _) in enumerate(plan.stages):
        if stage == name:
            if index != plan.current:  # a stage may open several bars (train and test images): one count
                plan.current, plan.done_units_in_current = index, 0.0
            return f"stage {index + 1}/{plan.count}: {name}"
    return name


def advance(items: int = 1, bar=None) -> None:
    """Count ``items`` of the current stage's work done; with ``bar`` (tqdm), show the estimate for all stages."""
    plan = _ACTIVE.get()
    if plan is None or not plan.stages:
        return
    units = items * COST[plan.stages[plan.current][2]]
    plan.done_units += units
    plan.done_units_in_current += units
    if bar is not None:
        bar.set_postfix_str(plan.eta(), refresh=False)


def eta() -> str:
    """The estimate for all stages left (``all ≈ m:ss``), or "" outside a plan."""
    plan = _ACTIVE.get()
    return plan.eta() if plan is not None and plan.stages else ""
