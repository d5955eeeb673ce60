"""The shape of every built-in loss term: read two sides of the step output, apply a torch loss.

A term returns one tensor. Named as ``criterion_name`` it is the whole criterion (the trainer
logs it as ``train/loss_avg``); inside ``composite`` it is one weighted term among others.
"""

from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import nn

from gatle_ignite.losses.layout import same_shape
from gatle_ignite.losses.reading import Name, read_prediction, read_target

__all__ = ["ElementwiseTerm", "Term", "TorchTerm", "as_tensors"]

# Keyword arguments of torch's losses that must be tensors, and that a config gives as lists.
_TENSOR_KWARGS = ("weight", "pos_weight")


def as_tensors(kwargs: Mapping[str, Any]) -> dict:
    """``kwargs`` with a list given for a tensor argument (a class ``weight``) made a tensor."""
    kwargs = dict(kwargs)
    for key in _TENSOR_KWARGS:
        if isinstance(kwargs.get(key), (list, tuple)):
            kwargs[key] = torch.tensor(kwargs[key], dtype=torch.float32)
    return kwargs


class Term(nn.Module):
    """``compute(prediction, target)`` of ``y_pred[src_name]`` and ``target[tgt_name]``."""

    def __init__(self, src_name: Name, tgt_name: Name) -> None:
        super().__init__()
        self.src_name = src_name
        self.tgt_name = tgt_name

    def forward(self, y_pred: Any, target: Any, iteration: Optional[int] = None) -> torch.Tensor:
        prediction = read_prediction(y_pred, self.src_name)
        return self.compute(prediction, read_target(target, self.tgt_name))

    def compute(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class TorchTerm(Term):
    """A term applying ``torch_loss(**kwargs)``, the keyword arguments the config's."""

    # The torch loss class.
    torch_loss: type = nn.Module

    def __init__(
        self, src_name: Name = "logits", tgt_name: Name = ("targets", "labels"), **kwargs: Any
    ) -> None:
        super().__init__(src_name, tgt_name)
        self.loss = self.torch_loss(**as_tensors(kwargs))


class ElementwiseTerm(TorchTerm):
    """A torch loss comparing a prediction with a target of its shape, element by element.

    A prediction of shape ``(B, 1)`` against ``(B,)`` targets is compared as ``(B,)``; any other
    difference of shapes is refused rather than broadcast. The target takes the prediction's
    dtype, so integer labels work as they are.
    """

    def compute(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        what = f"{type(self).__module__.rsplit('.', 1)[-1]} of {self.src_name!r}"
        return self.loss(*same_shape(prediction, target, what))
