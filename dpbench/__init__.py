"""dpbench: a benchmark and leaderboard harness for differentially private optimizers."""
from dpbench import allocator

allocator.huge_pages()  # before PyTorch allocates anything (dpbench/allocator.py)
