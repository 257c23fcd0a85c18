"""The high-dimensional sets of Yu et al. 2020, Table 2 (from the LIBSVM collection), as sparse tensors.

Gisette (5,000 features; its own 6,000/1,000 train/test files), Real-sim (20,958 features, 72,309 rows) and RCV1
(``rcv1_train.binary``: 47,236 features, 20,242 rows), read with scikit-learn's svmlight loader from the canonical
bz2 files of the LIBSVM site (mirror, cache or download, :mod:`dpbench.data.files`). LIBSVM publishes no checksums: each
file's sha256 is pinned when first used and named in the data's ``preprocessing``. Preprocessing as the DP-ERM
benchmark of Iyengar et al. 2019 (whose data Yu et al. use) does for these sets: labels ±1 → {0, 1}; every row
scaled to unit L2 norm (so a linear model's per-example gradient norm is bounded, as for the other tabular tasks);
Real-sim and RCV1, single files, split by the benchmark's convention (a seeded 80/20 permutation), Gisette by its
own files. The rows stay sparse end to end (:mod:`dpbench.data.rows`): RCV1 densified would be 20,242 × 47,236 floats.
"""
from __future__ import annotations

import bz2

import numpy as np
import scipy.sparse
import torch
from sklearn.datasets import load_svmlight_file

from dpbench.data.files import DataError, RemoteFile, dpbench_home, fetch, mirror_dir, pinned_sha256
from dpbench.data.taskdata import TaskData

_LIBSVM = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary"
FILES = {
    "gisette": RemoteFile("gisette", "gisette_scale.bz2", f"{_LIBSVM}/gisette_scale.bz2", None),
    "gisette-test": RemoteFile("gisette", "gisette_scale.t.bz2", f"{_LIBSVM}/gisette_scale.t.bz2", None),
    "realsim": RemoteFile("realsim", "real-sim.bz2", f"{_LIBSVM}/real-sim.bz2", None),
    "rcv1": RemoteFile("rcv1", "rcv1_train.binary.bz2", f"{_LIBSVM}/rcv1_train.binary.bz2", None),
}
FEATURES = {"gisette": 5000, "realsim": 20958, "rcv1": 47236}
ROWS = {"gisette": 6000, "gisette-test": 1000, "realsim": 72309, "rcv1": 20242}


def _read(key: str) -> tuple[scipy.sparse.csr_matrix, np.ndarray, str]:
    """(rows, labels in {0, 1}, sha256) of one canonical file, its shape checked."""
    remote = FILES[key]
    path = fetch(remote)
    name = key.split("-")[0]
    try:
        with bz2.open(path, "rb") as stream:
            x, y = load_svmlight_file(stream, n_features=FEATURES[name], dtype=np.float32)
    except (OSError, EOFError, ValueError) as error:
        raise DataError(f"{path} is not a bz2 LIBSVM file of {FEATURES[name]} features: {error}") from None
    if x.shape[0] != ROWS[key] or set(np.unique(y)) - {-1.0, 1.0}:
        raise DataError(f"{path}: {x.shape[0]} rows with labels {sorted(set(np.unique(y)))[:5]}; the canonical "
                        f"file has {ROWS[key]} rows labelled -1 and +1")
    return x, (y > 0).astype(np.int64), pinned_sha256(path, remote)


def _unit_rows(x: scipy.sparse.csr_matrix) -> scipy.sparse.csr_matrix:
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1), dtype=np.float64)).ravel()
    return scipy.sparse.diags(np.where(norms > 0, 1 / np.where(norms > 0, norms, 1), 0).astype(np.float32)) @ x


def _torch(x: scipy.sparse.csr_matrix) -> torch.Tensor:
    coo = x.tocoo()
    index = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
    return torch.sparse_coo_tensor(index, torch.from_numpy(coo.data.astype(np.float32)), coo.shape,
                                   check_invariants=True).coalesce()


_LOADED: dict[tuple, TaskData] = {}


def load(name: str) -> TaskData:
    """``gisette``, ``realsim`` or ``rcv1`` as sparse train and test tensors (see the module docstring); parsed once
    per process and data source (callers must not modify the tensors)."""
    source = (name, mirror_dir(), dpbench_home())
    if source not in _LOADED:
        _LOADED[source] = _load(name)
    return _LOADED[source]


def _load(name: str) -> TaskData:
    unit = "each row scaled to unit L2 norm (the norms computed from the data, per row)"
    if name == "gisette":
        x_train, y_train, train_sha = _read("gisette")
        x_test, y_test, test_sha = _read("gisette-test")
        files = (f"gisette_scale.bz2 (sha256 {train_sha}) as the 6,000 training rows and gisette_scale.t.bz2 (sha256 "
                 f"{test_sha}) as the 1,000 test rows")
    else:
        x, y, sha = _read(name)
        order = np.random.default_rng(0).permutation(x.shape[0])
        train, test = order[: x.shape[0] * 4 // 5], order[x.shape[0] * 4 // 5:]
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
        files = (f"{FILES[name].name} (sha256 {sha}), {x.shape[0]:,} rows; split np.random.default_rng(0).permutation"
                 f"(n), the first floor(0.8 n) train, the rest test (DP-ERM benchmark convention)")
    preprocessing = (f"LIBSVM {files}; {FEATURES[name]:,} features read by sklearn.datasets.load_svmlight_file as "
                     f"float32; labels -1/+1 mapped to 0/1; {unit}; kept sparse (torch sparse COO).")
    return TaskData(_torch(_unit_rows(x_train)), torch.from_numpy(y_train), _torch(_unit_rows(x_test)),
                    torch.from_numpy(y_test), name, preprocessing)


def write_synthetic(path, rows: int, features: int, density: float, seed: int = 0) -> None:
    """A bz2 file in LIBSVM's format with ``rows`` rows of about ``density``·``features`` nonzeros in [0, 1) and
    ±1 labels from a hidden linear rule: what the tests and ``benchmarks/sparse_time.py`` read in place of the
    canonical files, which cannot be fetched where they run."""
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=features)
    path.parent.mkdir(parents=True, exist_ok=True)
    with bz2.open(path, "wt") as out:
        for _ in range(rows):
            columns = np.sort(rng.choice(features, size=max(1, rng.binomial(features, density)), replace=False))
            values = rng.random(len(columns))
            label = 1 if values @ hidden[columns] > 0 else -1
            out.write(f"{label} " + " ".join(f"{c + 1}:{v:.6f}" for c, v in zip(columns, values)) + "\n")
