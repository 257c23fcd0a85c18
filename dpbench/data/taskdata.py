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

    def __post_init__(self) -> None:
        # The clippers drop an example whose gradient is not finite (dpbench.privacy.clipping.keep_finite); a
        # feature that is not finite is a defect of the data, refused here rather than silently dropped.
        x = self.x_train
        if x.is_floating_point() and x.layout == torch.strided and not bool(x.isfinite().all()):
            raise ValueError(f"{self.data_id}: a training feature is not finite (NaN or infinite)")

    @property
    def n_train(self) -> int:
        return len(self.x_train)
