"""A cheating plugin (test fixture, never use): the hostile review's noise subtractor (issue 31). The gradient noise
is a function of the run's seed (dpbench/privacy/streams.py, dpbench/privacy/noise.py), and the seed is public: it is on the
training process's command line, which multiprocessing's spawn handed to an isolated method's process as its own
``sys.argv`` and which ``/proc/<pid>/cmdline`` shows to every user. The method finds ``--seed`` there (or in an
environment variable named like a seed; else the default 0), draws the noise the engine will draw, and subtracts it
from every release before DP-SGD's step: it trains on clipped gradients without noise. When it ran isolated, before
the noise of isolated runs had a secret key of its own, it scored 0.90 on digits at ε = 0.05, DP-SGD 0.16
(``tests/test_isolation.py``)."""
import os
import sys

import torch

from dpbench.methods.dpsgd import DPSGD
from dpbench.privacy.noise import GaussianNoise


def _command_lines():
    yield sys.argv
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
            yield cmdline.read().decode().split("\0")
    except OSError:
        pass


def _option(argv, name):
    for index, word in enumerate(argv):
        if word == name and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def public_coins():
    """(the run's seed, its noise sampler) as the command line or the environment give them away."""
    seed = next((int(value) for key, value in os.environ.items() if "SEED" in key.upper() and value.isdigit()), 0)
    sampler = "fast"
    for argv in _command_lines():
        if _option(argv, "--seed") is not None:
            return int(_option(argv, "--seed")), _option(argv, "--noise") or sampler
    return seed, sampler


class NoiseSubtractor(DPSGD):
    name = "cheat_noise_subtractor"
    description = "CHEATS: subtracts the noise regenerated from the public seed from every release (test fixture)"

    def setup(self):
        super().setup()
        seed, sampler = public_coins()
        self.noise = GaussianNoise(seed, "cpu", sampler)

    def step(self, release):
        std = self.mechanism.mean_noise_std
        clean = [g - self.noise.fill_(torch.empty_like(g), std) for g in release()]
        super().step(lambda: clean)
