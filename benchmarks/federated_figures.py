"""Koskela & Honkela's federated experiments (Figures 1-3) with ``dpbench federated``, regenerated from scratch:
runs, records, table and plots under ``leaderboards/federated/``.

    python benchmarks/federated_figures.py --workers 2       # every run not yet in records.jsonl, then the outputs
    python benchmarks/federated_figures.py --plots-only       # table and plots from the records only

Figure 2: ADADP clients (η0 = 10^-2) and constant-rate SGD clients with η on the paper's grid {10^-2.5, 10^-2,
10^-1.5} and one decade either side (10^-3.5, 10^-0.5), at 0, 1/3 and 1 of the data assigned at random; Figure 1 is
the same runs' curves. Figure 3: Adam clients at 1/3 random with the paper's initial learning rates {10^-5.5, 10^-5,
10^-4.5} (seed 0). ADADP runs with seeds 0..S-1. SGD's η is tuned in two stages (successive halving, to fit the
runs on two cores): every η of the grid with seed 0, then the ``--keep`` best of them at that fraction (by seed 0's
final test accuracy) with seeds 1..S-1; the table's tuned SGD is the best η by its mean over all S seeds.

Each run is one process (spawned, one torch thread), ``--workers`` at a time; a record is appended to
``records.jsonl`` when its run ends, and runs already there are skipped, so an interrupted invocation resumes.
Set ``DPBENCH_MIRROR``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dpbench.federated import experiment
from dpbench.run import allocator

OUT = Path(__file__).resolve().parents[1] / "leaderboards" / "federated"
FRACTIONS = ("0", "1/3", "1")
PERCENT = {"0": "0%", "1/3": "33%", "1": "100%"}
SGD_EXPONENTS = (-3.5, -2.5, -2.0, -1.5, -0.5)
ADAM_EXPONENTS = (-5.5, -5.0, -4.5)
ADADP_EXPONENT = -2.0


#: Relative cost of a run by client method, to start the longest runs first and for the ETA: the committed
#: records' train_seconds, 50 rounds of 8,000 images per client beside another run (SGD ~230 s, ADADP ~595 s,
#: Adam ~610 s).
COST = {"sgd": 1.0, "ada_dp": 2.6, "adam": 2.6}


def planned(seeds: int, keep: int, records: list[dict], rounds: int, client_size: int) -> list[tuple]:
    """(client method, random fraction, lr exponent, seed) of every run that can be planned now: seed 0 of each
    configuration, every ADADP seed, and SGD's later seeds at a fraction once all its seed-0 SGD runs are in
    ``records`` (the ``keep`` best η of seed 0 there)."""
    finals = {record_key(r): r["metrics"]["test_accuracy"] for r in records}
    runs = [("adam", "1/3", exponent, 0) for exponent in ADAM_EXPONENTS]
    for fraction in FRACTIONS:
        runs += [("ada_dp", fraction, ADADP_EXPONENT, seed) for seed in range(seeds)]
        first = {e: finals.get(key("sgd", fraction, e, 0, rounds, client_size)) for e in SGD_EXPONENTS}
        runs += [("sgd", fraction, exponent, 0) for exponent in SGD_EXPONENTS]
        if None not in first.values():
            best = sorted(SGD_EXPONENTS, key=lambda e: -_finite(first[e]))[:keep]
            runs += [("sgd", fraction, exponent, seed) for exponent in best for seed in range(1, seeds)]
    return runs


def _finite(accuracy: float) -> float:
    return accuracy if accuracy == accuracy else -1.0  # a diverged run (NaN accuracy) ranks last


def key(method: str, fraction: str, exponent: float, seed: int, rounds: int, client_size: int) -> tuple:
    return method, fraction, round(exponent, 3), seed, rounds, client_size


def record_key(record: dict) -> tuple:
    settings = record["settings"]
    exponent = torch.tensor(record["hyperparameters"]["lr"], dtype=torch.float64).log10().item()
    return key(record["client_method"], record["split"]["random_fraction_text"], exponent, record["seed"],
               settings["rounds"], settings["client_size"])


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _run(method: str, fraction: str, exponent: float, seed: int, rounds: int, client_size: int,
         no_wandb: bool) -> dict:
    """One run, in a worker process of its own."""
    torch.set_num_threads(1)
    allocator.keep_freed_memory()
    spec = experiment.FederatedSpec(client_method=method, random_fraction=fraction, rounds=rounds,
                                   client_size=client_size, lr=10**exponent, seed=seed, progress_bar=False,
                                   no_wandb=no_wandb)
    return experiment.run(spec)


def run_all(args: argparse.Namespace, path: Path) -> None:
    """Runs every plannable run not yet in ``path``, longest first, ``args.workers`` at a time, planning again as
    records arrive (SGD's later seeds wait for its seed-0 runs)."""
    records = load(path)
    settings = (args.rounds, args.client_size)
    running: dict[concurrent.futures.Future, tuple] = {}
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=context, max_tasks_per_child=1) as pool, \
            tqdm(unit="round", desc="federated figures", dynamic_ncols=True) as bar:
        while True:
            done = {record_key(r) for r in records}
            pending = [run for run in planned(args.seeds, args.keep, records, *settings)
                       if key(*run, *settings) not in done and run not in running.values()]
            bar.total = bar.n + sum(args.rounds * COST[run[0]] for run in [*pending, *running.values()])
            # SGD's seed-0 runs first (the later seeds' plan waits for them), then the longest first
            pending.sort(key=lambda run: (run[0] != "sgd" or run[3] != 0, -COST[run[0]], run[3]))
            while pending and len(running) < args.workers:
                run = pending.pop(0)
                running[pool.submit(_run, *run, *settings, args.no_wandb)] = run
            if not running:
                break
            bar.set_postfix_str(", ".join(f"{m} {f} 1e{e} s{s}" for m, f, e, s in running.values()))
            bar.refresh()
            finished, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                run = running.pop(future)
                record = future.result()
                records.append(record)
                with path.open("a") as file:
                    file.write(json.dumps(record, sort_keys=True) + "\n")
                bar.update(args.rounds * COST[run[0]])


