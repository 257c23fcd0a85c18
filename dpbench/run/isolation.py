"""Isolated methods (``dpbench run --isolate``): a plugin method runs in a process of its own that never holds the
training data, so that what it learns of the data is only what the engine releases.

In one Python process a method can always reach the data (closures, ``gc``, stack frames): the audit
(:mod:`dpbench.trust.audit`) is evidence against such a plugin, not a proof. With ``--isolate``:

* the parent process never imports the method's code: :func:`describe` loads the plugin folders in a spawned
  process and returns the method's public class attributes as JSON, from which the parent builds a stand-in class
  (:func:`stand_in`) for planning and accounting; the record's ``code`` hashes every ``*.py`` file of the plugin
  folders, read by the parent before any plugin code runs (the child names only its class's file, which must be
  one of them, and the built-in methods it derives from, whose files the parent finds in dpbench); the children
  are given those bytes and compile only them (:func:`dpbench.registry.pin_sources`), never a file read later nor
  cached bytecode;
* :class:`IsolatedMethod` takes the method's place in :class:`~dpbench.run.training.PrivateTraining`. It starts the
  method in a process of the ``spawn`` start method (a fresh interpreter: nothing of the parent is inherited but
  the arguments it is given) and hands it only: the trainable parameters' shapes, dtypes and values, ``hp``, the
  :class:`~dpbench.method.GradientMechanism` facts, and per release the noisy gradient. ``setup``, ``step`` and
  ``update_together`` run there;
* the protocol, over a pipe, is JSON (the parent never unpickles what the child sends: a pickle can run code) with
  the tensors in shared memory, one buffer per parameter for the values, the released gradient, and a
  :class:`~dpbench.privacy.clipping.CoordinateAffine`'s shift and scale: the parent sends ``step``; for each release the
  child writes its current parameter values (ADADP evaluates its second release at θ½) and its transform, and
  asks ``release``; the parent copies the values into the model, computes the release into tensors of its own and
  only then copies the finished noisy gradient into the shared buffer (the child never sees the noise alone), and
  answers ``released``; the child ends the step with its final values and ``done``;
* the parameters are the child's choice, so the clippers must not be steerable by them: the run clips with norms
  that cannot cancel (:class:`~dpbench.privacy.ghost.GhostClipper` ``exact``), and an example whose gradient is not
  finite adds nothing (:func:`~dpbench.privacy.clipping.keep_finite`);
* a per-example transform runs beside the data, so in isolated mode it can only be data: the identity or a
  ``CoordinateAffine`` (AdaCliP's (g − m)/b), copied by the parent before use and refused unless finite with a
  positive scale (its shapes are the parameters': the parent lays out the buffers); a transform that is code is
  refused;
* the method sees every release and may know the run's seed (it is on the parent's command line, which
  ``/proc/<pid>/cmdline`` shows to every user): the gradient noise of an isolated run is keyed by a secret the
  parent draws from the OS's entropy and never writes (:class:`~dpbench.run.training.PrivateTraining`; the record says
  ``"noise_coins": "secret"``), so subtracting the seed's noise gains nothing (``tests/cheaters/noise_subtractor.py``);
  so are the sampler's (``"sampler_coins": "secret"``: the method does not know which examples a release holds,
  which the amplification by subsampling assumes); the initial weights' coins stay the seed's;
* a child starts with the parent's program name for ``sys.argv`` and only :data:`KEPT_ENVIRONMENT` of its
  environment (spawn would hand it both whole), and on Linux the parent makes itself non-dumpable before the first
  child starts, for the rest of its life (a child may leave processes behind): a non-root process of the same user
  can then neither ptrace it nor read or write its memory or ``/proc/<pid>/environ``;
* the engine's hyperparameters (``epochs``, ``batch_size``, ``clip``) are the parent's: a child that changes them
  in ``hp`` is refused; the method's own keys come back for the record (ADADP writes its parsed ``tol``).

Limits, said plainly: the child is a process, not a sandbox (no seccomp, namespaces or other user): it can read
files, including a dataset's files on disk, so "isolated" means the method never shared memory with the run's
training data (nor saw which rows, or which audit canaries, it holds), not that it cannot read public files. A
child with ``CAP_SYS_PTRACE`` (root has it) can read and write the parent's memory, the noise's key included;
root without it still reads its environment. Code the plugin itself imports from outside its folders' ``*.py``
files and dpbench (another package, a file it opens) is not hashed. The noise samplers are not cryptographic
generators (a 64-bit key). Tasks from plugin folders, checkpoints, several devices and batched seeds are not
supported with ``--isolate``. Records are as trustworthy as the store they come from.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import inspect
import json
import multiprocessing
import os
import pkgutil
import sys
import traceback
import weakref
from pathlib import Path
from typing import Any

import torch

import dpbench.methods
from dpbench import registry
from dpbench.errors import UsageError
from dpbench.method import GradientMechanism, Method, ReleaseMethod
from dpbench.privacy.clipping import CoordinateAffine
from dpbench.results import records

#: The class attributes of a method that the engine reads (``dpbench.method.Method``).
PUBLIC_ATTRIBUTES = ("name", "description", "paper", "defaults", "private", "full_batch", "releases_per_step",
                     "default_sampler", "clip_to_task_bound", "search_space", "clipping", "fixed_clip", "moves_clip",
                     "count_release")
ENGINE_KEYS = ("epochs", "batch_size", "clip")
BUILT_IN_METHODS = "dpbench.methods."  # the package of the built-in methods' modules
#: What an isolated process keeps of the parent's environment: these names and those that start with
#: :data:`KEPT_PREFIXES` (no DPBENCH_* settings, store URLs, W&B keys or seeds).
KEPT_ENVIRONMENT = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")
KEPT_PREFIXES = ("LC_", "OMP_", "MKL_", "KMP_", "OPENBLAS_")
PR_SET_DUMPABLE = 4  # linux/prctl.h
_CONTEXT = multiprocessing.get_context("spawn")


def _forbid_tracing() -> None:
    """On Linux, make this process non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``) for the rest of its life: non-root
    processes of its user can then neither ptrace it nor open its ``/proc/<pid>/mem`` or ``environ``."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


