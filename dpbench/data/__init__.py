"""Data: dataset files (a mirror, the cache, the canonical source), their loaders by source (``tabular``, ``mnist``,
``cifar``, ``snli``, ``libsvm``), dense and sparse rows, and :class:`~dpbench.data.taskdata.TaskData`, the tensors a
task hands the engine.

Owns no privacy: a private preprocessing step (DP-PCA) lives in :mod:`dpbench.privacy` and is listed in ``TaskData``.
May import only the base modules (``dpbench.errors``, ``choices``, ``checks``, ``threads``).
"""
