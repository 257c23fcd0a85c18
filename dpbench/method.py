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

A method whose step is one release and then an update may implement :meth:`Method.update_together` instead of
``step``: the update of many runs at once, on stacked tensors (``methods/dpsgd.py``, ``dpadam.py``, ``adaclip.py``).
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch

Release = Callable[[], Any]  # list[torch.Tensor]; (list[torch.Tensor], CountRelease) for a count_release method


@dataclass(frozen=True)
class GradientMechanism:
    """What every release is: (Σ_i clip_C(t(g_i)) + N(0, σ²C²I)) / B, with B = q·n the expected batch size.

    Public facts a method may use (e.g. DP-AdamBC's bias correction); σ = 0 for non-private methods.
    """

    noise_multiplier: float
    clip: float
    expected_batch_size: float
    steps_per_epoch: int | None = None  # for epoch-based schedules
    #: σ_b of a method's count release (:attr:`Method.count_release`), else None
    count_noise_std: float | None = None

    @property
    def mean_noise_std(self) -> float:
        """Standard deviation of the noise in each coordinate of a released gradient: σC/B."""
        if self.noise_multiplier == 0:  # no noise, whatever the clip (C may be inf)
            return 0.0
        return self.noise_multiplier * self.clip / self.expected_batch_size


@dataclass(frozen=True)
class CountRelease:
    """The count release of one batch (:attr:`Method.count_release`): ``noisy_sum`` = Σ_i (1[‖g_i‖ ≤ C_t] − ½) +
    N(0, σ_b²) over the same batch as the gradient released with it, C_t that release's clip norm (Andrew et al.
    2021, Algorithm 1, with the count centred at ½ as in their Theorem 1's analysis and TF Privacy's implementation:
    each example then moves the sum by at most ½). A number, never a per-example quantity."""

    noisy_sum: float
    expected_batch_size: float

    @property
    def fraction(self) -> float:
        """b̃ = noisy_sum / B + ½, the noisy estimate of the fraction of the batch's examples whose norm was at most
        C_t (unbiased over the Poisson batch, whose expected size is B)."""
        return self.noisy_sum / self.expected_batch_size + 0.5


#: The range of a clip norm a method moves (:meth:`Method.next_clip`; the engine refuses a C_t outside it): below
#: 1e-30, σC/B and the contributions reach float32's subnormals, where they are quantized or zero; above float32's
#: largest, C_t is inf in float32, which the clipping reads as "not clipped".
MIN_CLIP = 1e-30
MAX_CLIP = float(torch.finfo(torch.float32).max)

#: The per-example scalings the engine offers (``Method.clipping``): "clip", min(1, C/‖g_i‖) (Abadi et al. 2016);
#: "automatic", C/(‖g_i‖ + γ) with γ = hp["gamma"] (Bu et al. 2022, AUTO-S). Both bound every contribution by C.
CLIPPING_RULES = ("clip", "automatic")


