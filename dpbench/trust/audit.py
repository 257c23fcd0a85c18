"""``dpbench audit``: a privacy audit with one training run (Steinke, Nasr & Jagielski, "Privacy Auditing with One
(1) Training Run", NeurIPS 2023), and which plugins have passed one: evidence on the board, never a certificate (a
plugin in the training process can behave otherwise under audit; ``dpbench.run.isolation``).

The auditor (their Algorithm 1) draws m canaries (``dpbench.trust.canaries``: mislabelled training rows), each in the
training data independently with probability 1/2 (S_i = ±1; when out, its row keeps its own label), runs the real
engine once, scores every canary from what its threat model observes (white-box: the parameters after every step;
black-box: the final model), guesses "in" for the k highest scores and "out" for the k lowest and abstains on the
rest. The theorem's hypothesis is that the run is (ε, δ)-DP as a function of S, i.e. when one S_i flips: here that
replaces one training example by another, so the claim audited is the run's ε under replace-one neighbours, the
relation the audit's run is calibrated and accounted under (the board's). With r = 2k guesses of which v are
right, their main result (Theorem 3 of arXiv:2305.08846) bounds

    P[W ≥ v] ≤ f(v) + 2mδ · max_{i ∈ {1..v}} (f(v − i) − f(v)) / i,   f(u) = P[Binomial(r, e^ε/(1 + e^ε)) ≥ u],

so every ε for which the right side is at most 1 − confidence is refuted at that confidence; the lower bound is
the largest such ε (0 if none), found by root-finding on the right side, which increases with ε. (The maximum
runs over i ∈ [m] in the theorem; terms with i > v are no larger than i = v, where f(0) = 1.) The paper leaves
k+ and k− to the auditor; here k+ = k− = k is not chosen after seeing the scores: the bound is computed for every
k of a grid fixed in advance and every score of the threat model, and the significance is split among them
(Bonferroni), so the largest is a lower bound at the stated confidence. A run passes if the bound is at most the
ε it claims.

Readings and limits:

* the run is an ordinary run of the task (same rows, n, model, hyperparameters and mechanism: the method's
  sampler, replace-one neighbours); only the audit's record says it had canaries (``data_id``);
* a pass is not a proof: the bound of one run is far below the ε of a correct run, and canaries among the real
  examples are weaker than canaries on coordinates of their own, so only leaks much larger than the claim are
  caught (planted defects: ``tests/test_audit.py``; the table in README.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from dpbench.checks import check_seed
from dpbench.choices import THREAT_MODELS
from dpbench.errors import UsageError
from dpbench.method import Method, ReleaseMethod
from dpbench.privacy import streams
from dpbench.results import records, store
from dpbench.run import engine, isolation, planning
from dpbench.spec import RunSpec
from dpbench.task import Task
from dpbench.trust.canaries import OBSERVERS, Canaries
from dpbench.trust.marks import AuditEvidence, plugin_mark, settings_key

assert tuple(OBSERVERS) == THREAT_MODELS
CONFIDENCE = 0.95
#: Guesses per side k (k "in" on the highest scores, k "out" on the lowest), fixed before any run; the
#: significance is split among those with 2k ≤ m.
GUESS_GRID = (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
MAX_CANARIES = 100_000
#: What the canaries are (``dpbench.trust.canaries``). A pass of another design does not count on the board: before
#: issue 31 each canary had an input coordinate of its own, which a plugin could see and take honest steps on.
CANARY_DESIGN = "mislabelled training rows"


def p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Steinke et al., Theorem 3: an upper bound on P[at least ``correct`` of ``guesses`` right] for an
    (ε, δ)-DP mechanism audited with ``canaries`` canaries."""
    q = special.expit(epsilon)  # e^ε / (1 + e^ε): the accuracy of ε-DP randomized response
    tail = stats.binom.sf(correct - 1, guesses, q)  # f(v) = P[Binomial(r, q) ≥ v]
    if delta == 0 or correct == 0:
        return float(tail)
    i = np.arange(1, correct + 1)
    slope = np.max((stats.binom.sf(correct - i - 1, guesses, q) - tail) / i)  # max_i (f(v − i) − f(v)) / i
    return float(min(tail + 2 * canaries * delta * slope, 1.0))


def epsilon_lower_bound(canaries: int, guesses: int, correct: int, delta: float,
                        significance: float = 1 - CONFIDENCE) -> float:
    """The largest ε refuted at ``significance`` by ``correct`` right of ``guesses`` guesses (0 if none)."""
    if not (0 <= correct <= guesses <= canaries and 0 <= delta < 1 and 0 < significance < 1):
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, 0 <= delta < 1, 0 < significance < 1; got "
                         f"{correct}, {guesses}, {canaries}, {delta}, {significance}")

    def excess(epsilon: float) -> float:  # > 0 where ε is not refuted
        return p_value(canaries, guesses, correct, epsilon, delta) - significance

    if excess(0.0) > 0:
        return 0.0
    high = 1.0
    while excess(high) <= 0:
        high *= 2
    return float(optimize.brentq(excess, high / 2 if high > 1 else 0.0, high, xtol=1e-9, rtol=1e-12))


