"""The fixed choices of the command line (accountants, samplers, modes, formats...), defined once here so that
``dpbench --help`` and its refusals need not import the modules that implement them (PyTorch, dp-accounting,
Optuna); those modules import their choices from here."""

ACCOUNTANTS = ("pld", "rdp")  # dpbench.privacy.accounting
SAMPLERS = ("poisson", "shuffle", "cyclic")  # dpbench.privacy.accounting: batch samplers (cyclic: correlated noise)
NEIGHBOURING = ("add-remove", "replace-one")  # dpbench.privacy.accounting
CLIPPING = ("fast", "reference")  # dpbench.run.planning: ghost norms, or materialized per-example gradients (vmap)
GAUSSIAN_SAMPLERS = ("fast", "torch")  # dpbench.privacy.noise: ``fast`` dpbench's sampler on the CPU, PyTorch's elsewhere
TUNING_MODES = ("random-stopping", "adaptive", "oracle")  # dpbench.tuning.tune
REFERENCE_MODE = "reference"  # dpbench.tuning.reference: the converged non-private references
SEARCH_SAMPLERS = ("random", "tpe", "qmc")  # dpbench.tuning.trials: Optuna samplers
K_DISTRIBUTIONS = ("negative-binomial", "poisson")  # dpbench.tuning.accounting
BOARD_FORMATS = ("md", "html", "csv", "jsonl")  # dpbench.board.leaderboard
THREAT_MODELS = ("white-box", "black-box")  # dpbench.trust.audit
STRATEGIES = ("ddp",)  # dpbench.run.distributed: how several processes train one run