class Method:
    """Base class of every method. Subclasses set the class attributes, then implement :meth:`setup`
    (optimizer and state) and :meth:`step`.

    ``defaults``: the method's own hyperparameters (overridable with ``--lr`` and ``--set key=value``).
    ``private``: False for non-private baselines (exact mean gradients of the actual batch, no accounting).
    ``full_batch``: every release uses the whole training set (q = 1).
    ``releases_per_step``: noisy gradients one step consumes; an epoch has n / (releases_per_step · B) steps.
    ``default_sampler``: ``poisson`` (what the accountant assumes) or ``shuffle``.
    ``clip_to_task_bound``: instead of a chosen C, use the task's proven bound on per-example gradient norms.
    ``search_space``: what ``dpbench tune`` searches (``dpbench/tuning/tune.py``), a JSON-able dict from hyperparameter
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
    Transforms: a ``per_example_transform`` that is a ``dpbench.privacy.clipping.CoordinateAffine`` keeps the fast
    clipping path on linear and normalization layers; any other transform materializes every per-example gradient
    (the run warns once, naming it).

    Scaling, clip norm and count release, declared as data (the engine computes each from the per-example norms its
    clippers already have, on the fast path too; a method never sees a norm):

    ``clipping``: the per-example scaling, one of :data:`CLIPPING_RULES`; "automatic" scales g_i by C/(‖g_i‖ + γ)
    with γ = ``hp["gamma"]`` (finite, positive).
    ``fixed_clip``: a C the method fixes (``--set clip`` is then refused), e.g. 1 for automatic clipping, where only
    the product of C and the learning rate matters.
    ``moves_clip``: the engine reads :meth:`next_clip` before every release: the method may move C between
    releases, as a function of earlier releases only (public information). The noise follows it: σC_t/B.
    ``count_release``: each ``release()`` returns ``(gradient, CountRelease)``: with the gradient, the engine
    releases Σ_i (1[‖g_i‖ ≤ C_t] − ½) + N(0, σ_b²) on the same batch, σ_b = :meth:`count_noise_std`, and charges
    the pair as one Gaussian mechanism of noise multiplier (σ⁻² + (2σ_b)⁻²)^(−1/2) (Andrew et al. 2021, Theorem 1;
    ``dpbench.privacy.accounting.combined_noise_multiplier``), σ then being calibrated so that the pair meets the
    target ε; the record lists the count under ``extra_releases``.

    Correlated noise, declared as data (``dpbench.privacy.correlated``; the engine draws, correlates and accounts it):

    ``noise_correlation``: None (independent noise, the default) or ``banded(b)`` (``dpbench.privacy.correlated``):
    the noise of the t-th release is w_t = (C⁻¹z)_t for the b-banded square-root strategy C, z the run's Gaussian
    draws; batches come from the ``cyclic`` sampler (one random partition into P ≥ b batches, the same order every
    epoch) and the whole run is charged as one Gaussian of noise multiplier σ/(√k·‖c‖), k the epochs, under
    replace-one neighbours. :meth:`correlation` may compute it from the hyperparameters (``methods/bandmf.py``: b from
    ``hp["bands"]``). Not combined with a scaling other than "clip", a moving clip norm, a count release, several
    releases per step, batched seeds, several devices or ``--isolate`` (each refused).
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
    clipping: ClassVar[str] = "clip"
    fixed_clip: ClassVar[float | None] = None
    moves_clip: ClassVar[bool] = False
    count_release: ClassVar[bool] = False
    noise_correlation: ClassVar[Any] = None  # None, or dpbench.privacy.correlated.banded(b)

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

    @classmethod
    def count_noise_std(cls, hp: dict[str, Any], expected_batch_size: float,
                        noise_multiplier: float | None = None) -> float:
        """σ_b of the count release (:attr:`count_release`), from the hyperparameters, the expected batch size B and
        the gradient's noise multiplier σ (None where it is not known yet) only: the engine calibrates σ with it
        before the method exists (a fixed point where σ_b depends on σ)."""
        raise NotImplementedError(f"{cls.name} declares a count release but no count_noise_std")

    @classmethod
    def correlation(cls, hp: dict[str, Any]) -> Any:
        """The noise correlation of a run with hyperparameters ``hp``: :attr:`noise_correlation` unless overridden (a
        function of the hyperparameters only: the engine plans the sampler and calibrates σ with it before the method
        exists)."""
        return cls.noise_correlation

    def next_clip(self) -> float:
        """The clip norm C of the next release (read by the engine before each release when :attr:`moves_clip`): a
        function of the method's hyperparameters and of earlier releases only. The engine refuses a C that is not
        finite and positive."""
        return self.mechanism.clip

    def step(self, release: Release) -> None:
        """One step: by default one release, then :meth:`update_together` for this run alone."""
        if not type(self).has_update_together():
            raise NotImplementedError(f"{self.name}: a method implements step or update_together")
        gradient = release()
        type(self).update_together([self], [p.detach().unsqueeze(0) for p in self.params],
                                   [g.unsqueeze(0) for g in gradient])

    @classmethod
    def update_together(cls, runs: list["Method"], params: list[torch.Tensor], gradients: list[torch.Tensor]) -> None:
        """Optional, instead of :meth:`step`: the update of S runs of this method after one release each, as one
        batched computation. ``params[j]`` and ``gradients[j]`` hold the j-th parameter and release of every run
        stacked, shape (S, *shape); update ``params`` in place, and each run's state. Per-run settings come from
        ``runs[i].hp`` (:func:`per_run`), per-run state tensors stack with :func:`stacked`.

        The default :meth:`step` calls it with S = 1, so a run alone and a batch of runs (``dpbench.run.multiseed``:
        a cell's seeds, a tuning's trials) execute the same update; a Python loop over S runs' small tensors cost
        more than the batched step of a linear model.
        """
        raise NotImplementedError

    @classmethod
    def has_update_together(cls) -> bool:
        """Whether this class implements :meth:`update_together`."""
        return cls.update_together.__func__ is not Method.update_together.__func__

    @classmethod
    def batches_updates(cls) -> bool:
        """Whether runs of this class may be updated together (it implements :meth:`update_together` and keeps the
        default one-release :meth:`step`)."""
        return cls.step is Method.step and cls.releases_per_step == 1 and cls.has_update_together()

    #: Attributes that are not the method's state: the model's parameters (checkpointed with the model), and what
    #: the engine passes in, which a resumed run sets up again from the same settings.
    NOT_STATE: ClassVar[tuple[str, ...]] = ("params", "hp", "mechanism")

    def state_dict(self) -> dict[str, Any]:
        """A copy of the method's state, for resuming a run exactly (``dpbench/run/checkpoint.py``): every instance
        attribute but :attr:`NOT_STATE`. Tensors, numbers, strings, None, ``torch.optim`` optimizers and torch
        generators are captured, also inside lists, tuples and dicts (e.g. ADADP's η, Adam's moments,
        AdaCliP's m and s, DP-SGD's momentum buffers in its optimizer). An attribute of any other type raises
        TypeError: a method whose state cannot be captured is refused a checkpoint rather than resumed wrongly."""
        return {name: _capture(value, name) for name, value in vars(self).items() if name not in self.NOT_STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s copy into a method set up with the same settings (tensors in place)."""
        missing = {name for name in vars(self) if name not in self.NOT_STATE} - set(state)
        if missing:
            raise ValueError(f"{self.name}: the checkpoint lacks the method's state {sorted(missing)}")
        for name, saved in state.items():
            setattr(self, name, _restore(getattr(self, name, None), saved, name))


