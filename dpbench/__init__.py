"""dpbench: a benchmark and leaderboard harness for differentially private optimizers.

The plugin contract is importable from here: ``from dpbench import Method, Task, apply_gradient`` (loaded on first use,
so that ``dpbench --help`` does not import PyTorch). The subpackages, lowest first (each imports only those before it;
``tests/test_layout.py`` keeps it so): the base modules (``errors``, ``choices``, ``checks``, ``catalog``, ``threads``),
``data``, ``privacy``, the contract (``method``, ``task``, ``spec``), ``results``, ``release``, the built-in ``methods``
and ``tasks``, ``registry``, ``run``, ``federated``, ``tuning``, ``trust``, ``board``, and ``cli``.
"""
from dpbench.run import allocator

allocator.huge_pages()  # before PyTorch allocates anything (dpbench/run/allocator.py)

_CONTRACT = {"Method": "dpbench.method", "ReleaseMethod": "dpbench.method", "apply_gradient": "dpbench.method",
             "per_run": "dpbench.method", "stacked": "dpbench.method", "Task": "dpbench.task",
             "Classification": "dpbench.task", "TaskData": "dpbench.task"}
__all__ = list(_CONTRACT)


def __getattr__(name: str):
    """The contract's names, imported when first asked for (PEP 562)."""
    if name not in _CONTRACT:
        raise AttributeError(f"module 'dpbench' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_CONTRACT[name]), name)
