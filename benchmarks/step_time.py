"""Median time of one training step and peak memory: non-private vs dpbench DP-SGD vs Opacus (hooks, ghost).

Every (model, variant) pair runs in its own subprocess, so that peak resident memory is its own; ratios are
taken against the non-private step of the same model measured in the same invocation. A step is forward,
backward (per-example clipping and noise for the private variants) and an SGD update on a fixed batch.

    python benchmarks/step_time.py --json benchmarks/results/step_time.json   # writes the table too
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

MODELS = ("logreg", "mlp", "cnn", "transformer")
VARIANTS = ("nonprivate", "dpbench", "opacus_hooks", "opacus_ghost")
EXTRA_VARIANTS = ("dpbench_no_noise",)  # dpbench's clipping with σ = 0: the step without the Gaussian draw


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
    if variant in ("nonprivate", "dpbench", "dpbench_no_noise"):
        from dpbench.engine import PrivateTraining
        from dpbench.methods.dpsgd import DPSGD
        from dpbench.methods.nonprivate import NonPrivate
        from dpbench.task import Classification

        class Bench(Classification):
            name = "bench"

        task = Bench()
        task.model, task.classes = net, classes
        method = NonPrivate if variant == "nonprivate" else DPSGD
        hp = {"lr": lr, "momentum": 0.0, "weight_decay": 0.0, "clip": clip, "optimizer": "sgd", "beta1": 0.9,
              "beta2": 0.999}
        module = PrivateTraining(task, method, hp, sigma if variant == "dpbench" else 0.0, len(x), seed=0)
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


def measure(model: str, variant: str, warmup: int, repeats: int) -> dict:
    """In this process: median seconds per step after warm-up, and peak resident memory."""
    step = step_function(model, variant)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return {"model": model, "variant": variant, "median_seconds": statistics.median(times),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS + EXTRA_VARIANTS)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.warmup, args.repeats)))
        return
    rows = []
    for model in args.models:
        for variant in args.variants:
            out = subprocess.run([sys.executable, __file__, "--one", model, variant, "--warmup", str(args.warmup),
                                  "--repeats", str(args.repeats)], capture_output=True, text=True)
            if out.returncode:
                rows.append({"model": model, "variant": variant, "error": out.stderr.strip().splitlines()[-1]})
            else:
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), file=sys.stderr)
    base = {r["model"]: r for r in rows if r["variant"] == "nonprivate" and "error" not in r}
    for r in rows:
        if "error" not in r and r["model"] in base:
            r["time_ratio"] = r["median_seconds"] / base[r["model"]]["median_seconds"]
            r["memory_ratio"] = r["peak_rss_mb"] / base[r["model"]]["peak_rss_mb"]
    result = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "torch_threads": torch.get_num_threads(), "torch": torch.__version__}, "rows": rows}
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
