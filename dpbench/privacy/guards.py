"""Checks that stand between a run and its record: what the accountant assumes must be what ran.

* :func:`refuse_example_mixing`, before training: the accountant assumes each release is a sum of per-example
  contributions of norm ≤ C. A layer that mixes examples in training mode (batch normalization: one example's
  input moves every other example's output, so its influence on the sum is not bounded by C) or that updates
  buffers in the forward pass (running statistics computed from private batches without noise, saved with the
  model) breaks that. Such a model is refused, whichever clipping path would run.
* :func:`check_sampling`, after training: the number of examples the engine actually handed to the method must be
  consistent with the sampler of the record (e.g. a Poisson rate wired as 2q while the ledger charges q would give
  twice the expected count). For Poisson sampling the count is Binomial(n·T, q); a count whose tail probability
  is below ``SAMPLING_TAIL`` (1e-20) on either side is refused. So a correctly wired engine refuses with
  probability below 2e-20, far below any δ dpbench accepts, and the refusal depends only on the sampler's own
  draws (and the public n): it adds at most 2e-20 to δ, which the record does not state. The count itself is
  never recorded: it depends on each example's own inclusions, a release the accountant does not cover.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from scipy import stats
from torch import nn

from dpbench.data import rows
from dpbench.errors import PrivacyCheckFailed, UsageError

if TYPE_CHECKING:  # a privacy module names the task contract as a type only
    from dpbench.task import Task

SAMPLING_TAIL = 1e-20


def refuse_example_mixing(task: Task, public_inputs: torch.Tensor) -> None:
    """Raise :class:`~dpbench.errors.UsageError` if ``task.model`` mixes examples or changes buffers in training.

    Checked three ways: batch normalization layers by type; a forward pass in training mode on three public
    (test) inputs that changes any buffer; and any module's outputs for examples 2 and 3 changing when example 1
    is replaced (same random draws for both passes, so dropout is not mistaken for mixing; every module, so that a
    model whose last layer starts at zero does not hide it). The model is left as it was."""
    model = task.model
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise UsageError(f"layer {name or 'model'} ({type(module).__name__}) mixes the examples of a batch: "
                             f"per-example clipping cannot bound one example's influence; use GroupNorm or LayerNorm")
    if len(public_inputs) < 3:
        return
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    swapped = rows.take(public_inputs, torch.tensor([1, 1, 2]))  # example 1 replaced by a copy of example 2
    try:
        first = _module_outputs(task, public_inputs)
        changed = [name for name, buffer in model.named_buffers() if not torch.equal(buffer, buffers[name])]
        second = [] if changed else _module_outputs(task, swapped)
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
    if changed:
        raise UsageError(f"the model's buffers {', '.join(changed)} change in a training forward pass: statistics of "
                         f"private batches would be kept without noise")
    for (name, a), (_, b) in zip(first, second):
        if a.shape == b.shape and a.shape[:1] == (3,) and not torch.allclose(a[1:], b[1:], rtol=1e-5, atol=1e-6):
            raise UsageError(f"task {task.name}: in training mode the output of {name or 'the model'} for one "
                             f"example depends on another example of the batch; per-example clipping cannot bound "
                             f"an example's influence")


def _module_outputs(task: Task, inputs: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Every module's tensor output, in call order, of one training-mode forward pass (random draws from a fixed
    seed, so that two passes draw alike)."""
    outputs: list[tuple[str, torch.Tensor]] = []
    hooks = [module.register_forward_hook(
        lambda module, args, output, name=name: outputs.append((name, output.detach())) if torch.is_tensor(output)
        else None) for name, module in task.model.named_modules()]
    was_training = task.training
    task.train()
    try:
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(0)
            task(inputs)
    finally:
        task.train(was_training)
        for hook in hooks:
            hook.remove()
    return outputs


def check_sampling(sampler: str, sample_rate: float, n: int, releases: int, sampled: int) -> None:
    """Refuse a run whose batches held a number of examples the record's sampler cannot explain (module docstring)."""
    if releases == 0:
        return
    if sampler in ("shuffle", "cyclic") or sample_rate >= 1:
        expected = releases * (n if sample_rate >= 1 else round(sample_rate * n))
        if sampled != expected:
            raise PrivacyCheckFailed(f"the batches held {sampled} examples; {releases} {sampler} batches of "
                                     f"{expected // releases} hold {expected}")
        return
    trials = n * releases
    low, high = stats.binom.cdf(sampled, trials, sample_rate), stats.binom.sf(sampled - 1, trials, sample_rate)
    if min(low, high) < SAMPLING_TAIL:
        raise PrivacyCheckFailed(
            f"the {releases} Poisson batches held {sampled} examples; at the recorded rate q = {sample_rate:.6g} over "
            f"n = {n} they hold {trials * sample_rate:.1f} on average (tail probability {min(low, high):.2g}): the "
            f"sampler does not draw at the rate the ε is computed for")
