"""Dataset files: a configured mirror first, then the local cache, then the canonical source.

Why hand-written: scikit-learn's fetchers download from fixed URLs into their own cache format and cannot
read a local mirror of the canonical files, which offline machines (and CI) need. This module is the one place
that touches the network: it verifies every file against a published checksum before a task reads it.

Environment:
  DPBENCH_MIRROR  a folder of canonical files laid out as ``<dataset folder>/<file name>`` (read-only).
  DPBENCH_HOME    dpbench's own folder (download cache under ``data/``, results store); default: per-user.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import os
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from dpbench.data import stages

if TYPE_CHECKING:
    from dpbench.data.taskdata import TaskData


class DataError(Exception):
    """A dataset file is missing or corrupt; the message says what to do."""


def dpbench_home() -> Path:
    return Path(os.environ.get("DPBENCH_HOME") or platformdirs.user_data_dir("dpbench"))


def mirror_dir() -> Path | None:
    mirror = os.environ.get("DPBENCH_MIRROR")
    return Path(mirror) if mirror else None


@dataclass(frozen=True)
class RemoteFile:
    """One canonical file: where it lives and the checksum it must have.

    ``checksum`` is ``"sha256:<hex>"`` or ``"md5:<hex>"``; with ``checksum_of_payload`` it is the checksum of the
    gunzipped content (MNIST publishes those; mirrors may re-gzip the same bytes). ``None`` where no checksum is
    published (the LIBSVM collection): the file's sha256 is pinned when it is first used (``<cache>.sha256``), every
    later use must match it, and loaders put it in the data's ``preprocessing`` so that records name the exact file.
    """

    folder: str
    name: str
    url: str
    checksum: str | None
    checksum_of_payload: bool = False

    def mirror_path(self) -> Path | None:
        mirror = mirror_dir()
        return mirror / self.folder / self.name if mirror else None

    def cache_path(self) -> Path:
        return dpbench_home() / "data" / self.folder / self.name

    def is_available(self) -> bool:
        """True when the file can be read without a download."""
        mirror = self.mirror_path()
        return (mirror is not None and mirror.exists()) or self.cache_path().exists()


def _digest(path: Path, algorithm: str, payload: bool) -> str:
    digest = hashlib.new(algorithm)
    with (gzip.open(path, "rb") if payload else open(path, "rb")) as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def pinned_sha256(path: Path, remote: RemoteFile) -> str:
    """The sha256 of a file without a published checksum, pinned on first use (see :class:`RemoteFile`)."""
    try:
        actual = _digest(path, "sha256", False)
    except OSError as error:
        raise DataError(f"cannot read {path}: {error}") from None
    pin = remote.cache_path().with_name(remote.name + ".sha256")
    if pin.exists():
        if pin.read_text().strip() != actual:
            raise DataError(f"{path} has sha256 {actual}, but the copy first used here had {pin.read_text().strip()} "
                            f"(pinned in {pin}); remove the pin only if the new file is the right one")
    else:
        pin.parent.mkdir(parents=True, exist_ok=True)
        pin.write_text(actual + "\n")
    return actual


def verify(path: Path, remote: RemoteFile) -> None:
    if remote.checksum is None:
        pinned_sha256(path, remote)
        return
    algorithm, expected = remote.checksum.split(":", 1)
    try:
        actual = _digest(path, algorithm, remote.checksum_of_payload)
    except (OSError, EOFError) as error:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read {path}: {error}") from None
    if actual != expected:
        what = "gunzipped content of " if remote.checksum_of_payload else ""
        raise DataError(f"checksum mismatch for {what}{path}: {algorithm} {actual}, expected {expected}")


def _download(remote: RemoteFile, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as partial:
        try:
            with urllib.request.urlopen(remote.url, timeout=60) as response:
                total = int(response.headers.get("Content-Length") or 0) or None
                with stages.bar(total=total, unit="B", unit_scale=True, desc=f"download {remote.name}") as bar:
                    for chunk in iter(lambda: response.read(1 << 16), b""):
                        partial.write(chunk)
                        bar.update(len(chunk))
            partial.close()
            verify(Path(partial.name), remote)
            shutil.move(partial.name, target)
        finally:
            Path(partial.name).unlink(missing_ok=True)


def fetch(remote: RemoteFile) -> Path:
    """Path of a verified local copy of ``remote``: from the mirror, the cache, or a fresh download."""
    mirror = remote.mirror_path()
    if mirror is not None and mirror.exists():
        verify(mirror, remote)
        return mirror
    cached = remote.cache_path()
    if not cached.exists():
        try:
            _download(remote, cached)
        except OSError as error:  # urllib's URLError is an OSError: no network, DNS, HTTP error
            places = f"{mirror.parent}/ or {cached.parent}/" if mirror else f"{cached.parent}/"
            checksum = remote.checksum or "no published checksum"
            raise DataError(
                f"cannot download {remote.url} ({error}); put {remote.name} ({checksum}) in {places}, or set "
                f"DPBENCH_MIRROR to a folder of the canonical files laid out as <dataset>/<file> "
                f"({remote.folder}/{remote.name})"
            ) from None
    verify(cached, remote)
    return cached


def cached(loader):
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
