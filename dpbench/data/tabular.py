"""Tabular datasets: scikit-learn's digits and breast cancer, UCI Adult, KDD Cup 99 and Covertype, as
:class:`~dpbench.data.taskdata.TaskData` with a fixed, deterministic split.

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

import numpy as np
import pandas as pd
import sklearn.datasets
import torch
from dpbench.data.files import RemoteFile, fetch, mirror_dir
from dpbench.data.taskdata import TaskData
from dpbench.data.files import cached

_UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases"


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


@cached
def load_digits() -> TaskData:
    """scikit-learn's bundled 8x8 digits (1,797 images, 10 classes)."""
    digits = sklearn.datasets.load_digits()
    x = _unit_rows(digits.data / 16.0)
    preprocessing = f"sklearn.datasets.load_digits: 64 pixel counts 0..16 divided by 16 (data-independent). {_UNIT}"
    return _shuffled_split(x, digits.target, "digits", preprocessing)


@cached
def load_breast_cancer() -> TaskData:
    """scikit-learn's bundled Wisconsin diagnostic breast cancer data (569 rows, labels 0 malignant / 1 benign)."""
    data = sklearn.datasets.load_breast_cancer(as_frame=True)
    scaled, bounds = _minmax(data.data)
    preprocessing = (
        f"sklearn.datasets.load_breast_cancer, labels as given (0 malignant, 1 benign): 30 features, {_MINMAX}: "
        f"{bounds}. {_UNIT}"
    )
    return _shuffled_split(_unit_rows(scaled.to_numpy()), data.target.to_numpy(), "breast_cancer", preprocessing)


@cached
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


@cached
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


@cached
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


#: The DP-ERM benchmark's KDD Cup 99 sample (Iyengar et al. 2019, github.com/sunblaze-ucb/dpml-benchmark, commit
#: 820cc89, ``datasets/preprocess/kddcup99.py``): ``np.random.seed(10000019)``, then 70,000 row indices drawn with
#: replacement by ``np.random.randint``, then the prepared rows shuffled by ``np.random.shuffle``, all from NumPy's
#: legacy global generator (a ``RandomState``, whose streams NumPy keeps unchanged across versions).
DPERM_SEED = 10_000_019
DPERM_ROWS = 70_000


def dperm_rows(n: int) -> np.ndarray:
    """The benchmark's rows, in its final order: indices into the ``n`` rows of the 10% file (in file order, as
    ``sklearn.datasets.fetch_kddcup99(percent10=True)`` returns them), drawn with replacement. The benchmark shuffles
    its prepared table (``np.random.shuffle`` of a 2-d array, a Fisher-Yates pass over its rows); shuffling the
    positions 0..69,999 with the same generator state draws the same numbers and makes the same swaps."""
    generator = np.random.RandomState(DPERM_SEED)
    drawn = generator.randint(n, size=DPERM_ROWS)
    order = np.arange(DPERM_ROWS)
    generator.shuffle(order)
    return drawn[order]


def kddcup99_dperm_arrays(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The benchmark's features and labels from the 10% file's rows (``frame``, in file order, the 42 columns of
    ``_KDD_COLUMNS``): the sample of :func:`dperm_rows`; the three text columns (protocol_type, service, flag) one-hot
    encoded over the categories that occur in the sample, in sorted order (LabelEncoder then OneHotEncoder), first;
    then the 38 numeric columns unscaled, in file order; label 1 for "normal." (the benchmark's +1), 0 for every
    attack (its -1). Rows are not yet normalized. Returns (x float64, y int64, the one-hot column names)."""
    sample = frame.iloc[dperm_rows(len(frame))].reset_index(drop=True)
    labels = sample.pop("label")
    categorical = ["protocol_type", "service", "flag"]
    blocks, names = [], []
    for column in categorical:
        categories = np.unique(sample[column].to_numpy(str))
        blocks.append((sample[column].to_numpy(str)[:, None] == categories[None, :]).astype(np.float64))
        names += [f"{column}={value}" for value in categories]
    numeric = sample.drop(columns=categorical).to_numpy(np.float64)
    return np.hstack(blocks + [numeric]), (labels == "normal.").to_numpy(np.int64), names


DPERM_SPLIT = "Split: the first int(0.8 n) = 56,000 rows of the benchmark's shuffled order train, the last 14,000 test."


@cached
def load_kddcup99_dperm() -> TaskData:
    """KDD Cup 1999 as the DP-ERM benchmark prepares it (Iyengar et al. 2019, the data of Yu et al. 2020): 70,000
    rows drawn with replacement from the 10% set with the benchmark's seed, its column handling and its 80/20 split
    (see ``tasks/dperm.py`` for what is reproduced exactly and what is not)."""
    frame = pd.read_csv(fetch(KDDCUP99_10PCT), header=None, names=_KDD_COLUMNS)
    x, y, names = kddcup99_dperm_arrays(frame)
    train = len(x) * 4 // 5  # int(0.8 * 70,000) in the benchmark's gridsearch.py
    preprocessing = (
        f"kddcup.data_10_percent.gz ({len(frame):,} rows, file order); the DP-ERM benchmark's sample "
        f"(sunblaze-ucb/dpml-benchmark datasets/preprocess/kddcup99.py, commit 820cc89): NumPy's legacy "
        f"RandomState({DPERM_SEED}), randint({len(frame):,}, size={DPERM_ROWS:,}) row indices drawn with "
        f"replacement ({len(np.unique(dperm_rows(len(frame)))):,} distinct), then the same generator's shuffle of "
        f"the 70,000 rows. Label 1 for 'normal.' (the benchmark's +1), 0 for every attack (-1). Features: "
        f"protocol_type, service, flag one-hot encoded over the categories present in the sample, sorted "
        f"({len(names)} columns), then the 38 numeric columns unscaled (the benchmark does not scale them); then "
        f"each row divided by its own L2 norm (the benchmark's clip_rows with L = 1, which rescales every row of "
        f"norm > 1: every row here, since the three one-hot ones alone have norm sqrt 3). {DPERM_SPLIT}"
    )
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)  # norms in float64, as the benchmark's
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    return TaskData(x[:train], y[:train], x[train:], y[train:], "kddcup99-dperm-70k", preprocessing,
                    "the DP-ERM benchmark's 70,000-row sample (with replacement) of the KDD Cup 99 10% set, not the "
                    "whole 10% set")
