"""The results store on a real PostgreSQL server (issue 18): concurrent writers, one killed mid-append, and the
board read from PostgreSQL equal to the board read from SQLite. The server is started by the ``postgres_url``
fixture (conftest.py: ``initdb`` in a temporary folder, loopback only, stopped at the end)."""
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from dpbench.cli import main
from dpbench.results import store
from tests.test_leaderboard import add_run, nonprivate_fields

WRITERS, RECORDS = 4, 200

WRITER = r'''
import sys
from dpbench.results import store
url, writer, count, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with open(log, "w") as committed:
    for number in range(count):
        # Every tenth record is also written by the next writer: duplicates between concurrent writers.
        owner = writer if number % 10 else (writer // 2) * 2
        record = {"task": "t", "method": "m", "data_id": "d", "created_at": f"2026-01-01T00:00:{number % 60:02d}",
                  "owner": owner, "number": number, "padding": "x" * 20_000}
        record["run_id"] = store.content_id(record)
        store.append(record, url)
        committed.write(record["run_id"] + "\n")
        committed.flush()
'''


def test_concurrent_writers_one_killed_leave_every_committed_record_once(postgres_url, tmp_path):
    logs = [tmp_path / f"writer{index}.log" for index in range(WRITERS)]
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, postgres_url, str(index), str(RECORDS), str(log)],
                                stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
               for index, log in enumerate(logs)]
    victim = writers[random.randrange(WRITERS)]
    deadline = time.monotonic() + 120
    victim_log = logs[writers.index(victim)]
    while (not victim_log.exists() or len(victim_log.read_text().split()) < 20) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(random.uniform(0, 0.05))  # a random moment, usually inside an append
    victim.send_signal(signal.SIGKILL)
    for writer in writers:
        _, err = writer.communicate(timeout=300)
        assert writer is victim or writer.returncode == 0, err
    assert victim.returncode == -signal.SIGKILL

    committed = {run_id for log in logs for run_id in log.read_text().split()}
    loaded = store.load(postgres_url)
    ids = [record["run_id"] for record in loaded]
    assert len(ids) == len(set(ids))  # no record twice, shared ones included
    assert committed <= set(ids)  # every append that returned is there
    assert len(set(ids) - committed) <= 1  # at most the one the victim committed before it could log it
    for record in loaded:  # whole records only
        assert store.content_id(record) == record["run_id"] and len(record["padding"]) == 20_000
    survivors = [index for index, writer in enumerate(writers) if writer is not victim]
    for index in survivors:
        mine = {r["number"] for r in loaded if r["owner"] == index and r["number"] % 10}
        assert mine == {number for number in range(RECORDS) if number % 10}


def test_the_board_from_postgresql_equals_the_board_from_sqlite(postgres_url, tmp_path, capsys, monkeypatch):
    for seed, accuracy in enumerate([0.8, 0.84, 0.82]):
        add_run(accuracy, seed=seed)
        add_run(accuracy - 0.1, seed=seed, epsilon_target=0.5, epsilon=0.5)
        add_run(accuracy - 0.05, method="dpgd", seed=seed)
        add_run(accuracy + 0.1, seed=seed, **nonprivate_fields())
    records = store.load(kind=None)
    for record in records:
        store.append(record, postgres_url)
    boards = {}
    for name, where in (("sqlite", str(store.default_path())), ("postgresql", postgres_url)):
        assert main(["--store", where, "leaderboard", "--format", "md"]) == 0
        boards[name] = capsys.readouterr().out
        monkeypatch.delenv("DPBENCH_STORE", raising=False)  # --store sets it for the process (and its workers)
    assert boards["sqlite"] == boards["postgresql"] and "| dpgd |" in boards["sqlite"]
    assert main(["--store", postgres_url, "runs"]) == 0
    listed = capsys.readouterr().out
    assert all(record["run_id"] in listed for record in records)
    assert main(["show", records[0]["run_id"]]) == 0  # DPBENCH_STORE, as --store left it
    assert json.loads(capsys.readouterr().out) == records[0]


def test_an_unreachable_or_unknown_store_is_one_line(refused):
    assert "cannot reach the results store" in refused("--store", "postgresql+psycopg2://nobody@127.0.0.1:1/x", "runs")
    assert "cannot use the results store" in refused("--store", "nosuchdialect://x", "runs")
