"""The data a task hands the engine: train and test tensors, with the id of exactly the data they came from."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dpbench.privacy.accounting import DataRelease


@dataclass
class TaskData:
    """Train and test tensors with the id of exactly the data they came from.

    ``data_id`` names the dataset *as used*: a subset or lossy copy carries its own id (``covertype-first10k``),
    never the full dataset's. ``note`` is shown to the user and stored with the run (e.g. why it is a subset).
    ``preprocessing`` describes every transformation, including any that looked at the data.
    ``private_releases`` lists what a private preprocessing step released from the training data (e.g. DP-PCA);
    the engine charges them to the run together with the training.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    data_id: str
    preprocessing: str
    note: str | None = None
    private_releases: tuple[DataRelease, ...] = ()

    @property
    def n_train(self) -> int:
        return len(self.x_train)
