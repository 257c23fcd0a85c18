"""Wall time of S seeds trained as one batched run (``dpbench.multiseed``) against one seed trained alone.

    DPBENCH_MIRROR=../shared/data python benchmarks/multiseed_time.py --method dpsgd --task adult --seeds 10

Both in this process, after a warm-up run (data and calibration caches), nothing stored; prints one JSON object.
"""
import argparse
import json
import time

from dpbench import engine, multiseed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="dpsgd")
    parser.add_argument("--task", default="adult")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    spec = engine.RunSpec(method=args.method, task=args.task, epsilon=args.epsilon, progress_bar=False,
                          no_wandb=True, append_to_store=False)
    engine.run(spec)
    started = time.perf_counter()
    alone = engine.run(spec)
    one_seed = time.perf_counter() - started
    started = time.perf_counter()
    batched = multiseed.run_seeds(spec, list(range(args.seeds)))
    all_seeds = time.perf_counter() - started
    print(json.dumps({"method": args.method, "task": args.task, "seeds": args.seeds, "one_seed_s": one_seed,
                      "batched_s": all_seeds, "ratio": all_seeds / one_seed,
                      "seed0_accuracy_alone": alone["metrics"]["test_accuracy"],
                      "seed0_accuracy_batched": batched[0]["metrics"]["test_accuracy"]}))


if __name__ == "__main__":
    main()
