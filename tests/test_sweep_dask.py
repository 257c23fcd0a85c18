"""``dpbench sweep --scheduler``: a real Dask scheduler and two workers on loopback, one worker SIGKILLed while it
trains a cell (issue 18). Dask runs the lost cell again on the other worker; the client stores every run once, and
the records equal those of the same grid run in one process."""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dpbench.board.sweep import run_grid
from dpbench.results import store
from dpbench.results.identity import identity

GRID = {"tasks": ["breast_cancer", "digits"], "methods": ["dpsgd", "ada_dp", "output_perturbation"],
        "epsilons": [1.0, 2.0], "seeds": 3}
RUNS = 2 * 3 * 2 * 3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(args: list[str], home: Path) -> subprocess.Popen:
    env = {**os.environ, "DPBENCH_HOME": str(home), "OMP_NUM_THREADS": "1"}  # no shared disk: a home each
    return subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_" + args[0], *args[1:]], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def cluster(tmp_path):
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    processes = [start(["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], tmp_path / "s")]
    workers = [start(["worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1",
                      "--name", f"w{index}"], tmp_path / f"w{index}") for index in range(2)]
    from distributed import Client

    deadline = time.monotonic() + 120
    with Client(address, timeout="60s") as client:
        while len(client.scheduler_info()["workers"]) < 2:
            assert time.monotonic() < deadline, "the Dask workers did not start"
            time.sleep(0.2)
    yield address, workers
    for process in [*workers, *processes]:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in [*workers, *processes]:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_a_killed_worker_loses_no_cell_and_duplicates_no_run(cluster, tmp_path, monkeypatch):
    address, workers = cluster
    grid_file = tmp_path / "grid.json"
    grid_file.write_text(json.dumps(GRID))
    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "client"))
    sweep = subprocess.Popen([sys.executable, "-m", "dpbench", "sweep", str(grid_file), "--scheduler", address],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    from distributed import Client

    victim = random.choice(workers)
    victim_name = f"w{workers.index(victim)}"
    deadline = time.monotonic() + 300
    with Client(address, timeout="60s") as client:
        while True:  # kill the victim while it trains a cell, after some cells were stored
            assert time.monotonic() < deadline and sweep.poll() is None, "the sweep ended before the kill"
            names = {worker: info["name"] for worker, info in client.scheduler_info()["workers"].items()}
            training = {names.get(worker) for worker, keys in client.processing().items() if keys}
            stored = len(store.load()) if store.default_path().exists() else 0
            if stored >= 3 and victim_name in training:
                time.sleep(random.uniform(0, 0.5))
                victim.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
    out, err = sweep.communicate(timeout=900)
    assert sweep.returncode == 0, err
    assert victim.wait(timeout=30) == -signal.SIGKILL
    assert out.strip() == f"{RUNS} ran, 0 already stored, 0 refused"
    distributed_runs = store.load()
    keys = [(identity(r), r["seed"]) for r in distributed_runs]
    assert len(distributed_runs) == RUNS and len(set(keys)) == RUNS  # every run once

    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "one-process"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the Dask workers train
    try:
        assert run_grid(GRID, progress=False) == {"ran": RUNS, "already stored": 0, "refused": 0}
    finally:
        torch.set_num_threads(threads)
    alone = {(identity(r), r["seed"]): (r["metrics"], r["epsilon"]) for r in store.load()}
    assert {(identity(r), r["seed"]): (r["metrics"], r["epsilon"]) for r in distributed_runs} == alone


def test_the_workers_load_the_plugin_folders_of_the_sweep(cluster, tmp_path, monkeypatch):
    """Issue 35, item 5: ``--plugins`` reaches the Dask workers (each started without it)."""
    address, _ = cluster
    grid_file = tmp_path / "grid.json"
    grid_file.write_text(json.dumps({"tasks": ["digits"], "methods": ["dp_nesterov"], "epsilons": [1], "seeds": 2}))
    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "client"))
    plugins = str(Path(__file__).resolve().parents[1] / "examples" / "plugins")
    result = subprocess.run([sys.executable, "-m", "dpbench", "sweep", str(grid_file), "--scheduler", address,
                             "--plugins", plugins], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2 ran, 0 already stored, 0 refused"
    assert {(r["method"], r["seed"]) for r in store.load()} == {("dp_nesterov", 0), ("dp_nesterov", 1)}
