"""Multi-process DP training through Lightning: ``dpbench run ... --devices N --strategy ddp``.

Each of the N ranks (processes; gloo on the CPU, NCCL on GPUs) holds the same model and method state. Per release:

* sampling: rank r Poisson-samples its own shard, the examples r, r + N, r + 2N, ..., each with the run's rate q,
  from a stream of its own (``sampler`` at (epoch, rank)); every example is in exactly one shard, so the union of
  the ranks' batches is a Poisson sample of the whole training set at rate q, what the accountant assumes;
* clipping: each rank clips its examples' gradients and sums them (scaled by 1/B, B = q·n the expected size of the
  whole batch);
* noise: rank 0 alone draws N(0, σ²C²/B²) from the run's noise stream, the other ranks contribute zeros, and one
  all-reduce (sum) gives every rank (Σ_all clip_C(g_i) + N(0, σ²C²I))/B, the release of a one-process run. One rank
  drawing, rather than each rank N(0, σ²C²/N): the noise is one draw from one stream whatever N is (a seed's noise is
  the one-process run's), and no rank's share can be lost or doubled; the partial sums that cross ranks carry no
  noise, but never leave the data owner's processes, as a one-process run's intermediate values never do;
* the ledger: every rank counts each release once, as one process would, and rank 0 writes the record (with
  ``world_size``); the examples the batches held are summed over ranks for the sampling guard.

The ranks' models are never wrapped in DistributedDataParallel: its gradient all-reduce would exchange unclipped,
un-noised gradients and average them, which is not the release; here every parameter update is the method's
post-processing of the all-reduced release, identical on every rank. Methods need no change.
"""
from __future__ import annotations

import torch
from pytorch_lightning.strategies import DDPStrategy


class PrivateDDP(DDPStrategy):
    """Lightning's DDP (process group, launcher, ranks) without the DistributedDataParallel wrapper (see above)."""

    strategy_name = "dpbench_ddp"

    def configure_ddp(self) -> None:
        pass  # no wrapper: the ranks exchange releases in PrivateTraining.release, nothing else


def strategy(accelerator: str, devices: int):
    """What the Lightning Trainer gets: "auto" for one process, :class:`PrivateDDP` for several."""
    if devices == 1:
        return "auto"
    return PrivateDDP(process_group_backend="gloo" if accelerator == "cpu" else None)


def world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside a process group."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def sum_over_ranks(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor replaced, in place, by its sum over the ranks."""
    for tensor in tensors:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensors


def total(count: int) -> int:
    """A count summed over the ranks."""
    value = torch.tensor([count], dtype=torch.float64)
    sum_over_ranks([value])
    return int(value.item())