# --- outputs --------------------------------------------------------------------------------------------------------

def label(method: str, exponent: float) -> str:
    names = {"ada_dp": "ADADP, η0", "sgd": "SGD, η", "adam": "Adam, η0"}
    return f"{names[method]} = 10^{exponent:g}"


def groups(records: list[dict]) -> dict[tuple, list[dict]]:
    """(method, fraction, exponent) -> records of the largest (rounds, client size) setting, one per seed."""
    setting = max((r["settings"]["rounds"], r["settings"]["client_size"]) for r in records)
    grouped: dict[tuple, list[dict]] = {}
    for r in records:
        if (r["settings"]["rounds"], r["settings"]["client_size"]) == setting:
            method, fraction, exponent, *_ = record_key(r)
            grouped.setdefault((method, fraction, exponent), []).append(r)
    return grouped


def final(runs: list[dict]) -> list[float]:
    return [r["metrics"]["test_accuracy"] for r in runs]


def summary(values: list[float]) -> str:
    std = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.3f}{std} (n = {len(values)})"


def best_sgd(grouped: dict, fraction: str) -> float | None:
    """The SGD learning rate exponent with the highest mean final accuracy at ``fraction`` among those run with the
    most seeds (the second stage's; tuned on test accuracy, as the paper tunes it)."""
    runs = {e: final(r) for (m, f, e), r in grouped.items() if m == "sgd" and f == fraction}
    if not runs:
        return None
    most = max(map(len, runs.values()))
    return max((statistics.mean(values), e) for e, values in runs.items() if len(values) == most)[1]


def robustness(grouped: dict, best: dict) -> list[tuple[tuple[str, float], float]]:
    """((method, exponent), max over shares of best SGD's mean − its mean) for every setting run at every share,
    smallest first."""
    if None in best.values():
        return []
    tuned = {f: statistics.mean(final(grouped["sgd", f, best[f]])) for f in FRACTIONS}
    settings = {(m, e) for m, f, e in grouped if m in ("ada_dp", "sgd")}
    gaps = [((m, e), max(tuned[f] - statistics.mean(final(grouped[m, f, e])) for f in FRACTIONS))
            for m, e in settings if all((m, f, e) in grouped for f in FRACTIONS)]
    return sorted(gaps, key=lambda item: item[1])


def curve(runs: list[dict]) -> torch.Tensor:
    return torch.tensor([[row["test_accuracy"] for row in r["history"]] for r in runs])