def guess_and_bound(scores: dict[str, np.ndarray], included: np.ndarray, delta: float,
                    confidence: float = CONFIDENCE) -> dict[str, Any]:
    """For each score of ``scores`` (the threat model's, all fixed in advance) and each k of :data:`GUESS_GRID`
    with 2k ≤ m: guess "in" on the k highest and "out" on the k lowest scores and take the bound at significance
    (1 − confidence) / (number of scores × number of k); the largest wins. Ties in the scores are broken by canary
    index (the sort is stable), which does not depend on the coins."""
    m = len(included)
    grid = [k for k in GUESS_GRID if 2 * k <= m]
    if not grid:
        raise ValueError(f"need at least {2 * GUESS_GRID[0]} canaries, got {m}")
    significance = (1 - confidence) / (len(grid) * len(scores))
    rows = []
    for name, values in scores.items():
        order = np.argsort(-np.asarray(values), kind="stable")
        for k in grid:
            correct = int(included[order[:k]].sum() + (~included[order[m - k:]]).sum())
            bound = epsilon_lower_bound(m, 2 * k, correct, delta, significance)
            rows.append({"score": name, "k": k, "guesses": 2 * k, "correct": correct, "epsilon_lower_bound": bound})
    best = max(rows, key=lambda row: row["epsilon_lower_bound"])
    return {"epsilon_lower_bound": best["epsilon_lower_bound"], "guesses": best["guesses"],
            "correct": best["correct"], "score": best["score"], "guess_grid": rows}


@dataclass
class AuditSpec:
    """What ``dpbench audit`` was asked. ``overrides``: as ``RunSpec.overrides`` (``--epochs``, ``--set``...)."""

    method: str
    task: str
    epsilon: float | None = None
    delta: float | None = None
    seed: int = 0
    canaries: int = 1000
    threat_model: str = "white-box"
    overrides: dict[str, Any] = field(default_factory=dict)
    plugins: list[str] = field(default_factory=list)
    store_path: Any = None
    progress_bar: bool = False
    isolate: bool = False  # audit the method run in a process of its own (dpbench.run.isolation)


def _check(spec: AuditSpec) -> tuple[type[Method], type[Task]]:
    if spec.threat_model not in THREAT_MODELS:
        raise UsageError(f"unknown threat model {spec.threat_model!r}; choose one of {', '.join(THREAT_MODELS)}")
    if not isinstance(spec.canaries, int) or not 2 * GUESS_GRID[0] <= spec.canaries <= MAX_CANARIES:
        raise UsageError(f"canaries must be a whole number from {2 * GUESS_GRID[0]} to {MAX_CANARIES}, "
                         f"got {spec.canaries}")
    check_seed(spec.seed)
    method, task = planning.registered(spec.method, spec.task, spec.plugins, spec.isolate)
    if issubclass(method, ReleaseMethod) or not method.private:
        raise UsageError(f"{method.name} is not a private gradient method: the audit trains through the engine's "
                         f"noisy gradients")
    return method, task


