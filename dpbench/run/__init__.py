"""Training runs of gradient methods: the engine (a spec planned, noise calibrated, trained under a Lightning
``Trainer``, the record written), the private training loop, batched runs of many seeds or trials, checkpoints,
DDP, the isolated method process, and the allocator. May import everything below it: the base modules, data,
privacy, the contract, :mod:`dpbench.spec`, the registry, results and :mod:`dpbench.release`.
"""
