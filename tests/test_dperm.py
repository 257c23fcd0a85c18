"""``kddcup99_dperm`` (tasks/dperm.py, ``dpbench.data.tabular.load_kddcup99_dperm``): the DP-ERM benchmark's KDD Cup 99
sample, on a file the test writes in the canonical format (never the mirror)."""
from __future__ import annotations

import dataclasses
import gzip
import hashlib

import numpy as np
import pytest
import torch

from dpbench.data import tabular

TEXT = {"protocol_type": ["tcp", "udp", "icmp"], "service": ["http", "smtp", "private", "ecr_i", "ftp"],
        "flag": ["SF", "S0", "REJ", "RSTO"]}
LABELS = ["normal.", "smurf.", "neptune.", "back."]


def kdd_file(rows: int, seed: int = 0) -> tuple[bytes, list[list[str]]]:
    """A gzipped kddcup.data_10_percent in the canonical format (42 comma-separated fields, no header), and its
    fields."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(rows):
        fields = []
        for column in tabular._KDD_COLUMNS[:-1]:
            if column in TEXT:
                fields.append(str(rng.choice(TEXT[column])))
            elif column.endswith("_rate"):
                fields.append(f"{rng.integers(0, 101) / 100:.2f}")
            else:
                fields.append(str(int(rng.integers(0, 5000))))
        fields.append(str(rng.choice(LABELS, p=[0.3, 0.4, 0.2, 0.1])))
        lines.append(fields)
    return gzip.compress(("\n".join(",".join(f) for f in lines) + "\n").encode()), lines


@pytest.fixture
def generated(tmp_path, monkeypatch):
    """A mirror holding a generated 10% file of 300 rows (the checksum replaced by the file's own)."""
    payload, lines = kdd_file(300)
    remote = tabular.KDDCUP99_10PCT
    (tmp_path / "mirror" / remote.folder).mkdir(parents=True)
    (tmp_path / "mirror" / remote.folder / remote.name).write_bytes(payload)
    monkeypatch.setattr(tabular, "KDDCUP99_10PCT",
                        dataclasses.replace(remote, checksum=f"md5:{hashlib.md5(payload).hexdigest()}"))
    monkeypatch.setenv("DPBENCH_MIRROR", str(tmp_path / "mirror"))
    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "home"))
    return lines


def benchmark_steps(lines: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """The benchmark's steps written out independently of the loader: the global-generator calls replaced by one
    RandomState of its seed, the rows sampled, the text columns one-hot over the sorted categories of the sample, the
    numeric ones as they are, the label +1 / -1, and the 2-d table (features and label) shuffled by rows."""
    generator = np.random.RandomState(10_000_019)
    sample = [lines[i] for i in generator.randint(len(lines), size=70_000)]
    columns = []
    for j in range(41):
        values = [row[j] for row in sample]
        if tabular._KDD_COLUMNS[j] in TEXT:
            categories = sorted(set(values))
            columns.append(np.array([[v == c for c in categories] for v in values], dtype=float))
    columns += [np.array([[float(row[j])] for row in sample]) for j in range(41) if tabular._KDD_COLUMNS[j] not in TEXT]
    table = np.hstack(columns + [np.array([[1.0 if row[41] == "normal." else -1.0] for row in sample])])
    generator.shuffle(table)
    return table[:, :-1], table[:, -1]


def test_the_loader_reproduces_the_benchmarks_sample_columns_and_split(generated):
    data = tabular.load_kddcup99_dperm.__wrapped__()  # not a cached copy
    features, labels = benchmark_steps(generated)
    assert (data.data_id, len(data.y_train), len(data.y_test)) == ("kddcup99-dperm-70k", 56_000, 14_000)
    assert data.note and "70,000" in data.note
    x = torch.cat([data.x_train, data.x_test]).numpy()
    y = torch.cat([data.y_train, data.y_test]).numpy()
    assert x.shape == (70_000, 3 + 5 + 4 + 38) and x.dtype == np.float32
    np.testing.assert_allclose(x, features / np.linalg.norm(features, axis=1, keepdims=True), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(y, (labels == 1).astype(np.int64))
    torch.testing.assert_close(data.x_train.norm(dim=1), torch.ones(56_000))
    assert "RandomState(10000019)" in data.preprocessing and "56,000" in data.preprocessing


def test_the_sample_is_the_legacy_generators_and_reproducible():
    """The row indices of the benchmark's sample of the real file (494,021 rows), pinned: a NumPy that changed the
    legacy stream would fail here, not silently train on other rows."""
    rows = tabular.dperm_rows(494_021)
    assert rows[:6].tolist() == [469414, 431857, 470822, 373152, 331232, 436805]
    assert rows[-3:].tolist() == [8069, 413138, 205111]
    assert int(rows.sum()) == 17240969278 and len(np.unique(rows)) == 65_371
    assert np.array_equal(rows, tabular.dperm_rows(494_021))
    # the shuffle of positions is the shuffle of the benchmark's 2-d table
    generator = np.random.RandomState(tabular.DPERM_SEED)
    table = np.stack([generator.randint(494_021, size=70_000), np.arange(70_000)], axis=1).astype(object)
    generator.shuffle(table)
    assert np.array_equal(table[:, 0].astype(np.int64), rows)


def test_the_task_has_its_own_data_id_and_the_benchmarks_model():
    from dpbench import registry

    tasks = registry.tasks()
    dperm, kdd = tasks["kddcup99_dperm"], tasks["kddcup99"]
    assert dperm.load_data is tabular.load_kddcup99_dperm and kdd.load_data is tabular.load_kddcup99
    assert dperm.options["bias"] is False and kdd.options["bias"] is True
    assert dperm.min_train_examples == 56_000 and dperm.profiles["yu2020"]["epsilon"] == 0.1
    assert dperm.profiles["yu2020"]["bias"] is False


def test_the_published_kddcup99_numbers_name_this_task_and_data_id():
    from dpbench.board.published import PUBLISHED

    kdd = [entry for entry in PUBLISHED if entry.source == "Yu et al., Table 2" and entry.paper_dataset == "KDDCup99"]
    assert len(kdd) == 5
    assert {(e.task, e.paper_data_id) for e in kdd} == {("kddcup99_dperm", "kddcup99-dperm-70k")}
