"""Checks that do not trust the code that made a result: the audit (canaries and Steinke et al.'s one-run lower
bound), ``dpbench verify`` (records recomputed from their public plan, reruns), and the board's mark for an
external plugin. May import :mod:`dpbench.tuning` and everything below it.
"""
