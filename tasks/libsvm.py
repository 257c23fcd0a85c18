"""Logistic regression on the high-dimensional LIBSVM sets of Yu et al. 2020, Table 2 (Gisette, Real-sim, RCV1), with
sparse inputs kept sparse through sampling, clipping and evaluation (``dpbench/data/libsvm.py``, ``dpbench/data/rows.py``).

Yu et al. report at ε = 0.1 (δ = 1/n²): DP-GD 67.3 (Gisette), 76.1 (Real-sim), 74.9 (RCV1). None of the files can be
fetched on this project's machines; the loaders are tested on files the tests write in the canonical format. The
model is :class:`LinearClassification`'s (a bias unless ``bias=false``), rows of unit norm; ``dense=true`` loads the
same rows densified (to measure what sparsity saves, ``benchmarks/sparse_time.py``). The gradient methods without a
per-example transform train on sparse rows; AdaCliP, output and objective perturbation, the audit's canaries and
batched seeds need dense rows and refuse them.
"""
from dataclasses import replace

from dpbench.data import libsvm
from dpbench.tasks.linear import STEPS, LinearClassification


class SparseLinear(LinearClassification):
    """A LIBSVM set: ``dataset`` names it in :data:`dpbench.data.libsvm.FILES`."""

    dataset: str
    classes = 2
    options = {"bias": True, "dense": False}
    defaults = {"epochs": 10, "batch_size": 256, "steps": 200}
    search_lists = {"epochs": [3, 5, 10, 20, 40], "batch_size": [64, 256, 1024, 4096], "steps": STEPS}

    def load_data(self):
        data = libsvm.load(self.dataset)
        if not self.settings["dense"]:
            return data
        return replace(data, x_train=data.x_train.to_dense(), x_test=data.x_test.to_dense(),
                       preprocessing=data.preprocessing + " Densified (option dense=true).")


class Gisette(SparseLinear):
    name = "gisette"
    description = "logistic regression on LIBSVM's Gisette (5,000 features; 6,000/1,000 train/test), sparse rows"
    dataset = "gisette"


class RealSim(SparseLinear):
    name = "realsim"
    description = "logistic regression on LIBSVM's Real-sim (20,958 features, 72,309 rows, 80/20), sparse rows"
    dataset = "realsim"


class RCV1(SparseLinear):
    name = "rcv1"
    description = "logistic regression on LIBSVM's RCV1 (rcv1_train.binary: 47,236 features, 20,242 rows), sparse"
    dataset = "rcv1"
