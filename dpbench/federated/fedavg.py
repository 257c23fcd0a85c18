"""Federated averaging whose clients adapt their learning rate: Koskela & Honkela, "Learning Rate Adaptation for
Federated and Differentially Private Learning" (AISTATS 2020), Section "Adaptive federated averaging algorithm";
FedAvg is McMahan et al. 2017, Algorithm 1, with C = 1 (every client in every round, as in the paper).

The K clients are simulated in one process: each parameter is one tensor with a leading client dimension, linear
layers are batched matrix products, and a client's loss only reaches its own slice, so one backward pass of the sum
of the clients' losses gives every client its own gradient. Weights are stored transposed, (K, in, out), so that
gradients come out contiguous. A round runs the clients one after the other on one-client views of these tensors
(faster on a CPU: :class:`StackedModel`); the server averages the stacked tensors.

Client methods:

* ``ada_dp``: the paper's adaptive client update, "Algorithm 2 without clipping and additive noise (C = ∞, Cσ = 0)"
  with the error function (6) and "the condition err < tol for the model update" (tol = 0.1, α_min = 0.9,
  α_max = 1.1, Section "Experiments"). One iteration takes two batches::

      G1 = ∇L(θ; B1);  θ1 = θ − η·G1;  θ½ = θ − (η/2)·G1;  G2 = ∇L(θ½; B2);  θ̂ = θ½ − (η/2)·G2
      err = ‖(θ1 − θ̂) / max(1, |θ1|)‖₂;  θ ← θ1 if err < tol, else θ;  η ← min(max(tol/err, α_min), α_max)·η

  This is ``methods/ada_dp.py``'s ``variant="paper"`` (next iterate θ1, Algorithm 2's θ_{ℓ+1}; η from tol/err, not
  the published code's √(tol/err)) plus Algorithm 1's rejection, which the paper adds for federated learning:
  the DP method's ``paper`` variant never rejects and its ``code`` variant continues from θ̂ with √(tol/err), so
  neither fits as is (a test checks that without rejection this rule is the ``paper`` step). θ1 − θ̂ is computed
  as (η/2)(G2 − G1), the same number up to rounding. The gradient is the batch mean, as in the code (Algorithm 2's
  sum without |B| "only scales η"). Algorithm 1 discards when err > tol, the federated text updates when err < tol;
  they differ only at err = tol, which rejects here. η, the only state, is one number per client.
* ``sgd``: a constant learning rate, McMahan et al.'s ClientUpdate (equal to ``torch.optim.SGD``: a test).
* ``adam``: ``torch.optim.Adam`` (β = 0.9, 0.999, ε = 1e-8, PyTorch's defaults: the paper names none).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from dpbench.data import cifar
from dpbench.privacy import streams
from dpbench.task import Task

#: The paper's pathological split: client k holds exactly these two classes ("client 1 has cars and trucks, client
#: 2 planes and ships, client 3 cats and dogs, client 4 birds and frogs and client 5 deers and horses").
CLIENT_CLASSES = (("automobile", "truck"), ("airplane", "ship"), ("cat", "dog"), ("bird", "frog"), ("deer", "horse"))
CLIENTS = len(CLIENT_CLASSES)
CLIENT_METHODS = ("ada_dp", "sgd", "adam")


# --- data -----------------------------------------------------------------------------------------------------------

def client_split(labels: torch.Tensor, fraction: float, client_size: int, seed: int) -> list[torch.Tensor]:
    """Indices (sorted) of each client's training examples: the paper's pathological split interpolated toward a
    uniformly random one by ``fraction``, its "% of the data chosen randomly".

    Pathological part: client k takes the first ``client_size``/2 images of each of its two classes
    (:data:`CLIENT_CLASSES`) in the loader's order. Then each client puts a uniformly random ``round(fraction ·
    client_size)`` of its images into a pool, which is permuted and dealt back in equal shares: every client holds
    ``client_size`` images, (1 − fraction) of them from its own classes and the rest a uniform draw from everyone's
    (0: the pathological split; 1: a uniformly random split into equal parts). The paper does not say how it
    interpolates; this reading keeps its equal client sizes. Draws: stream ``federated-split`` of ``seed``."""
    names = cifar.CIFAR10_CLASSES
    generator = streams.generator(seed, "federated-split")
    moved = round(fraction * client_size)
    kept, pool = [], []
    for pair in CLIENT_CLASSES:
        own = torch.cat([(labels == names.index(name)).nonzero().flatten()[:client_size // 2] for name in pair])
        order = torch.randperm(len(own), generator=generator)
        pool.append(own[order[:moved]])
        kept.append(own[order[moved:]])
    pool = torch.cat(pool)[torch.randperm(moved * CLIENTS, generator=generator)]
    return [torch.cat([own, pool[k * moved:(k + 1) * moved]]).sort().values for k, own in enumerate(kept)]


def available_client_size(labels: torch.Tensor) -> int:
    """The largest client size that every client can fill half and half from its own two classes."""
    counts = labels.bincount(minlength=len(cifar.CIFAR10_CLASSES))
    return 2 * min(int(counts[cifar.CIFAR10_CLASSES.index(name)]) for pair in CLIENT_CLASSES for name in pair)


# --- the stacked model ----------------------------------------------------------------------------------------------

class StackedModel:
    """K copies of ``task.model`` (a Sequential of Linear and ReLU layers): :meth:`stack` turns its parameters into
    client-stacked tensors (weights transposed to (K, in, out), biases (K, 1, out)), :meth:`forward` runs every
    client on its own inputs (K, batch, features), calling it gives each client's gradient of its mean loss, and
    :meth:`descend` takes an SGD step in place.

    Backpropagation through the layers is written out (autograd only differentiates the task's loss with respect
    to the outputs): a layer's weight gradient is one batched matrix product of its input and output gradients,
    which :meth:`descend` adds to the weight in place, with no gradient tensor in between. With |B| = 10 a step
    is bound by memory traffic over the 1600×500 weight; measured on one core, one client's step takes 1.0 ms this
    way against 2.0 ms through autograd and ``torch.optim.SGD`` (and 2.3 ms per client when five stacked clients
    step together, whose weights no longer fit in cache: :func:`local_round` therefore runs the clients one after
    the other, on one-client views of the stacked parameters)."""

    def __init__(self, task: Task):
        self.task = task
        for module in task.model:
            if not isinstance(module, (nn.Linear, nn.ReLU)):
                raise ValueError(f"stacked clients support Linear and ReLU layers, not {type(module).__name__}")

    def stack(self, clients: int) -> list[torch.Tensor]:
        """The model's parameters, repeated for each client, in the stacked layout."""
        stacked = []
        for module in self.task.model:
            if isinstance(module, nn.Linear):
                stacked.append(module.weight.detach().t().unsqueeze(0).repeat(clients, 1, 1))
                if module.bias is not None:
                    stacked.append(module.bias.detach().view(1, 1, -1).repeat(clients, 1, 1))
        return stacked

    def _layers(self, params: list[torch.Tensor]):
        """(weight, bias or None) per module of the model; (None, None) for a ReLU."""
        values = iter(params)
        for module in self.task.model:
            if isinstance(module, nn.Linear):
                yield next(values), (next(values) if module.bias is not None else None)
            else:
                yield None, None

    def forward(self, params: list[torch.Tensor], x: torch.Tensor,
                inputs: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Every client's outputs; each module's input is appended to ``inputs`` when given."""
        for weight, bias in self._layers(params):
            if inputs is not None:
                inputs.append(x)
            if weight is None:
                x = torch.relu(x)
            else:
                x = torch.bmm(x, weight) if bias is None else torch.baddbmm(bias, x, weight)
        return x

    def _backward(self, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor):
        """Yields (weight, bias, layer input, ∂loss/∂layer output) for each Linear layer, last layer first, where the
        loss is the sum over clients of each client's mean loss. The gradient passed on to the layer below is
        computed before the yield, so the caller may then change the layer's weight in place."""
        layers = list(self._layers(params))
        inputs: list[torch.Tensor] = []
        with torch.no_grad():
            x = self.forward(params, x, inputs)
        outputs = x.requires_grad_()
        with torch.enable_grad():
            clients, batch = y.shape
            losses = self.task.per_example_loss(outputs.reshape(clients * batch, -1), y.reshape(-1))
            (delta,) = torch.autograd.grad(losses.view(clients, batch).mean(1).sum(), outputs)
        with torch.no_grad():
            for index in range(len(layers) - 1, -1, -1):
                weight, bias = layers[index]
                if weight is None:
                    delta = delta.mul_(inputs[index] > 0)
                    continue
                below = torch.bmm(delta, weight.transpose(1, 2)) if index > 0 else None
                yield weight, bias, inputs[index], delta
                delta = below

    def __call__(self, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        """∇ of each client's mean loss over its batch (x: (K, B, features), y: (K, B)), stacked like ``params``."""
        gradients = []
        for _, bias, inputs, delta in self._backward(params, x, y):
            if bias is not None:
                gradients.append(delta.sum(1, keepdim=True))
            gradients.append(torch.bmm(inputs.transpose(1, 2), delta))
        return gradients[::-1]

    def descend(self, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, lr: float) -> None:
        """θ ← θ − lr·∇ (each client's mean loss over its batch), in place."""
        for weight, bias, inputs, delta in self._backward(params, x, y):
            if bias is not None:
                bias.sub_(delta.sum(1, keepdim=True), alpha=lr)
            weight.baddbmm_(inputs.transpose(1, 2), delta, alpha=-lr)


# --- clients --------------------------------------------------------------------------------------------------------

def _per_client(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (K,) tensor shaped to broadcast over a stacked parameter."""
    return values.view(-1, *[1] * (like.dim() - 1))


class SGDClients:
    """``sgd`` clients: θ ← θ − η·∇, McMahan et al.'s ClientUpdate (:meth:`StackedModel.descend`)."""

    batches_per_step = 1

    def __init__(self, params: list[torch.Tensor], hp: dict[str, Any]):
        self.params, self.lr = params, float(hp["lr"])

    def step(self, gradients: StackedModel, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        gradients.descend(self.params, *batches[0], self.lr)

    def round_summary(self) -> dict[str, Any]:
        return {}


class AdamClients:
    """``adam`` clients: one ``torch.optim.Adam`` over the given parameters. Adam updates each coordinate from that
    coordinate's own history, so one optimizer over stacked clients is that many independent client optimizers."""

    batches_per_step = 1

    def __init__(self, params: list[torch.Tensor], hp: dict[str, Any]):
        self.params = params
        # fused: on one core 0.8 ms a step over the cifar10 head's 1.05M weights, against 2.6 ms for foreach
        self.optimizer = torch.optim.Adam(params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                                          fused=True)

    def step(self, gradients: StackedModel, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for param, g in zip(self.params, gradients(self.params, *batches[0])):
            param.grad = g
        self.optimizer.step()

    def round_summary(self) -> dict[str, Any]:
        return {}


class AdaDPClients:
    """``ada_dp`` clients (module docstring): η per client, starting at ``lr``."""

    batches_per_step = 2

    def __init__(self, params: list[torch.Tensor], hp: dict[str, Any]):
        self.params, self.hp = params, hp
        self.lr = torch.full((len(params[0]),), float(hp["lr"]), dtype=params[0].dtype)
        self.accepted = torch.zeros(len(params[0]), dtype=torch.long)
        self.iterations = 0

    def step(self, gradients: StackedModel, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One iteration for every client; returns which clients took their step (err < tol)."""
        tol = self.hp["tol"]
        with torch.no_grad():
            g1 = gradients(self.params, *batches[0])
            lrs = [_per_client(self.lr, p) for p in self.params]
            g2 = gradients([torch.addcmul(p, lr, g, value=-0.5) for p, lr, g in zip(self.params, lrs, g1)],
                           *batches[1])  # at θ½
            squares = torch.zeros_like(self.lr)
            full = []
            for param, lr, first, second in zip(self.params, lrs, g1, g2):
                difference = second.sub_(first).mul_(lr / 2)  # θ1 − θ̂ = (η/2)(G2 − G1)
                theta_1 = torch.addcmul(param, lr, first, value=-1, out=first)  # θ1, in G1's memory
                difference.div_(theta_1.abs().clamp_(min=1.0))  # err(θ1, θ̂)_i, equation (6)
                squares += difference.square().flatten(1).sum(1)
                full.append(theta_1)
            err = squares.sqrt()
            accept = err < tol
            for k in accept.nonzero().flatten().tolist():
                for param, theta_1 in zip(self.params, full):
                    param[k].copy_(theta_1[k])
            ratio = torch.where(err > 0, tol / err, torch.full_like(err, math.inf))
            self.lr *= ratio.clamp(self.hp["alpha_min"], self.hp["alpha_max"])
        self.accepted += accept
        self.iterations += 1
        return accept

    def round_summary(self) -> dict[str, Any]:
        """Each client's η after the round and the share of the round's iterations that took their step."""
        summary = {"client_lr": self.lr.tolist(),
                   "accepted_fraction": (self.accepted / max(self.iterations, 1)).tolist()}
        self.accepted.zero_()
        self.iterations = 0
        return summary


Clients = AdaDPClients | SGDClients | AdamClients
CLIENT_RULES = {"ada_dp": AdaDPClients, "sgd": SGDClients, "adam": AdamClients}


def make_clients(method: str, params: list[torch.Tensor], hp: dict[str, Any]) -> list[Clients]:
    """One client object per client, each over its one-client views (k:k+1) of the stacked ``params``, which its
    steps change in place."""
    if method not in CLIENT_METHODS:
        raise ValueError(f"unknown client method {method!r}; choose one of {', '.join(CLIENT_METHODS)}")
    return [CLIENT_RULES[method]([p[k:k + 1] for p in params], hp) for k in range(len(params[0]))]


def round_summary(clients: list[Clients]) -> dict[str, list]:
    """The clients' round summaries, each value a list over clients."""
    merged: dict[str, list] = {}
    for client in clients:
        for name, values in client.round_summary().items():
            merged.setdefault(name, []).extend(values)
    return merged


def average(params: list[torch.Tensor], weights: torch.Tensor) -> list[torch.Tensor]:
    """McMahan et al.'s server update: Σ_k w_k θ_k over the leading client dimension (w_k = n_k / n)."""
    return [torch.tensordot(weights.to(p.dtype), p, dims=1) for p in params]


def local_round(clients: list[Clients], gradients: StackedModel, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                seed: int, round_number: int) -> int:
    """One local epoch of every client: a fresh permutation of each client's examples (stream ``client-batches``,
    index: round), cut into batches of ``batch_size``, ``batches_per_step`` per step; a remainder too small for a
    step is left out this round. The clients run one after the other (they are independent within a round; see
    :class:`StackedModel` for why not together). Returns the number of steps per client."""
    clients_count, size = y.shape
    generator = streams.generator(seed, "client-batches", round_number)
    order = torch.stack([torch.randperm(size, generator=generator) for _ in range(clients_count)])
    rows = torch.arange(clients_count)[:, None]
    xs, ys = x[rows, order], y[rows, order]
    per_step = batch_size * clients[0].batches_per_step
    steps = size // per_step
    for k, client in enumerate(clients):
        for step in range(steps):
            starts = range(step * per_step, (step + 1) * per_step, batch_size)
            client.step(gradients, [(xs[k:k + 1, s:s + batch_size], ys[k:k + 1, s:s + batch_size]) for s in starts])
    return steps
