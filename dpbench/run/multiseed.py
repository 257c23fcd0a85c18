"""Many runs of a linear model (logistic/softmax regression) trained at once, as one batched computation: the seeds
of a leaderboard cell, or the trials of a tuning (other seeds, learning rates, clip norms, method settings, noise
multipliers, sampling rates and schedules: a run with fewer steps drops out when it is done), as long as they share
the method, the data and the model's shape.

Each run keeps everything a separate run has: its own initialization, sampler, noise generator, method state
and ledger (a :class:`~dpbench.run.training.PrivateTraining` module per run). Per step, the S batches are concatenated
(or taken once where they are the same rows, as full batches are) and every seed's per-example clipped sum comes
from one forward pass, one backward pass to the logits and the closed form of a linear layer
(‖∇ℓ_i‖² = ‖∂ℓ_i/∂z_i‖²(‖x_i‖² + 1)); each seed's noise is drawn from its own generator in the order a separate
run draws it. The S runs therefore equal S separate runs
up to floating-point summation order (tested), without S Lightning loops and per-layer hooks.

Per-example transforms that are coordinate-wise affine (:class:`~dpbench.privacy.clipping.CoordinateAffine`, AdaCliP's
(g − m)/b) are batched too, each run with its own: its examples' transformed norms come from
:func:`dpbench.privacy.affine.affine_sq_norm_bound` and its clipped sum (Σ_i c_i G_i − (Σ_i c_i)·M)/S from
:func:`dpbench.privacy.affine.affine_clipped_sum`, as on the engine's fast path.

A method that implements :meth:`~dpbench.method.Method.update_together` (one release per step, then an update)
is updated for all runs at once: every run's parameters and state become rows of stacked tensors
(:func:`~dpbench.method.stacked`), and a step is one batched release and one batched update, with no Python loop
over the runs but their noise draws. Other methods see the engine's contract unchanged: each run's ``step`` runs
in a greenlet of its own and its ``release()`` suspends it until every run of the step has asked for one
(:func:`_lockstep`); the releases are then computed together, each at its run's parameters of that moment. So
methods with several releases per step (ADADP's full and half steps) and methods that move their parameters
before a release batch too.

The engine's other per-run mechanics are batched as each run has them alone (``dpbench.run.training``): automatic
clipping's scaling C/(‖g_i‖ + γ) from the same closed-form norms (a product of non-negative terms: no cancellation,
as the exact ghost norm the engine uses for it); a moving clip norm (each run's :meth:`~dpbench.method.Method.next_clip`
read at its release, its noise σC_t/B); a count release (each run's count over its own batch, an example whose norm
is not finite counted above C, its noise drawn after the gradient's from the run's stream, as alone); correlated noise
(each run's band or tree state applied to its draw at its release's step in the epoch, and a step whose release the
method skipped still drawing and forming its noise).

Only for what this closed form covers: a task whose model is one ``nn.Linear`` (no augmentation), and no
per-example transform other than a coordinate-wise affine one.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch
from greenlet import greenlet
from torch import nn

from dpbench.data import rows
from dpbench.errors import UsageError
from dpbench.method import CLIPPING_RULES, ReleaseMethod, stacked
from dpbench.privacy.clipping import CoordinateAffine, check_gamma, clip_factors, keep_finite
from dpbench.privacy.affine import affine_clipped_sum, affine_sq_norm_bound
from dpbench.privacy.sampling import IndexedTensors
from dpbench.results import tracking
from dpbench.run import engine, planning
from dpbench.run.training import PrivateTraining
from dpbench.spec import RunSpec
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
    transform = module.current_transform()
    if transform is not None and not isinstance(transform, CoordinateAffine):
        raise NotBatchable(f"{method.name}: only coordinate-wise affine per-example transforms are batched")
    if module.task.data.x_train.is_sparse:
        raise NotBatchable(f"task {module.task.name}: sparse inputs are not batched")
    if method.private and getattr(method, "clipping", "clip") not in CLIPPING_RULES:
        raise NotBatchable(f"{method.name}: clipping {method.clipping!r} is not batched")


def distinct_examples(data: IndexedTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """(one position of each distinct example (x, y) of ``data``, how many times it occurs)."""
    _, by_row = rows.distinct(data.x.numpy())
    first, by_example = rows.distinct(np.column_stack([by_row, data.y.numpy().reshape(len(data.y), -1)]))
    return torch.from_numpy(first), torch.from_numpy(np.bincount(by_example)).to(data.x.dtype)


def _releases(modules: list[PrivateTraining], data: IndexedTensors, input_sq: torch.Tensor,
              batches: list[torch.Tensor], clips: torch.Tensor, scales: torch.Tensor,
              whole: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None,
              positions: list[int] | None = None):
    """Every run's release for its own batch: clipped sum + its own noise, over its expected batch size, stacked
    (one (S, *shape) tensor per parameter); and, for a method that declares a count release, each run's count (else
    None). ``positions``: each run's step in its epoch, where the noise is correlated.

    Where every run drew the same rows (full batches), the rows are taken once and every row is paired with every
    run: one product with all S runs' weights gives every pair's logits, one product of the clipped output gradients
    with the rows every run's sum. A batch of the whole training set is taken as its distinct examples ``whole()``
    (:func:`distinct_examples`), each clipped gradient weighted by its count: identical examples have identical
    gradients, so the sum is the same (kddcup99's 395,216 training examples are 119,784 distinct ones).
    Otherwise each run's batch is a row of an (S, longest batch) table of row indices, padded (padding pairs take
    no part: their output gradients are zero), and one batched product per direction (``torch.baddbmm``,
    ``torch.bmm``) multiplies every run's rows with its own weights; a Python loop over the runs cost more than the
    products on small batches. ``clips`` and ``scales`` are each run's C and 1/B (a method that moves C gives its
    own, read here at the release); ``input_sq`` is ‖x_i‖² (+ 1 with a bias) of every training example. A run whose
    method transforms its examples' gradients (a coordinate-wise affine (G − M)/S, checked by
    :func:`check_batchable`) gets its own norms and sum.
    """
    runs = len(modules)
    method = modules[0].method_class
    moving = method.private and method.moves_clip
    if moving:  # C_t of this release, each run's (refused unless finite, positive); its noise and count use the float
        moved = [module.release_clip() for module in modules]
        clips = torch.tensor(moved, dtype=clips.dtype)
    layers = [module.task.model for module in modules]
    weight = stacked([layer.weight for layer in layers])  # (S, K, d), the runs' own weights as its rows
    classes = weight.shape[1]
    bias = stacked([layer.bias for layer in layers]) if layers[0].bias is not None else None
    transforms = [module.current_transform() for module in modules]
    if any(t is not None and not isinstance(t, CoordinateAffine) for t in transforms):
        raise NotBatchable("a per-example transform became other than coordinate-wise affine")
    affine = transforms[0] is not None  # (G − M)/S, each run its own M and S: weight, then bias
    if any((t is not None) != affine for t in transforms):
        raise NotBatchable("some runs transform their examples' gradients and some do not")
    shared = not affine and all(torch.equal(batch, batches[0]) for batch in batches[1:])
    counts = None
    if shared:
        chosen = batches[0]
        if whole is not None and len(chosen) == len(data.x) and bool((chosen[1:] > chosen[:-1]).all()):
            chosen, counts = whole()  # n increasing positions: every example once
        x = data.x.index_select(0, chosen)
        logits = (x @ weight.flatten(0, 1).T).view(len(chosen), runs, classes)  # pair (row, run) at [row, run]
        if bias is not None:
            logits = logits + bias
        logits = logits.reshape(-1, classes)
        example_of_pair = chosen.repeat_interleave(runs)
        run_of_pair = torch.arange(runs).repeat(len(chosen))
    else:
        lengths = torch.tensor([len(batch) for batch in batches])
        filled = torch.arange(int(lengths.max())) < lengths[:, None]  # (S, width): which pairs are real
        example_of_pair = torch.cat(batches)  # the real pairs in run order: run 0's rows, then run 1's, ...
        table = example_of_pair.new_zeros(filled.shape).masked_scatter_(filled, example_of_pair)
        padded = data.x.index_select(0, table.flatten()).view(*filled.shape, -1)  # (S, width, d)
        logits = (torch.bmm(padded, weight.transpose(1, 2)) if bias is None else
                  torch.baddbmm(bias.unsqueeze(1), padded, weight.transpose(1, 2)))[filled]  # (P, K)
        run_of_pair = torch.repeat_interleave(torch.arange(runs), lengths)
    logits.requires_grad_(True)
    task = modules[0].task
    with torch.enable_grad():  # ∂ℓ/∂z of every pair, (P, K)
        losses = task.per_example_loss(logits, data.y.index_select(0, example_of_pair))
        output_grads, = torch.autograd.grad(losses.sum(), logits)
    kept, (output_grads,) = keep_finite([output_grads], len(output_grads))  # a pair whose loss overflowed: nothing
    if affine:  # ‖(G_i − M)/S‖ as the fast clipper computes it (dpbench.privacy.ghost), every run's pairs at once
        shifts, divisors = ([torch.stack(parts) for parts in zip(*(getattr(t, side) for t in transforms))]
                           for side in ("shift", "scale"))
        spread = output_grads.new_zeros((*filled.shape, classes)).masked_scatter_(filled.unsqueeze(2), output_grads)
        sq = affine_sq_norm_bound(padded, spread, shifts[0], divisors[0])
        if bias is not None:
            sq = sq + ((spread - shifts[1].unsqueeze(1)) / divisors[1].unsqueeze(1)).pow(2).sum(2)
        norms = sq.clamp_min(0).sqrt()[filled]
    else:
        norms = (output_grads.square().sum(1) * input_sq.index_select(0, example_of_pair)).sqrt()
    # each run's clip factors, its sum divided by its B: min(1, C/‖g‖), or automatic clipping's C/(‖g‖ + γ)
    if modules[0].gamma is not None:
        gammas = torch.tensor([module.gamma for module in modules], dtype=norms.dtype)
        factors = ((clips * scales).index_select(0, run_of_pair) / (norms + gammas.index_select(0, run_of_pair)))
        factors = torch.where(kept & norms.isfinite() & factors.isfinite(), factors, 0.0)
    else:
        factors = torch.where(kept, clip_factors(norms, clips.index_select(0, run_of_pair),
                                                 scales.index_select(0, run_of_pair)), 0.0)
    if affine:  # Σ_i c_i (G_i − M)/S with a bounded rounding error, as the fast clipper computes it; weight and
        # bias at once, the bias as a weight on an input column of ones
        table = factors.new_zeros(filled.shape).masked_scatter_(filled, factors)
        columns = [padded] + ([padded.new_ones((*filled.shape, 1))] if bias is not None else [])
        shift, divisor = (torch.cat([side.view(runs, classes, -1) for side in sides], 2)
                          for sides in (shifts, divisors))
        summed = affine_clipped_sum(torch.cat(columns, 2), spread, table, shift, divisor, sq)
        sums = [part.reshape(side.shape) for part, side in zip(summed.split([c.shape[2] for c in columns], 2), shifts)]
    else:
        weighted = output_grads * factors.unsqueeze(1)
        if counts is not None:
            weighted *= counts.repeat_interleave(runs).unsqueeze(1)
        if shared:
            sums = [(weighted.view(len(chosen), runs * classes).T @ x).view(runs, classes, -1)]
        else:
            spread = weighted.new_zeros((*filled.shape, classes)).masked_scatter_(filled.unsqueeze(2), weighted)
            sums = [torch.bmm(spread.transpose(1, 2), padded)]  # (S, K, d)
        if bias is not None:
            sums.append(weighted.new_zeros((runs, classes)).index_add_(0, run_of_pair, weighted))
    noisy = [torch.empty(total.shape, dtype=weight.dtype) for total in sums]  # every run's noise, from its stream
    for index, module in enumerate(modules):
        own = module.fill_noise([noise[index] for noise in noisy], moved[index] if moving else None)
        if module.correlated is not None:  # z_t → w_t in place, at the release's step in its epoch
            module.correlated.apply_(own, positions[index])
    for noise, total in zip(noisy, sums):
        if total.dtype == noise.dtype:
            noise.add_(total)
        else:  # an affine sum, in float64: noise + sum rounded once
            noise.copy_(noise.double() + total)
    if not (method.private and method.count_release):
        return noisy, None
    # each run's count over its batch, its noise after the gradient's (PrivateTraining.count): an example whose
    # norm is not finite is counted above C; a distinct example of a whole-set batch counts as often as it occurs
    seen = torch.where(kept, norms, math.inf)
    counted = []
    for index, module in enumerate(modules):
        mine = seen[run_of_pair == index]
        if counts is not None:
            mine = mine.repeat_interleave(counts.to(torch.long))
        counted.append(module.count(mine, moved[index] if moving else module.hp["clip"]))
    return noisy, counted


def _steps(sampler, epochs: int):
    """A run's steps (each a list of ``releases_per_step`` batches) over all its epochs, each epoch on its own
    sampler stream."""
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        yield from sampler


def _switch(target: greenlet, *args):
    """``target.switch(*args)``, the caller's grad mode restored when it resumes: PyTorch keeps the mode per thread, and
    the greenlets of one thread would otherwise share it (a method's ``@torch.no_grad()`` step, suspended inside
    its release, would resume in whatever mode another run's step left)."""
    mode = torch.is_grad_enabled()
    try:
        return target.switch(*args)
    finally:
        torch.set_grad_enabled(mode)


def _lockstep(modules: list[PrivateTraining], steps: list[list[torch.Tensor]], releases: Callable) -> list[int]:
    """One step of every run, its method's ``step`` running in a greenlet of its own: each time every unfinished
    run waits for a release, ``releases(indices, batches)`` computes all of theirs in one batched computation, each
    for its run's parameters as they are at that moment (a method may move them between its releases, as ADADP's
    half step does, or before its first). The k-th release of a run's step uses the k-th of its step's batches.
    Returns the runs whose step left some of its batches unreleased."""
    waiting: dict[int, torch.Tensor] = {}
    unused = [iter(batches) for batches in steps]

    def start(index: int) -> greenlet:
        pending = unused[index]
        module = modules[index]

        def release() -> list[torch.Tensor]:
            batch = next(pending, None)
            if batch is None:
                raise RuntimeError(f"{module.method_class.name} asked for more than "
                                   f"releases_per_step={module.method_class.releases_per_step} gradients in one step")
            waiting[index] = batch
            return _switch(main)

        return greenlet(lambda: module.method.step(release))

    main = greenlet.getcurrent()
    runs = [start(index) for index in range(len(modules))]
    for run in runs:
        _switch(run)  # returns when the run waits for a release or its step is done
    while waiting:
        indices = sorted(waiting)
        for index, gradients in zip(indices, releases(indices, [waiting.pop(index) for index in indices])):
            _switch(runs[index], gradients)
    return [index for index, pending in enumerate(unused) if next(pending, None) is not None]


def train(modules: list[PrivateTraining], data: IndexedTensors, samplers: list, epochs: list[int]) -> None:
    """Train every module for its ``epochs`` of its own sampler, in lockstep: at each step every run that has steps
    left draws its next batches; runs with fewer steps (fewer epochs, larger batches) drop out when they are done."""
    for module in modules:
        check_batchable(module)
        if module.gamma is not None:
            check_gamma(module.gamma)  # as the engine's clipper checks it at the first release
        module.on_fit_start()
    clips = torch.tensor([module.hp.get("clip", math.inf) for module in modules], dtype=data.x.dtype)
    scales = torch.tensor([1 / module.expected_batch_size for module in modules], dtype=data.x.dtype)
    input_sq = data.x.square().sum(1) + (1.0 if modules[0].task.model.bias is not None else 0.0)
    pending = [_steps(sampler, count) for sampler, count in zip(samplers, epochs)]
    active = list(range(len(modules)))
    whole = functools.cache(lambda: distinct_examples(data))  # on the first batch of the whole training set
    method_class = modules[0].method_class
    together = (method_class.batches_updates() and all(module.method_class is method_class for module in modules)
                and not (method_class.private and method_class.count_release))
    correlated = any(module.correlated is not None for module in modules)  # (a plugin's may depend on its hp)
    # the ledger, as the engine's training_step keeps it; counted here and set on the modules at the end (an
    # nn.Module's attribute assignment cost more than the step of a small model)
    releases, sampled, steps = [0] * len(modules), [0] * len(modules), [0] * len(modules)
    while True:
        step = [(index, next(pending[index], None)) for index in active]
        active = [index for index, batches in step if batches is not None]
        if not active:
            break
        batches = [batches for _, batches in step if batches is not None]
        for index, step_batches in zip(active, batches):
            if modules[index].method_class.private:
                releases[index] += len(step_batches)
                sampled[index] += sum(len(batch) for batch in step_batches)

        def release_all(chosen: list[int], chosen_batches: list[torch.Tensor]):
            runs = [active[i] for i in chosen]
            at = torch.tensor(runs)
            positions = [steps[r] % modules[r].steps_per_epoch if modules[r].correlated is not None else 0
                         for r in runs] if correlated else None
            return _releases([modules[r] for r in runs], data, input_sq, chosen_batches, clips.index_select(0, at),
                             scales.index_select(0, at), whole, positions)

        def per_run(chosen: list[int], chosen_batches: list[torch.Tensor]) -> list:
            noisy, counted = release_all(chosen, chosen_batches)
            gradients = [list(released) for released in zip(*noisy)]
            return gradients if counted is None else list(zip(gradients, counted))

        stepping = [modules[index] for index in active]
        if together:  # one release each, then one update of all runs
            gradients, _ = release_all(list(range(len(active))), [step_batches[0] for step_batches in batches])
            methods = [module.method for module in stepping]  # their parameters: rows of _releases' stacks
            params = [stacked([method.params[j] for method in methods]) for j in range(len(gradients))]
            method_class.update_together(methods, params, gradients)
        else:
            skipped = _lockstep(stepping, batches, per_run)
            for i in skipped if correlated else ():
                # a step whose release the method skipped still draws z_t and forms w_t (PrivateTraining.training_step)
                module = stepping[i]
                if module.correlated is not None:
                    module.correlated.apply_(module.draw_noise(module.params()),
                                             steps[active[i]] % module.steps_per_epoch)
        for index in active:
            steps[index] += 1
    for module, released, drawn, taken in zip(modules, releases, sampled, steps):
        module.releases, module.sampled, module.steps = released, drawn, taken


@torch.no_grad()
def test_metrics(module: PrivateTraining, x_test: torch.Tensor, y_test: torch.Tensor) -> dict[str, float]:
    """The test metrics exactly as the engine's evaluation computes them (slices of 4096)."""
    for x, y in zip(rows.chunks(x_test, 4096), y_test.split(4096)):
        module.validation_step((x, y), 0)
    return module.collect_test_metrics()


def run_seeds(spec: RunSpec, seeds: list[int]) -> list[dict[str, Any]]:
    """``dpbench run`` of ``spec`` for each seed, trained together (:func:`run_batch`)."""
    return run_batch([replace(spec, seed=seed) for seed in seeds])


def run_batch(specs: list[RunSpec]) -> list[dict[str, Any]]:
    """``dpbench run`` of each spec, trained together; one record per spec, as :func:`engine.run`'s.

    The specs may differ in seed and hyperparameters (overrides: learning rate, clip norm, epochs, batch size...) but
    must run one method on one task's training data (inputs and labels) with models of one shape. ``train_seconds``
    is the batch's wall time divided by the number of runs, and ``batched_seeds`` says how many were trained
    together. Raises :class:`NotBatchable` (before any training)
    where the closed form does not apply. W&B gets each run's configuration and final summary, not per-epoch
    curves.
    """
    first = specs[0]
    if issubclass(planning.registered(first.method, first.task, first.plugins)[0], ReleaseMethod):
        raise NotBatchable(f"{first.method} releases through dpbench.release.mechanisms, not by gradient steps")
    if any(spec.clipping != "fast" for spec in specs):
        raise NotBatchable("only the fast clipping path is batched")
    if len({(spec.method, spec.task, tuple(spec.plugins)) for spec in specs}) > 1:
        raise NotBatchable("batched runs must share the method and the task")
    planned = [planning.plan(spec) for spec in specs]
    modules = [run.module() for run in planned]
    for module in modules:
        check_batchable(module)
    if len({tuple(p.shape for p in module.params()) for module in modules}) > 1:  # e.g. with and without a bias
        raise NotBatchable(f"task {first.task}: the runs' models differ")
    data = planned[0].data

    def same_data(run) -> bool:  # the trials of a tuning share their split's tensors (ValidationSplit.split)
        return all(mine is shared or torch.equal(mine, shared) for mine, shared in
                   ((run.data.x_train, data.x_train), (run.data.y_train, data.y_train)))

    if any(run.data_releases or not same_data(run) for run in planned):
        raise NotBatchable(f"task {first.task}: the training data differ between runs")
    started = time.perf_counter()
    train(modules, IndexedTensors(data.x_train, data.y_train), [run.sampler for run in planned],
          [run.hp["epochs"] for run in planned])
    seconds = (time.perf_counter() - started) / len(specs)
    finished = []
    for spec, run, module in zip(specs, planned, modules):
        wandb = tracking.wandb_settings(spec.wandb_project, spec.wandb_entity, spec.no_wandb)
        module.test_metrics = test_metrics(module, run.data.x_test, run.data.y_test)
        run.record.update(batched_seeds=len(specs), clipping="multiseed")
        finished.append(engine.finish(run, module, seconds, tracking.start_run(wandb, run.record) if wandb else None))
    return finished


#: The most (example, run) pairs a batched step holds, summed over its runs (~40 bytes each at its peak): runs
#: beyond it train in the next group. 80 full-batch trials on kddcup99 in one step were 28 million pairs.
MAX_PAIRS_PER_STEP = 2**23


def _groups(indices: list[int], rows_per_step: list[float]) -> list[list[int]]:
    """``indices`` in consecutive groups whose expected rows per step sum to at most :data:`MAX_PAIRS_PER_STEP`."""
    groups: list[list[int]] = []
    load = math.inf
    for index, expected in zip(indices, rows_per_step):
        if load + expected > MAX_PAIRS_PER_STEP:
            groups.append([])
            load = 0.0
        groups[-1].append(index)
        load += expected
    return groups


def run_many(specs: list[RunSpec], on_done: Callable[[int], None] | None = None,
             refusals: dict[int, UsageError] | None = None) -> list[dict[str, Any] | None]:
    """Every spec's record: those :func:`run_batch` can take trained together, the rest one by one with
    ``engine.run``; None for a spec the engine refuses (a ``UsageError``, which depends only on its settings), whose
    error goes to ``refusals[index]`` when a dict is given."""
    results: list[dict[str, Any] | None] = [None] * len(specs)
    refusals = {} if refusals is None else refusals
    accepted, rows_per_step = [], []
    for index, spec in enumerate(specs):
        try:
            described = planning.describe_record(spec)
            accepted.append(index)
            rows_per_step.append((described.get("sample_rate") or 1.0) * (described.get("n_train") or 0))
        except UsageError as error:
            refusals[index] = error
            if on_done:
                on_done(1)
    unbatched = []
    for group in _groups(accepted, rows_per_step):
        try:
            for index, record in zip(group, run_batch([specs[i] for i in group])):
                results[index] = record
            if on_done:
                on_done(len(group))
        except (NotBatchable, UsageError):  # not batchable, or a spec refused only by its method's setup
            unbatched += group
    for index in unbatched:
        try:
            results[index] = engine.run(specs[index])
        except UsageError as error:
            refusals[index] = error
        if on_done:
            on_done(1)
    return results