@contextlib.contextmanager
def _bare_start():
    """While a child starts: ``sys.argv`` cut to the program's name and ``os.environ`` to :data:`KEPT_ENVIRONMENT`
    (spawn hands the child both), restored after. Other threads of this process see them cut meanwhile."""
    argv, environment = sys.argv, dict(os.environ)
    sys.argv = sys.argv[:1]
    for key in environment:
        if key not in KEPT_ENVIRONMENT and not key.startswith(KEPT_PREFIXES):
            del os.environ[key]
    try:
        yield
    finally:
        sys.argv = argv
        os.environ.update(environment)


def _start(process) -> None:
    """Start ``process`` (which will run plugin code) as the module docstring says: non-dumpable parent, bare
    command line and environment."""
    _forbid_tracing()
    with _bare_start():
        process.start()


def _send(conn, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message).encode())


def _receive(conn) -> dict[str, Any]:
    message = json.loads(conn.recv_bytes().decode())
    if not isinstance(message, dict):
        raise RuntimeError(f"the isolated method sent {str(message)[:80]}, not an object")
    return message


def _describe_child(conn, name: str, folders: list[str], sources: dict[str, bytes]) -> None:
    try:
        registry.pin_sources(sources)
        methods = registry.methods([Path(folder) for folder in folders])
        if name not in methods:
            _send(conn, {"usage": f"unknown method {name!r}; available: {', '.join(methods)}"})
            return
        cls = methods[name]
        if issubclass(cls, ReleaseMethod):
            _send(conn, {"usage": f"{name} releases through dpbench.release.mechanisms: only gradient methods run isolated"})
            return
        built_in = sorted({klass.__module__ for klass in cls.__mro__ if isinstance(klass, type)
                           and issubclass(klass, Method) and klass.__module__.startswith(BUILT_IN_METHODS)})
        _send(conn, {"attributes": {key: getattr(cls, key) for key in PUBLIC_ATTRIBUTES},
                     "transforms": cls.per_example_transform is not Method.per_example_transform,
                     # correlated noise is not forwarded: the parent refuses it (refusals.check_correlation)
                     "correlated": cls.noise_correlation is not None
                     or cls.correlation.__func__ is not Method.correlation.__func__,
                     "file": inspect.getsourcefile(cls), "built_in": built_in})
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
        _send(conn, {"error": f"{type(error).__name__}: {error}"})


def describe(name: str, folders: list[Path]) -> type[Method]:
    """The stand-in class of method ``name`` from the plugin ``folders``, loaded in a spawned process (the parent
    never imports the plugins' code; it hashes their files first)."""
    sources = records.plugin_sources(folders)
    files = {path: hashlib.sha256(source).hexdigest() for path, source in sources.items()}
    parent, child = _CONTEXT.Pipe()
    process = _CONTEXT.Process(target=_describe_child, args=(child, name, [str(f) for f in folders], sources),
                               daemon=True)
    _start(process)
    child.close()
    try:
        reply = _receive(parent)
    except EOFError:
        raise RuntimeError(f"describing method {name} in an isolated process failed (exit {process.exitcode})") \
            from None
    finally:
        process.join(timeout=30)
    if "usage" in reply:
        raise UsageError(reply["usage"])
    if "error" in reply:
        raise UsageError(f"plugin method {name}: {reply['error']}")
    if reply["attributes"]["name"] != name:
        raise UsageError(f"plugin method {name}: its isolated process described {reply['attributes']['name']!r}")
    return stand_in(reply, [str(f) for f in folders], files, sources)


