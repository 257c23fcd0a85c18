"""Many seeds of a linear model (logistic/softmax regression) trained at once, as one batched computation.

Each seed keeps everything a separate run has: its own initialization, sampler, noise generator, method state
and ledger (a :class:`~dpbench.engine.PrivateTraining` module per seed). Per step, the S batches are concatenated
(or taken once where they are the same rows, as full batches are) and every seed's per-example clipped sum comes
from one forward pass, one backward pass to the logits and the closed form of a linear layer
(‖∇ℓ_i‖² = ‖∂ℓ_i/∂z_i‖²(‖x_i‖² + 1)); each seed's noise is drawn from its own generator in the order a separate
run draws it. The S runs therefore equal S separate runs
up to floating-point summation order (tested), without S Lightning loops and per-layer hooks.

Only for what this closed form covers: a task whose model is one ``nn.Linear`` (no augmentation), a
private method with one release per step, no per-example transform, that asks for its release before changing
the parameters (checked at run time through the parameters' version counters: a method that moves them first,
e.g. a look-ahead, is refused with :class:`NotBatchable` and runs seed by seed instead).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from dpbench import engine, tracking
from dpbench.clipping import clip_factors
from dpbench.engine import PrivateTraining, RunSpec
from dpbench.method import Method, ReleaseMethod
from dpbench.sampling import IndexedTensors
from dpbench.task import Task


class NotBatchable(Exception):
    """These runs cannot be batched; train them one by one."""


def check_batchable(module: PrivateTraining) -> None:
    """Raise :class:`NotBatchable` unless the closed form applies to this run."""
    method = module.method_class
    if not isinstance(module.task.model, nn.Linear):
        raise NotBatchable(f"task {module.task.name}: the model is not a single linear layer")
    if type(module.task).augment is not Task.augment:
        raise NotBatchable(f"task {module.task.name}: data augmentation is not batched")
    if not method.private or method.releases_per_step != 1:
        raise NotBatchable(f"{method.name}: batched seeds need a private method with one release per step")
    if method.per_example_transform is not Method.per_example_transform:
        raise NotBatchable(f"{method.name}: per-example transforms are not batched")


def _releases(modules: list[PrivateTraining], data: IndexedTensors, input_sq: torch.Tensor,
              batches: list[torch.Tensor], clips: torch.Tensor, scales: torch.Tensor):
    """Every seed's release for its own batch: clipped sum + its own noise, over its expected batch size.

    Each (row, seed) pair whose row is in that seed's batch is one example of that seed. The batches are
    concatenated, or, where every seed drew the same rows (full batches), taken once with every row paired with
    every seed. The pairs' logits come from one product of the rows with all S seeds' weights, and each seed's
    clipped sum is one product of the pairs' clipped output gradients, spread into their seed's block, with the rows.
    ``clips`` and ``scales`` are each seed's C and 1/B; ``input_sq`` is ‖x_i‖² (+ 1 with a bias) of every training
    example. Every selection is a one-dimensional ``index_select``/``index_copy_``.
    """
    seeds = len(modules)
    if all(torch.equal(batch, batches[0]) for batch in batches[1:]):
        rows = batches[0]
        row_of_pair = torch.arange(len(rows)).repeat_interleave(seeds)
        seed_of_pair = torch.arange(seeds).repeat(len(rows))
    else:
        rows = torch.cat(batches)
        row_of_pair = torch.arange(len(rows))
        seed_of_pair = torch.repeat_interleave(torch.arange(seeds), torch.tensor([len(batch) for batch in batches]))
    entry_of_pair = row_of_pair * seeds + seed_of_pair  # the pair's place among the rows × seeds
    example_of_pair = rows.index_select(0, row_of_pair)
    x = data.x.index_select(0, rows)
    layers = [module.task.model for module in modules]
    weight = torch.stack([layer.weight.detach() for layer in layers])  # (S, K, d)
    classes = weight.shape[1]
    logits = (x @ weight.flatten(0, 1).T).view(-1, classes).index_select(0, entry_of_pair)
    if layers[0].bias is not None:
        logits = logits + torch.stack([layer.bias.detach() for layer in layers]).index_select(0, seed_of_pair)
    logits.requires_grad_(True)
    task = modules[0].task
    with torch.enable_grad():  # ∂ℓ/∂z of every pair, (P, K)
        losses = task.per_example_loss(logits, data.y.index_select(0, example_of_pair))
        output_grads, = torch.autograd.grad(losses.sum(), logits)
    norms = (output_grads.square().sum(1) * input_sq.index_select(0, example_of_pair)).sqrt()
    # each seed's clip factors, its sum divided by its B
    factors = clip_factors(norms, clips.index_select(0, seed_of_pair), scales.index_select(0, seed_of_pair))
    weighted = output_grads * factors.unsqueeze(1)
    spread = weighted.new_zeros((len(rows) * seeds, classes)).index_copy_(0, entry_of_pair, weighted)
    sums = [(spread.view(len(rows), seeds * classes).T @ x).view(seeds, classes, -1)]
    if layers[0].bias is not None:
        sums.append(weighted.new_zeros((seeds, classes)).index_add_(0, seed_of_pair, weighted))
    noisy = [torch.empty_like(total) for total in sums]  # every seed's noise, drawn from its own stream
    for seed_index, module in enumerate(modules):
        module.fill_noise([noise[seed_index] for noise in noisy])
    for noise, total in zip(noisy, sums):
        noise.add_(total)
    return [[noise[seed_index] for noise in noisy] for seed_index in range(seeds)]


def _release_once(module: PrivateTraining, params: list[torch.Tensor], gradients: list[torch.Tensor]):
    """The release callable for one step: the precomputed gradients, if the parameters have not moved."""
    versions = [p._version for p in params]
    calls = []

    def release() -> list[torch.Tensor]:
        if calls:
            raise RuntimeError(f"{module.method_class.name} asked for more than one release in one step")
        if [p._version for p in params] != versions:
            raise NotBatchable(f"{module.method_class.name} changes the parameters before its release")
        calls.append(1)
        return gradients

    return release


def train(modules: list[PrivateTraining], data: IndexedTensors, samplers: list, epochs: int) -> None:
    """Train every module for ``epochs`` epochs of its own sampler, all seeds in lockstep."""
    for module in modules:
        check_batchable(module)
        module.on_fit_start()
    params = [module.params() for module in modules]  # one nn.Linear each, trainable throughout
    clips = torch.tensor([module.hp["clip"] for module in modules], dtype=data.x.dtype)
    scales = torch.tensor([1 / module.expected_batch_size for module in modules], dtype=data.x.dtype)
    input_sq = data.x.square().sum(1) + (1.0 if modules[0].task.model.bias is not None else 0.0)
    for epoch in range(epochs):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        for step_batches in zip(*samplers, strict=True):
            batches = [batches_of_seed[0] for batches_of_seed in step_batches]
            for module, batch in zip(modules, batches):
                module.releases += 1
                module.sampled += len(batch)
            releases = _releases(modules, data, input_sq, batches, clips, scales)
            for module, own_params, gradients in zip(modules, params, releases):
                module.method.step(_release_once(module, own_params, gradients))
                module.steps += 1


@torch.no_grad()
def test_metrics(module: PrivateTraining, x_test: torch.Tensor, y_test: torch.Tensor) -> dict[str, float]:
    """The test metrics exactly as the engine's evaluation computes them (slices of 4096)."""
    for x, y in zip(x_test.split(4096), y_test.split(4096)):
        module.validation_step((x, y), 0)
    return module.collect_test_metrics()


