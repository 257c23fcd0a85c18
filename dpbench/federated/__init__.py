"""Federated learning: FedAvg whose clients adapt their learning rate (ADADP, Koskela & Honkela 2020) and one run of
the paper's federated experiments (``dpbench federated``). May import :mod:`dpbench.run` and everything below it.
"""
