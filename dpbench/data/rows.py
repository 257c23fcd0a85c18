"""Rows of a data tensor, dense or sparse: the tasks with sparse inputs (LIBSVM's text sets, ``tasks/libsvm.py``)
keep their examples as a coalesced ``torch.sparse_coo_tensor`` end to end, so that no batch of RCV1's 47,236
features is ever densified. PyTorch's sparse tensors support selecting rows (``index_select``), not slicing or
boolean masks: every place that takes rows of ``x`` goes through here."""
from __future__ import annotations

import numpy as np
import pandas as pd
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


def distinct(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the position of the first occurrence of each distinct row of ``x``, the distinct row of each row), rows
    compared bit for bit. Rows are grouped by a 64-bit polynomial hash of their bytes and each group is then checked
    to hold one row exactly (``np.unique`` if a hash collided). Hand-written: ``np.unique(x, axis=0)`` sorts and
    took 10 s on kddcup99's 395,216 × 119 floats, this ~0.3 s."""
    data = np.ascontiguousarray(x).view(np.uint8).reshape(len(x), -1)
    if data.shape[1] % 8:
        data = np.hstack([data, np.zeros((len(x), 8 - data.shape[1] % 8), dtype=np.uint8)])
    words = data.view(np.uint64)
    multipliers = np.uint64(0x9E3779B97F4A7C15) ** np.arange(1, words.shape[1] + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):  # arithmetic modulo 2⁶⁴
        keys = (words * multipliers).sum(axis=1, dtype=np.uint64)
    groups, _ = pd.factorize(keys)
    first = np.empty(groups.max() + 1 if len(x) else 0, dtype=np.int64)
    first[groups[::-1]] = np.arange(len(x) - 1, -1, -1)
    if not all(np.array_equal(words[first[groups[start:start + 8192]]], words[start:start + 8192])
               for start in range(0, len(x), 8192)):
        _, first, groups = np.unique(words.view(np.dtype((np.void, words.shape[1] * 8))).ravel(), return_index=True,
                                     return_inverse=True)
    return first, groups.reshape(-1)
