"""Rows of a data tensor, dense or sparse: the tasks with sparse inputs (LIBSVM's text sets, ``tasks/libsvm.py``)
keep their examples as a coalesced ``torch.sparse_coo_tensor`` end to end, so that no batch of RCV1's 47,236
features is ever densified. PyTorch's sparse tensors support selecting rows (``index_select``), not slicing or
boolean masks: every place that takes rows of ``x`` goes through here."""
from __future__ import annotations

import torch


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows ``index`` (a long tensor of positions, or a boolean mask) of ``x``, in that order."""
    if x.is_sparse:
        if index.dtype == torch.bool:
            index = index.nonzero().flatten()
        return x.index_select(0, index)
    return x[index]


def first(x: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` rows of ``x``."""
    return take(x, torch.arange(min(count, x.shape[0]))) if x.is_sparse else x[:count]


def chunks(x: torch.Tensor, size: int) -> list[torch.Tensor]:
    """``x`` in consecutive chunks of ``size`` rows (the test set's evaluation batches)."""
    if not x.is_sparse:
        return list(x.split(size))
    return [take(x, torch.arange(start, min(start + size, x.shape[0]))) for start in range(0, x.shape[0], size)]


def squared_norms(x: torch.Tensor) -> torch.Tensor:
    """‖x_i‖² of every row i, dense."""
    if x.is_sparse:
        return torch.sparse.sum(x * x, dim=1).to_dense() if x._nnz() else torch.zeros(x.shape[0], dtype=x.dtype)
    return torch.linalg.vector_norm(x, dim=1).square()
