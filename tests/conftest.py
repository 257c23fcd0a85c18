import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The offline mirror of dataset files: the one ``DPBENCH_MIRROR`` names, as for ``dpbench run`` (read before
#: :func:`isolated_home` clears it for each test), else ``../shared/data`` beside the repository.
MIRROR = Path(os.environ.get("DPBENCH_MIRROR") or REPO.parent / "shared" / "data").resolve()


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test gets its own results store and download cache; no user plugins leak in, and the thread setting
    the ``dpbench`` command makes (dpbench/threads.py) ends with the test that ran it."""
    from dpbench import threads

    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DPBENCH_PLUGINS", raising=False)
    monkeypatch.delenv("DPBENCH_STORE", raising=False)
    monkeypatch.delenv("DPBENCH_MIRROR", raising=False)
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "DPBENCH_THREADS",
                 "DPBENCH_PROGRESS_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "_configured", None)
    torch = sys.modules.get("torch")
    count = torch.get_num_threads() if torch else None
    yield tmp_path / "home"
    if count is not None and torch.get_num_threads() != count:
        torch.set_num_threads(count)


@pytest.fixture
def refused(capsys):
    """Runs a ``dpbench`` command that must be refused: exit code 2, one line on stderr, nothing stored."""
    from dpbench.cli import main
    from dpbench.results import store

    def run(*args: str) -> str:
        code = main(list(args))
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("dpbench: error:") and "\n" not in err, err
        assert not store.default_path().exists()
        return err

    return run


@pytest.fixture
def one_thread():
    """One torch thread for the test (small models: faster than two contending ones; what verify --rerun uses)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    """One decoded-CIFAR and pretraining cache for the whole session (decoding and pretraining take seconds)."""
    return tmp_path_factory.mktemp("cifar-cache")


@pytest.fixture
def cifar_home(mirror, isolated_home, shared_cache):
    """The per-test home (own results store) with the session's shared data and cache folders."""
    isolated_home.mkdir(parents=True, exist_ok=True)
    for folder in ("data", "cache"):
        (shared_cache / folder).mkdir(exist_ok=True)
        (isolated_home / folder).symlink_to(shared_cache / folder)
    return isolated_home


@pytest.fixture
def mirror(monkeypatch):
    """The offline mirror of canonical dataset files (../shared/data beside the repository)."""
    if not MIRROR.is_dir():
        pytest.skip(f"no dataset mirror at {MIRROR} (set DPBENCH_MIRROR)")
    monkeypatch.setenv("DPBENCH_MIRROR", str(MIRROR))
    return MIRROR


# ---- a throwaway PostgreSQL server (tests of shared tuning studies and of the shared results store) -------------

def server_binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    if on_path:
        return Path(on_path).parent
    pytest.fail("PostgreSQL server binaries not found (install Debian's postgresql package, as .ci/run does)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def postgres_url():
    import sqlalchemy

    bindir = server_binaries()
    folder = Path(tempfile.mkdtemp(prefix="dpbench-pg-"))  # not under pytest's root-only tmp folders
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        as_user = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
    data = folder / "data"
    subprocess.run([*as_user, bindir / "initdb", "-D", data, "-U", "dpbench", "-A", "trust", "--no-sync"],
                   check=True, capture_output=True)
    port = free_port()
    server = subprocess.Popen([*as_user, bindir / "postgres", "-D", data, "-h", "127.0.0.1", "-p", str(port),
                               "-k", folder, "-F"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"postgresql+psycopg2://dpbench@127.0.0.1:{port}/postgres"
    deadline = time.monotonic() + 60
    while True:
        try:
            sqlalchemy.create_engine(url).connect().close()
            break
        except sqlalchemy.exc.OperationalError:  # not accepting connections yet
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail("the PostgreSQL test server did not start")
            time.sleep(0.2)
    yield url
    server.send_signal(signal.SIGINT)  # fast shutdown
    server.wait(timeout=60)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def together(tmp_path):
    """Run ``n`` Python processes that each execute ``setup`` (imports, planning), wait at a common barrier, then
    print ``json.dumps(<act>)`` as close to the same moment as the OS allows; returns their decoded outputs. The
    test folder is on their path (``import test_...``) and ``root`` is ``tmp_path``."""
    import json

    def run(setup: str, act: str, n: int) -> list:
        go = tmp_path / "go"
        script = (f"import json, os, sys, time\nfrom pathlib import Path\n"
                  f"sys.path.insert(0, {str(Path(__file__).parent)!r})\nroot = Path({str(tmp_path)!r})\n{setup}\n"
                  f"print('ready', flush=True)\n"
                  f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.001)\nprint(json.dumps({act}))\n")
        children = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "DPBENCH_HOME": str(tmp_path / "home")})
                    for _ in range(n)]
        for child in children:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
        go.touch()
        outputs = []
        for child in children:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, err
            outputs.append(json.loads(out))
        return outputs

    return run