def _capture(value: Any, where: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, torch.optim.Optimizer):
        return copy.deepcopy(value.state_dict())
    if isinstance(value, torch.Generator):
        return value.get_state()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_capture(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {key: _capture(item, f"{where}[{key!r}]") for key, item in value.items()}
    raise TypeError(f"method attribute {where} is a {type(value).__name__}, which a checkpoint cannot capture "
                    f"(tensors, numbers, strings, None, torch optimizers and generators, and lists, tuples and "
                    f"dicts of these)")


def _restore(current: Any, saved: Any, where: str) -> Any:
    """``saved`` in place of ``current`` (the freshly set-up attribute): optimizers, generators and tensors of the
    same shape and dtype are loaded in place, so that references to them stay valid; other values are replaced."""
    if isinstance(current, torch.optim.Optimizer):
        current.load_state_dict(saved)
        return current
    if isinstance(current, torch.Generator):
        current.set_state(saved)
        return current
    if isinstance(current, torch.Tensor) and isinstance(saved, torch.Tensor) and \
            (saved.shape, saved.dtype) == (current.shape, current.dtype):
        with torch.no_grad():
            current.copy_(saved)
        return current
    if isinstance(current, (list, tuple)) and isinstance(saved, list) and len(saved) == len(current):
        restored = [_restore(item, value, f"{where}[{i}]") for i, (item, value) in enumerate(zip(current, saved))]
        if isinstance(current, list):
            current[:] = restored
            return current
        return tuple(restored)
    if isinstance(current, dict) and isinstance(saved, dict) and set(saved) == set(current):
        for key, value in saved.items():
            current[key] = _restore(current[key], value, f"{where}[{key!r}]")
        return current
    return saved


class ReleaseMethod(Method):
    """Base class of the methods outside the gradient mould: output and objective perturbation.

    Such a method never sees a noisy gradient. ``dpbench.release.mechanisms`` (the engine's release mechanisms) clips
    the training inputs to the norm the method declares, runs the method's non-private computation, draws every noise
    vector and charges the privacy from the sensitivity or constants the method declares. Subclass
    ``dpbench.release.mechanisms.OutputPerturbationMethod`` or
    ``dpbench.release.mechanisms.ObjectivePerturbationMethod``.
    """

    def __init__(self, hyperparameters: dict[str, Any]):
        self.hp = hyperparameters
        self.setup()


def per_run(values: list[float], like: torch.Tensor) -> torch.Tensor:
    """One number per run as a column (S, 1, ..., 1) that broadcasts against ``like`` (S, *shape), in its dtype
    (read-only: the same settings give the same tensor, so that a step does not build it again)."""
    return _column(tuple(values), like.dtype, like.dim())


@functools.lru_cache(maxsize=1024)
def _column(values: tuple[float, ...], dtype: torch.dtype, dim: int) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).view(-1, *[1] * (dim - 1))


def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One (S, *shape) tensor whose i-th row *is* ``tensors[i]`` (one run's state or parameter), for
    :meth:`Method.update_together` to update in place.

    Free when the S tensors are already the consecutive rows of one block of memory (after a first call);
    otherwise they are copied into a new tensor and each is pointed at its row (``Tensor.data``), so that every
    reference to them (the run's state, the model's parameters) stays valid.
    """
    first = tensors[0]
    rows, size = len(tensors), first.numel() * first.element_size()
    start = first.data_ptr()
    if (first.is_contiguous() and first.storage_offset() == 0 and first.untyped_storage().nbytes() == rows * size
            and [t.data_ptr() for t in tensors] == list(range(start, start + rows * size, size))
            and all(t.shape == first.shape and t.is_contiguous() for t in tensors)):
        return first.detach().new_empty(0).set_(first.untyped_storage(), 0, (rows, *first.shape))
    together = torch.stack([t.detach() for t in tensors])
    for tensor, row in zip(tensors, together):
        tensor.data = row
    return together


def apply_gradient(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], gradient: list[torch.Tensor]):
    """One step of a ``torch.optim`` optimizer along ``gradient`` (e.g. the released noisy gradient)."""
    for param, g in zip(params, gradient):
        param.grad = g
    optimizer.step()
