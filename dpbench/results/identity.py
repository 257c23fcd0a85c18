"""Which experiment a record is: its identity, the settings and code it ran (without importing PyTorch, so that
``dpbench runs`` can number the reruns of an experiment). Two records of the same identity and seed are runs of the
same experiment: the sweep does not run it again, the leaderboard counts the seed once, ``dpbench runs`` numbers
them."""
from __future__ import annotations

import json
from typing import Any

#: The fields that say which settings and code a record ran: records of the same identity are one leaderboard cell.
IDENTITY_FIELDS = ("task", "method", "data_id", "delta", "epsilon_target", "neighbouring", "accountant", "sampler",
                   "hyperparameters", "overrides", "profile", "code", "ledger_version")


#: A tuned record's hyperparameters, sampler and accountant are outputs of its tuning: its identity is the tuning's
#: configuration (``record["tuning"]["config"]``) instead.
TUNED_IDENTITY_FIELDS = ("task", "method", "data_id", "delta", "epsilon_target", "neighbouring", "profile", "code",
                         "ledger_version")


def identity(record: dict[str, Any]) -> str:
    """The canonical JSON of a record's :data:`IDENTITY_FIELDS`, or of a tuned record's
    :data:`TUNED_IDENTITY_FIELDS` and tuning configuration (δ to 10 significant digits: release methods record the
    sum of their parts' δ)."""
    tuning = record.get("tuning")
    fields = {key: record.get(key) for key in (TUNED_IDENTITY_FIELDS if tuning else IDENTITY_FIELDS)}
    if tuning:
        fields["tuning"] = tuning.get("config", tuning.get("mode"))
    if fields["delta"] is not None:
        fields["delta"] = float(f"{fields['delta']:.10g}")
    return json.dumps(fields, sort_keys=True)
