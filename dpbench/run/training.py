"""The LightningModule that trains a task privately: the only code that reads training examples.

Per step it hands the method a ``release`` callable for each of the step's batches (drawn by the engine's sampler, each
charged to the ledger when drawn): ``release()`` returns (Σ_i clip_C(t(g_i)) + N(0, σ²C²I)) / B, the noisy clipped
gradient of the next batch, with the noise from the run's stream (:mod:`dpbench.privacy.noise`) and the clipped sum from
the per-example clipper (:mod:`dpbench.privacy.ghost`, :mod:`dpbench.privacy.clipping`). The method turns releases into
updates. With several processes each rank clips its shard's examples and the releases are summed over the ranks
(:mod:`dpbench.run.distributed`).

What a method declares as data (``dpbench.method.Method``) the release computes here, from the per-example norms the
clipper returns, which never leave this module: the scaling (``clipping``: C/(‖g_i‖ + γ) for "automatic"), the clip
norm C_t of each release (``moves_clip``: the method's :meth:`~dpbench.method.Method.next_clip`, refused unless finite
and positive; the noise is σC_t/B) and the count release (``count_release``: Σ_i (1[‖g_i‖ ≤ C_t] − ½) + N(0, σ_b²)
on the same batch, its noise drawn from the run's noise stream after the gradient's).

Correlated noise (``correlation``, the method's ``noise_correlation``, :mod:`dpbench.privacy.correlated`): the release
takes the same draw z_t from the run's noise stream as independent noise would, and transforms it in place: banded,
w_t = z_t − Σ_{j=1}^{b−1} c_j w_{t−j} (so b = 1 is independent noise, draw for draw); tree, z_t is the new node's noise
and w_t = z_t − Σ of the nodes it retires (N(t) − N(t − 1)). The clipped sum is then added into w_t.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

import pytorch_lightning as pl
import torch

from dpbench.errors import PrivacyCheckFailed, UsageError
from dpbench.method import MAX_CLIP, MIN_CLIP, CountRelease, GradientMechanism, Method
from dpbench.privacy import correlated, streams
from dpbench.privacy.clipping import PerExampleClipper, Transform
from dpbench.privacy.ghost import make_clipper
from dpbench.privacy.noise import GaussianNoise
from dpbench.data import stages
from dpbench.run import distributed
from dpbench.run.isolation import IsolatedMethod
from dpbench.task import Task

#: The count release's grid (:meth:`PrivateTraining.count`): 2⁻¹⁰, a divisor of the count's sensitivity ½.
COUNT_GRID = 2.0**-10


class ProgressLines(pl.Callback):
    """Lightning's progress bar off a terminal (:class:`dpbench.data.stages.Lines`): a line every few seconds with the
    step, the epoch, the rate (test passes included) and the ETA; rank 0 only."""

    def __init__(self, label: str):
        self.label = label
        self.lines: stages.Lines | None = None

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if trainer.global_rank == 0:
            self.lines = stages.Lines(total=trainer.max_epochs * trainer.num_training_batches, desc=self.label,
                                      unit="step", initial=getattr(module, "steps", 0))

    def on_train_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if self.lines is not None:
            self.lines.set_postfix_str(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}")

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *_: Any) -> None:
        if self.lines is not None:
            self.lines.update()

    def on_train_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if self.lines is not None:
            self.lines.close()


class PrivateTraining(pl.LightningModule):
    """Trains ``task`` with ``method``; the only code that reads training examples."""

    def __init__(self, task: Task, method: type[Method], hp: dict[str, Any], noise_multiplier: float,
                 expected_batch_size: float, seed: int, clipper: PerExampleClipper | None = None,
                 steps_per_epoch: int | None = None, epsilon_so_far: Callable[[int], float] | None = None,
                 noise: str = "fast", isolate: bool = False, count_noise_std: float | None = None,
                 correlation: correlated.Banded | correlated.Tree | None = None):
        super().__init__()
        self.task, self.method_class, self.hp = task, method, hp
        self.noise_multiplier, self.expected_batch_size, self.seed = noise_multiplier, expected_batch_size, seed
        # Isolated, the method sees every release and may know the public seed (it is on the command line): the
        # noise is then keyed by a secret of this process's, never written (dpbench.run.isolation).
        self.noise_seed = streams.secret_seed() if isolate and method.private else seed
        self.noise_sampler = noise
        counts = method.private and method.count_release
        if counts and not (isinstance(count_noise_std, (int, float)) and 0 < count_noise_std < math.inf):
            raise UsageError(f"{method.name} declares a count release, whose noise std {count_noise_std!r} is not "
                             f"finite and positive")
        self.mechanism = GradientMechanism(noise_multiplier, hp.get("clip", math.inf), expected_batch_size,
                                           steps_per_epoch, count_noise_std if counts else None)
        # the engine's per-example scaling: None (Abadi's min(1, C/‖g‖)) or γ of automatic clipping
        self.gamma = hp["gamma"] if method.private and method.clipping == "automatic" else None
        self.last_clip = hp.get("clip")  # the clip norm of the latest release (the audit's observer reads it)
        self.clip_norms: dict[str, float] | None = None  # first, last, min, max of a moving clip norm
        try:  # isolated: the method runs in a process of its own (dpbench.run.isolation)
            self.method = IsolatedMethod(method, self.params(), hp, self.mechanism) if isolate else \
                method(self.params(), hp, self.mechanism)
        except ValueError as error:
            raise UsageError(f"{method.name}: {error}") from None
        self.transforms = method.per_example_transform is not Method.per_example_transform
        # banded noise's last b − 1 noise vectors, or the tree's nodes (checkpointed: dpbench.run.checkpoint)
        self.correlated = correlated.noise_state(correlation, steps_per_epoch) if method.private else None
        self.steps_per_epoch = steps_per_epoch
        if self.correlated is not None and (isolate or method.releases_per_step != 1 or not steps_per_epoch):
            raise UsageError(f"{method.name}: correlated noise needs the steps per epoch, and is not supported isolated "
                             f"or with several releases a step")
        # exact norms where the parameters are the method's choice (isolated) or where an underestimated norm is not
        # capped at C (automatic clipping scales by C/(‖g‖ + γ): a float32 ghost norm cancelled to 0 gave 12·C)
        self.clipper = clipper or (make_clipper(task.model, self.current_transform(),
                                                exact=isolate or self.gamma is not None)
                                   if method.private else None)  # isolated: norms that cannot cancel
        self.epsilon_so_far = epsilon_so_far  # for the per-epoch privacy log, when a logger is attached
        self.automatic_optimization = False
        self.releases = 0  # the ledger: every batch drawn for a private method
        self.sampled = 0  # examples in those batches, for the sampling guard (never recorded: see guards.py)
        self.steps = 0
        self.rank, self.world = 0, 1  # of a multi-process run (dpbench.run.distributed), set when training starts
        self._metric_sums: dict[str, float] = {}
        self._metric_count = 0

    def current_transform(self) -> Transform | None:
        """The method's per-example transform as of now (it may depend on the method's state)."""
        return self.method.per_example_transform if self.transforms else None

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.task.model.parameters() if p.requires_grad]

    def configure_optimizers(self):
        return None

    def on_fit_start(self):
        self.rank, self.world = distributed.world()
        self.noise = GaussianNoise(self.noise_seed, self.device, self.noise_sampler)
        streams.seed_globals(self.seed, "training")  # dropout and other unasked draws during training

    def on_train_epoch_start(self):
        # Lightning (2.x) does not set the epoch of a DataLoader's batch sampler; without this every epoch would
        # draw epoch 0's batches again, which the accountant's independent Poisson draws do not allow.
        self.trainer.train_dataloader.batch_sampler.set_epoch(self.current_epoch)
        if self.world > 1:
            self.trainer.train_dataloader.batch_sampler.shard(self.rank, self.world)

    def on_train_end(self):
        if isinstance(self.method, IsolatedMethod):
            self.method.close()
        if self.world > 1:  # the examples all ranks' batches held, for the sampling guard (rank 0 checks it)
            self.sampled = distributed.total(self.sampled)

    @torch.enable_grad()  # methods may ask for a release inside their own ``torch.no_grad()`` update
    def release(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        params = self.params()
        if not self.method_class.private:
            loss = self.task.per_example_loss(self.task(x), y).mean()
            return list(torch.autograd.grad(loss, params))
        clip = self.release_clip()
        # Several ranks: rank 0 draws the noise, the others add their clipped sums into zeros (dpbench.run.distributed).
        # (the noise of a moving clip norm's release is σC_t/B)
        into = ((self.draw_noise(params, clip) if self.method_class.moves_clip else self.draw_noise(params))
                if self.rank == 0 else [torch.zeros_like(p) for p in params])
        if self.correlated is not None:  # z_t → w_t in place (one process: refusals.check_correlation)
            into = self.correlated.apply_(into, self.steps % self.steps_per_epoch)
        noisy, norms = self.clipper.clipped_sum(self.task, x, y, clip, self.current_transform(),
                                                scale=1 / self.expected_batch_size, into=into, gamma=self.gamma)
        noisy = distributed.sum_over_ranks(noisy) if self.world > 1 else noisy
        if not self.method_class.count_release:
            return noisy
        return noisy, self.count(norms, clip)

    def check_correlated_draws(self) -> None:
        """PrivacyCheckFailed unless, with correlated noise, the noise stream advanced by one draw per charged
        release: C's row index is the step, and a release without its draw would shift every later one's."""
        if self.correlated is None:
            return
        state = self.noise.state_dict()
        if "counter" not in state:  # PyTorch's generator (the C sampler not built, or not on the CPU): opaque state
            raise PrivacyCheckFailed("correlated noise needs the counter-based Philox stream, whose position the run's "
                                     f"end checks; this run drew from {self.noise.name}")
        per_release = sum(-(-p.numel() // 4) for p in self.params()) if self.mechanism.mean_noise_std else 0
        if state["counter"] != self.releases * per_release:
            raise PrivacyCheckFailed(f"the correlated noise drew {state['counter']} counter values for "
                                     f"{self.releases} releases of {per_release}: its steps are out of line")

    def release_clip(self) -> float:
        """C of the next release: the run's clip norm, or, for a method that moves it, its :meth:`next_clip`, refused
        unless a finite positive number (a NaN or infinite C would make the sensitivity unbounded). A moving C's
        first, last, smallest and largest values are kept for the record (functions of earlier releases only)."""
        if not self.method_class.moves_clip:
            return self.hp["clip"]
        clip = self.method.next_clip()
        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not MIN_CLIP <= clip <= MAX_CLIP:
            raise PrivacyCheckFailed(f"{self.method_class.name} set the clip norm of a release to {clip!r}: a clip norm "
                                     f"must be a finite number of at least {MIN_CLIP} and at most float32's largest, "
                                     f"{MAX_CLIP:.4g}")
        clip = float(clip)
        seen = self.clip_norms
        self.clip_norms = {"first": clip, "last": clip, "min": clip, "max": clip} if seen is None else \
            {"first": seen["first"], "last": clip, "min": min(seen["min"], clip), "max": max(seen["max"], clip)}
        self.last_clip = clip
        return clip

    def count(self, norms: torch.Tensor, clip: float) -> CountRelease:
        """Σ_i (1[‖g_i‖ ≤ C] − ½) + N(0, σ_b²) over the batch whose per-example norms are ``norms`` (an example dropped
        for a norm that is not finite counts as above C: −½, within the sensitivity ½), σ_b from the mechanism, the
        noise from the run's noise stream (σ_b = 0 only in tests)."""
        below = float((norms <= clip).sum()) - len(norms) / 2
        std = self.mechanism.count_noise_std
        noise = float(self.noise.fill_(torch.empty(1), std)[0]) if std else 0.0
        # Rounded to a grid of COUNT_GRID, a divisor of ½: the half-integer count plus a float32 noise value is exact
        # in float64, so whoever knew the other examples could test which candidate count leaves a float32 value
        # (8% of releases ruled one out with certainty at q = 1; hostile review of the adaptive clipping, 26 November
        # 2026). On the grid every candidate leaves a grid value: post-processing of the Gaussian count.
        return CountRelease(round((below + noise) / COUNT_GRID) * COUNT_GRID, self.expected_batch_size)

    def draw_noise(self, like: list[torch.Tensor], clip: float | None = None) -> list[torch.Tensor]:
        """:meth:`fill_noise` of new tensors shaped like each of ``like``."""
        return self.fill_noise([torch.empty_like(t) for t in like], clip)

    def fill_noise(self, tensors: list[torch.Tensor], clip: float | None = None) -> list[torch.Tensor]:
        """Overwrite ``tensors`` with N(0, (σC/B)²I) from the run's noise stream (:mod:`dpbench.privacy.noise`): a
        release's noise, into which the clipped sum divided by B is then added, giving (Σ_i clip_C(t(g_i)) + N(0,
        σ²C²I)) / B; C is the release's ``clip`` where a method moves it. Zeros for σ = 0 (only in tests: such a run
        reports ε = inf)."""
        mechanism = self.mechanism if clip is None else replace(self.mechanism, clip=clip)
        std = mechanism.mean_noise_std
        if std == 0:
            return [t.zero_() for t in tensors]
        return [self.noise.fill_(t, std) for t in tensors]

    def training_step(self, batches, batch_index):
        if self.method_class.private:
            self.releases += len(batches)
            self.sampled += sum(len(y) for _, y in batches)
        pending = iter(batches)

        def release() -> list[torch.Tensor]:
            batch = next(pending, None)
            if batch is None:
                raise RuntimeError(f"{self.method_class.name} asked for more than "
                                   f"releases_per_step={self.method_class.releases_per_step} gradients in one step")
            x, y = batch
            return self.release(self.task.augment(x), y)

        self.method.step(release)
        if self.correlated is not None and next(pending, None) is not None:
            # A step whose release the method skipped (the contract allows it) still draws z_t and forms w_t, never
            # released: C's index is the step, so each example's participations stay ≥ b rows of C apart (skipping
            # shifted the band, and its ε was 1.17–1.60 where 1 was reported; hostile review of 26 November 2026).
            self.correlated.apply_(self.draw_noise(self.params()), self.steps % self.steps_per_epoch)
        self.steps += 1

    def validation_step(self, batch, batch_index):
        x, y = batch
        metrics = self.task.per_example_metrics(self.task(x), y)
        for name, values in metrics.items():
            self._metric_sums[name] = self._metric_sums.get(name, 0.0) + float(values.sum())
        self._metric_count += len(y)

    def on_train_epoch_end(self):
        if self.epsilon_so_far is not None:
            self.log_dict({"privacy/epsilon_spent_rdp": self.epsilon_so_far(self.releases),
                           "privacy/gradient_evaluations": float(self.releases), "privacy/steps": float(self.steps)})

    def collect_test_metrics(self) -> dict[str, float]:
        """The means of the metrics summed by :meth:`validation_step` since the last call."""
        metrics = {f"test_{name}": total / self._metric_count for name, total in self._metric_sums.items()}
        self._metric_sums, self._metric_count = {}, 0
        return metrics

    def on_validation_epoch_end(self):
        self.test_metrics = self.collect_test_metrics()
        self.log_dict(self.test_metrics, prog_bar=True)
