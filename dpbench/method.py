"""The method contract: turn released gradients into parameter updates.

A method is one file in ``methods/`` with a subclass of :class:`Method`. The engine owns sampling, clipping,
noise and accounting; a method receives a ``release`` callable and may call it at most
``releases_per_step`` times per step. Each call returns, for the current parameter values, the engine's noisy
gradient estimate (private methods: (Σ clipped per-example gradients + N(0, σ²C²)) / (q·n)) as one tensor per
trainable parameter. A method cannot touch the data any other way, so it cannot spend privacy that the ledger
does not see: the ledger charges every batch the sampler draws, whether the method uses it or not.

Minimal example (``methods/dpsgd.py``)::

    class DPSGD(Method):
        name = "dpsgd"
        description = "DP-SGD (Abadi et al. 2016): clip, add Gaussian noise, SGD step"
        defaults = {"lr": 0.1, "momentum": 0.0}

        def setup(self):
            self.optimizer = torch.optim.SGD(self.params, lr=self.hp["lr"], momentum=self.hp["momentum"])

        def step(self, release):
            apply_gradient(self.optimizer, self.params, release())
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch

Release = Callable[[], list[torch.Tensor]]


@dataclass(frozen=True)
class GradientMechanism:
    """What every release is: (Σ_i clip_C(t(g_i)) + N(0, σ²C²I)) / B, with B = q·n the expected batch size.

    Public facts a method may use (e.g. DP-AdamBC's bias correction); σ = 0 for non-private methods.
    """

    noise_multiplier: float
    clip: float
    expected_batch_size: float
    steps_per_epoch: int | None = None  # for epoch-based schedules

    @property
    def mean_noise_std(self) -> float:
        """Standard deviation of the noise in each coordinate of a released gradient: σC/B."""
        if self.noise_multiplier == 0:  # no noise, whatever the clip (C may be inf)
            return 0.0
        return self.noise_multiplier * self.clip / self.expected_batch_size


class Method:
    """Base class of every method. Subclasses set the class attributes, then implement :meth:`setup`
    (optimizer and state) and :meth:`step`.

    ``defaults``: the method's own hyperparameters (overridable with ``--lr`` and ``--set key=value``).
    ``private``: False for non-private baselines (exact mean gradients of the actual batch, no accounting).
    ``full_batch``: every release uses the whole training set (q = 1).
    ``releases_per_step``: noisy gradients one step consumes; an epoch has n / (releases_per_step · B) steps.
    ``default_sampler``: ``poisson`` (what the accountant assumes) or ``shuffle``.
    ``clip_to_task_bound``: instead of a chosen C, use the task's proven bound on per-example gradient norms.
    ``search_space``: what ``dpbench tune`` searches (``dpbench/tuning.py``), a JSON-able dict from hyperparameter
    name to ``{"type": "float", "low": a, "high": b, "log": true}``, ``{"type": "int", "low": a, "high": b}`` or
    ``{"type": "categorical", "choices": [...]}``; ``dpbench tune --search-space FILE`` replaces it. The
    hyperparameters outside it keep their resolved values (task defaults, ``--set``). The leaderboard's validation
    track draws every method's trials from it, plus the task's shared epochs and batch sizes.
    ``paper``: a link shown on the leaderboard beside ``description``.

    What a method sees. ``self.params``: the model's trainable parameters, in order. ``self.hp``: the method's
    ``defaults`` merged with the engine's (``epochs``, ``batch_size`` — for a full-batch method the training set
    size — and ``clip`` C, absent for non-private methods), the task's defaults and per-method defaults, the
    profile and the command line; values given with ``--set`` arrive as the type of the default they replace, as
    strings where the default is None. ``self.mechanism`` (:class:`GradientMechanism`): the noise multiplier σ
    (0 for non-private methods), the clip C, the expected batch size B = q·n, the steps per epoch, and
    ``mean_noise_std`` σC/B, the standard deviation of each coordinate of a release's noise.
    Transforms: a ``per_example_transform`` that is a ``dpbench.clipping.CoordinateAffine`` keeps the fast
    clipping path on linear and normalization layers; any other transform materializes every per-example gradient
    (the run warns once, naming it).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    paper: ClassVar[str | None] = None  # a link to the method's paper, shown on the leaderboard
    defaults: ClassVar[dict[str, Any]] = {}
    private: ClassVar[bool] = True
    full_batch: ClassVar[bool] = False
    releases_per_step: ClassVar[int] = 1
    default_sampler: ClassVar[str] = "poisson"
    clip_to_task_bound: ClassVar[bool] = False
    search_space: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init__(self, params: list[torch.nn.Parameter], hyperparameters: dict[str, Any],
                 mechanism: GradientMechanism):
        self.params = params
        self.hp = hyperparameters
        self.mechanism = mechanism
        self.setup()

    def setup(self) -> None:
        """Create optimizers and state from ``self.params`` and ``self.hp``; raise ValueError on bad values."""

    def per_example_transform(self, gradients: list[torch.Tensor]) -> list[torch.Tensor]:
        """Map per-example gradients (one tensor per parameter, batch first) before clipping; identity here.

        Only a public function of the method's own state (e.g. AdaCliP's (g − m)/b) belongs here: the engine
        clips its output to norm C and adds the noise, so the privacy guarantee does not depend on it.
        """
        return gradients

    def step(self, release: Release) -> None:
        raise NotImplementedError


class ReleaseMethod(Method):
    """Base class of the methods outside the gradient mould: output and objective perturbation.

    Such a method never sees a noisy gradient. ``dpbench.release`` (the engine's release mechanisms) clips the
    training inputs to the norm the method declares, runs the method's non-private computation, draws every noise
    vector and charges the privacy from the sensitivity or constants the method declares. Subclass
    ``dpbench.release.OutputPerturbationMethod`` or ``dpbench.release.ObjectivePerturbationMethod``.
    """

    def __init__(self, hyperparameters: dict[str, Any]):
        self.hp = hyperparameters
        self.setup()


def apply_gradient(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], gradient: list[torch.Tensor]):
    """One step of a ``torch.optim`` optimizer along ``gradient`` (e.g. the released noisy gradient)."""
    for param, g in zip(params, gradient):
        param.grad = g
    optimizer.step()
