"""What a record's public plan and its built-in method and task imply it ran (the counts of its noisy gradients,
its data releases, its classifiers, its gradient run's DpEvent), refused where the record says otherwise."""
from __future__ import annotations

import functools
import json
import math
from typing import Any

import dp_accounting

from dpbench import registry
from dpbench.trust.recompute import Mismatch, _check_whole, _close, _event


@functools.cache
def _builtin_methods() -> dict[str, type]:
    return registry.methods([], installed=False)


def _builtin(record: dict[str, Any]) -> type | None:
    """The built-in method class the record names, None for a plugin's. By name, whatever ``code.method.external``
    says: the registry refuses a plugin named like a built-in, so a record that names one and says "external" is
    forged to escape the built-in's checks (a quantile_clip record without its count passed so)."""
    return _builtin_methods().get(record["method"])


@functools.cache
def _builtin_tasks() -> dict[str, type]:
    return registry.tasks([], installed=False)


def _builtin_task(record: dict[str, Any]) -> type | None:
    """The built-in task class the record names, None for a plugin's; by name, as :func:`_builtin`."""
    return _builtin_tasks().get(record["task"])


def _options(task: type, record: dict[str, Any]) -> dict[str, Any]:
    """The task options a record ran with (its hyperparameters hold them; a missing one has its default), refused
    unless the task accepts them: an option the task would reject (``network="adaclip "``) read as "not adaclip" and
    dropped the DP-PCA it releases (hostile review of 27 November)."""
    options = {key: record["hyperparameters"].get(key, default) for key, default in task.options.items()}
    problem = _rejected(task.name, json.dumps(options, sort_keys=True))
    if problem is not None:
        raise Mismatch(f"task {task.name} rejects its options {options}: {problem}")
    return options


@functools.cache
def _rejected(task_name: str, options: str) -> str | None:
    """Why the built-in task refuses these options (JSON), as its constructor says, else None."""
    try:
        _builtin_tasks()[task_name](**json.loads(options))
    except (ValueError, TypeError) as error:
        return str(error)
    return None


@functools.cache
def _task_data(task_name: str, options: str) -> tuple[int, str, int, float | None] | str:
    """(n, data_id, n_test, test majority rate) of a built-in task's data on this machine, or why it cannot be loaded
    here (the canonical sources of a mirror this machine lacks: any loader's error; the facts then go unchecked, and
    are said so)."""
    from dpbench.results.records import majority_rate

    try:
        data = _builtin_tasks()[task_name](**json.loads(options)).prepare(0)
    except Exception as error:  # noqa: BLE001 — whatever stops the loader, n is reported as not checked
        return f"its data cannot be loaded here ({type(error).__name__}: {str(error)[:120]})"
    return data.n_train, data.data_id, len(data.x_test), majority_rate(data)


def _records_data(record: dict[str, Any]) -> tuple[type, tuple[int, str, int, float | None]] | str:
    """(the built-in task class, :func:`_task_data`) of the record's task and options, if its data is the record's;
    else why not (a plugin task, data not loadable here, another data id)."""
    task = _builtin_task(record)
    if task is None:
        return f"task {record['task']} is a plugin's"
    found = _task_data(task.name, json.dumps(_options(task, record), sort_keys=True))
    if isinstance(found, str):
        return found
    data_id = found[1]
    if record["data_id"] != data_id and not record["data_id"].startswith(f"{data_id}+"):  # audits: "+m-...canaries"
        return f"its data {record['data_id']!r} is not this machine's {data_id!r}"
    return task, found


