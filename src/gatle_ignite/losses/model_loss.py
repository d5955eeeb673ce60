"""The loss the model computes itself: a ``transformers`` model given ``labels`` returns it.

``prep_batch`` puts the labels among ``model_input``, so the model receives them; this term
reads the ``loss`` its output carries (``src_name``), and needs no target of its own.
"""

from typing import Any, Optional

import torch
from torch import nn

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.losses.reading import Name, read_prediction

__all__ = ["Loss"]

_NO_LOSS = (
    "  model_loss reads the loss the model computed itself, which a transformers model does "
    "only when it is given its labels: add them to prep_batch's model_input (e.g. "
    '"labels": input_ids), or name the output that holds the loss in src_name.'
)


class Loss(nn.Module):
    """``y_pred[src_name]``: the scalar loss the model's forward returned."""

    def __init__(self, src_name: Name = "loss") -> None:
        super().__init__()
        self.src_name = src_name

    def forward(self, y_pred: Any, target: Any, iteration: Optional[int] = None) -> torch.Tensor:
        try:
            loss = read_prediction(y_pred, self.src_name)
        except ConfigError as error:
            raise ConfigError(f"{error}\n{_NO_LOSS}") from None
        if loss is None:
            raise ConfigError(f"the model's output holds {self.src_name!r} = None.\n{_NO_LOSS}")
        return loss
