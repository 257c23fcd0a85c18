"""The leaderboard: sweeps of a declared grid, the model of tables and cells, its checks, the text, CSV and HTML
views, and the seed papers' published figures. May import every other subpackage; only the command line imports
it.
"""
