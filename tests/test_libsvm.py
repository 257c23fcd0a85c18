"""The LIBSVM tasks (gisette, realsim, rcv1: tasks/libsvm.py) on files the tests write in the canonical format (bz2
LIBSVM text, labels ±1, 1-based feature indices): none can be fetched here. Sparse rows stay sparse and train to the
same model as the same rows densified; what would densify them is refused."""
import json

import pytest
import torch

from dpbench.cli import main
from dpbench.data import files, libsvm, rows
from dpbench.privacy.clipping import VmapClipper
from dpbench.privacy.ghost import GhostClipper
from dpbench.tasks.linear import Adult


@pytest.fixture
def libsvm_mirror(tmp_path, monkeypatch):
    """A mirror holding all four files, with fewer rows than the canonical ones (the shapes are checked against
    libsvm.ROWS, patched to match) and the canonical feature counts."""
    mirror = tmp_path / "mirror"
    sizes = {"gisette": 600, "gisette-test": 100, "realsim": 700, "rcv1": 800}
    for seed, (key, n) in enumerate(sizes.items()):
        remote = libsvm.FILES[key]
        libsvm.write_synthetic(mirror / remote.folder / remote.name, n, libsvm.FEATURES[key.split("-")[0]], 0.002, seed)
    monkeypatch.setattr(libsvm, "ROWS", sizes)
    monkeypatch.setenv("DPBENCH_MIRROR", str(mirror))
    libsvm._LOADED.clear()
    yield mirror
    libsvm._LOADED.clear()


@pytest.mark.parametrize("name, n_train, n_test", [("gisette", 600, 100), ("realsim", 560, 140), ("rcv1", 640, 160)])
def test_loaders_read_the_canonical_format_as_sparse_unit_rows(libsvm_mirror, name, n_train, n_test):
    loaded = libsvm.load(name)
    assert loaded.x_train.is_sparse and loaded.x_test.is_sparse and loaded.data_id == name
    assert loaded.x_train.shape == (n_train, libsvm.FEATURES[name]) and len(loaded.y_test) == n_test
    assert set(loaded.y_train.tolist()) <= {0, 1}
    torch.testing.assert_close(rows.squared_norms(loaded.x_train), torch.ones(n_train))
    sha = files._digest(libsvm_mirror / libsvm.FILES[name].folder / libsvm.FILES[name].name, "sha256", False)
    assert f"sha256 {sha}" in loaded.preprocessing and "unit L2 norm" in loaded.preprocessing


def test_a_file_that_changed_after_its_first_use_is_refused(libsvm_mirror):
    libsvm.load("rcv1")
    remote = libsvm.FILES["rcv1"]
    libsvm.write_synthetic(libsvm_mirror / remote.folder / remote.name, 800, libsvm.FEATURES["rcv1"], 0.002, seed=99)
    libsvm._LOADED.clear()
    with pytest.raises(files.DataError, match="but the copy first used here had"):
        libsvm.load("rcv1")


def test_a_file_of_another_shape_is_refused(libsvm_mirror, monkeypatch):
    monkeypatch.setitem(libsvm.ROWS, "rcv1", 20242)
    with pytest.raises(files.DataError, match="the canonical file has 20242 rows"):
        libsvm.load("rcv1")


def test_ghost_clipping_of_sparse_rows_equals_dense_and_the_reference():
    """Per-example norms and the clipped sum of a linear model on sparse rows: the same as on the densified rows
    and as the materialized reference (vmap)."""
    torch.manual_seed(0)
    task = Adult()
    task.classes, task.model = 2, torch.nn.Linear(50, 1)
    dense = torch.rand(12, 50) * (torch.rand(12, 50) < 0.1)
    dense[3] = 0  # an empty row
    sparse, y = dense.to_sparse(), torch.randint(0, 2, (12,))
    sums_sparse, norms_sparse = GhostClipper().clipped_sum(task, sparse, y, 0.05)
    sums_dense, norms_dense = GhostClipper().clipped_sum(task, dense, y, 0.05)
    sums_reference, norms_reference = VmapClipper().clipped_sum(task, dense, y, 0.05)
    torch.testing.assert_close(norms_sparse, norms_dense)
    torch.testing.assert_close(norms_sparse, norms_reference)
    for a, b, c in zip(sums_sparse, sums_dense, sums_reference):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)


def run_json(capsys, *args):
    assert main(["run", *args, "--json", "--no-wandb"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sparse_rows_train_the_model_their_densified_copy_trains(libsvm_mirror, capsys):
    args = ["--method", "dpsgd", "--task", "rcv1", "--epsilon", "1", "--epochs", "3", "--batch-size", "64"]
    sparse = run_json(capsys, *args)
    dense = run_json(capsys, *args, "--set", "dense=true")
    assert sparse["clipping"] == dense["clipping"] == "ghost" and sparse["epsilon"] == dense["epsilon"]
    assert sparse["metrics"] == pytest.approx(dense["metrics"], rel=1e-4)


@pytest.mark.parametrize("args, reason", [
    (["--method", "adaclip"], "per-example transform"),
    (["--method", "dpsgd", "--clipping", "reference"], "reference clipping path"),
    (["--method", "output_perturbation"], "solves on dense rows"),
])
def test_what_would_densify_sparse_rows_is_refused(libsvm_mirror, refused, args, reason):
    assert reason in refused("run", *args, "--task", "rcv1", "--epsilon", "1", "--no-wandb")