def _built_in_files(modules: list[str]) -> list[str]:
    """The source files of those of ``modules`` that are built-in methods' modules (found, not imported)."""
    known = {BUILT_IN_METHODS + info.name for info in pkgutil.iter_modules(dpbench.methods.__path__)}
    return [importlib.util.find_spec(module).origin for module in modules
            if isinstance(module, str) and module in known]


def stand_in(facts: dict[str, Any], folders: list[str], files: dict[str, str],
             sources: dict[str, bytes]) -> type[Method]:
    """A :class:`~dpbench.method.Method` subclass with the described method's public attributes, marked as isolated
    (``isolated_folders``) and carrying its ``code`` for the record: the sha256 over ``files`` (the plugin folders'
    files, :func:`dpbench.results.records.plugin_files`, hashed before the child ran) and the files of the built-in
    methods it derives from, as :func:`dpbench.results.records.code_of` hashes the class in process. Whatever else the
    child names is not hashed; a child that leaves a built-in out only drops that file (pinned by the record's
    ``git_commit``) from the hash."""
    name = facts["attributes"]["name"]
    if facts["file"] not in files:
        raise UsageError(f"plugin method {name}: its isolated process named {str(facts['file'])[:200]!r} as its "
                         f"file, which is none of its plugin folders' files")
    hashed = {**files, **{path: records.file_sha256(path) for path in _built_in_files(facts["built_in"])}}
    # Built-in methods never get here (dpbench.run.planning.registered): whatever the child says of its module's name (a
    # plugin can call itself dpbench.methods.x), a described method is an external plugin.
    attributes = dict(facts["attributes"], isolated_folders=tuple(folders), isolated_sources=sources,
                      code={"name": name, "file": facts["file"], "external": True,
                            "sha256": records.combined_sha256(hashed)})
    if facts.get("correlated"):  # refused by dpbench.run.refusals.check_correlation
        attributes["isolated_correlation"] = True
    if facts["transforms"]:  # the engine checks for an override (fast clipping path, sparse inputs)
        attributes["per_example_transform"] = lambda self, gradients: gradients
    return type(f"Isolated_{facts['attributes']['name']}", (Method,), attributes)


def code_of(method: type[Method]) -> dict[str, Any]:
    """The record's ``code`` of a method class: a stand-in's (hashed by :func:`stand_in`) or the class's own."""
    return method.code if hasattr(method, "isolated_folders") else records.code_of(method, Method)


def _views(flat: torch.Tensor, layout: list[tuple[list[int], str]]) -> list[torch.Tensor]:
    """Tensors of the given shapes and dtypes laid end to end in the bytes of ``flat``."""
    views, offset = [], 0
    for shape, dtype_name in layout:
        dtype = getattr(torch, dtype_name)
        size = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        views.append(flat[offset:offset + size].view(dtype).view(shape))
        offset += size
    return views


def _buffer(layout: list[tuple[list[int], str]]) -> torch.Tensor:
    total = sum(int(torch.Size(s).numel()) * torch.empty((), dtype=getattr(torch, d)).element_size()
                for s, d in layout)
    return torch.zeros(max(total, 1), dtype=torch.uint8).share_memory_()


def _transform_of(method: Method, shift: list[torch.Tensor], scale: list[torch.Tensor]) -> str:
    """Write the method's current transform into the shared buffers: "identity" or "affine"."""
    if type(method).per_example_transform is Method.per_example_transform:
        return "identity"
    transform = method.per_example_transform
    if not isinstance(transform, CoordinateAffine):
        raise UsageError(f"{method.name}: its per_example_transform is code ({type(transform).__name__}), which "
                         f"would run beside the training data; isolated mode takes only the identity or a "
                         f"dpbench.privacy.clipping.CoordinateAffine returned as data")
    with torch.no_grad():
        for into, value in zip(shift, transform.shift):
            into.copy_(value)
        for into, value in zip(scale, transform.scale):
            into.copy_(value)
    return "affine"


