"""Progress: of a run that prepares in stages (issue 17), and off a terminal (issue 35).

The ``cifar10`` task's first run decodes the images, pretrains convolutions, extracts features and only then trains
privately. Each stage's bar is labelled ``stage k/n`` and shows, besides its own ETA, an estimate for all the
stages left, the private training included (``all ≈ m:ss``).

The estimate converts each stage's work into one unit, a forward pass of one image through the network being
prepared, with fixed relative costs (``COST``, measured once on a 2-core CPU: decoding a 32x32 JPEG took 0.11 ms,
a forward pass 0.9 ms, a pretraining step 1.2 ms per image with augmentation, and the private training of
``cifar10``'s head 0.12 ms per example and epoch: 95 s for 20 epochs of 40,000 at commit 7090732), and divides the
units left by the rate measured so far in this run. It is an estimate, labelled as one. The private training, last,
has Lightning's own bar, whose ETA is then the run's; the engine tells the plan its epochs (:func:`training_epochs`).

A stage that a cache makes unnecessary is not planned. Code that can run inside a plan or alone (e.g. a dataset
loader) names its stage with :func:`label` and reports work with :func:`advance`; both do nothing outside a plan.

Off a terminal (a log file, a CI job, a sweep's worker), a bar's redrawn line would be one endless line or nothing
at all: :func:`bar` then gives :class:`Lines`, which prints a whole line every ``DPBENCH_PROGRESS_SECONDS``
(default 30) seconds instead: the stage, done/total, the rate, its ETA and the estimate for all stages left.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from dpbench.errors import UsageError

#: Relative cost of one item of work, in forward passes of one image (see the module docstring); "private": one
#: training example in one epoch of the private training.
COST = {"decode": 0.12, "forward": 1.0, "train": 1.3, "private": 0.13}
INTERVAL_VARIABLE = "DPBENCH_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 30.0


@dataclass
class Plan:
    """Stages in order: ``(name, items, kind)`` with ``kind`` a key of ``COST``; the final training stage is
    named by ``training``, and costs ``training_units`` (0 where its epochs are not known)."""
    stages: list[tuple[str, int, str]]
    training: str = "private training"
    training_units: float = 0.0
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
        return max(0.0, left - self.done_units_in_current) + self.training_units

    def eta(self) -> str:
        elapsed = time.perf_counter() - self.started
        if self.done_units <= 0 or elapsed <= 0:
            return "all ≈ ?"
        return f"all ≈ {clock(self.units_left() * elapsed / self.done_units)}"


_ACTIVE: contextvars.ContextVar[Plan | None] = contextvars.ContextVar("dpbench_stages", default=None)
_EPOCHS: contextvars.ContextVar[int | None] = contextvars.ContextVar("dpbench_training_epochs", default=None)


@contextlib.contextmanager
def training_epochs(epochs: int) -> Iterator[None]:
    """The epochs of the private training that follows the data's preparation, for the plans made meanwhile."""
    token = _EPOCHS.set(epochs)
    try:
        yield
    finally:
        _EPOCHS.reset(token)


@contextlib.contextmanager
def planned(stages: list[tuple[str, int, str]], training: str = "private training",
            training_examples: int = 0) -> Iterator[Plan]:
    """Run the preparation stages under a plan, which counts the training of ``training_examples`` for the
    :func:`training_epochs` the engine set; on leaving, announce the training stage (``stage n/n``)."""
    units = (_EPOCHS.get() or 0) * training_examples * COST["private"]
    plan = Plan([stage for stage in stages if stage[1] > 0], training, units)
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


def _plain(rate: float) -> str:
    """A rate in plain digits, three significant where it has them (never ``1.04e+03`` nor ``1e-05``)."""
    return f"{rate:.0f}" if rate >= 99.95 else f"{rate:.3g}" if rate >= 0.001 else f"{rate:.6f}".rstrip("0").rstrip(".")


def clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour."""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def interval() -> float:
    """Seconds between the lines of :class:`Lines`: ``DPBENCH_PROGRESS_SECONDS``, default 30."""
    text = os.environ.get(INTERVAL_VARIABLE, "").strip()
    if not text:
        return DEFAULT_INTERVAL
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"{INTERVAL_VARIABLE} must be a number of seconds > 0, got {text!r}")
    return seconds


def on_terminal() -> bool:
    """Whether progress (on stderr) goes to a terminal, where bars redraw their line."""
    return sys.stderr.isatty()


class Lines:
    """A progress bar off a terminal: while work goes on, one line on stderr every :func:`interval` seconds,
    ``desc: done/total unit (p%), rate unit/s, m:ss elapsed, ETA m:ss, postfix``, and one at the end if any was
    printed. Takes tqdm's calls that dpbench makes (``update``, ``set_postfix_str``, ``close``, iteration,
    ``with``)."""

    def __init__(self, iterable: Iterable | None = None, total: int | None = None, desc: str = "",
                 unit: str = "it", initial: int = 0, disable: bool = False, **_: object):
        self.iterable, self.desc, self.unit, self.disable = iterable, desc, unit, disable
        self.total = len(iterable) if total is None and hasattr(iterable, "__len__") else total
        self.n = self.initial = initial
        self.postfix = ""
        self.every = interval()
        self.started = self.last = time.perf_counter()
        self.printed = False

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update()

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            self._print(now)

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def set_postfix(self, refresh: bool = True, **values: object) -> None:
        self.postfix = ", ".join(f"{key}={value}" for key, value in values.items())

    def close(self) -> None:
        if self.printed:
            self._print(time.perf_counter(), done=True)
            self.printed = False

    def line(self, now: float, done: bool = False) -> str:
        elapsed = now - self.started
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        parts.append(f"{_plain(rate)} {self.unit}/s")
        if done:
            parts.append(f"done in {clock(elapsed)}")
        else:  # the time so far: a log of the lines then times each part of a long job (the board's breakdown)
            parts.append(f"{clock(elapsed)} elapsed")
            if self.total and rate > 0:
                parts.append(f"ETA {clock((self.total - self.n) / rate)}")
        return f"{self.desc}: {', '.join(parts + ([self.postfix] if self.postfix else []))}"

    def _print(self, now: float, done: bool = False) -> None:
        if not self.disable:
            print(self.line(now, done), file=sys.stderr, flush=True)
            self.printed = True


def bar(iterable: Iterable | None = None, **kwargs):
    """tqdm's bar on a terminal, :class:`Lines` off one (same arguments)."""
    if on_terminal():
        from tqdm.auto import tqdm

        return tqdm(iterable, **kwargs)
    return Lines(iterable, **kwargs)
