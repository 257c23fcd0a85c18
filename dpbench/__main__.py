"""``python -m dpbench ARGS``: the ``dpbench`` command."""
import sys

from dpbench.cli import main

sys.exit(main())