def _serve(conn, name: str, folders: list[str], sources: dict[str, bytes], layout, buffers, hp: dict[str, Any],
           mechanism: GradientMechanism, threads: int) -> None:
    """The isolated process: set the method up on copies of the parameters' values, then run its steps."""
    torch.set_num_threads(threads)  # as many as the parent uses
    values, gradients, shift, scale = (_views(flat, layout) for flat in buffers)
    try:
        registry.pin_sources(sources)
        method_class = registry.methods([Path(f) for f in folders])[name]
        params = [torch.nn.Parameter(value.clone()) for value in values]
        try:
            method = method_class(params, hp, mechanism)
        except ValueError as error:
            _send(conn, {"usage": f"{name}: {error}"})
            return
        _send(conn, {"ready": method.hp, "transform": _transform_of(method, shift, scale)})
    except UsageError as error:
        _send(conn, {"usage": str(error)})
        return
    except Exception:  # noqa: BLE001 - reported to the parent, which raises it
        _send(conn, {"error": traceback.format_exc()})
        return

    def publish() -> None:
        with torch.no_grad():
            for into, param in zip(values, params):
                into.copy_(param)

    def release() -> list[torch.Tensor]:
        publish()
        _send(conn, {"release": True, "transform": _transform_of(method, shift, scale)})
        if "released" not in _receive(conn):
            raise RuntimeError("the engine refused the release")
        return [g.clone() for g in gradients]

    while "step" in _receive(conn):
        try:
            method.step(release)
            publish()
            _send(conn, {"done": True, "transform": _transform_of(method, shift, scale)})
        except Exception:  # noqa: BLE001
            _send(conn, {"error": traceback.format_exc()})
            return


def _stop(process, conn) -> None:
    try:
        _send(conn, {"stop": True})
    except (OSError, ValueError):
        pass
    process.join(timeout=10)
    if process.is_alive():
        process.kill()
    conn.close()


class IsolatedMethod:
    """The method's stand-in inside the training module: it forwards ``step`` to the isolated process and serves
    its releases (see the module docstring)."""

    def __init__(self, method_class: type[Method], params: list[torch.nn.Parameter], hp: dict[str, Any],
                 mechanism: GradientMechanism):
        self.name, self.params = method_class.name, params
        layout = [(list(p.shape), str(p.dtype).removeprefix("torch.")) for p in self.params]
        buffers = [_buffer(layout) for _ in range(4)]
        self.values, self.gradients, self.shift, self.scale = (_views(flat, layout) for flat in buffers)
        with torch.no_grad():
            for into, param in zip(self.values, self.params):
                into.copy_(param)
        self.conn, child = _CONTEXT.Pipe()
        self.process = _CONTEXT.Process(
            target=_serve, daemon=True,
            args=(child, method_class.name, list(getattr(method_class, "isolated_folders", ())),
                  dict(getattr(method_class, "isolated_sources", {})), layout, buffers,
                  dict(hp), mechanism, torch.get_num_threads()))
        _start(self.process)
        child.close()
        self._finalizer = weakref.finalize(self, _stop, self.process, self.conn)
        reply = self._receive()
        if "usage" in reply:
            self.close()
            raise UsageError(reply["usage"])
        changed = [key for key in ENGINE_KEYS if key in hp and reply["ready"].get(key) != hp[key]]
        if changed:
            self.close()
            raise UsageError(f"{self.name} changed the engine's {', '.join(changed)} in setup, which isolated "
                             f"mode refuses")
        hp.update(reply["ready"])  # the method's parsed values, for the record
        self.transform = reply["transform"]

    def _receive(self) -> dict[str, Any]:
        try:
            message = _receive(self.conn)
        except EOFError:
            raise RuntimeError(f"{self.name}'s isolated process ended (exit {self.process.exitcode})") from None
        if "error" in message:
            raise RuntimeError(f"{self.name} failed in its isolated process:\n{message['error']}")
        return message

    @property
    def per_example_transform(self) -> CoordinateAffine | None:
        """The child's current transform, copied (the child cannot change it while a release uses it) and checked
        (:meth:`~dpbench.privacy.clipping.CoordinateAffine.check`; its shapes are the parameters', laid out here)."""
        if self.transform != "affine":
            return None
        transform = CoordinateAffine([t.clone() for t in self.shift], [t.clone() for t in self.scale])
        try:
            transform.check()
        except ValueError as error:
            raise UsageError(f"{self.name}'s isolated process sent a per-example transform that {error}: refused") \
                from None
        return transform

    def _take(self, message: dict[str, Any]) -> None:
        if message.get("transform") not in ("identity", "affine"):
            raise RuntimeError(f"{self.name}'s isolated process sent an unknown transform")
        self.transform = message["transform"]
        with torch.no_grad():
            for param, value in zip(self.params, self.values):
                param.copy_(value)

    def step(self, release) -> None:
        _send(self.conn, {"step": True})
        while True:
            message = self._receive()
            self._take(message)
            if "done" in message:
                return
            if "release" not in message:
                raise RuntimeError(f"{self.name}'s isolated process sent {sorted(message)}")
            gradient = release()
            with torch.no_grad():
                for into, g in zip(self.gradients, gradient):
                    into.copy_(g)
            _send(self.conn, {"released": True})

    def close(self) -> None:
        self._finalizer()
