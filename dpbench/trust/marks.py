"""How far the board trusts an external plugin's row: its isolation, then its audit as evidence (no imports:
the board reads it without loading PyTorch)."""


def plugin_mark(isolation: str, audit: str) -> str:
    """The board's mark of an external plugin's row: "isolated" for ``isolation`` "process", else "unverified:
    in-process plugin"; then the audit of its code on the task, as evidence ("audit passed", "audit failed",
    "unaudited")."""
    trust = "isolated" if isolation == "process" else "unverified: in-process plugin"
    return f"{trust}, {audit if audit == 'unaudited' else 'audit ' + audit}"
