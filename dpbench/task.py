"""The task contract: a PyTorch Lightning module with a model, a per-example loss, metrics and its data.

A task family is one file in ``tasks/``; every concrete subclass of :class:`Task` with a ``name`` is a task.
The engine trains it privately; the task never sees how batches are sampled or gradients are released.
"""
from __future__ import annotations

from typing import Any, ClassVar

import dp_accounting
import pytorch_lightning as pl
import torch
from torch import nn

from dpbench.data.taskdata import TaskData
from dpbench.privacy import streams


class Task(pl.LightningModule):
    """Base class of every task.

    Subclasses set ``name`` and ``description`` and implement :meth:`load_data`, :meth:`build_model`,
    :meth:`per_example_loss` and :meth:`per_example_metrics`. ``defaults`` holds the task's hyperparameters
    (``epochs``, ``batch_size``, ``clip``, ``lr``, ``epsilon``...); ``method_defaults`` overrides them per method.
    Keyword options (``dpbench run --set key=value`` for keys in ``options``) reach ``__init__``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    defaults: ClassVar[dict[str, Any]] = {}
    method_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    options: ClassVar[dict[str, Any]] = {}
    #: The validation track's lists, shared by every method (``dpbench.tuning.validation``): ``epochs`` and
    #: ``batch_size`` for minibatch methods, ``steps`` (full-batch steps, their epochs) for full-batch ones. Empty: the
    #: defaults.
    search_lists: ClassVar[dict[str, list[int]]] = {}
    #: Named settings (``dpbench run --profile NAME``), applied over the defaults and under the command line:
    #: hyperparameters and options for every method, per-method ones under ``"methods"``, and a default budget
    #: (``epsilon`` or ``noise_multiplier``, ``delta``). Deep tasks have ``paper`` (the seed paper's setting) and
    #: ``smoke`` (end to end on a CPU in under a minute).
    profiles: ClassVar[dict[str, dict[str, Any]]] = {}
    #: A lower bound on the training examples with the default options (a literal: ``dpbench.catalog`` reads it from
    #: the file, so that the command line refuses δ ≥ 1/n before importing PyTorch); None: not stated. The engine
    #: checks it against the data of every run with the default options.
    min_train_examples: ClassVar[int | None] = None

    def __init_subclass__(cls, **kwargs: Any):
        """``options``, ``defaults`` and ``method_defaults`` (method by method) merge along the class hierarchy: a
        subclass states what it adds or changes. (A plugin's subclass of Adult that set ``options`` dropped Adult's
        ``bias`` and failed with ``KeyError: 'bias'`` at model build; issue 34.)"""
        super().__init_subclass__(**kwargs)
        for attribute in ("options", "defaults", "method_defaults"):
            merged: dict[str, Any] = {}
            for values in [getattr(base, attribute, {}) for base in reversed(cls.__bases__)] + \
                    [cls.__dict__.get(attribute, {})]:
                for key, value in values.items():
                    nested = attribute == "method_defaults" and isinstance(merged.get(key), dict)
                    merged[key] = {**merged[key], **value} if nested else value
            setattr(cls, attribute, merged)

    def __init__(self, **options: Any):
        super().__init__()
        unknown = set(options) - set(self.options)
        if unknown:
            raise ValueError(f"task {self.name} has no option {sorted(unknown)}; options: {sorted(self.options)}")
        self.settings = {**self.options, **options}
        self.data: TaskData | None = None
        self.model: nn.Module | None = None
        self.seed = 0
        self._generators: dict[str, torch.Generator] = {}

    def prepare(self, seed: int = 0) -> TaskData:
        """Load the data and build the model for run seed ``seed`` (call once). Each phase draws from its own
        stream (:mod:`dpbench.privacy.streams`): the global generator is seeded with stream ``data`` before
        :meth:`load_data` and with stream ``init`` before :meth:`build_model`."""
        self.seed, self._generators = seed, {}
        streams.seed_globals(seed, "data")
        self.data = self.load_data()
        streams.seed_globals(seed, "init")
        self.model = self.build_model(self.data)
        return self.data

    @classmethod
    def private_release_events(cls, settings: dict[str, Any]) -> tuple[dp_accounting.DpEvent, ...]:
        """The events of what :meth:`load_data` releases privately from the training data under the options
        ``settings`` (``TaskData.private_releases``, e.g. DP-PCA), known from the options alone: the engine refuses a
        run whose data released others, and ``dpbench verify`` recomputes a built-in task's from a record's options.
        None by default."""
        return ()

    def rng(self, purpose: str) -> torch.Generator:
        """The task's own CPU generator for ``purpose`` (e.g. ``augmentation``, ``dp-pca``, or ``task:NAME``),
        on a stream of the run seed that nothing else draws from; the same object on every call of a run."""
        if purpose not in self._generators:
            self._generators[purpose] = streams.generator(self.seed, purpose)
        return self._generators[purpose]

    def generator_states(self) -> dict[str, torch.Tensor]:
        """The states of the generators :meth:`rng` handed out, by purpose (for resuming a run exactly)."""
        return {purpose: generator.get_state() for purpose, generator in self._generators.items()}

    def load_generator_states(self, states: dict[str, torch.Tensor]) -> None:
        for purpose, state in states.items():
            self.rng(purpose).set_state(state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        """Random data augmentation of a training batch, example by example (e.g. crop and flip); none by default.

        It must treat each example independently (the engine applies it before per-example clipping) and draw from
        ``self.rng("augmentation")``."""
        return x

    def gradient_norm_bound(self) -> float | None:
        """A proven, data-independent bound on every per-example gradient norm, or None where there is none."""
        return None

    # --- to implement -------------------------------------------------------------------------------------
    def load_data(self) -> TaskData:
        raise NotImplementedError

    def build_model(self, data: TaskData) -> nn.Module:
        raise NotImplementedError

    def per_example_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Loss of each example, shape ``(batch,)``; the training objective is its mean."""
        raise NotImplementedError

    def per_example_metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Metric values per example, averaged over the test set by the engine (e.g. ``accuracy``, ``loss``)."""
        raise NotImplementedError


class Classification(Task):
    """A classifier: logistic loss on one output for 2 classes, softmax cross-entropy on K outputs for K > 2.

    Subclasses set ``classes`` (in :meth:`build_model`, or as a class attribute where the number of classes is a
    public fact of the task: ``dpbench verify`` derives the one-vs-all classifiers of a release method from it).
    Metrics: ``accuracy`` and ``loss``.
    """

    classes: int

    def per_example_loss(self, outputs, targets):
        if self.classes == 2:
            return nn.functional.binary_cross_entropy_with_logits(
                outputs.squeeze(-1), targets.to(outputs.dtype), reduction="none")
        return nn.functional.cross_entropy(outputs, targets, reduction="none")

    def per_example_metrics(self, outputs, targets):
        predicted = (outputs.squeeze(-1) > 0).long() if self.classes == 2 else outputs.argmax(-1)
        return {"accuracy": (predicted == targets).float(), "loss": self.per_example_loss(outputs, targets)}
