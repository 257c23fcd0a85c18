"""How many threads PyTorch computes with (dpbench/threads.py, issue 35): dpbench's choice, or the user's."""
import json
import os

import pytest
import torch

from dpbench import threads
from dpbench.cli import main
from dpbench.errors import UsageError


def test_one_thread_below_the_crossover_and_every_core_above():
    assert threads.automatic(650, 64, cores=8) == 1  # digits
    assert threads.automatic(269_322, 256, cores=8) == 1  # mnist_mlp at B = 256
    assert threads.automatic(269_322, 4096, cores=8) == 8
    assert threads.automatic(int(threads.CROSSOVER), 1, cores=2) == 2


def test_the_user_decides_first_with_the_option_then_the_variables(monkeypatch):
    for variable in threads.VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert threads.requested() == (None, "automatic")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.requested() == (3, "OMP_NUM_THREADS")
    monkeypatch.setenv("DPBENCH_THREADS", "2")
    assert threads.requested() == (2, "DPBENCH_THREADS")
    assert threads.requested(5) == (5, "--threads")
    monkeypatch.setenv("DPBENCH_THREADS", "two")
    with pytest.raises(UsageError, match="DPBENCH_THREADS must be a whole number of threads from 1 to 1024, got 'two'"):
        threads.requested()


def run(capsys, *args):
    assert main(["run", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--epochs", "1", "--no-wandb",
                 "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_run_records_the_threads_it_chose_or_was_given(capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)  # PyTorch's default on two cores
    assert run(capsys)["threads"] == 1  # digits: far below the crossover
    assert run(capsys, "--threads", "2")["threads"] == 2
    monkeypatch.setenv("DPBENCH_THREADS", "3")
    assert run(capsys)["threads"] == 3
    monkeypatch.setattr(threads, "CROSSOVER", 1.0)  # every model is large enough
    monkeypatch.delenv("DPBENCH_THREADS")
    assert run(capsys, "--seed", "1")["threads"] == (os.cpu_count() or 1)
