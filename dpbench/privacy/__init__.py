"""The privacy core: accounting (:mod:`~dpbench.privacy.accounting`, dp-accounting's PLD and RDP with the replace-one
bounds), independent random streams, the Gaussian noise and its C sampler, batch samplers, per-example clipping
(reference and ghost norms), the guards between a run and its record, DP-PCA, and the cache of slow computations.

Everything a reported ε rests on is here, below the method and task contract: these modules name ``Task`` only as a
type. May import the base modules and :mod:`dpbench.data`.
"""
