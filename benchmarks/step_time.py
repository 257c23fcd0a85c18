"""Median time of one training step and peak memory: non-private vs dpbench DP-SGD vs Opacus (hooks, ghost).

Times are side by side: for each model, one subprocess builds every variant and runs their steps in rotating
round-robin order, so that a slower or faster spell of the machine falls on all of them alike; a variant's ratio
is the median over rounds of its step time over the non-private step time of the same round. Peak resident
memory comes from a separate subprocess per (model, variant), so that it is that variant's own. A step is
forward, backward (per-example clipping and noise for the private variants) and an SGD update on a fixed batch.

    python benchmarks/step_time.py --json benchmarks/results/step_time.json   # writes the table too
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from dpbench.run.allocator import keep_freed_memory

MODELS = ("logreg", "mlp", "cnn", "transformer")
VARIANTS = ("nonprivate", "dpbench", "opacus_hooks", "opacus_ghost")
#: dpbench_no_noise: dpbench's step with σ = 0 (no Gaussian draw); dpbench_torch_noise: dpbench's step with
#: PyTorch's sampler (``--noise torch``); gaussian_draw / torch_randn: the draw alone, one number per parameter,
#: from dpbench's sampler (dpbench/privacy/noise.py) / PyTorch's, the floor under a DP-SGD step that uses it.
EXTRA_VARIANTS = ("dpbench_no_noise", "dpbench_torch_noise", "gaussian_draw", "torch_randn")


class SelfAttentionBlock(nn.Module):
    """A pre-norm transformer block from Linear and LayerNorm layers, with a mean-pooled classifier head."""

    def __init__(self, vocab=1000, dim=128, heads=4, classes=3):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff1, self.ff2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        h = self.embed(tokens)
        q, k, v = self.qkv(self.norm1(h)).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        h = h + self.out(attended)
        h = h + self.ff2(nn.functional.gelu(self.ff1(self.norm2(h))))
        return self.head(h.mean(1))


def build(model: str):
    """(network, inputs, labels, classes) of the benchmark settings named in the project's issue."""
    if model == "logreg":
        return nn.Linear(784, 10), torch.rand(600, 784), torch.randint(0, 10, (600,)), 10
    if model == "mlp":
        net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        return net, torch.rand(256, 784), torch.randint(0, 10, (256,)), 10
    if model == "cnn":  # DP-AdamBC's 5-layer tanh CNN on 32x32x3
        net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, padding=1), nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(256, 10))
        return net, torch.randn(256, 3, 32, 32), torch.randint(0, 10, (256,)), 10
    if model == "transformer":
        return SelfAttentionBlock(), torch.randint(0, 1000, (32, 128)), torch.randint(0, 3, (32,)), 3
    raise ValueError(model)


def step_function(model: str, variant: str):
    torch.manual_seed(0)
    net, x, y, classes = build(model)
    lr, clip, sigma = 0.1, 1.0, 1.0
    if variant in ("gaussian_draw", "torch_randn"):
        from dpbench.privacy.noise import GaussianNoise

        sampler = GaussianNoise(0, sampler="fast" if variant == "gaussian_draw" else "torch")
        return lambda: [sampler.fill_(torch.empty_like(p), sigma * clip / len(x)) for p in net.parameters()]
    if variant in ("nonprivate", "dpbench", "dpbench_no_noise", "dpbench_torch_noise"):
        from dpbench.methods.dpsgd import DPSGD
        from dpbench.methods.nonprivate import NonPrivate
        from dpbench.run.training import PrivateTraining
        from dpbench.task import Classification

        class Bench(Classification):
            name = "bench"

        task = Bench()
        task.model, task.classes = net, classes
        method = NonPrivate if variant == "nonprivate" else DPSGD
        hp = {"lr": lr, "momentum": 0.0, "weight_decay": 0.0, "clip": clip, "optimizer": "sgd", "beta1": 0.9,
              "beta2": 0.999}
        noisy = variant in ("dpbench", "dpbench_torch_noise")
        module = PrivateTraining(task, method, hp, sigma if noisy else 0.0, len(x), seed=0,
                                 noise="torch" if variant == "dpbench_torch_noise" else "fast")
        module.on_fit_start()
        return lambda: module.training_step([(x, y)], 0)

    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    loader = DataLoader(TensorDataset(x, y), batch_size=len(x))
    criterion = nn.CrossEntropyLoss()
    mode = {"opacus_hooks": "hooks", "opacus_ghost": "ghost"}[variant]
    engine = PrivacyEngine()
    made = engine.make_private(module=net, optimizer=optimizer, data_loader=loader, noise_multiplier=sigma,
                               max_grad_norm=clip, poisson_sampling=False, grad_sample_mode=mode,
                               **({"criterion": criterion} if mode == "ghost" else {}))
    private_net, private_optimizer = made[0], made[1]
    if mode == "ghost":
        criterion = made[2]

    def step():
        private_optimizer.zero_grad()
        criterion(private_net(x), y).backward()
        private_optimizer.step()

    return step


