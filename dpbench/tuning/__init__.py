"""Hyperparameter tuning whose privacy cost is reported: ``dpbench tune`` (:mod:`~dpbench.tuning.tune`, Optuna
studies with secret coins), a study's plan, the privacy of tuning (random stopping, adaptive composition, the noisy
held-out score), search spaces, and the board's validation track. May import :mod:`dpbench.run` and everything
below it.
"""