def check_test_set(record: dict[str, Any]) -> str | None:
    """Refuse an ``n_test`` or ``test_majority_rate`` that is not the built-in task's public test set on this machine:
    the board's interval reads n_test, and its collapsed and below-majority checks the majority rate, so a record
    that raised the rate hid a collapsed cell, and one that lowered n_test widened its interval into a tie (review of
    27 November). Returns why they could not be checked (a plugin task, data not here or not the record's), else
    None; the test set does not depend on the seed or the tuning's split."""
    found = _records_data(record)
    if isinstance(found, str):
        return found
    task, (_, data_id, n_test, rate) = found
    for field, value in (("n_test", n_test), ("test_majority_rate", rate)):
        if field not in record or record[field] != value or type(record[field]) is not type(value):  # 114.0: the
            # board's interval takes an int n_test only, and fell back to a wider one (review of 27 November)
            raise Mismatch(f"{field} is {record.get(field, 'missing')!r}, but task {task.name}'s test set on "
                           f"{data_id} gives {value!r}")
    return None


def check_n_train(record: dict[str, Any]) -> str | None:
    """Refuse an ``n_train`` that is not the built-in task's training data on this machine (for a privately tuned
    record, the training part its public split leaves: ``tuning.validation``'s fraction and split seed): q = B/n and
    the plan's steps follow n, so ten times n with ten times the steps and a tenth of q passed every other check at a
    fifth of the ε (hostile review of 26 November). Returns why n could not be checked (a plugin task, data not on
    this machine or not the record's, a split from a secret seed), else None."""
    found = _records_data(record)
    if isinstance(found, str):
        return found
    task, (n, data_id, _, _) = found
    tuning = record.get("tuning") or {}
    if tuning.get("private"):
        split, config = tuning["validation"], tuning.get("config") or {}
        # the split is the one the tuning's configuration (the board cell's identity) and the record's seed name: a
        # record whose validation fields alone named another split, with n_train, q and ε made to match, passed
        # (review of 27 November: ε 0.1 → 0.0966 on breast_cancer with another split seed)
        for key, value, named in (("split_seed", split.get("split_seed"), config.get("split_seed")),
                                  ("fraction", split.get("fraction"), config.get("validation_fraction")),
                                  ("seed", split.get("seed"), record.get("seed"))):
            if value != named or isinstance(value, bool) != isinstance(named, bool):
                raise Mismatch(f"tuning.validation.{key} is {value!r}, but the tuning's configuration and seed name "
                               f"{named!r}")
        if split.get("split_seed") is not None and (isinstance(split["split_seed"], bool)
                                                    or not isinstance(split["split_seed"], int)):
            raise Mismatch(f"tuning.validation.split_seed is {split['split_seed']!r}: a whole number, or none")
        seed = split["seed"] if split.get("split_seed") is None else split["split_seed"]
        fraction = split["fraction"]
        if seed != "secret" and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise Mismatch(f"tuning.validation's split seed is {seed!r}: a whole number, or \"secret\"")
        if seed == "secret":  # secret coins: Binomial(n, 1 − f) examples left
            spread = 6 * math.sqrt(n * fraction * (1 - fraction)) + 1
            if not abs(record["n_train"] - (1 - fraction) * n) <= spread:
                raise Mismatch(f"n_train is {record['n_train']!r}, but a split holding out {fraction} of task "
                               f"{task.name}'s {n} examples leaves {(1 - fraction) * n:.0f} ± {spread:.0f}")
            # ±6 sd is loose on a small task (breast_cancer: n_train up to ~12% above the part, q and Δ ∝ 1/n as
            # much lower); an exact count needs a split of exactly round(f·n) examples, which the engine does not make
            return "its validation split's coins are secret (n_train checked to ±6 standard deviations only)"
        from dpbench.tuning.accounting import ValidationSplit  # the public split's coins, as the tuning drew them

        n -= int(ValidationSplit(fraction, seed, 0.0, 0, split_seed=split.get("split_seed")).mask(n).sum())
    if record["n_train"] != n:
        raise Mismatch(f"n_train is {record['n_train']!r}, but task {task.name}'s data {data_id} has {n} training "
                       f"examples{' in its tuning split' if tuning.get('private') else ''}")
    return None


