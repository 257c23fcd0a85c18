"""The audit's canaries (``dpbench.trust.audit``): examples that take the place of training rows, and what the auditor
observes of them.

Steinke et al. (Algorithm 1) hide their canaries among the training examples. Here m training rows r_1…r_m (drawn
from the ``audit-canaries`` stream) give their places to canaries: canary i has an input x_i in the task's input
space, of the norm of the row it replaces (so within the task's bound R) and in a random direction weighted toward
those the real rows occupy least (:func:`_quiet`), and two distinct labels, a_i and b_i, uniform among the classes
(the same stream). Its coin S_i (stream ``audit-inclusion``, probability 1/2) decides which label it trains with:
a_i if S_i = +1 ("in"), b_i if S_i = −1. Nothing else changes: the task's class, model, input width and n, the
method's hyperparameters and mechanism are those of an ordinary run (``tests/test_audit.py``), so a method that
sees only them cannot tell an audit from a run. A method in the
training process can still compare the rows it reaches with the public dataset (``dpbench.run.isolation``: such a
plugin is never more than "unverified" on the board).

Toggling S_i replaces one example (x_i, b_i) by another (x_i, a_i), so the run's guarantee for the audit is its ε
under replace-one neighbours (``dpbench.trust.audit``). To the engine a canary is an ordinary example: sampled, clipped,
noised and charged like the rest. The directions keep a canary's gradient nearly orthogonal to the real rows' and
to the other canaries' as far as the model's parameters allow: Steinke et al.'s white-box canaries are gradients on
coordinates of their own, which the model does not have here (m canaries share its parameters with the real rows).

Observers (Lightning callbacks, reading only the parameters and the canaries, never a batch). With u(x, y; θ) the
gradient of ℓ(x, y) at θ clipped at C (eval mode), d_i(θ) = u(x_i, a_i; θ) − u(x_i, b_i; θ) is what S_i changes in
the sum of clipped gradients when canary i is sampled. Every score is centred on the mean of the canaries with
the same labels (a, b): that removes what the real rows do along the part of d_i all of them share (the model's
bias), and, being a function of the run's output, it keeps the scores fixed in advance.

* white-box: x_i,t = ⟨θ_t − θ_{t+1}, d_i(θ_t)⟩ after every step; two scores: ``matched``, Σ_t x_i,t (a matched
  filter), and ``position-max`` (see :attr:`WhiteBox.scores`);
* black-box: after training, ℓ(x_i, b_i) − ℓ(x_i, a_i) under the final model (how far it prefers label a_i).
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

import pytorch_lightning as pl
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpbench.errors import UsageError
from dpbench.privacy import streams
from dpbench.privacy.clipping import clip_factors
from dpbench.task import Task, TaskData

#: τ of :func:`_quiet`. Measured on digits (ε = 1, 10 epochs, 1000 canaries, DP-SGD with σ/10 and the cheating
#: plugins; ``tests/test_audit.py``): τ = ∞ (isotropic directions) gave bounds 0.31-0.57, τ = 1, 0.1, 0.03 gave
#: 0.73-1.27, 1.06-1.52 and 1.26-1.52.
QUIET = 0.03
#: Per-example gradient entries the white-box observer materializes at once (canaries × parameters).
CHUNK = 1 << 22


@contextlib.contextmanager
def _evaluating(model: nn.Module):
    """``model`` in eval mode (no dropout, so no draw from the training's generator), then back as it was."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _quiet(x: torch.Tensor) -> torch.Tensor:
    """(M + τ·tr(M)/d·I)^(-1/2), M = XᵀX/n the second moment of the training rows (d × d, float64), τ =
    :data:`QUIET`: a standard normal vector times it is a random direction weighted toward those the rows occupy
    least (always-zero pixels, the one-hot columns' linear dependencies), where their gradients move a canary's
    score least."""
    rows = x.double()
    values, vectors = torch.linalg.eigh(rows.T @ rows / len(rows))
    return (vectors * (values.clamp_min(0) + QUIET * values.mean()).rsqrt()) @ vectors.T


class Canaries:
    """m canaries of a task: their rows, inputs, labels and inclusion coins, from the audit's streams of ``seed``."""

    def __init__(self, count: int, seed: int):
        self.count, self.seed = count, seed
        self.included = torch.rand(count, generator=streams.generator(seed, "audit-inclusion")) < 0.5
        self.rows: torch.Tensor | None = None
        self.inputs: torch.Tensor | None = None
        self.labels_in: torch.Tensor | None = None  # a_i
        self.labels_out: torch.Tensor | None = None  # b_i
        self.groups: torch.Tensor | None = None  # the index of (a_i, b_i) among the pairs that occur

    def attach(self, task: Task) -> TaskData:
        """The task's training data with the canaries in their rows (``planning.plan``'s ``replace_rows``). The data id
        and description stay the task's, so that nothing the method reaches says "audit"; the audit's record says
        it."""
        data = task.data
        x = data.x_train
        if x.is_sparse:
            raise UsageError(f"task {task.name}: canaries are not put into sparse inputs")
        if x.dim() != 2 or not x.is_floating_point():
            raise UsageError(f"task {task.name}: canaries need flat float inputs (one row per example), the task's "
                             f"are {tuple(x.shape[1:])} {x.dtype}")
        classes = getattr(task, "classes", None)
        if not isinstance(classes, int) or classes < 2 or data.y_train.dtype != torch.long:
            raise UsageError(f"task {task.name}: canaries need a classification task (integer labels)")
        m = self.count
        if m > len(x):
            raise UsageError(f"task {task.name}: {m} canaries, but only {len(x)} training rows for them to replace")
        generator = streams.generator(self.seed, "audit-canaries")
        self.rows = torch.randperm(len(x), generator=generator)[:m]
        directions = torch.randn(m, x.shape[1], generator=generator, dtype=torch.float64) @ _quiet(x).T
        norms = x[self.rows].double().norm(dim=1, keepdim=True)
        self.inputs = (directions / directions.norm(dim=1, keepdim=True) * norms).to(x.dtype)
        self.labels_in = torch.randint(classes, (m,), generator=generator)
        self.labels_out = (self.labels_in + torch.randint(1, classes, (m,), generator=generator)) % classes
        self.groups = torch.unique(self.labels_in * classes + self.labels_out, return_inverse=True)[1]
        x, y = x.clone(), data.y_train.clone()
        x[self.rows] = self.inputs
        y[self.rows] = torch.where(self.included, self.labels_in, self.labels_out)
        return replace(data, x_train=x, y_train=y)

    def centred(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` minus the mean score of the canaries with the same labels (a, b)."""
        count = int(self.groups.max()) + 1
        totals = torch.zeros(count, dtype=scores.dtype).index_add_(0, self.groups, scores)
        sizes = torch.zeros(count, dtype=scores.dtype).index_add_(0, self.groups, torch.ones_like(scores))
        return scores - (totals / sizes)[self.groups]

    def losses(self, task: Task, labels: torch.Tensor) -> torch.Tensor:
        """ℓ(x_i, labels_i) of every canary under the current model (eval mode)."""
        with _evaluating(task.model), torch.no_grad():
            return task.per_example_loss(task.model(self.inputs), labels).double()

    def directions(self, task: Task, params: dict[str, torch.Tensor], clip: float, rows: slice,
                   gamma: float | None = None) -> torch.Tensor:
        """d_i(θ) (module docstring) of the canaries ``rows`` at the trainable parameters ``params``: (rows, P), each
        gradient scaled as the engine scales it at clip norm ``clip`` (automatic clipping with ``gamma``)."""
        buffers = dict(task.model.named_buffers())

        def loss_of_one(p, xi, yi):
            outputs = functional_call(task.model, (p, buffers), (xi.unsqueeze(0),))
            return task.per_example_loss(outputs, yi.unsqueeze(0)).sum()

        x = self.inputs[rows]
        with _evaluating(task.model):
            both = vmap(grad(loss_of_one), in_dims=(None, 0, 0))(
                params, torch.cat([x, x]), torch.cat([self.labels_in[rows], self.labels_out[rows]]))
        flat = torch.cat([g.flatten(1) for g in both.values()], 1).double()
        clipped = flat * clip_factors(flat.norm(dim=1), clip, gamma=gamma)[:, None]
        return clipped[:len(x)] - clipped[len(x):]


class WhiteBox(pl.Callback):
    """Scores from every step's parameters (see the module docstring)."""

    #: The scores, in the order of the audit's guess grid (``dpbench verify`` checks a record's grid against it).
    score_names = ("matched", "position-max")

    def __init__(self, canaries: Canaries):
        self.canaries = canaries
        self.matched = torch.zeros(canaries.count, dtype=torch.float64)
        self.by_position: dict[int, torch.Tensor] = {}  # position in the epoch -> Σ over epochs of z
        self.epochs_at: dict[int, int] = {}

    @staticmethod
    def _trainable(module) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in module.task.model.named_parameters() if p.requires_grad}

    def on_train_batch_start(self, trainer, module, batch, batch_index):  # ``batch`` is never read
        self.before = {name: p.clone() for name, p in self._trainable(module).items()}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index):
        step = torch.cat([(self.before[name] - p).flatten() for name, p in self._trainable(module).items()]).double()
        chunk = max(1, CHUNK // len(step))
        found = [(d @ step, d.norm(dim=1)) for start in range(0, self.canaries.count, chunk)
                 for d in [self.canaries.directions(module.task, self.before, module.last_clip,
                                                    slice(start, start + chunk), module.gamma)]]
        projections = self.canaries.centred(torch.cat([p for p, _ in found]))
        self.matched += projections
        # z: the projection in units of its noise, with the noise per coordinate estimated robustly from the step
        # itself (median absolute value over the parameters)
        scale = step.abs().median() / 0.6745 * torch.cat([n for _, n in found])
        z = torch.where(scale > 0, projections / scale.clamp_min(torch.finfo(scale.dtype).tiny), 0.0)
        self.by_position[batch_index] = self.by_position.get(batch_index, 0.0) + z
        self.epochs_at[batch_index] = self.epochs_at.get(batch_index, 0) + 1

    @property
    def scores(self) -> dict[str, torch.Tensor]:
        """``matched``: the matched filter summed over all steps, the best score when a canary's effect is spread
        over its Poisson inclusions; ``position-max``: over the positions j within an epoch, the largest sum of
        z over the epochs' steps at j, normalized by √epochs, which finds a canary whose batches repeat from
        epoch to epoch (the bug of the sampler that Lightning never told the epoch; README)."""
        positions = torch.stack([total / self.epochs_at[j] ** 0.5 for j, total in sorted(self.by_position.items())])
        return dict(zip(self.score_names, (self.matched, positions.max(0).values), strict=True))


class BlackBox(pl.Callback):
    """Scores from the final model only: ℓ(x_i, b_i) − ℓ(x_i, a_i), centred (module docstring)."""

    score_names = ("loss",)

    def __init__(self, canaries: Canaries):
        self.canaries = canaries
        self.scores: dict[str, torch.Tensor] = {}

    def on_train_end(self, trainer, module):
        canaries = self.canaries
        [name] = self.score_names
        self.scores = {name: canaries.centred(canaries.losses(module.task, canaries.labels_out)
                                              - canaries.losses(module.task, canaries.labels_in))}


OBSERVERS = {"white-box": WhiteBox, "black-box": BlackBox}
