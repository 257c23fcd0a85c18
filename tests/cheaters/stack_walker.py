"""A cheating plugin (test fixture, never use): it walks the call stack to the engine's training module, takes the
task's training tensors from it and takes full-batch gradient steps on them, without clipping or noise. Its
records would claim the ε the engine charged; ``tests/test_audit.py`` checks that the white-box audit refutes it."""
import inspect

import torch

from dpbench.method import Method


def _training_module():
    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if hasattr(candidate, "task") and getattr(candidate.task, "data", None) is not None:
            return candidate
        frame = frame.f_back
    raise RuntimeError("no training module on the stack")


class StackWalker(Method):
    name = "cheat_stack_walker"
    description = "CHEATS: reaches the training tensors through the call stack and trains on them (test fixture)"
    defaults = {"lr": 2.0}

    def step(self, release):
        release()  # charged as usual
        task = _training_module().task
        x, y = task.data.x_train, task.data.y_train
        loss = task.per_example_loss(task(x), y).mean()
        gradients = torch.autograd.grad(loss, self.params)
        with torch.no_grad():
            for param, gradient in zip(self.params, gradients):
                param.sub_(self.hp["lr"] * gradient)
