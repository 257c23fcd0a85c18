"""What checkpointing (``dpbench run --checkpoint-dir``) costs: training time with checkpoints every N steps against
none, and the time of one checkpoint.

    DPBENCH_MIRROR=../shared/data python benchmarks/checkpoint_time.py --task adult --epochs 2 --every 1 10 100

All in this process, after a warm-up run (data and accountant caches), nothing stored: ``--rounds`` rounds, each
training once without checkpoints and once per interval, so that a slow spell of the machine falls on all of them.
A checkpoint's time is the median over rounds of (time with checkpoints every step − time without) / checkpoints.
Prints one JSON object.
"""
import argparse
import json
import statistics
import tempfile
from dataclasses import replace

from dpbench.run import checkpoint, engine
from dpbench.spec import RunSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="dpsgd")
    parser.add_argument("--task", default="adult")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--every", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spec = RunSpec(method=args.method, task=args.task, noise_multiplier=1.0, progress_bar=False, no_wandb=True,
                   append_to_store=False, overrides={"epochs": args.epochs})
    written = []
    atomic_write = checkpoint.atomic_write

    def counting(path, write):
        atomic_write(path, write)
        written.append(path.name)

    checkpoint.atomic_write = counting
    engine.run(spec)
    seconds: dict[str, list[float]] = {"none": []}
    per_checkpoint, counts = [], {}
    for _ in range(args.rounds):
        record = engine.run(spec)
        seconds["none"].append(record["train_seconds"])
        for every in args.every:
            written.clear()
            with tempfile.TemporaryDirectory() as folder:
                timed = engine.run(replace(spec, checkpoint_dir=f"{folder}/run", checkpoint_every=every))
            seconds.setdefault(str(every), []).append(timed["train_seconds"])
            counts[str(every)] = written.count(checkpoint.CHECKPOINT)
            if every == 1:
                per_checkpoint.append((timed["train_seconds"] - record["train_seconds"]) / counts["1"])
    print(json.dumps({"task": args.task, "method": args.method, "steps": record["steps"],
                      "median_train_seconds": {k: statistics.median(v) for k, v in seconds.items()},
                      "checkpoints": counts,
                      "seconds_per_checkpoint": statistics.median(per_checkpoint) if per_checkpoint else None}))


if __name__ == "__main__":
    main()
