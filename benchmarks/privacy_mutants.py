"""Planted privacy defects: does the test suite catch each one?

Each mutant is one small textual change to the engine that makes a reported ε smaller than what ran (or leaks what
the record must not say). For each, this script applies the change to the working tree, runs the privacy part of
the test suite with ``pytest -x`` (stop at the first failure; the mutant's likely catcher first, so that the table
comes in minutes, then every other privacy test), restores the file, and reports whether a test
failed, which one, and how long it took to fail. Run it on a clean checkout, from the repository root, after any
change to privacy code::

    python benchmarks/privacy_mutants.py                 # every mutant; the table for BENCHMARKS.md
    python benchmarks/privacy_mutants.py --only rate-2q  # one mutant
    python benchmarks/privacy_mutants.py --json benchmarks/results/privacy_mutants.json

The files are restored in a ``finally`` block (and checked unmodified by git before each mutant), so an interrupted
run leaves the tree as it was. Exit status 1 if any mutant survives (no test failed) or a snippet no longer matches
the code (update the mutant)."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The privacy part of the suite, in the order that catches most mutants soonest.
PRIVACY_TESTS = ["tests/test_guards.py", "tests/test_streams.py", "tests/test_privacy.py", "tests/test_engine.py",
                 "tests/test_sampling.py", "tests/test_clipping.py", "tests/test_ghost.py", "tests/test_multiseed.py",
                 "tests/test_tuning.py", "tests/test_tuning_privacy.py", "tests/test_output_perturbation.py",
                 "tests/test_amp.py", "tests/test_cli.py", "tests/test_adaclip.py", "tests/test_ada_dp.py",
                 "tests/test_dpadam.py", "tests/test_mnist_tasks.py"]


@dataclass(frozen=True)
class Mutant:
    name: str
    area: str
    defect: str
    file: str
    old: str
    new: str
    first: str = ""  # the test file to run first (only the order: the rest of the privacy tests follow)


MUTANTS = [
    Mutant("rate-2q", "sampling", "the Poisson sampler draws at 2q; record, calibration and ledger keep q",
           "dpbench/engine.py", "sampler = PoissonSampler(n, sample_rate, steps_per_epoch, per_step, spec.seed)",
           "sampler = PoissonSampler(n, min(1.0, 2 * sample_rate), steps_per_epoch, per_step, spec.seed)",
           first="tests/test_guards.py"),
    Mutant("epoch-replay", "sampling", "every epoch replays epoch 0's batches (the bug fixed on 22 November 2026)",
           "dpbench/sampling.py", 'return streams.generator(seed, "sampler", epoch)',
           'return streams.generator(seed, "sampler", 0)', first="tests/test_guards.py"),
    Mutant("shared-stream", "sampling", "the sampler's stream is the initial weights' (the review's collision)",
           "dpbench/sampling.py", 'return streams.generator(seed, "sampler", epoch)',
           'return streams.generator(seed, "init") if epoch == 0 else streams.generator(seed, "sampler", epoch)',
           first="tests/test_streams.py"),
    Mutant("noise-half", "noise scale", "the release's noise has standard deviation σC/(2B)",
           "dpbench/method.py", "return self.noise_multiplier * self.clip / self.expected_batch_size",
           "return self.noise_multiplier * self.clip / self.expected_batch_size / 2", first="tests/test_engine.py"),
    Mutant("no-clipping", "clipping", "per-example gradients are not clipped",
           "dpbench/clipping.py", "return (max_norm * scale) / norms.clamp_min(max_norm)",
           "return torch.full_like(norms, scale)", first="tests/test_clipping.py"),
    Mutant("adaclip-cancellation", "clipping", "AdaCliP's closed-form norm without its rounding bound (float32)",
           "dpbench/ghost.py", "return ((sq + error) * (1 + 2.0**-22)).float()",
           "return (t1.float() - 2 * t2.float() + t3.float()).clamp_min(0)", first="tests/test_adaclip.py"),
    Mutant("mixing-layers", "clipping", "layers that mix examples (batch norm) are no longer refused",
           "dpbench/engine.py", "        guards.refuse_example_mixing(task, rows.first(data.x_test, 3))", "        pass",
           first="tests/test_guards.py"),
    Mutant("ledger-one-per-step", "ledger", "one release charged per step, whatever the method drew (ADADP: 2)",
           "dpbench/training.py", "self.releases += len(batches)", "self.releases += 1", first="tests/test_ada_dp.py"),
    Mutant("delta-tenfold", "δ", "the spent ε is computed at 10δ",
           "dpbench/engine.py", "spent = planned.releases_charged(module.releases).epsilon(planned.delta, spec.accountant)",
           "spent = planned.releases_charged(module.releases).epsilon(10 * planned.delta, spec.accountant)",
           first="tests/test_engine.py"),
    Mutant("calibrate-half-steps", "calibration", "σ calibrated for half the planned releases",
           "dpbench/engine.py", "planned_releases = hp[\"epochs\"] * steps_per_epoch * per_step",
           "planned_releases = max(1, hp[\"epochs\"] * steps_per_epoch * per_step // 2)", first="tests/test_engine.py"),
    Mutant("relation-swapped", "calibration", "replace-one accounted as add/remove-one",
           "dpbench/privacy.py", '"replace-one": dp_accounting.NeighboringRelation.REPLACE_ONE}',
           '"replace-one": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE}', first="tests/test_privacy.py"),
    Mutant("tuning-one-trial", "tuning", "random stopping charged as one trial (K ignored)",
           "dpbench/tuning_privacy.py", "ORDERS, trial.curve(), distribution[\"mean\"], k_shape(distribution)))",
           "ORDERS, trial.curve(), 1.0, k_shape(distribution)))", first="tests/test_tuning.py"),
    Mutant("tuning-shuffle-trials", "tuning", "trials sample with the method's default sampler, not Poisson",
           "dpbench/tuning.py", 'noise_multiplier=plan_.trial.noise_multiplier, sampler="poisson",',
           'noise_multiplier=plan_.trial.noise_multiplier, sampler=None,', first="tests/test_tuning.py"),
    Mutant("tuning-score-noise", "tuning", "the validation score's noise is a tenth of what parallel composition needs",
           "dpbench/tuning_privacy.py", "return math.sqrt(float(np.max(ORDERS / (2 * trial.curve())))) * (1 + 1e-9)",
           "return math.sqrt(float(np.max(ORDERS / (2 * trial.curve())))) * (1 + 1e-9) / 10",
           first="tests/test_tuning_privacy.py"),
    Mutant("replace-one-curve", "tuning", "the tuning's replace-one curve taken as the add/remove one",
           "dpbench/privacy.py", "    if neighbouring == \"add-remove\":\n        accountant = rdp.RdpAccountant",
           "    if True:\n        accountant = rdp.RdpAccountant", first="tests/test_tuning_privacy.py"),
    Mutant("tuning-reveals-k", "tuning", "the released record says how many trials ran",
           "dpbench/tuning.py", '"selected_params": best.params, "study": study.study_name,',
           '"selected_params": best.params, "trials_run": k, "study": study.study_name,', first="tests/test_tuning.py"),
    Mutant("tuning-reveals-batch", "tuning", "the release of studies tuned together says how many trials trained "
           "with it (the sum of their K)", "dpbench/tuning.py",
           'TRIAL_ONLY_FIELDS = ("run_id", "created_at", "validation", "batched_seeds", "train_seconds")',
           'TRIAL_ONLY_FIELDS = ("run_id", "created_at", "validation", "train_seconds")', first="tests/test_tuning.py"),
    Mutant("multiseed-noise", "batched seeds", "batched seeds add noise for twice the expected batch size",
           "dpbench/multiseed.py", "scales = torch.tensor([1 / module.expected_batch_size for module in modules]",
           "scales = torch.tensor([0.5 / module.expected_batch_size for module in modules]",
           first="tests/test_multiseed.py"),
    Mutant("multiseed-ledger", "batched seeds", "batched runs charge one release per step to the first run only",
           "dpbench/multiseed.py", "            if modules[index].method_class.private:  # the ledger",
           "            if index == active[0] and modules[index].method_class.private:  # the ledger",
           first="tests/test_multiseed.py"),
    Mutant("output-noise-half", "release methods", "output perturbation adds half the calibrated noise",
           "dpbench/release.py", "    std = sigma * sensitivity\n", "    std = sigma * sensitivity / 2\n",
           first="tests/test_output_perturbation.py"),
    Mutant("amp-sensitivity", "release methods", "AMP's output noise for the paper's nγ/Λ instead of 2nγ/Λ",
           "dpbench/release.py", "out_sensitivity = 2 * n * gamma / regularization",
           "out_sensitivity = n * gamma / regularization", first="tests/test_amp.py"),
]


@dataclass
class Outcome:
    name: str
    area: str
    defect: str
    caught: bool
    test: str | None
    seconds: float


def _first_failure(output: str) -> str | None:
    match = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    return match.group(1) if match else None


def run_mutant(mutant: Mutant, tests: list[str], timeout: float) -> Outcome:
    path = REPO / mutant.file
    original = path.read_text()
    if original.count(mutant.old) != 1:
        raise SystemExit(f"mutant {mutant.name}: the snippet occurs {original.count(mutant.old)} times in "
                         f"{mutant.file}; update the mutant")
    if subprocess.run(["git", "diff", "--quiet", "--", mutant.file], cwd=REPO).returncode != 0:
        raise SystemExit(f"{mutant.file} has uncommitted changes: run the mutants on a clean checkout")
    # The mutant's likely catcher first, then the rest: the order changes how soon a failure shows, not whether.
    ordered = [mutant.first] if mutant.first else []
    rest = [test for test in tests if test != mutant.first]
    started = time.perf_counter()
    try:
        path.write_text(original.replace(mutant.old, mutant.new))
        for part in (ordered, rest):
            if not part:
                continue
            result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *part],
                                    cwd=REPO, capture_output=True, text=True, timeout=timeout)
            if result.returncode != 0:
                break
    finally:
        path.write_text(original)
    seconds = time.perf_counter() - started
    return Outcome(mutant.name, mutant.area, mutant.defect, result.returncode != 0,
                   _first_failure(result.stdout) if result.returncode != 0 else None, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutant names (default: all)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for one mutant's test run")
    parser.add_argument("--json", help="write the outcomes here")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    outcomes = []
    print(f"{len(chosen)} mutants; privacy tests: {' '.join(PRIVACY_TESTS)}", file=sys.stderr)
    # A mutant counts as caught when the privacy tests fail: they must pass without it, or every mutant is "caught".
    started = time.perf_counter()
    baseline = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PRIVACY_TESTS],
                              cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    if baseline.returncode != 0:
        raise SystemExit(f"the privacy tests fail without any mutant ({_first_failure(baseline.stdout)}): fix that first")
    print(f"baseline: the privacy tests pass in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    for index, mutant in enumerate(chosen, 1):
        outcome = run_mutant(mutant, PRIVACY_TESTS, args.timeout)
        outcomes.append(outcome)
        print(f"[{index}/{len(chosen)}] {mutant.name}: {'caught by ' + str(outcome.test) if outcome.caught else 'SURVIVED'}"
              f" in {outcome.seconds:.0f} s", file=sys.stderr, flush=True)
    print("| defect | area | caught by | time to catch |")
    print("| --- | --- | --- | --- |")
    for o in outcomes:
        print(f"| `{o.name}`: {o.defect} | {o.area} | {f'`{o.test}`' if o.caught else '**not caught**'} | "
              f"{o.seconds:.0f} s |")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=1) + "\n")
    return 0 if all(o.caught for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
