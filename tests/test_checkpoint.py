"""``leaderboards/checkpoint.py``: an unfinished rebuild's records carried to another store, and a forged one
refused."""
import gzip
import json
import runpy
from pathlib import Path

import pytest

from dpbench.cli import main
from dpbench.results import records, store
from tests.test_leaderboard import add_run

SCRIPT = Path(__file__).resolve().parents[1] / "leaderboards" / "checkpoint.py"


def checkpoint(tmp_path):
    module = runpy.run_path(str(SCRIPT))
    module["save"].__globals__["CHECKPOINT"] = tmp_path / "rebuild" / "records.jsonl.gz"
    return module


@pytest.fixture
def real_runs():
    """Two short real runs of the engine (records verify can check), in the test's store."""
    for seed in ("0", "1"):
        assert main(["run", "--method", "dpsgd", "--task", "digits", "--noise-multiplier", "5", "--epochs", "1",
                     "--seed", seed, "--no-wandb"]) == 0
    return store.load()


def test_saved_records_load_into_an_empty_store_unchanged(tmp_path, monkeypatch, real_runs):
    saved = real_runs
    module = checkpoint(tmp_path)
    assert module["save"]() == 0
    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "elsewhere"))
    assert store.load() == []
    assert module["load"]() == 0
    assert store.load() == saved


def test_a_record_whose_run_id_is_not_its_hash_loads_nothing(tmp_path, monkeypatch, capsys):
    add_run(0.8)
    module = checkpoint(tmp_path)
    module["save"]()
    path = module["save"].__globals__["CHECKPOINT"]
    [record] = [json.loads(line) for line in gzip.open(path, "rt")]
    record["epsilon"] = 0.5  # edited after it was sealed
    with gzip.open(path, "wt") as out:
        out.write(json.dumps(record) + "\n")
    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "elsewhere"))
    assert module["load"]() == 2
    assert "run id is not their content's hash" in capsys.readouterr().err
    assert store.load() == []


@pytest.mark.parametrize("line", ['"a string"', '{"run_id": "x"}'])
def test_a_line_that_is_not_a_record_loads_nothing_not_even_the_records_before_it(tmp_path, monkeypatch, capsys, line):
    add_run(0.8)
    module = checkpoint(tmp_path)
    module["save"]()
    path = module["save"].__globals__["CHECKPOINT"]
    with gzip.open(path, "at") as out:
        out.write(line + "\n")
    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "elsewhere"))
    assert module["load"]() == 2
    assert "1 lines that are not records (first line 2)" in capsys.readouterr().err
    assert store.load() == []


def test_an_empty_store_does_not_overwrite_the_checkpoint(tmp_path, monkeypatch):
    add_run(0.8)
    module = checkpoint(tmp_path)
    module["save"]()
    path = module["save"].__globals__["CHECKPOINT"]
    before = path.read_bytes()
    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "elsewhere"))
    assert module["save"]() == 2
    assert path.read_bytes() == before


def test_a_record_that_fails_verify_loads_nothing(tmp_path, monkeypatch, capsys, real_runs):
    module = checkpoint(tmp_path)
    assert module["save"]() == 0
    path = module["save"].__globals__["CHECKPOINT"]
    first, second = [json.loads(line) for line in gzip.open(path, "rt")]
    second = records.seal({**second, "noise_multiplier": 0.0})  # edited and resealed: the hash holds, verify not
    with gzip.open(path, "wt") as out:
        out.write(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "elsewhere"))
    assert module["load"]() == 2
    assert "fails verify (noise multiplier 0.0 is not positive)" in capsys.readouterr().err
    assert store.load() == []


def test_a_file_that_is_not_gzip_loads_nothing(tmp_path, monkeypatch, capsys):
    module = checkpoint(tmp_path)
    path = module["save"].__globals__["CHECKPOINT"]
    path.parent.mkdir()
    path.write_text("{}\n")
    assert module["load"]() == 2
    assert "is not gzip JSON lines" in capsys.readouterr().err
