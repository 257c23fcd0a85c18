"""One-shot release methods, outside the gradient mould: output perturbation and AMP's objective perturbation. The
mechanisms (:mod:`~dpbench.release.mechanisms`: clipping the rows, drawing every noise vector, charging the ledger)
and a run of one (:mod:`~dpbench.release.runner`). May import everything below :mod:`dpbench.results`, and
:mod:`dpbench.spec`; the gradient engine imports this package, never the other way round.
"""
