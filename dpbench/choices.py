"""The fixed choices of the command line (accountants, samplers, modes, formats...), defined once here so that
``dpbench --help`` and its refusals need not import the modules that implement them (PyTorch, dp-accounting,
Optuna); those modules import their choices from here."""

ACCOUNTANTS = ("pld", "rdp")  # dpbench.privacy
SAMPLERS = ("poisson", "shuffle")  # dpbench.privacy: batch samplers
NEIGHBOURING = ("add-remove", "replace-one")  # dpbench.privacy
CLIPPING = ("fast", "reference")  # dpbench.engine: ghost norms, or materialized per-example gradients (vmap)
GAUSSIAN_SAMPLERS = ("fast", "torch")  # dpbench.noise: ``fast`` dpbench's sampler on the CPU, PyTorch's elsewhere
TUNING_MODES = ("random-stopping", "adaptive", "oracle")  # dpbench.tuning
SEARCH_SAMPLERS = ("random", "tpe", "qmc")  # dpbench.tuning: Optuna samplers
K_DISTRIBUTIONS = ("negative-binomial", "poisson")  # dpbench.tuning_privacy
BOARD_FORMATS = ("md", "html", "csv", "jsonl")  # dpbench.leaderboard
THREAT_MODELS = ("white-box", "black-box")  # dpbench.audit
STRATEGIES = ("ddp",)  # dpbench.distributed: how several processes train one run
