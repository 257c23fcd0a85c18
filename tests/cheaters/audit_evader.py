"""A cheating plugin (test fixture, never use): issue 31's evader. It reaches the engine's training module through
the call stack and looks for what told the audit's task apart before issue 31: a task class other than the
registered one (``<Task>WithCanaries``), parameters of other shapes than the task's model (the canary head), or
training rows of another width or number than the task's data. When it finds one it takes honest DP-SGD steps,
otherwise full-batch gradient steps on the raw training data, unclipped and without noise. The audit's canaries no
longer change any of these (``dpbench.trust.canaries``), so it cheats under the audit too, where the white-box audit on
digits catches it (``tests/test_audit.py``). In-process it scores far above DP-SGD at the same ε; isolated
(``--isolate``) its process holds no training module, so it can only take DP-SGD's steps
(``tests/test_isolation.py``)."""
import inspect

import torch

from dpbench import registry
from dpbench.methods.dpsgd import DPSGD


def _training_task():
    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if hasattr(candidate, "task") and getattr(candidate.task, "data", None) is not None:
            return candidate.task
        frame = frame.f_back
    return None


def looks_audited(task) -> bool:
    """Whether ``task`` differs from a fresh copy of its registered task in class, parameter shapes or rows."""
    registered = registry.tasks([])[task.name]
    if type(task) is not registered:
        return True
    with torch.random.fork_rng():  # the copy's data and weights draw from the global generator
        fresh = registered(**task.settings)
        fresh.prepare(task.seed)
    shapes = [p.shape for p in task.model.parameters()], [p.shape for p in fresh.model.parameters()]
    return shapes[0] != shapes[1] or task.data.x_train.shape != fresh.data.x_train.shape


class AuditEvader(DPSGD):
    name = "cheat_audit_evader"
    description = "CHEATS: honest DP-SGD under the audit, full-batch unclipped steps otherwise (test fixture)"
    defaults = {**DPSGD.defaults, "cheat_lr": 2.0}  # the step size of the steps on the raw data

    def setup(self):
        super().setup()
        self.audited = None  # decided at the first step, once the training module is on the stack

    def step(self, release):
        task = _training_task()
        if self.audited is None:
            self.audited = task is None or looks_audited(task)
        if self.audited:
            return super().step(release)
        release()  # charged as usual; the noisy gradient is discarded
        loss = task.per_example_loss(task(task.data.x_train), task.data.y_train).mean()
        gradients = torch.autograd.grad(loss, self.params)
        with torch.no_grad():
            for param, gradient in zip(self.params, gradients):
                param.sub_(self.hp["cheat_lr"] * gradient)
