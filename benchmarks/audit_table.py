"""The audit table of docs/auditing.md: the one-run audit (``dpbench audit``) of every built-in gradient
method (issue 34's four included) at ε = 1 on adult and digits with the tasks' default hyperparameters, and the
planted defects.

    DPBENCH_MIRROR=../shared/data OMP_NUM_THREADS=1 python benchmarks/audit_table.py [--canaries 1000] [--seed 0]

Writes ``benchmarks/results/audit_table.json`` (every audit record) and prints the tables in Markdown.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import dp_accounting
import torch
from dp_accounting import pld
from tqdm import tqdm

from dpbench import method
from dpbench.privacy import clipping, ghost, sampling
from dpbench.trust import audit

TASKS = ("adult", "digits")
METHODS = ("dpsgd", "dpgd", "norm_bound", "adaclip", "ada_dp", "dpadam", "dpadam_bc",
           "quantile_clip", "autoclip", "dpftrl", "bandmf")
CHEATERS = str(Path(__file__).resolve().parents[1] / "tests" / "cheaters")


@contextlib.contextmanager
def planted(defect: str | None):
    """The engine with one planted defect (the same patches as tests/test_audit.py)."""
    saved = (method.GradientMechanism.mean_noise_std, ghost.clip_factors, clipping.clip_factors,
             sampling.PoissonSampler.set_epoch)
    try:
        if defect == "noise σ/10":
            method.GradientMechanism.mean_noise_std = property(lambda self: saved[0].fget(self) / 10)
        elif defect == "clipping off":
            ghost.clip_factors = clipping.clip_factors = lambda norms, max_norm, scale=1.0, gamma=None: \
                torch.full_like(norms, scale)
        elif defect == "epoch replay":
            sampling.PoissonSampler.set_epoch = lambda self, epoch: None
        yield
    finally:
        (method.GradientMechanism.mean_noise_std, ghost.clip_factors, clipping.clip_factors,
         sampling.PoissonSampler.set_epoch) = saved


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "audit_table.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    os.environ.setdefault("DPBENCH_HOME", tempfile.mkdtemp())
    jobs = [(m, t, tm, None, []) for t in TASKS for m in METHODS for tm in audit.THREAT_MODELS]
    jobs += [("dpsgd", t, "white-box", d, []) for t in TASKS for d in ("noise σ/10", "clipping off", "epoch replay")]
    jobs += [(c, t, "white-box", "cheating plugin", [CHEATERS]) for t in TASKS
             for c in ("cheat_keep_gradients", "cheat_stack_walker")]
    results = []
    for name, task, threat, defect, plugins in tqdm(jobs, desc="audits", file=sys.stderr):
        started = time.perf_counter()
        with planted(defect), contextlib.redirect_stdout(sys.stderr):
            record = audit.audit(audit.AuditSpec(method=name, task=task, epsilon=1.0, seed=args.seed,
                                                 canaries=args.canaries, threat_model=threat, plugins=plugins))
        results.append({"defect": defect, "seconds": time.perf_counter() - started, "record": record})
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))  # after each audit: a crash keeps what ran

    def bound(name, task, threat, defect=None):
        [found] = [r["record"] for r in results if (r["record"]["method"], r["record"]["task"],
                                                    r["record"]["threat_model"], r["defect"]) ==
                   (name, task, threat, defect)]
        return f"{found['epsilon_lower_bound']:.2f}" + ("" if found["passed"] else " (fails)")

    print("| method | adult, white-box | adult, black-box | digits, white-box | digits, black-box |")
    print("| --- | --- | --- | --- | --- |")
    for name in METHODS:
        print(f"| `{name}` | " + " | ".join(bound(name, t, tm) for t in TASKS for tm in audit.THREAT_MODELS) + " |")
    print("\n| planted defect (white-box) | adult | digits |\n| --- | --- | --- |")
    for defect in ("noise σ/10", "clipping off", "epoch replay"):
        print(f"| {defect} | " + " | ".join(bound("dpsgd", t, "white-box", defect) for t in TASKS) + " |")
    for name in ("cheat_keep_gradients", "cheat_stack_walker"):
        print(f"| `{name}` | " + " | ".join(bound(name, t, "white-box", "cheating plugin") for t in TASKS) + " |")
    for task in TASKS:  # what the replayed run really spent: each batch released once per epoch
        [replayed] = [r["record"] for r in results if r["defect"] == "epoch replay" and r["record"]["task"] == task]
        epochs, releases = replayed["hyperparameters"]["epochs"], replayed["gradient_evaluations"]
        event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            replayed["sample_rate"], dp_accounting.GaussianDpEvent(replayed["noise_multiplier"] / epochs**0.5)),
            releases // epochs)
        relation = (dp_accounting.NeighboringRelation.REPLACE_ONE if replayed["neighbouring"] == "replace-one"
                    else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        spent = pld.PLDAccountant(relation).compose(event).get_epsilon(replayed["delta"])
        print(f"\nepoch replay on {task}: ε really spent {spent:.2f} (σ = {replayed['noise_multiplier']:.3f}, "
              f"{epochs} epochs), bound {bound('dpsgd', task, 'white-box')} without the bug, "
              f"{bound('dpsgd', task, 'white-box', 'epoch replay')} with it")
    print(f"\n{len(results)} audits, {sum(r['seconds'] for r in results):.0f} s; claimed ε = 1 in every run",
          file=sys.stderr)


if __name__ == "__main__":
    main()
