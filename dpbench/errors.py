"""The exceptions the ``dpbench`` command turns into its exits, importable without PyTorch (``dpbench.cli`` imports
the modules that train only in the commands that need them)."""


class UsageError(Exception):
    """Bad input: the run is refused before anything is written (exit 2)."""


class RegistryError(Exception):
    """A plugin folder or entry point that cannot be registered (exit 2)."""


class TuningError(Exception):
    """The study cannot release anything (e.g. all its trials failed, or K = 0 was drawn) (exit 1)."""


class PrivacyCheckFailed(RuntimeError):
    """A run is inconsistent with what its record would claim; nothing is recorded (exit 1)."""