def audit(spec: AuditSpec) -> dict[str, Any]:
    """Run the audit of ``spec``: one training run with canaries, the scores, the guesses and the bound. The record
    (``kind: "audit"``) is appended to the results store and returned."""
    method, task = _check(spec)
    # An isolated method can read the dataset's files and the command line's seed: from them it would recompute which
    # rows are canaries and which are in, and could steer the scores of exactly those. Its audit draws them from a
    # secret (as its noise and batches); an in-process plugin holds the data anyway.
    canaries = Canaries(spec.canaries, streams.secret_seed() if spec.isolate else spec.seed)
    observer = OBSERVERS[spec.threat_model](canaries)
    run_spec = RunSpec(method=spec.method, task=spec.task, epsilon=spec.epsilon, delta=spec.delta, seed=spec.seed,
                       overrides=dict(spec.overrides), neighbouring="replace-one",
                       plugins=list(spec.plugins), progress_bar=spec.progress_bar, no_wandb=True,
                       append_to_store=False, isolate=spec.isolate)
    run = engine.run(run_spec, replace_rows=canaries.attach, callbacks=(observer,))
    included = canaries.included.numpy()
    result = guess_and_bound({name: values.numpy() for name, values in observer.scores.items()}, included,
                             run["delta"])
    record = {
        "kind": "audit",
        "task": run["task"], "method": run["method"], "seed": spec.seed,
        "data_id": f"{run['data_id']}+{spec.canaries}-audit-canaries", "canary_design": CANARY_DESIGN,
        "canary_coins": "secret" if spec.isolate else "seed",
        "threat_model": spec.threat_model,
        "epsilon_claimed": run["epsilon"], "epsilon_target": run["epsilon_target"], "delta": run["delta"],
        **result,
        "passed": result["epsilon_lower_bound"] <= run["epsilon"],
        "confidence": CONFIDENCE,
        "canaries": spec.canaries,
        # the mechanism of the audited run, from which ``dpbench verify`` recomputes epsilon_claimed
        **{key: run[key] for key in ("neighbouring", "noise_multiplier", "sample_rate", "steps",
                                      "gradient_evaluations", "accountant", "sampler", "data_release_events",
                                      "hyperparameters", "overrides", "n_train", "clipping", "noise", "versions",
                                      "git_commit", "isolation")},
        # a count release with each gradient (Method.count_release), charged with it; a moving clip's summary
        **{key: run[key] for key in ("extra_releases", "combined_noise_multiplier", "clip_norms", "noise_correlation",
                                      "delta_forced")
           if key in run},
        "run_metrics": run["metrics"],
        "code": {"method": isolation.code_of(method), "task": records.code_of(task, Task)},
        "ledger_version": records.LEDGER_VERSION,
    }
    records.seal(record)
    store.append(record, spec.store_path)
    return record


def _current_white_box(record: dict[str, Any]) -> bool:
    return (record.get("kind") == "audit" and record.get("threat_model") == "white-box"
            and record.get("ledger_version") == records.LEDGER_VERSION
            and record.get("canary_design") == CANARY_DESIGN
            # an isolated audit whose canaries came from the public seed (before 26 November 2026) is not evidence
            and (record.get("isolation") != "process" or record.get("canary_coins") == "secret"))


def audit_status(all_records: list[dict[str, Any]]) -> AuditEvidence:
    """The audit records among ``all_records``, as evidence for the board (:class:`~dpbench.trust.marks.AuditEvidence`).

    The rule for the board: a cell of an external plugin (``record["code"]["method"]["external"]``) is
    "unaudited" unless a white-box audit of the current ledger version and canary design (:data:`CANARY_DESIGN`),
    of the same method code hash, on the same task, run the same way (in process, or isolated: ``isolation``),
    passed; "passed" only where it ran at the cell's settings (hyperparameters, target ε, relation, data, sampler,
    noise: :func:`~dpbench.trust.marks.settings_key`), else "passed at other settings"; a
    failed audit of that code and task, run either way (any threat model or design, current ledger version), marks
    it "failed", whatever passed. (A pass of a plugin in process says nothing of how it behaves isolated, where it
    cannot reach the data and sees other coins, nor the reverse, nor of other settings; a failure is evidence
    against the code.) Only white-box passes count: a black-box pass is weak evidence.
    """
    evidence = AuditEvidence()
    for record in all_records:
        if record.get("kind") != "audit" or record.get("ledger_version") != records.LEDGER_VERSION:
            continue
        code, task = record["code"]["method"]["sha256"], record["task"]
        if not record["passed"]:  # evidence against the code, however it ran
            evidence.failed.update((code, task, isolation) for isolation in ("in-process", "process"))
        elif _current_white_box(record):
            key = (code, task, record.get("isolation") or "in-process")
            evidence.passed.setdefault(key, set()).add(settings_key(record))
    return evidence


def board_mark(run: dict[str, Any], evidence: AuditEvidence) -> str | None:
    """What the board shows for a run's cell: None for a built-in method, else
    :func:`~dpbench.trust.marks.plugin_mark` of its isolation and its audit status ("passed", "passed at other
    settings", "failed", "unaudited"), the audit being evidence, never a certificate."""
    code = run.get("code", {}).get("method", {})
    if not code.get("external"):
        return None
    isolation = run.get("isolation") or "in-process"
    return plugin_mark(isolation, evidence.of((code["sha256"], run["task"], isolation), [run]))


def summary(record: dict[str, Any]) -> str:
    verdict = "passed" if record["passed"] else "FAILED"
    return (f"{record['method']} on {record['task']}, {record['threat_model']} audit: {verdict}\n"
            f"  ε lower bound {record['epsilon_lower_bound']:.4g} ({record['confidence']:.0%} confidence) vs ε "
            f"claimed {record['epsilon_claimed']:.4g} (δ = {record['delta']:.3g})\n"
            f"  {record['correct']} of {record['guesses']} guesses right, {record['canaries']} canaries; "
            f"run metrics: " + ", ".join(f"{k} = {v:.4f}" for k, v in record["run_metrics"].items()) + "\n"
            f"  audit {record['run_id']}")
