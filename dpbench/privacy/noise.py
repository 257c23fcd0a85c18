"""The Gaussian noise of the gradient releases, from one seeded stream per run.

On the CPU it comes from ``dpbench.privacy._philox`` (``dpbench/privacy/_philox.c``): Philox4x32-10 counter-based bits
(Salmon et al., SC 2011; the generator behind PyTorch's CUDA sampler) turned into float32 Gaussians by the Box–Muller
transform, in vectorized loops. dpbench has its own sampler because the draw is a DP step's largest fixed cost and
PyTorch's CPU sampler is slow: one Mersenne Twister, one number at a time, about a third of the benchmark MLP's whole
non-private step for its 269,322 parameters (docs/benchmarks.md). No library dpbench installs offers a faster one:
NumPy's Gaussians are slower still on the benchmark machine, and Intel's ``mkl_random`` brings 1.1 GB of packages. The
stream is a pure function of (seed, position), specified in ``_philox.c``. ``tests/test_noise.py`` checks its bits
against Random123's known answers and ``randomgen``'s independent Philox, and its numbers bit for bit against a NumPy
transcription and statistically against N(0, 1).

With ``--noise torch``, on other devices, or where the extension was not built (no C compiler at install time),
the noise comes from PyTorch's ``normal_``, one parameter after another. Either way the stream is the run's
``gradient-noise`` stream (:mod:`dpbench.privacy.streams`), which no other draw of the run shares. Each record names its
sampler (``noise``); a run is reproducible under the same sampler.
"""
from __future__ import annotations

import warnings

import torch

try:
    from dpbench.privacy._philox import fill_normal
except ImportError:  # built without a C compiler
    fill_normal = None

from dpbench.privacy import streams

#: The samplers (``dpbench.choices.GAUSSIAN_SAMPLERS``): ``fast``, dpbench's on the CPU and PyTorch's elsewhere;
#: ``torch``, PyTorch's everywhere.
PHILOX = "philox4x32-10 + box-muller, float32 (dpbench.privacy._philox)"


class GaussianNoise:
    """std·N(0, 1) numbers for tensors of ``device``, from the stream of ``seed``.

    Philox stream: the key is the run's ``gradient-noise`` stream seed (64 bits), and a draw of n numbers uses the
    next ⌈n/4⌉ counter values (four numbers each). Tensors of another floating dtype get float32 numbers, converted.
    """

    def __init__(self, seed: int, device: torch.device | str = "cpu", sampler: str = "fast"):
        device = torch.device(device)
        stream = streams.derive(seed, "gradient-noise")
        self.philox = sampler == "fast" and device.type == "cpu" and fill_normal is not None
        if self.philox:
            self.key, self.counter = stream, 0
            self.name = PHILOX
        else:
            if sampler == "fast" and device.type == "cpu":
                warnings.warn("dpbench.privacy._philox is not built (no C compiler at install?): the gradient noise comes "
                              "from PyTorch's slower CPU sampler")
            self.generator = torch.Generator(device=device).manual_seed(stream)
            self.name = f"torch normal_ ({device.type})"

    def state_dict(self) -> dict:
        """The stream's position: the Philox key and counter, or the torch generator's state."""
        if self.philox:
            return {"sampler": self.name, "key": self.key, "counter": self.counter}
        return {"sampler": self.name, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Continue the stream where :meth:`state_dict` was taken (the same run's stream, from the same sampler)."""
        if state["sampler"] != self.name or self.philox and state["key"] != self.key:
            raise ValueError(f"the checkpoint's noise came from another stream ({state['sampler']}) than this "
                             f"run's ({self.name})")
        if self.philox:
            self.counter = state["counter"]
        else:
            self.generator.set_state(state["generator"])

    def fill_(self, tensor: torch.Tensor, std: float) -> torch.Tensor:
        """Overwrite ``tensor`` with the stream's next ``tensor.numel()`` numbers times ``std``; returns it."""
        if not self.philox:
            return tensor.normal_(0.0, std, generator=self.generator)
        if tensor.dtype == torch.float32 and tensor.is_contiguous():
            fill_normal(tensor.detach().numpy(), self.key, self.counter, std)
        else:
            numbers = torch.empty(tensor.shape, dtype=torch.float32)
            fill_normal(numbers.numpy(), self.key, self.counter, std)
            tensor.copy_(numbers)
        self.counter += -(-tensor.numel() // 4)
        return tensor
