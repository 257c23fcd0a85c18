"""The Gaussian draw alone: dpbench's sampler built for each x86-64 instruction-set level, and PyTorch's.

Builds ``dpbench/privacy/_philox.c`` once per level (x86-64, x86-64-v3 with AVX2, x86-64-v4 with AVX-512) with the
compile flags of ``pyproject.toml``, as a single copy (``-DDPBENCH_ONE_TARGET``: no multi-versioning), and times
filling the 269,322 float32 numbers of the benchmark MLP's parameters, median over repeats after warm-up, next to
the installed module (which picks its copy when it loads) and PyTorch's ``normal_``. Levels this CPU lacks are
skipped. Needs a C compiler and Python ≥ 3.11 (``tomllib``).

    python benchmarks/noise_time.py --json benchmarks/results/noise_time.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
#: Level -> the /proc/cpuinfo flag it needs (None: every x86-64 CPU).
LEVELS = {"x86-64": None, "x86-64-v3": "avx2", "x86-64-v4": "avx512f"}


def supported(level: str) -> bool:
    if platform.machine() != "x86_64":
        return False
    flag = LEVELS[level]
    if flag is None:
        return True
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def build(level: str, directory: Path):
    """``_philox.c`` compiled for one level only, imported from ``directory``."""
    (extension,) = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"]
    target = directory / level / f"_philox{sysconfig.get_config_var('EXT_SUFFIX')}"
    target.parent.mkdir(parents=True, exist_ok=True)
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    subprocess.run([compiler, *extension["extra-compile-args"], f"-march={level}", "-DDPBENCH_ONE_TARGET", "-shared",
                    "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(REPO / extension["sources"][0]),
                    "-o", str(target)], check=True, capture_output=True)
    spec = importlib.util.spec_from_file_location("_philox", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_seconds(draw, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        draw()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        draw()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numbers", type=int, default=269_322, help="numbers per draw (default: the MLP's)")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    out = np.empty(args.numbers, dtype=np.float32)
    draws = {}
    with tempfile.TemporaryDirectory() as directory:
        for level in LEVELS:
            if supported(level):
                module = build(level, Path(directory))
                draws[f"dpbench, {level} build"] = lambda fill=module.fill_normal: fill(out, 0, 0, 1.0)
        from dpbench.privacy.noise import fill_normal

        if fill_normal is not None:
            draws["dpbench, installed module"] = lambda: fill_normal(out, 0, 0, 1.0)
        tensor, generator = torch.empty(args.numbers), torch.Generator().manual_seed(0)
        draws["PyTorch normal_"] = lambda: tensor.normal_(0.0, 1.0, generator=generator)
        seconds = {name: median_seconds(draw, args.repeats, args.warmup) for name, draw in draws.items()}
    base = seconds["PyTorch normal_"]
    rows = [{"sampler": name, "median_ms": 1e3 * value, "vs_pytorch": value / base} for name, value in seconds.items()]
    print("| sampler | median draw (ms) | × PyTorch |\n| --- | --- | --- |")
    for row in rows:
        print(f"| {row['sampler']} | {row['median_ms']:.3f} | {row['vs_pytorch']:.2f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": {"platform": platform.platform(), "processor": platform.processor(),
                                                     "python": sys.version.split()[0], "torch": torch.__version__},
                                         "numbers": args.numbers, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
