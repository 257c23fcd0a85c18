"""Crash-safe resume: ``dpbench run ... --checkpoint-dir D`` keeps in D what the run needs to continue exactly, and
``dpbench run ... --resume D`` (the same command otherwise) continues it with the record an uninterrupted run gives.

A checkpoint (``D/checkpoint.ckpt``) is a Lightning checkpoint, which holds the model's parameters and buffers and
the training loops' progress, plus dpbench's part (:func:`capture`): the method's state (:meth:`Method.state_dict`:
ADADP's η, Adam's moments, AdaCliP's m and s, optimizers' buffers), the noise stream's position (the Philox counter,
or the torch generator's state), the ledger (releases, sampled examples, steps), the global generators (torch's,
stream ``training``: dropout; NumPy's and Python's), the task's own generators (``Task.rng``, e.g. augmentation),
the band of banded noise (its last b − 1 noise vectors, :mod:`dpbench.privacy.correlated`), the latest test
metrics, and the run's settings, against which ``--resume`` is checked; the ledger is checked
against what the checkpoint's position implies (:func:`check_ledger`). The sampler needs no state
of its own: its draws are a pure function of (seed, epoch, position), and the position is the ledger's step count.
A checkpoint is written every ``every`` steps and at the end of every epoch (after its test metrics), each time to a
temporary file in D that is flushed, fsync'ed and renamed over the previous one (then D is fsync'ed): a process
killed while writing leaves the previous checkpoint whole. When the run ends, its record is written to
``D/record.json`` (atomically, too) before it is appended to the results store; resuming a finished run appends
that record again (a no-op if it is there: ``run_id`` is a content hash) and returns it.

Why the steps re-executed after a crash release nothing new. A resumed run repeats the steps between its last
checkpoint and the crash. A step's release is a deterministic function of the parameters and method state
(restored), its batches (drawn from the sampler's stream of the epoch, at the restored position) and its noise (the
restored stream position): the repeated step computes bit for bit the release that the killed process computed,
given the same code, libraries and thread count, which the resume check requires (with another thread count the
floating-point sums, hence the gradients, can differ in their last bits). So whatever the killed process output
(e.g. per-epoch metrics logged to W&B) and the resumed run output together are post-processing of one run's
releases, each computed twice identically; and the ledger, restored from the checkpoint and counting each repeated
step once, charges every release once, exactly as the uninterrupted run does. What resuming must never do is
draw other batches or fresh noise for a step of which a function may already be out: that would be a second,
uncharged release of the same step. Hence positions come from the checkpoint, never from new draws, and a
resume with other settings, code or library versions is refused. A checkpoint holds the parameters after a step:
keep it as private as the model.

Lightning restores the model and calls the checkpoint hooks before ``on_fit_start``, where the engine creates the
noise stream and seeds the global generator; :class:`Checkpoints` therefore sets the sampler's position when the
checkpoint is loaded (before the first batch is drawn) and the rest in ``on_train_start``, after ``on_fit_start``
(or in ``on_fit_end`` for the checkpoint of the last epoch's end, from which Lightning trains no more).
"""
from __future__ import annotations

import copy
import itertools
import json
import os
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytorch_lightning as pl
import torch
from lightning_fabric.plugins import TorchCheckpointIO

from dpbench.errors import UsageError
from dpbench.privacy import correlated, noise
from dpbench.results import records
from dpbench.results.identity import identity

CHECKPOINT = "checkpoint.ckpt"
RECORD = "record.json"


def atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """``write(file)`` into a temporary file beside ``path``, fsync it, rename it over ``path``, fsync the folder."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def load(path: Path) -> dict[str, Any]:
    """A checkpoint file's contents: tensors, numbers, strings and containers only (``weights_only``)."""
    return torch.load(path, map_location="cpu", weights_only=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint file I/O with :func:`atomic_write` and :func:`load`."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        atomic_write(Path(path), lambda file: torch.save(checkpoint, file))

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict[str, Any]:
        return load(Path(path))


def settings(planned) -> dict[str, Any]:
    """What a run's checkpoint must have been made with to be resumed exactly: the record's identity
    (``identity.identity``: task, method, data, budget, hyperparameters, code, ledger version), the seed, σ, the
    samplers, the clipping path, dpbench's commit, the library versions and the thread count."""
    spec, record = planned.spec, planned.record
    return {**json.loads(identity(record)), "seed": spec.seed, "noise_multiplier": record["noise_multiplier"],
            "sample_rate": record["sample_rate"], "noise": spec.noise, "philox_built": noise.fill_normal is not None,
            "clipping": spec.clipping, "git_commit": records.git_commit(), "versions": records.versions(),
            "threads": torch.get_num_threads()}


def capture(module) -> dict[str, Any]:
    """dpbench's part of a checkpoint of ``module`` (a ``training.PrivateTraining``) between two steps."""
    numpy_state = np.random.get_state()
    return {
        "ledger": {"releases": module.releases, "sampled": module.sampled, "steps": module.steps},
        "method": module.method.state_dict(),
        "noise": module.noise.state_dict(),
        # banded noise's last b − 1 vectors (dpbench.privacy.correlated.BandedNoise), None for independent noise
        "correlated": module.correlated.state_dict() if module.correlated is not None else None,
        "generators": {"torch": torch.get_rng_state(), "task": module.task.generator_states(),
                       "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]],
                       "python": random.getstate()},
        "test_metrics": getattr(module, "test_metrics", None),
    }


def check_correlated_values(module) -> None:
    """Refuse a restored band (banded noise's last b − 1 vectors) or tree (its current nodes' noises) that is not what
    the run's noise stream drew: both are replayed from the stream's start to its restored position (Philox, a pure
    function of the run's key and counter) and compared bit for bit. An edited band would make every later release's
    noise w_t = z_t − Σ_j c_j w_{t−j} other than the mechanism the record charges (a band that cancels z_t adds none);
    :func:`check_ledger` has already checked how many vectors the state holds."""
    stream, state = module.noise, module.correlated
    params = module.params()
    per_draw = sum(-(-p.numel() // 4) for p in params)
    if not stream.philox or not per_draw or stream.counter % per_draw:
        raise UsageError("the checkpoint's noise stream is not at a whole number of correlated draws: it cannot be "
                         "resumed")
    replay = copy.copy(stream)
    replay.counter = 0
    expected = (correlated.BandedNoise(state.bands) if isinstance(state, correlated.BandedNoise)
                else correlated.TreeNoise(state.steps_per_tree))
    std = module.mechanism.mean_noise_std
    for draw in range(stream.counter // per_draw):
        expected.apply_([replay.fill_(torch.empty_like(p), std) for p in params], draw % module.steps_per_epoch)

    def equal(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(
                torch.equal(a, b))
        if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
            return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) and all(
                equal(x, y) for x, y in zip(a, b))
        if isinstance(a, dict) or isinstance(b, dict):
            return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(
                equal(a[k], b[k]) for k in a)
        return a == b

    if not equal(expected.state_dict(), state.state_dict()):
        raise UsageError("the checkpoint's correlated-noise state is not what the run's noise stream drew: it cannot "
                         "be resumed")


def restore(module, state: dict[str, Any]) -> None:
    """Put :func:`capture`'s ``state`` back into ``module`` (after its ``on_fit_start``)."""
    ledger = state["ledger"]
    module.releases, module.sampled, module.steps = ledger["releases"], ledger["sampled"], ledger["steps"]
    module.method.load_state_dict(state["method"])
    module.noise.load_state_dict(state["noise"])
    if (module.correlated is None) != (state.get("correlated") is None):
        raise UsageError("the checkpoint's correlated-noise state does not match the run's noise correlation")
    if module.correlated is not None:
        try:
            module.correlated.load_state_dict(state["correlated"])
        except ValueError as error:
            raise UsageError(str(error)) from None
        check_correlated_values(module)
    generators = state["generators"]
    torch.set_rng_state(generators["torch"])
    module.task.load_generator_states(generators["task"])
    name, keys, *rest = generators["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    random.setstate(generators["python"])
    if state["test_metrics"] is not None:
        module.test_metrics = state["test_metrics"]


class Checkpoints(pl.Callback):
    """Writes the checkpoints of a run (see the module docstring) and, resuming, restores dpbench's part."""

    def __init__(self, folder: Path, every: int, run_settings: dict[str, Any], sampler):
        self.folder, self.every, self.settings, self.sampler = folder, every, run_settings, sampler
        self.restored: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return self.folder / CHECKPOINT

    def attach(self, module) -> None:
        """Refuse a method whose state cannot be captured, then create the folder: both before any training."""
        try:
            module.method.state_dict()
        except TypeError as error:
            raise UsageError(f"{module.method_class.name} cannot be checkpointed: {error}") from None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"cannot create the checkpoint folder {self.folder}: {error.strerror}") from None
        for left in self.folder.glob(".*.tmp"):  # of writes that a kill interrupted
            left.unlink(missing_ok=True)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index):
        # An epoch's last step is checkpointed at the epoch's end, with its test metrics.
        if module.steps % self.every == 0 and module.steps % len(self.sampler):
            trainer.save_checkpoint(self.path, weights_only=False)

    def on_train_epoch_end(self, trainer, module):
        trainer.save_checkpoint(self.path, weights_only=False)

    def on_save_checkpoint(self, trainer, module, checkpoint):
        checkpoint["dpbench"] = {"settings": self.settings, **capture(module)}

    def on_load_checkpoint(self, trainer, module, checkpoint):
        self.restored = checkpoint["dpbench"]
        self.sampler.resume(*divmod(self.restored["ledger"]["steps"], len(self.sampler)))

    def on_train_start(self, trainer, module):
        if self.restored is not None:
            restore(module, self.restored)
            self.restored = None

    def on_fit_end(self, trainer, module):
        self.on_train_start(trainer, module)  # a checkpoint of the last epoch's end: Lightning trains no more

    def finished(self, record: dict[str, Any]) -> None:
        """Keep the finished run's record (before it goes to the store): resuming now returns it."""
        text = json.dumps({"settings": self.settings, "record": record})
        atomic_write(self.folder / RECORD, lambda file: file.write(text.encode()))


def check_folder(folder: str) -> None:
    """Refuse, before a run is planned (whose warnings would precede the refusal), a checkpoint folder that is a
    file or cannot be created where it would go: its nearest existing ancestor is a file or not writable."""
    path = Path(folder)
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"checkpoint folder {path} is not a folder")
        return
    ancestor = next(parent for parent in path.absolute().parents if parent.exists())
    if not ancestor.is_dir():
        raise UsageError(f"cannot create the checkpoint folder {path}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"cannot create the checkpoint folder {path}: {ancestor} is not writable")


def prepare(planned, folder: str, resume: bool, every: int) -> tuple[Checkpoints, Path | None, dict | None]:
    """Check the checkpoint folder of a run about to train, writing nothing: (the callback, the checkpoint to resume
    from or None, the record of a run that had finished or None). Refuses a folder that holds a run unless
    resuming, a resume without a checkpoint, and a checkpoint made with other settings (:func:`settings`)."""
    if every < 1:
        raise UsageError(f"the checkpoint interval must be at least 1 step, got {every}")
    if planned.spec.accelerator != "cpu":
        raise UsageError("checkpoints resume exactly on the CPU only (--accelerator cpu): the generators of other "
                         "devices are not saved")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"checkpoint folder {folder} is not a folder")
    path, finished = folder / CHECKPOINT, folder / RECORD
    callback = Checkpoints(folder, every, settings(planned), planned.sampler)
    if not resume:
        if path.exists() or finished.exists():
            raise UsageError(f"{folder} already holds a run's checkpoint: continue it with --resume {folder}, or "
                             f"choose another folder")
        return callback, None, None
    if finished.exists():
        try:
            saved = json.loads(finished.read_text())
            saved_settings, record = saved["settings"], saved["record"]
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise UsageError(f"cannot read the finished run's record {finished}: {error}") from None
        _check(callback.settings, saved_settings, folder)
        return callback, None, record
    if not path.exists():
        raise UsageError(f"no checkpoint to resume in {folder} (killed before its first checkpoint? start the run "
                         f"again with --checkpoint-dir {folder})")
    try:
        saved = load(path)
        saved_settings = saved["dpbench"]["settings"]
    except Exception as error:  # an unreadable file: torch.load raises errors of many kinds
        raise UsageError(f"cannot read the checkpoint {path}: {type(error).__name__}") from None
    _check(callback.settings, saved_settings, folder)
    check_ledger(planned, saved, folder)
    return callback, path, None


def check_ledger(planned, saved: dict[str, Any], folder: Path) -> None:
    """Refuse a checkpoint whose ledger is not what its position implies: ``steps`` must be the steps Lightning's
    loop processed (from which the sampler resumes, :meth:`Checkpoints.on_load_checkpoint`), ``releases`` the
    method's k per step, ``sampled`` the examples of the batches the sampler draws for those steps (a pure function
    of the seed, the epoch and the position); none of either for a non-private method, which charges nothing. An
    edited ledger would resume into a record that charges fewer releases than were made."""
    try:
        ledger = dict(saved["dpbench"]["ledger"])
        processed = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"]
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"the checkpoint in {folder} has no ledger or no loop progress") from None
    if not isinstance(processed, int) or not 0 <= processed <= planned.hp["epochs"] * len(planned.sampler):
        raise UsageError(f"the checkpoint in {folder} is at step {processed!r}, which is not one of this run's")
    private = planned.method.private
    implied = {"steps": processed, "releases": processed * planned.method.releases_per_step if private else 0,
               "sampled": _sampled(planned.sampler, processed) if private else 0}
    differing = [f"{key} {ledger.get(key)!r}, not {value!r}" for key, value in implied.items()
                 if ledger.get(key) != value]
    # The noise stream's position: a rewound counter would add the same noise again, which two releases' difference
    # cancels. Philox draws ⌈numel/4⌉ counter values per parameter a release (dpbench.privacy.noise); PyTorch's
    # generator state is opaque and is not checked here.
    noise_state = saved["dpbench"].get("noise") or {}
    if private and "counter" in noise_state:
        per_release = sum(-(-p.numel() // 4) for p in planned.task.parameters() if p.requires_grad)
        drawn = implied["releases"] * per_release if planned.record["noise_multiplier"] else 0
        if noise_state["counter"] != drawn:
            differing.append(f"noise counter {noise_state['counter']!r}, not {drawn!r}")
    # Banded noise keeps its last b − 1 noise vectors: as many as the releases made, up to b − 1.
    bands = (planned.record.get("noise_correlation") or {}).get("bands", 0)
    band = saved["dpbench"].get("correlated")
    if private and bands:
        kept = len((band or {}).get("history", ())) if isinstance(band, dict) else None
        if kept != min(bands - 1, implied["releases"]) or band.get("bands") != bands:
            differing.append(f"a band of {kept!r} noise vectors, not {min(bands - 1, implied['releases'])}")
    # Tree aggregation keeps the nodes of the current prefix: one per set bit of the step's position in its tree.
    if private and (planned.record.get("noise_correlation") or {}).get("kind") == "tree":
        per_tree, done = len(planned.sampler), implied["releases"]
        nodes = bin((done - 1) % per_tree + 1).count("1") if done else 0
        kept = len((band or {}).get("nodes", ())) if isinstance(band, dict) else None
        if kept != nodes or band.get("steps_per_tree") != per_tree:
            differing.append(f"a tree of {kept!r} node noises, not {nodes}")
    if differing:
        raise UsageError(f"the checkpoint in {folder} has a ledger its position does not imply "
                         f"({'; '.join(differing)}): it cannot be resumed")


def _sampled(sampler, steps: int) -> int:
    """The examples in the batches of a run's first ``steps`` steps, drawn again by a copy of its sampler."""
    draws, total, epoch = copy.copy(sampler), 0, 0
    while steps > 0 and len(draws):
        draws.resume(epoch, 0)
        for batches in itertools.islice(draws.steps(0), steps):
            total += sum(len(batch) for batch in batches)
            steps -= 1
        epoch += 1
    return total


def _check(current: dict[str, Any], saved: Any, folder: Path) -> None:
    if not isinstance(saved, dict):
        raise UsageError(f"the checkpoint in {folder} names no settings")
    differing = sorted(key for key in current.keys() | saved.keys() if current.get(key) != saved.get(key))
    if differing:
        raise UsageError(f"the checkpoint in {folder} is of another run (differs in {', '.join(differing)}): "
                         f"resume with the command, code, libraries and thread count it was started with")