def table(records: list[dict]) -> str:
    grouped = groups(records)
    any_record = next(iter(grouped.values()))[0]
    settings = any_record["settings"]
    seconds = sum(r["train_seconds"] for r in records)
    commits = sorted({r["git_commit"] for r in records})
    lines = [
        "# Federated averaging with adaptive clients (Koskela & Honkela, Figures 1-3)", "",
        "Generated by `python benchmarks/federated_figures.py` from [records.jsonl](records.jsonl) "
        f"({len(records)} runs, {seconds / 3600:.2f} h of training in total, commit(s) {', '.join(commits)}).", "",
        f"Setting: FedAvg with all {settings['clients']} clients in every round, {settings['rounds']} rounds, one "
        f"local epoch of {settings['client_size']:,} images per client and round (|B| = {settings['batch_size']}: "
        f"{settings['client_size'] // settings['batch_size']} SGD/Adam steps or "
        f"{settings['client_size'] // (2 * settings['batch_size'])} ADADP iterations of two batches), client "
        f"optimizer state kept across rounds; data `{any_record['data_id']}` (the cifar10 task's cached features of "
        "its frozen convolutions; only the 1600-500-500-10 head trains); test accuracy of the global model on the "
        "10,000 CIFAR-10 test images after the last round, mean ± standard deviation over seeds "
        "(the seed draws the initial weights, the random part of the split and the batches). SGD's η is tuned in two "
        "stages: all five η with seed 0, then the two best of seed 0 at that share with seeds 1 and 2; the tuned SGD "
        "is the better of those two by its mean over the three seeds (n in each cell says how many seeds ran).", "",
        "## Figure 2: final test accuracy by share of randomly assigned data", "",
        "| clients | " + " | ".join(f"{PERCENT[f]} random" for f in FRACTIONS) + " |",
        "| --- | " + " | ".join("---" for _ in FRACTIONS) + " |",
    ]
    rows = sorted({(m, e) for m, f, e in grouped if m in ("ada_dp", "sgd")}, key=lambda me: (me[0] != "ada_dp", me[1]))
    for method, exponent in rows:
        cells = [summary(final(grouped[method, f, exponent])) if (method, f, exponent) in grouped else "—"
                 for f in FRACTIONS]
        lines.append(f"| {label(method, exponent)} | " + " | ".join(cells) + " |")
    best = {f: best_sgd(grouped, f) for f in FRACTIONS}
    lines.append("| SGD, best η of the grid (tuned on test accuracy) | "
                 + " | ".join(f"{summary(final(grouped['sgd', f, best[f]]))}, η = 10^{best[f]:g}" if best[f] is not None
                              else "—" for f in FRACTIONS) + " |")
    differences = []
    for f in FRACTIONS:
        if best[f] is None or ("ada_dp", f, ADADP_EXPONENT) not in grouped:
            differences.append("—")
            continue
        difference = statistics.mean(final(grouped["ada_dp", f, ADADP_EXPONENT])) - statistics.mean(
            final(grouped["sgd", f, best[f]]))
        differences.append(f"{difference:+.3f}")
    lines.append("| ADADP − best SGD | " + " | ".join(differences) + " |")
    shortfalls = robustness(grouped, best)
    if shortfalls:
        lines += ["", "One setting for every share: the largest shortfall of each client rule with a single η (ADADP: "
                  "η0) against the SGD tuned for that share, over the three shares (mean final accuracies):", "",
                  ", ".join(f"{label(m, e)}: {gap:.3f}" for (m, e), gap in shortfalls)]
    lines += ["", "ADADP's learning rates at the end (mean over clients and seeds; per client: min–max) and the share "
              "of its iterations that took their step in the last round:", ""]
    for f in FRACTIONS:
        runs = grouped.get(("ada_dp", f, ADADP_EXPONENT), [])
        if runs:
            lrs = [lr for r in runs for lr in r["history"][-1]["client_lr"]]
            accepted = [a for r in runs for a in r["history"][-1]["accepted_fraction"]]
            lines.append(f"* {PERCENT[f]} random: η = {statistics.mean(lrs):.3g} ({min(lrs):.3g}–{max(lrs):.3g}), "
                         f"accepted {statistics.mean(accepted):.2f}")
    adam = sorted((e, runs) for (m, f, e), runs in grouped.items() if m == "adam")
    if adam:
        lines += ["", "## Figure 3: Adam clients, 33% random data", "",
                  "| clients | final test accuracy | best round's test accuracy |", "| --- | --- | --- |"]
        for exponent, runs in adam:
            lines.append(f"| {label('adam', exponent)} | {summary(final(runs))} | "
                         f"{summary([max(row['test_accuracy'] for row in r['history']) for r in runs])} |")
        if ("ada_dp", "1/3", ADADP_EXPONENT) in grouped:
            lines.append(f"| {label('ada_dp', ADADP_EXPONENT)} (for reference) | "
                         f"{summary(final(grouped['ada_dp', '1/3', ADADP_EXPONENT]))} | — |")
    lines += ["", "Plots: [figure1.png](figure1.png) (test accuracy by round, ADADP and the best SGD), "
              "[figure2.png](figure2.png) (final accuracy by share of random data and by learning rate), "
              "[figure3.png](figure3.png) (Adam).", ""]
    return "\n".join(lines)