def run_seeds(spec: RunSpec, seeds: list[int]) -> list[dict[str, Any]]:
    """``dpbench run`` of ``spec`` for each seed, trained together; one record per seed, as :func:`engine.run`'s.

    ``train_seconds`` is the batch's wall time divided by the number of seeds, and ``batched_seeds`` says how
    many were trained together. Raises :class:`NotBatchable` (before any training) where the closed form does
    not apply. W&B gets each run's configuration and final summary, not per-epoch curves.
    """
    if issubclass(engine.registered(spec.method, spec.task, spec.plugins)[0], ReleaseMethod):
        raise NotBatchable(f"{spec.method} releases through dpbench.release, not by gradient steps")
    if spec.clipping != "fast":
        raise NotBatchable(f"clipping={spec.clipping}: only the fast path is batched")
    planned = [engine.plan(replace(spec, seed=seed)) for seed in seeds]
    modules = [run.module() for run in planned]
    for module in modules:
        check_batchable(module)
    data = planned[0].data
    if any(run.data_releases or not torch.equal(run.data.x_train, data.x_train) for run in planned):
        raise NotBatchable(f"task {spec.task}: the training data differ between seeds")
    started = time.perf_counter()
    train(modules, IndexedTensors(data.x_train, data.y_train), [run.sampler for run in planned],
          planned[0].hp["epochs"])
    seconds = (time.perf_counter() - started) / len(seeds)
    wandb = tracking.wandb_settings(spec.wandb_project, spec.wandb_entity, spec.no_wandb)
    finished = []
    for run, module in zip(planned, modules):
        module.test_metrics = test_metrics(module, run.data.x_test, run.data.y_test)
        run.record.update(batched_seeds=len(seeds), clipping="multiseed")
        finished.append(engine.finish(run, module, seconds, tracking.start_run(wandb, run.record) if wandb else None))
    return finished
