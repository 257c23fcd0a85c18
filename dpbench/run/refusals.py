"""What a run's request must satisfy before anything is planned: devices, sparse inputs, a secret seed, isolation,
the budget. Each refusal is one :class:`~dpbench.errors.UsageError` line (the engine calls these from ``plan``)."""
from __future__ import annotations

import torch

from dpbench.checks import check_budget, check_seed
from dpbench.choices import STRATEGIES
from dpbench.errors import UsageError
from dpbench.method import CLIPPING_RULES, Method
from dpbench.privacy.accounting import ACCOUNTANTS
from dpbench.spec import RunSpec
from dpbench.task import Task


def check_devices(spec: RunSpec, method: type[Method], sampler_name: str) -> None:
    """Several processes (dpbench.run.distributed) train a private method on Poisson batches, without checkpoints."""
    if not isinstance(spec.devices, int) or isinstance(spec.devices, bool) or not 1 <= spec.devices <= 1024:
        raise UsageError(f"devices must be a whole number from 1 to 1024, got {spec.devices}")
    if spec.strategy not in (None, *STRATEGIES):
        raise UsageError(f"unknown strategy {spec.strategy!r}; choose {', '.join(STRATEGIES)}")
    if spec.devices == 1:
        return
    reasons = {"a non-private method (dpbench shards private releases only)": not method.private,
               "shuffled or cyclic batches (Poisson sampling shards; the shuffle and cyclic accounting do not)":
                   sampler_name != "poisson",
               "checkpoints (a resume restores one process)": bool(spec.checkpoint_dir)}
    for reason, applies in reasons.items():
        if applies:
            raise UsageError(f"--devices {spec.devices} trains with several processes, which does not support {reason}")


def check_sparse(task: Task, method: type[Method], spec: RunSpec) -> None:
    """Sparse inputs (dpbench.data.rows) stay sparse only on the fast path, in the closed form of linear layers with
    one input per example: no per-example transform, no reference (vmap) clipping, no batched seeds."""
    reasons = {"the reference clipping path (--clipping reference)": spec.clipping == "reference",
               f"{method.name}'s per-example transform": method.per_example_transform
               is not Method.per_example_transform,
               "a model that is not a stack of linear layers": any(
                   any(p.requires_grad for p in module.parameters(recurse=False))
                   and not isinstance(module, torch.nn.Linear) for module in task.model.modules())}
    for reason, applies in reasons.items():
        if applies:
            raise UsageError(f"task {task.name} has sparse inputs, which {reason} would densify")


def check_secret_seed(spec: RunSpec) -> None:
    """A ``--secret-seed`` run keeps its seed nowhere: nothing can resume it or start its other processes."""
    if spec.checkpoint_dir or spec.resume:
        raise UsageError("--secret-seed keeps no checkpoints: resuming needs the seed, which is never written")
    if spec.devices > 1:
        raise UsageError("--secret-seed trains in one process: each of --devices N would draw its own seed")


def check_isolation(spec: RunSpec) -> None:
    """An isolated run's noise has a secret key that is never written (:mod:`dpbench.run.isolation`): nothing can resume
    it; and its method runs beside one training process. Checked before a plugin's describing process starts."""
    if not spec.isolate:
        return
    if spec.checkpoint_dir or spec.resume:
        raise UsageError("--isolate keeps no checkpoints: its noise has a secret key, never written, which resuming "
                         "would need")
    if spec.devices != 1:
        raise UsageError("--isolate runs the method beside one training process: it takes no --devices")


def check_run_budget(spec: RunSpec, method: type[Method]) -> None:
    check_seed(spec.seed)
    if not method.private:
        if spec.epsilon is not None or spec.noise_multiplier is not None:
            raise UsageError(f"{method.name} is not private: it takes neither --epsilon nor --noise-multiplier")
        return
    check_budget(spec.epsilon, spec.noise_multiplier, spec.delta)
    if spec.accountant not in ACCOUNTANTS:
        raise UsageError(f"unknown accountant {spec.accountant!r}; choose one of {', '.join(ACCOUNTANTS)}")


