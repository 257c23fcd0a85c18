"""The audit's canaries (``dpbench.trust.audit``): training examples the auditor adds, and what it observes of them.

Each of m canaries lives on an input coordinate of its own. The task's inputs (rows of a flat float ``x``) get
m extra coordinates, zero for every real example (training and test), and canary i is the example whose base
coordinates are zero and whose extra coordinates are s·e_i (s = ``CANARY_NORM``), with a label drawn from the
audit's ``audit-canaries`` stream. The model gets a bias-free linear head on the extra coordinates, zero at the
start, added to the task's output: for a linear task this is the same linear model on the wider input; for a
network it makes canary i's gradient on head column i a gradient canary (as in Steinke et al.'s white-box audits)
that no real example touches. Real examples see the task's model and loss unchanged (their extra coordinates are zero).

To the engine a canary is an ordinary training example: it is sampled, clipped, noised and charged like the
rest. Only the included canaries (coin of the ``audit-inclusion`` stream) are in the training data; the auditor
knows all m. The large norm s is legitimate — a DP guarantee holds for every dataset — and makes the canary's
clipped gradient lie almost entirely on its own head column (for a linear task, a share 1/√(1 + s²) is on the
shared bias). The canaries change n: see ``dpbench.trust.audit``.

Observers (Lightning callbacks, reading only the parameters, never a batch):

* white-box: before each step, the clipped gradient u_i(θ_t) of every canary on its head column (as the engine
  would clip it at C, with the norm taken as ‖δ_i‖·√(1 + s²), exact for a linear task, where δ_i is the loss
  gradient at the output); after it, x_i = ⟨θ_t − θ_{t+1}, u_i⟩ on that column. Two scores, both fixed in
  advance: ``matched``, Σ_t x_i (a matched filter of the steps in which canary i was in the batch), and
  ``position-max`` (see :attr:`WhiteBox.scores`);
* black-box: after training, score_i = −loss of the final model on canary i.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

import pytorch_lightning as pl
import torch
from torch import nn

from dpbench.errors import UsageError
from dpbench.privacy import streams
from dpbench.task import Task

CANARY_NORM = 100.0  # s: the L2 norm of a canary's input


@contextlib.contextmanager
def _evaluating(model: nn.Module):
    """``model`` in eval mode (no dropout, so no draw from the training's generator), then back as it was."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class CanaryModel(nn.Module):
    """The task's model on the first ``base_width`` coordinates plus a bias-free linear head, zero at the start,
    on the m canary coordinates."""

    def __init__(self, base: nn.Module, base_width: int, canaries: int, outputs: int):
        super().__init__()
        self.base, self.base_width = base, base_width
        self.head = nn.Linear(canaries, outputs, bias=False)
        nn.init.zeros_(self.head.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x[:, :self.base_width])
        return out + self.head(x[:, self.base_width:]).reshape(out.shape)


class Canaries:
    """m canaries of a task: their inputs, labels and inclusion coins, all from the audit's streams of ``seed``."""

    def __init__(self, count: int, seed: int, norm: float = CANARY_NORM):
        self.count, self.seed, self.norm = count, seed, norm
        self.included = torch.rand(count, generator=streams.generator(seed, "audit-inclusion")) < 0.5
        self.inputs: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None

    def task_class(self, base: type[Task]) -> type[Task]:
        """A subclass of ``base`` whose training data holds the included canaries and whose model has the head."""
        canaries = self

        class WithCanaries(base):
            __doc__ = base.__doc__

            def prepare(self, seed: int = 0):
                data = super().prepare(seed)
                return canaries.attach(self, data)

        # named as the task itself, so that the class does not say it is the audit's (Steinke et al. hide canaries
        # among the examples); what still tells it apart is the wider input and the canary head (module docstring)
        WithCanaries.__name__, WithCanaries.__qualname__ = base.__name__, base.__qualname__
        WithCanaries.__module__ = base.__module__
        return WithCanaries

    def attach(self, task: Task, data):
        """Widen ``task``'s data and model (see the module docstring); returns the training data with canaries."""
        x = data.x_train
        if x.is_sparse:
            raise UsageError(f"task {task.name}: canaries are not added to sparse inputs")
        if x.dim() != 2 or not x.is_floating_point():
            raise UsageError(f"task {task.name}: canaries need flat float inputs (one row per example), the task's "
                             f"are {tuple(x.shape[1:])} {x.dtype}")
        classes = getattr(task, "classes", None)
        if not isinstance(classes, int) or classes < 2 or data.y_train.dtype != torch.long:
            raise UsageError(f"task {task.name}: canaries need a classification task (integer labels)")
        width, m = x.shape[1], self.count
        self.inputs = torch.cat([torch.zeros(m, width, dtype=x.dtype), self.norm * torch.eye(m, dtype=x.dtype)], 1)
        self.labels = torch.randint(classes, (m,), generator=streams.generator(self.seed, "audit-canaries"))
        with _evaluating(task.model), torch.no_grad():  # eval: no dropout draw from the global generator
            outputs = task.model(data.x_test[:1]).shape[-1]
        task.model = CanaryModel(task.model, width, m, outputs)

        def widen(rows: torch.Tensor) -> torch.Tensor:
            return torch.cat([rows, rows.new_zeros(len(rows), m)], 1)

        task.data = replace(
            data, x_train=torch.cat([widen(x), self.inputs[self.included]]),
            y_train=torch.cat([data.y_train, self.labels[self.included]]), x_test=widen(data.x_test),
            data_id=f"{data.data_id}+{m}-audit-canaries",
            preprocessing=f"{data.preprocessing} Audit: {m} zero columns appended; {int(self.included.sum())} of "
                          f"{m} canaries (input norm {self.norm:g} on a column of their own) added to the training "
                          f"rows (dpbench.trust.canaries).")
        return task.data

    def output_gradients(self, task: Task) -> tuple[torch.Tensor, torch.Tensor]:
        """(δ, loss): the gradient of each canary's loss at the model's output (m × outputs) and the losses."""
        with _evaluating(task.model), torch.no_grad():
            outputs = task.model(self.inputs)
        with torch.enable_grad():
            outputs.requires_grad_(True)
            losses = task.per_example_loss(outputs, self.labels)
            (delta,) = torch.autograd.grad(losses.sum(), outputs)
        return delta.reshape(self.count, -1), losses.detach()


class WhiteBox(pl.Callback):
    """Scores from every step's parameters (see the module docstring)."""

    def __init__(self, canaries: Canaries):
        self.canaries = canaries
        self.matched = torch.zeros(canaries.count, dtype=torch.float64)
        self.by_position: dict[int, torch.Tensor] = {}  # position in the epoch -> Σ over epochs of z
        self.epochs_at: dict[int, int] = {}

    def on_train_batch_start(self, trainer, module, batch, batch_index):  # ``batch`` is never read
        head = module.task.model.head.weight  # outputs × m: column i is canary i's
        delta, _ = self.canaries.output_gradients(module.task)
        s, clip = self.canaries.norm, module.hp["clip"]
        norms = delta.norm(dim=1) * (1 + s * s) ** 0.5
        factors = torch.clamp(clip / norms.clamp_min(torch.finfo(norms.dtype).tiny), max=1.0)
        self.direction = (delta * (s * factors)[:, None]).T.reshape(head.shape).double()
        self.before = head.detach().double().clone()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index):
        step = self.before - module.task.model.head.weight.detach().double()
        projections = (step * self.direction).sum(0)
        self.matched += projections
        # z: the projection in units of its noise, with the noise per coordinate estimated robustly from the step
        # itself (median absolute value over the head's coordinates, nearly all of which carry noise only)
        scale = step.abs().median() / 0.6745 * self.direction.norm(dim=0)
        z = torch.where(scale > 0, projections / scale.clamp_min(torch.finfo(scale.dtype).tiny), 0.0)
        self.by_position[batch_index] = self.by_position.get(batch_index, 0.0) + z
        self.epochs_at[batch_index] = self.epochs_at.get(batch_index, 0) + 1

    @property
    def scores(self) -> dict[str, torch.Tensor]:
        """``matched``: the matched filter summed over all steps, the best score when a canary's effect is spread
        over its Poisson inclusions; ``position-max``: over the positions j within an epoch, the largest sum of
        z over the epochs' steps at j, normalized by √epochs, which finds a canary whose batches repeat from
        epoch to epoch (the bug of the sampler that Lightning never told the epoch; CHANGELOG.md)."""
        positions = torch.stack([total / self.epochs_at[j] ** 0.5 for j, total in sorted(self.by_position.items())])
        return {"matched": self.matched, "position-max": positions.max(0).values}


class BlackBox(pl.Callback):
    """Scores from the final model only: minus each canary's loss."""

    def __init__(self, canaries: Canaries):
        self.canaries = canaries
        self.scores: dict[str, torch.Tensor] = {}

    def on_train_end(self, trainer, module):
        _, losses = self.canaries.output_gradients(module.task)
        self.scores = {"loss": -losses.double()}


OBSERVERS = {"white-box": WhiteBox, "black-box": BlackBox}