def plots(records: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grouped = groups(records)
    best = {f: best_sgd(grouped, f) for f in FRACTIONS}
    adadp = {f: grouped.get(("ada_dp", f, ADADP_EXPONENT)) for f in FRACTIONS}

    def draw(axis, runs, text, **style):
        values = curve(runs)
        rounds = torch.arange(1, values.shape[1] + 1)
        line, = axis.plot(rounds, values.mean(0), label=f"{text} (n = {len(runs)})", **style)
        axis.fill_between(rounds, values.min(0).values, values.max(0).values, alpha=0.2, color=line.get_color())

    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, fraction in zip(axes, ("1/3", "0")):
        if adadp[fraction]:
            draw(axis, adadp[fraction], label("ada_dp", ADADP_EXPONENT))
        if best[fraction] is not None:
            draw(axis, grouped["sgd", fraction, best[fraction]], label("sgd", best[fraction]) + " (best)")
        axis.set(title=f"{PERCENT[fraction]} random", xlabel="communication round", ylabel="test accuracy")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle("Figure 1: FedAvg on CIFAR-10, ADADP vs learning-rate tuned SGD (mean, min–max over seeds)")
    figure.tight_layout()
    figure.savefig(out / "figure1.png", dpi=120)

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    percents = [100 * float(Fraction(f)) for f in FRACTIONS]
    for exponent in SGD_EXPONENTS:
        means = [statistics.mean(final(grouped["sgd", f, exponent])) if ("sgd", f, exponent) in grouped else None
                 for f in FRACTIONS]
        left.plot(percents, means, "o--", alpha=0.5, label=label("sgd", exponent))
    tuned = [statistics.mean(final(grouped["sgd", f, best[f]])) if best[f] is not None else None for f in FRACTIONS]
    left.plot(percents, tuned, "s-", color="black", label="SGD, best η per column")
    left.plot(percents, [statistics.mean(final(adadp[f])) if adadp[f] else None for f in FRACTIONS], "D-",
              color="tab:red", linewidth=2, label=label("ada_dp", ADADP_EXPONENT))
    left.set(xlabel="% of data assigned at random", ylabel="final test accuracy", title="(a) by randomness")
    for fraction in FRACTIONS:
        exponents = [e for e in SGD_EXPONENTS if ("sgd", fraction, e) in grouped]
        line, = right.plot(exponents, [statistics.mean(final(grouped["sgd", fraction, e])) for e in exponents], "o-",
                           label=f"SGD, {PERCENT[fraction]} random")
        if adadp[fraction]:
            right.plot([ADADP_EXPONENT], [statistics.mean(final(adadp[fraction]))], "D", markersize=10,
                       color=line.get_color(), markeredgecolor="black", label=f"ADADP η0, {PERCENT[fraction]} random")
    right.set(xlabel="log10 η (ADADP: η0)", ylabel="final test accuracy", title="(b) by learning rate")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle("Figure 2: final test accuracy (mean over seeds)")
    figure.tight_layout()
    figure.savefig(out / "figure2.png", dpi=120)

    adam = sorted((e, runs) for (m, f, e), runs in grouped.items() if m == "adam")
    if adam:
        figure, axis = plt.subplots(figsize=(6, 4))
        for exponent, runs in adam:
            draw(axis, runs, label("adam", exponent))
        if adadp["1/3"]:
            draw(axis, adadp["1/3"], label("ada_dp", ADADP_EXPONENT), linestyle=":", color="black")
        axis.set(title="Figure 3: Adam clients, 33% random", xlabel="communication round", ylabel="test accuracy")
        axis.grid(alpha=0.3)
        axis.legend()
        figure.tight_layout()
        figure.savefig(out / "figure3.png", dpi=120)
    plt.close("all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--client-size", type=int, default=8000,
                        help="images per client (8,000: all the cifar10 task's private split holds; the paper: 10,000)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--keep", type=int, default=2, help="SGD learning rates that go on to seeds 1..S-1")
    parser.add_argument("--workers", type=int, default=2, help="runs at a time (one core each)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--plots-only", action="store_true", help="only the table and plots, from records.jsonl")
    parser.add_argument("--no-wandb", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "records.jsonl"
    started = time.perf_counter()
    if not args.plots_only:
        run_all(args, path)
    records = load(path)
    if not records:
        sys.exit(f"no records in {path}")
    (args.out / "README.md").write_text(table(records))
    plots(records, args.out)
    print(f"wrote {args.out}/README.md and figure1-3.png from {len(records)} records in "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
