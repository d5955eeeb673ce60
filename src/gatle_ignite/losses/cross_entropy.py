"""Cross-entropy between class scores and class indices (or class probabilities).

Sequence logits are taken as models give them: ``(B, T, V)`` against ``(B, T)`` targets, the
classes last whenever the shapes say so (see :mod:`gatle_ignite.losses.layout`); ``(B, C)``
against ``(B,)`` and torch's ``(B, C, H, W)`` against ``(B, H, W)`` as usual. Targets of the
logits' own shape are class probabilities, in torch's layout.
"""

import torch
from torch import nn

from gatle_ignite.losses.layout import class_dim, shape_mismatch
from gatle_ignite.losses.term import TorchTerm

__all__ = ["KWARGS_GO_TO", "Loss"]

# Where Loss's **kwargs go: ignore_index, label_smoothing, weight, reduction.
KWARGS_GO_TO = ((nn.CrossEntropyLoss, ()),)


class Loss(TorchTerm):
    """``nn.CrossEntropyLoss(**kwargs)`` of ``y_pred[src_name]`` against ``target[tgt_name]``.

    ``ignore_index`` (default -100) leaves those target positions out of the mean;
    ``label_smoothing`` and a per-class ``weight`` (a list) are torch's.
    """

    torch_loss = nn.CrossEntropyLoss

    def compute(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if prediction.shape == target.shape:
            return self.loss(prediction, target.to(prediction.dtype))
        if not target.is_floating_point():
            target = target.long()
        dim = class_dim(prediction, target)
        if dim is None:
            raise shape_mismatch(f"cross_entropy of {self.src_name!r}", prediction, target)
        if dim == 1:
            return self.loss(prediction, target)
        value = self.loss(prediction.reshape(-1, prediction.shape[-1]), target.reshape(-1))
        # reduction="none": one value per position, in the targets' shape.
        return value.reshape(target.shape) if value.dim() else value
