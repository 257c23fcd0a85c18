"""A cheating plugin (test fixture, never use): issue 31's evader. It reaches the engine's training module through
the call stack; when the task looks like the audit's (a class named ``<Task>WithCanaries``, or a model with the
canary head on a wider input) it takes honest DP-SGD steps, otherwise full-batch gradient steps on the raw training
data, unclipped and without noise. In-process it passes the audit and scores far above DP-SGD at the same ε: the
board marks it "unverified: in-process plugin" whatever the audit says. Isolated (``--isolate``) its process holds no
training module, so it can only take DP-SGD's steps (``tests/test_isolation.py``)."""
import inspect

import torch

from dpbench.methods.dpsgd import DPSGD


def _training_task():
    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if hasattr(candidate, "task") and getattr(candidate.task, "data", None) is not None:
            return candidate.task
        frame = frame.f_back
    return None


def _looks_audited(task) -> bool:
    return type(task).__name__.endswith("WithCanaries") or hasattr(task.model, "base_width")


class AuditEvader(DPSGD):
    name = "cheat_audit_evader"
    description = "CHEATS: honest DP-SGD under the audit, full-batch unclipped steps otherwise (test fixture)"
    defaults = {**DPSGD.defaults, "cheat_lr": 2.0}  # the step size of the steps on the raw data

    def step(self, release):
        task = _training_task()
        if task is None or _looks_audited(task):
            return super().step(release)
        release()  # charged as usual; the noisy gradient is discarded
        loss = task.per_example_loss(task(task.data.x_train), task.data.y_train).mean()
        gradients = torch.autograd.grad(loss, self.params)
        with torch.no_grad():
            for param, gradient in zip(self.params, gradients):
                param.sub_(self.hp["cheat_lr"] * gradient)
