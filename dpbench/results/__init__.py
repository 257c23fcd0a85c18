"""Results: what a record carries (provenance, identity, storage), the store (SQLAlchemy), W&B tracking, and browsing
the store (``dpbench runs``, ``dpbench show``). May import the base modules, :mod:`dpbench.data`, :mod:`dpbench.privacy`
and the contract (``dpbench.method``, ``dpbench.task``).
"""
