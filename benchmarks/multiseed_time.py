"""Wall time of S seeds trained as one batched run (``dpbench.run.multiseed``) against one seed trained alone.

    DPBENCH_MIRROR=../shared/data python benchmarks/multiseed_time.py --method dpsgd --task adult --seeds 10

Both in this process, after a warm-up run of each (data and calibration caches), nothing stored, side by side:
``--rounds`` rounds each time one seed alone, then the S seeds batched; the ratio is the median over rounds of
(batched / one seed) of the same round, so that a slow spell of the machine falls on both. Prints one JSON object.
"""
import argparse
import json
import statistics
import time

from dpbench.run import engine, multiseed
from dpbench.spec import RunSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="dpsgd")
    parser.add_argument("--task", default="adult")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    spec = RunSpec(method=args.method, task=args.task, epsilon=args.epsilon, progress_bar=False,
                   no_wandb=True, append_to_store=False)
    seeds = list(range(args.seeds))
    engine.run(spec)
    multiseed.run_seeds(spec, seeds)
    one_seed, batched = [], []
    for _ in range(args.rounds):
        started = time.perf_counter()
        alone = engine.run(spec)
        one_seed.append(time.perf_counter() - started)
        started = time.perf_counter()
        together = multiseed.run_seeds(spec, seeds)
        batched.append(time.perf_counter() - started)
    ratios = [b / a for a, b in zip(one_seed, batched)]
    print(json.dumps({"method": args.method, "task": args.task, "seeds": args.seeds, "rounds": args.rounds,
                      "one_seed_s": statistics.median(one_seed), "batched_s": statistics.median(batched),
                      "ratio": statistics.median(ratios), "ratios": ratios,
                      "seed0_accuracy_alone": alone["metrics"]["test_accuracy"],
                      "seed0_accuracy_batched": together[0]["metrics"]["test_accuracy"]}))


if __name__ == "__main__":
    main()
