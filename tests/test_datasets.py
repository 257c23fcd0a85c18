"""The loaders of dpbench.data (tabular, mnist, cifar, snli) on the offline mirror of canonical files.

The mirror is ``$DPBENCH_MIRROR``, by default ``<repo root>/../shared/data``; tests that need it are skipped when
it does not exist. Each dataset is loaded once per module (kddcup99 takes a few seconds).
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import sklearn.datasets
import torch

from dpbench.data import cifar, files, mnist, snli, tabular
from dpbench.data.files import DataError
from tests.conftest import MIRROR, REPO

UNREACHABLE = "http://127.0.0.1:9/x"


def source(name: str):
    """The loader module (by source) that defines ``name``."""
    return next(module for module in (tabular, mnist, cifar, snli) if name in vars(module))

# loader: data_id, n_train, n_test, classes, rows of unit norm, partial dataset (has a note)
EXPECTED = {
    "load_digits": ("digits", 1437, 360, 10, True, False),  # 1,797
    "load_breast_cancer": ("breast_cancer", 455, 114, 2, True, False),  # 569
    "load_adult": ("adult", 36177, 9045, 2, True, False),  # 45,222
    "load_kddcup99": ("kddcup99-10pct", 395216, 98805, 2, True, False),  # 494,021
    "load_covertype": ("covertype-first10k", 8000, 2000, 7, True, True),  # 10,000
    "load_mnist": ("mnist-5k-train", 5000, 10000, 10, False, True),
}
# label counts over train + test, from the mirror's PROVENANCE files and the UCI/sklearn documentation
LABEL_COUNTS = {
    "load_digits": [178, 182, 177, 183, 181, 182, 181, 179, 174, 180],
    "load_breast_cancer": [212, 357],
    "load_adult": [34014, 11208],
    "load_kddcup99": [97278, 494021 - 97278],
    "load_covertype": [1375, 1462, 1262, 1620, 1583, 1349, 1349],
    "load_mnist": [500 + n for n in [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]],
}
MINMAX_NOTICE = (
    "min-max bounds computed on the full dataset before the split, not privatized, as in the DP-ERM benchmark"
)


def use_mirror(mp: pytest.MonkeyPatch, home: Path) -> None:
    """Point dpbench at the test mirror (tests/conftest.py clears DPBENCH_MIRROR before every test)."""
    if not MIRROR.is_dir():
        pytest.skip(f"no dataset mirror at {MIRROR} (set DPBENCH_MIRROR)")
    mp.setenv("DPBENCH_MIRROR", str(MIRROR))
    mp.setenv("DPBENCH_HOME", str(home))


@pytest.fixture(scope="module")
def mirror_env(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        use_mirror(mp, tmp_path_factory.mktemp("home"))
        yield


@pytest.fixture(scope="module", params=list(EXPECTED))
def loaded(request, mirror_env):
    """(loader name, TaskData), loaded once per module."""
    return request.param, getattr(source(request.param), request.param)()


def test_sizes_types_and_classes(loaded):
    name, task_data = loaded
    _, n_train, n_test, classes, _, _ = EXPECTED[name]
    assert (len(task_data.x_train), len(task_data.y_train)) == (n_train, n_train)
    assert (len(task_data.x_test), len(task_data.y_test)) == (n_test, n_test)
    assert task_data.x_train.dtype == task_data.x_test.dtype == torch.float32
    assert task_data.y_train.dtype == task_data.y_test.dtype == torch.int64
    assert task_data.x_train.shape[1] == task_data.x_test.shape[1]
    assert torch.isfinite(task_data.x_train).all() and torch.isfinite(task_data.x_test).all()
    for labels in (task_data.y_train, task_data.y_test):
        assert labels.unique().tolist() == list(range(classes))  # 0..K-1, every class in both splits
    all_labels = torch.cat([task_data.y_train, task_data.y_test])
    assert torch.bincount(all_labels, minlength=classes).tolist() == LABEL_COUNTS[name]


def test_feature_scaling(loaded):
    name, task_data = loaded
    for x in (task_data.x_train, task_data.x_test):
        assert x.min() >= 0
        if EXPECTED[name][4]:
            torch.testing.assert_close(x.norm(dim=1), torch.ones(len(x)), atol=1e-5, rtol=0)
        else:  # MNIST: pixels /255, flattened 28x28, rows not normalized
            assert x.shape[1] == 784 == np.prod(mnist.MNIST_IMAGE_SHAPE)
            assert x.max() == 1.0 and x.norm(dim=1).max() > 2


def test_id_note_and_preprocessing(loaded):
    name, task_data = loaded
    data_id, _, _, _, _, partial = EXPECTED[name]
    assert task_data.data_id == data_id
    assert (task_data.note is not None) == partial
    if partial:
        assert task_data.note and "\n" not in task_data.note
    uses_minmax = name in {"load_breast_cancer", "load_adult", "load_kddcup99", "load_covertype"}
    assert (MINMAX_NOTICE in task_data.preprocessing) == uses_minmax


def test_loading_is_deterministic(loaded, monkeypatch, tmp_path):
    name, first = loaded
    use_mirror(monkeypatch, tmp_path / "home")
    second = getattr(source(name), name)()
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(first, field), getattr(second, field)), field
    assert (first.data_id, first.preprocessing, first.note) == (second.data_id, second.preprocessing, second.note)


def test_split_is_the_dp_erm_convention():
    digits = sklearn.datasets.load_digits()
    x = digits.data / 16.0
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    order = np.random.default_rng(0).permutation(len(x))
    task_data = tabular.load_digits()
    np.testing.assert_allclose(task_data.x_train.numpy(), x[order[:1437]], atol=1e-6)
    np.testing.assert_array_equal(task_data.y_test.numpy(), digits.target[order[1437:]])


def test_adult_label_balance(monkeypatch, tmp_path):
    use_mirror(monkeypatch, tmp_path / "home")
    task_data = tabular.load_adult()
    labels = torch.cat([task_data.y_train, task_data.y_test]).double()
    assert len(labels) == 45222
    assert labels.mean().item() == pytest.approx(0.248, abs=0.001)  # 11,208 of 45,222 earn >50K
    assert task_data.y_train.double().mean().item() == pytest.approx(0.248, abs=0.01)


@pytest.mark.parametrize(
    ("loader", "folder", "name"),
    [("load_adult", "adult", "adult.data"), ("load_covertype", "covertype", "covtype_first10000.csv")],
)
def test_corrupted_mirror_file_is_rejected(tmp_path, monkeypatch, loader, folder, name):
    use_mirror(monkeypatch, tmp_path / "home")
    mirror = tmp_path / "mirror"
    shutil.copytree(MIRROR / folder, mirror / folder)
    corrupted = mirror / folder / name
    content = bytearray(corrupted.read_bytes())
    content[len(content) // 2] ^= 0x01
    corrupted.chmod(0o644)
    corrupted.write_bytes(bytes(content))
    monkeypatch.setenv("DPBENCH_MIRROR", str(mirror))
    with pytest.raises(DataError) as error:
        getattr(source(loader), loader)()
    message = str(error.value)
    assert str(corrupted) in message
    assert hashlib.sha256(content).hexdigest() in message  # the actual hash
    assert hashlib.sha256((MIRROR / folder / name).read_bytes()).hexdigest() in message  # the expected hash


@pytest.mark.parametrize(
    ("loader", "mirrored", "remote"),
    [
        ("load_adult", True, tabular.ADULT_DATA),
        ("load_kddcup99", True, tabular.KDDCUP99_10PCT),
        ("load_covertype", True, tabular.COVTYPE),  # an empty mirror has no subset: ask for the full file
        ("load_covertype", False, tabular.COVTYPE),
        ("load_mnist", True, mnist.MNIST_5K),  # a mirror without training images: the 5k fallback
        ("load_mnist", False, mnist.MNIST_TRAIN_IMAGES),  # no mirror: the canonical files
    ],
)
def test_missing_file_error_says_where_to_put_it(tmp_path, monkeypatch, loader, mirrored, remote):
    home, mirror = tmp_path / "home", tmp_path / "mirror"
    mirror.mkdir()
    monkeypatch.setenv("DPBENCH_HOME", str(home))
    if mirrored:
        monkeypatch.setenv("DPBENCH_MIRROR", str(mirror))
    else:
        monkeypatch.delenv("DPBENCH_MIRROR", raising=False)
    monkeypatch.setattr(source(loader), "fetch", lambda file: files.fetch(dataclasses.replace(file, url=UNREACHABLE)))
    with pytest.raises(DataError) as error:
        getattr(source(loader), loader)()
    message = str(error.value)
    assert f"cannot download {UNREACHABLE}" in message
    assert f"put {remote.name} ({remote.checksum}) in" in message
    assert f"{home / 'data' / remote.folder}/" in message
    assert (f"{mirror / remote.folder}/" in message) == mirrored
    assert f"or set DPBENCH_MIRROR to a folder of the canonical files laid out as <dataset>/<file> " \
           f"({remote.folder}/{remote.name})" in message
    assert [path for path in home.rglob("*") if path.is_file()] == []  # no partial download left behind


# ---- the full datasets, on files the tests write in the canonical formats (none can be fetched here) -------------

def _canonical(tmp_path, monkeypatch, attribute: str, payload: bytes, payload_md5: bool = False):
    """A mirror holding ``payload`` as the canonical file ``datasets.<attribute>``, with the checksum it has."""
    remote = getattr(source(attribute), attribute)
    (tmp_path / "mirror" / remote.folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "mirror" / remote.folder / remote.name).write_bytes(payload)
    digest = hashlib.md5(gzip.decompress(payload) if payload_md5 else payload).hexdigest()
    monkeypatch.setattr(source(attribute), attribute, dataclasses.replace(remote, checksum=f"md5:{digest}"))
    monkeypatch.setenv("DPBENCH_MIRROR", str(tmp_path / "mirror"))
    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "home"))


def _idx(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes (MNIST's format): magic 0 0 8 ndim, big-endian int32 sizes, the bytes; gzipped."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(size).to_bytes(4, "big") for size in array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def test_full_mnist_reads_the_canonical_idx_files(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    images = {"TRAIN": rng.integers(0, 256, (60000, 28, 28)), "TEST": rng.integers(0, 256, (10000, 28, 28))}
    labels = {"TRAIN": rng.integers(0, 10, 60000), "TEST": rng.integers(0, 10, 10000)}
    for split in ("TRAIN", "TEST"):
        _canonical(tmp_path, monkeypatch, f"MNIST_{split}_IMAGES", _idx(images[split]), payload_md5=True)
        _canonical(tmp_path, monkeypatch, f"MNIST_{split}_LABELS", _idx(labels[split]), payload_md5=True)
    loaded = mnist.load_mnist.__wrapped__()  # not the process's cached copy
    assert loaded.data_id == "mnist" and loaded.note is None and loaded.x_train.shape == (60000, 784)
    expected = images["TRAIN"][123].reshape(784).astype(np.float32) / np.float32(255)
    assert torch.equal(loaded.x_train[123], torch.from_numpy(expected))
    assert loaded.y_test.tolist() == labels["TEST"].tolist()


def test_full_covertype_reads_the_canonical_file(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    rows = 2000
    continuous = rng.integers(0, 4000, (rows, 10))
    wilderness = np.eye(4, dtype=int)[rng.integers(0, 4, rows)]
    soil = np.eye(40, dtype=int)[rng.integers(0, 40, rows)]
    cover = rng.integers(1, 8, rows)
    table = np.hstack([continuous, wilderness, soil, cover[:, None]])
    text = "\n".join(",".join(map(str, row)) for row in table) + "\n"  # covtype.data: no header, 55 columns
    _canonical(tmp_path, monkeypatch, "COVTYPE", gzip.compress(text.encode()))
    loaded = tabular.load_covertype()
    assert loaded.data_id == "covertype" and loaded.note is None
    assert len(loaded.y_train) + len(loaded.y_test) == rows and loaded.x_train.shape[1] == 54
    assert sorted(set(loaded.y_train.tolist()) | set(loaded.y_test.tolist())) == sorted(set(cover - 1))
    torch.testing.assert_close(loaded.x_train.norm(dim=1), torch.ones(len(loaded.y_train)))


def test_snli_train_reads_the_canonical_zip(tmp_path, monkeypatch):
    """snli_1.0.zip's jsonl files: pairs whose gold label is '-' are dropped; the train split is the training set."""
    def jsonl(pairs):
        return "".join(json.dumps({"gold_label": label, "sentence1": s1, "sentence2": s2}) + "\n"
                       for s1, s2, label in pairs)

    train = [("A man sleeps.", "A person rests.", "entailment"), ("Two dogs run.", "Cats sit.", "contradiction"),
             ("No majority.", "None.", "-"), ("A girl reads.", "She is happy.", "neutral")]
    test = [("It rains.", "It is wet.", "entailment")]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for split, pairs in (("train", train), ("dev", test), ("test", test)):
            archive.writestr(f"snli_1.0/snli_1.0_{split}.jsonl", jsonl(pairs))
    _canonical(tmp_path, monkeypatch, "SNLI_ZIP", buffer.getvalue())
    loaded = snli.load_snli.__wrapped__()
    assert loaded.data_id == "snli" and loaded.note is None
    assert loaded.train.premises == ["A man sleeps.", "Two dogs run.", "A girl reads."]
    assert loaded.train.labels.tolist() == [0, 2, 1] and loaded.test.hypotheses == ["It is wet."]


def test_the_tests_read_the_mirror_that_dpbench_mirror_names(tmp_path):
    """Issue 35, item 7: the tests read ``DPBENCH_MIRROR``, the variable README names (not one of their own)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("DPBENCH_")}
    code = "from tests import conftest, test_datasets; print(conftest.MIRROR, test_datasets.MIRROR)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                            env={**env, "DPBENCH_MIRROR": str(tmp_path)})
    assert result.stdout.split() == [str(tmp_path)] * 2