def _data_releases(record: dict[str, Any]) -> list[dp_accounting.DpEvent]:
    """The record's data releases (``data_release_events``), refused unless they are what its built-in task
    releases under the record's options (``Task.private_release_events``: e.g. mnist_mlp's DP-PCA with
    ``network=adaclip``, of noise multiplier ``pca_noise_multiplier``); a plugin task's, which verify does not load,
    as recorded."""
    recorded = [_event(fields) for fields in record.get("data_release_events") or []]
    task = _builtin_task(record)
    if task is None:
        return recorded
    options = _options(task, record)
    expected = list(task.private_release_events(options))
    if recorded != expected:
        raise Mismatch(f"its data releases are {recorded}, but task {task.name} with options {options} releases "
                       f"{expected}")
    return recorded


def _classifiers(record: dict[str, Any], parts: list[str], what: str) -> None:
    """A release method's ledger parts named ``what`` (their suffixes after ``what``, in order): one per binary
    classifier, labelled 0…K−1 (one-vs-all) or unlabelled (K = 1), where K is 1 for a built-in task of 2 classes
    and its number of classes otherwise (``dpbench.release``; the task's declared ``classes``); for a plugin task
    or one without declared classes, K is the number of parts."""
    classes = getattr(_builtin_task(record), "classes", None)
    count = len(parts) if classes is None else 1 if classes == 2 else classes
    labels = [""] if count == 1 else [f", classifier {k} (one-vs-all)" for k in range(count)]
    if parts != labels:
        raise Mismatch(f"its ledger holds {len(parts)} {what} parts {[what + p for p in parts]}, not one per "
                       f"classifier of task {record['task']} ({count})")


def _releases_per_step(record: dict[str, Any]) -> int:
    """k, the noisy gradients a step draws: a built-in method's ``releases_per_step`` (ADADP: 2, both charged
    whether its step is accepted or not); a plugin's, which verify does not load, the record's releases over its
    steps (which :func:`_plan` then checks against the plan)."""
    method = _builtin(record)
    return method.releases_per_step if method is not None else record["gradient_evaluations"] // record["steps"]


def _plan(record: dict[str, Any]) -> tuple[float, int]:
    """The record's (q, releases), refused unless they and its steps are what its public plan implies, as
    ``planning.plan`` derives them: k releases per step (:func:`_releases_per_step`), batch size B (n for a
    full-batch method), q = B/n, steps per epoch max(1, round(n/(Bk))) for Poisson batches and ⌊n/(Bk)⌋ for
    shuffled ones, steps = epochs × that, releases = k × steps. The engine draws every step's k batches and
    charges each (``training.PrivateTraining``): the count depends on the plan only."""
    hp, n, sampler = record["hyperparameters"], record["n_train"], record["sampler"]
    for key in ("batch_size", "epochs"):  # as the engine takes them (review of 27 November)
        _check_whole(hp.get(key), f"hyperparameters.{key}")
    k, batch, epochs = _releases_per_step(record), hp["batch_size"], hp["epochs"]
    q, steps, releases = record["sample_rate"], record["steps"], record["gradient_evaluations"]
    method = _builtin(record)
    if method is not None and method.full_batch and batch != n:
        raise Mismatch(f"{record['method']} uses full batches, but its batch size is {batch} of n = {n}")
    if q != batch / n:
        raise Mismatch(f"sample_rate is {q!r}, but its batch size {batch} of n = {n} gives {batch / n!r}")
    if sampler == "poisson":
        planned = epochs * max(1, round(n / (batch * k)))
    elif sampler in ("shuffle", "cyclic"):  # cyclic: ⌊n/B⌋ batches of one fixed partition (correlated noise)
        if sampler == "cyclic" and k != 1:
            raise Mismatch(f"{k} releases per step with the cyclic sampler, which the engine refuses (correlated "
                           f"noise is accounted for one release per step)")
        planned = epochs * (n // (batch * k))
    else:
        raise Mismatch(f"sampler {sampler!r} is not one verify knows")
    if (steps, releases) != (planned, k * planned):
        raise Mismatch(f"{releases!r} releases in {steps!r} steps, but its plan (n = {n}, batch size {batch}, "
                       f"{epochs} epochs, {k} releases per step, {sampler} batches) implies {k * planned} in "
                       f"{planned}")
    return q, releases


def _training_event(record: dict[str, Any], sigma: float, q: float, releases: int) -> dp_accounting.DpEvent:
    if record["sampler"] == "poisson":
        once = dp_accounting.GaussianDpEvent(sigma)
        if q < 1:
            once = dp_accounting.PoissonSampledDpEvent(q, once)
        return dp_accounting.SelfComposedDpEvent(once, releases)
    if record["sampler"] == "shuffle":  # one Gaussian per started epoch (dpbench.privacy.accounting): the plan's epochs
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma),
                                                 record["hyperparameters"]["epochs"])
    if record["sampler"] == "cyclic" and (record.get("noise_correlation") or {}).get("kind") == "tree":
        return _tree_event(record, sigma)
    if record["sampler"] == "cyclic":
        return dp_accounting.GaussianDpEvent(sigma / _banded_sensitivity(record))
    raise Mismatch(f"sampler {record['sampler']!r} is not one verify knows")