def peak_memory(model: str, variant: str, warmup: int) -> dict:
    """In this process: peak resident memory after warm-up and three steps."""
    step = step_function(model, variant)
    for _ in range(warmup + 3):
        step()
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def side_by_side(model: str, variants: list[str], warmup: int, repeats: int) -> dict:
    """In this process: every variant's median step time, and its median per-round ratio to the non-private step."""
    steps = {variant: step_function(model, variant) for variant in variants}
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {variant: [] for variant in variants}
    for round_index in range(repeats):
        shift = round_index % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            started = time.perf_counter()
            steps[variant]()
            times[variant].append(time.perf_counter() - started)
    return {variant: {"median_seconds": statistics.median(times[variant]),
                      "time_ratio": statistics.median(t / base for t, base in zip(times[variant], times["nonprivate"]))}
            for variant in variants}


def run_child(*args: str, malloc: str) -> dict:
    """This script with ``args`` and ``--malloc malloc`` in a process of its own, PyTorch's page-aligned allocation
    on or off as ``malloc`` says (dpbench sets it at import, before the child could choose; dpbench/run/allocator.py)."""
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1" if malloc == "dpbench" else "0"}
    out = subprocess.run([sys.executable, __file__, *args, "--malloc", malloc], capture_output=True, text=True,
                         env=env)
    if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS + EXTRA_VARIANTS)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--malloc", choices=("dpbench", "default"), default="dpbench",
                        help="dpbench: every variant's process keeps freed memory as the dpbench command does "
                             "(dpbench/run/allocator.py); default: glibc's and PyTorch's own settings")
    parser.add_argument("--memory", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--side-by-side", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = ["nonprivate"] + [v for v in args.variants if v != "nonprivate"]
    if (args.memory or args.side_by_side) and args.malloc == "dpbench":
        keep_freed_memory()
    if args.memory:
        print(json.dumps(peak_memory(*args.memory, args.warmup)))
        return
    if args.side_by_side:
        print(json.dumps(side_by_side(args.side_by_side, variants, args.warmup, args.repeats)))
        return
    rows = []
    for model in args.models:
        try:
            timed = run_child("--side-by-side", model, "--variants", *variants, "--warmup", str(args.warmup),
                              "--repeats", str(args.repeats), malloc=args.malloc)
        except RuntimeError as error:
            rows += [{"model": model, "variant": variant, "error": str(error)} for variant in variants]
            continue
        for variant in variants:
            try:
                memory = run_child("--memory", model, variant, "--warmup", str(args.warmup), malloc=args.malloc)
            except RuntimeError as error:
                rows.append({"model": model, "variant": variant, "error": str(error)})
                continue
            rows.append({"model": model, "variant": variant, **timed[variant], **memory})
            print(json.dumps(rows[-1]), file=sys.stderr)
    base = {r["model"]: r for r in rows if r["variant"] == "nonprivate" and "error" not in r}
    for r in rows:
        if "error" not in r and r["model"] in base:
            r["memory_ratio"] = r["peak_rss_mb"] / base[r["model"]]["peak_rss_mb"]
    result = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "torch_threads": torch.get_num_threads(), "torch": torch.__version__},
              "malloc": args.malloc, "rows": rows}
    lines = ["| model | variant | median step (ms) | × non-private | peak RSS (MB) | × non-private |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['variant']} | failed: {r['error']} | | | |")
        else:
            lines.append(f"| {r['model']} | {r['variant']} | {1e3 * r['median_seconds']:.1f} | "
                         f"{r.get('time_ratio', float('nan')):.2f} | {r['peak_rss_mb']:.0f} | "
                         f"{r.get('memory_ratio', float('nan')):.2f} |")
    print("\n".join(lines))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