def adaptive_features(method: type[Method]) -> list[str]:
    """What of the engine's scaling, clip norm and count release (``dpbench.method.Method``) ``method`` declares."""
    return [feature for feature, declared in (
        (f"{getattr(method, 'clipping', 'clip')} clipping", getattr(method, "clipping", "clip") != "clip"),
        ("a moving clip norm", getattr(method, "moves_clip", False)),
        ("a count release", getattr(method, "count_release", False))) if declared]


def check_adaptive(spec: RunSpec, method: type[Method]) -> None:
    """Refuse what the engine does not (yet) combine with a method's scaling, moving clip norm or count release."""
    features = adaptive_features(method)
    if getattr(method, "clipping", "clip") not in CLIPPING_RULES:
        raise UsageError(f"{method.name} asks for clipping {method.clipping!r}; the engine offers "
                         f"{', '.join(CLIPPING_RULES)}")
    if not features:
        return
    for reason, applies in (("--isolate (the isolated process does not forward them)", spec.isolate),
                            ("several devices", spec.devices != 1),
                            ("checkpoints (the clip trajectory is not checkpointed)",
                             bool(spec.checkpoint_dir or spec.resume))):
        if applies:
            raise UsageError(f"{method.name} declares {' and '.join(features)}, which the engine does not support "
                             f"with {reason}")


def check_correlation(spec: RunSpec, method: type[Method], hp: dict, sampler_name: str):
    """The method's noise correlation for ``hp`` (``Method.correlation``; None for independent noise), refused
    where the engine does not implement it or cannot combine it (``dpbench.privacy.correlated``): a correlation other
    than ``banded(b)`` and ``tree()``; another sampler than ``cyclic`` (and ``cyclic`` without one); several releases
    per step; automatic scaling, a moving clip norm or a count release; ``--isolate`` (the isolated process does not
    forward it). (Several devices: refused before, by :func:`check_devices`, for the cyclic sampler.) (The tree is accounted by RDP whatever
    the accountant asked: ``dpbench.run.planning.plan``; the record says ``"accountant": "rdp"``.) Batched seeds and trials keep each run's state (``dpbench.run.multiseed``);
    private tuning charges it as its trials' mechanism (``dpbench.tuning.plan``, which runs this check first)."""
    from dpbench.privacy import correlated, noise  # imported here: they import torch and dp-accounting

    if not method.private:
        return None
    if getattr(method, "isolated_correlation", False):
        raise UsageError(f"{method.name} declares correlated noise, which the engine does not support with --isolate "
                         f"(the isolated process does not forward it)")
    try:
        correlation = method.correlation(hp)
    except (ValueError, TypeError, KeyError) as error:
        raise UsageError(f"{method.name}: {error}") from None
    if correlation is None:
        if sampler_name == correlated.SAMPLER:
            raise UsageError(f"the {correlated.SAMPLER} sampler is the participation schema of correlated (banded or "
                             f"tree) noise, which {method.name} does not declare: use poisson or shuffle")
        return None
    if not isinstance(correlation, (correlated.Banded, correlated.Tree)):
        raise UsageError(f"{method.name} declares the noise correlation {correlation!r}; the engine implements "
                         f"{', '.join(correlated.CORRELATIONS)} (dpbench.privacy.correlated.banded(b), tree())")
    what = "tree-aggregation noise" if isinstance(correlation, correlated.Tree) else \
        f"banded noise (b = {correlation.bands})"
    reasons = {f"the {sampler_name} sampler (correlated noise is accounted for the cyclic sampler's participation)":
               sampler_name != correlated.SAMPLER,
               f"{method.releases_per_step} releases per step": method.releases_per_step != 1,
               " and ".join(adaptive_features(method)) or "adaptive clipping": bool(adaptive_features(method)),
               "--isolate (the isolated process does not forward it)": spec.isolate,
               f"--noise {spec.noise} (only the counter-based Philox stream's position is checked at the end of a run "
               f"and on resume)": spec.noise != "fast",
               "the fast Gaussian sampler not built (dpbench.privacy._philox, compiled at install: the run would "
               "fall back to PyTorch's generator and be refused at its end)": noise.fill_normal is None}
    for reason, applies in reasons.items():
        if applies:
            raise UsageError(f"{method.name} declares {what}, which the engine does not support with {reason}")
    return correlation