def _tree_event(record: dict[str, Any], sigma: float) -> dp_accounting.DpEvent:
    """A tree-aggregation record's event (DP-FTRL with a restart every epoch): one
    ``SingleEpochTreeAggregationDpEvent(σ, P)`` per epoch of the plan (P = ⌊n/B⌋ steps, one batch of a fixed partition
    each: every example in one leaf per tree), accounted by RDP only (dp-accounting has the event for RDP only). The
    recorded steps per tree, trees and depth ⌈log2(P + 1)⌉ must be these; a built-in method must declare a tree."""
    found, hp = record["noise_correlation"], record["hyperparameters"]
    method = _builtin(record)
    if method is not None and getattr(method.correlation(hp), "kind", None) != "tree":
        raise Mismatch(f"{record['method']} does not add tree-aggregation noise, but the record says it did")
    if record.get("accountant") != "rdp":
        raise Mismatch(f"a tree-aggregation record accounted by {record.get('accountant')!r}: dp-accounting's tree event "
                       f"has an RDP analysis only")
    batches, epochs = record["n_train"] // hp["batch_size"], hp["epochs"]
    expected = {"steps_per_tree": batches, "trees": epochs, "depth": math.ceil(math.log2(batches + 1)),
                "restarts": "every epoch"}
    for key, value in expected.items():
        if found.get(key) != value:
            raise Mismatch(f"noise_correlation.{key} is {found.get(key)!r}, its plan gives {value!r}")
    return dp_accounting.SelfComposedDpEvent(dp_accounting.SingleEpochTreeAggregationDpEvent(sigma, batches), epochs)


def _banded_sensitivity(record: dict[str, Any]) -> float:
    """Δ/C of a banded-noise record (``noise_correlation``), recomputed from its public plan without
    ``dpbench.privacy.correlated``: the coefficients of (1 − x)^(−1/2) as binom(2j, j)/4^j for j < b; k = the plan's
    epochs (one batch of a fixed partition per epoch); the partition's P = ⌊n/B⌋ batches must be ≥ b (participations
    ≥ b apart, so the columns they touch have disjoint supports); Δ/C = √(k·Σ_j c_j²). The recorded coefficients,
    participations, separation and sensitivity must be these; a built-in method's b must be the one its
    hyperparameters give (``Method.correlation``)."""
    found = record.get("noise_correlation")
    if not isinstance(found, dict) or found.get("kind") != "banded":
        raise Mismatch(f"a cyclic-sampler record without banded noise_correlation: {found!r}")
    bands, hp = found.get("bands"), record["hyperparameters"]
    _check_whole(bands, "noise_correlation.bands")
    method = _builtin(record)
    if method is not None:
        declared = method.correlation(hp)
        if getattr(declared, "bands", None) != bands:
            raise Mismatch(f"{record['method']} with its hyperparameters adds noise of {declared!r}, but the record "
                           f"says {bands} bands")
    values = [math.comb(2 * j, j) / 4**j for j in range(bands)]
    recorded = found.get("coefficient_values")
    if not isinstance(recorded, list) or len(recorded) != bands:
        raise Mismatch(f"noise_correlation.coefficient_values is not a list of {bands} numbers")
    for j, (value, given) in enumerate(zip(values, recorded)):
        _close(value, given, f"noise_correlation.coefficient_values[{j}]")
    batches, epochs = record["n_train"] // hp["batch_size"], hp["epochs"]
    if batches < bands:
        raise Mismatch(f"{batches} batches per epoch are fewer than the {bands} bands: participations closer than b")
    for key, value in (("participations", epochs), ("min_separation", batches)):
        if found.get(key) != value:
            raise Mismatch(f"noise_correlation.{key} is {found.get(key)!r}, its plan gives {value}")
    sensitivity = math.sqrt(epochs * math.fsum(c * c for c in values))
    _close(sensitivity, found.get("sensitivity"), "noise_correlation.sensitivity")
    return sensitivity


def _charged_sigma(record: dict[str, Any]) -> float:
    """The noise multiplier of one release with the extra releases made on its batch (``extra_releases``, e.g.
    quantile clipping's count): the vector of all of them, each part divided by its noise std, is one Gaussian sum
    of per-example contributions of norm ≤ (σ⁻² + Σ_k (s_k/σ_k)²)^(1/2) (Andrew et al. 2021, Theorem 1), so
    z = (σ⁻² + Σ_k (s_k/σ_k)²)^(−1/2), under either relation. A built-in method that declares a count release
    (``count_release``) must list exactly one, of sensitivity ½ and the noise std its ``count_noise_std`` gives for
    the record's hyperparameters; ``combined_noise_multiplier``, where recorded, must be z."""
    sigma, extra = record["noise_multiplier"], record.get("extra_releases") or []
    method = _builtin(record)
    if method is not None and getattr(method, "count_release", False):
        expected = method.count_noise_std(record["hyperparameters"], record["sample_rate"] * record["n_train"],
                                          sigma)
        if len(extra) != 1 or extra[0].get("sensitivity") != 0.5:
            raise Mismatch(f"{record['method']} releases a count of sensitivity 1/2 with each gradient, but its "
                           f"extra_releases are {extra!r}")
        _close(expected, extra[0].get("noise_std"), "extra_releases[0].noise_std (the method's count noise)")
    parts = [(part["sensitivity"], part["noise_std"]) for part in extra]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for pair in parts for v in pair):
        raise Mismatch(f"extra_releases {extra!r}: sensitivities and noise stds must be finite and positive")
    charged = (sigma**-2 + math.fsum((s / std) ** 2 for s, std in parts)) ** -0.5 if parts else sigma
    if parts or "combined_noise_multiplier" in record:
        _close(charged, record.get("combined_noise_multiplier"), "combined_noise_multiplier")
    return charged


def _run_event(record: dict[str, Any]) -> dp_accounting.DpEvent:
    """The event of a gradient run's record: its data releases, then its noisy gradients (with the extra releases
    on their batches, :func:`_charged_sigma`), counted from its plan."""
    if record.get("data_releases") and len(record.get("data_release_events") or []) != len(record["data_releases"]):
        raise Mismatch("its data releases have no machine-readable events (data_release_events)")
    q, releases = _plan(record)
    method = _builtin(record)
    declares = method is not None and method.private and method.correlation(record["hyperparameters"]) is not None
    if (declares or "noise_correlation" in record) and record["sampler"] != "cyclic":
        raise Mismatch(f"banded noise is accounted with the cyclic sampler, but the record's sampler is "
                       f"{record['sampler']!r}")
    training = _training_event(record, _charged_sigma(record), q, releases)
    before = _data_releases(record)
    return dp_accounting.ComposedDpEvent([*before, training]) if before else training
