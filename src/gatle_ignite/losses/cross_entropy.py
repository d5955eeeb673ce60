"""Cross-entropy between class scores and class indices (or class probabilities).

Sequence logits are taken as models give them: ``(B, T, V)`` against ``(B, T)`` targets, the
classes last whenever the shapes say so (see :mod:`gatle_ignite.losses.layout`); ``(B, C)``
against ``(B,)`` and torch's ``(B, C, H, W)`` against ``(B, H, W)`` as usual. Targets of the
logits' own shape are class probabilities, in torch's layout.
"""

import torch
from torch import nn

from gatle_ignite.losses.layout import class_dim, misread_classes, not_class_indices, shape_mismatch
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
        what = f"cross_entropy of {self.src_name!r}"
        dim = class_dim(prediction, target)
        if dim is None:
            raise shape_mismatch(what, prediction, target)
        if target.is_floating_point():
            raise not_class_indices(what, prediction, target)
        target = target.long()
        try:
            if dim == 1:
                return self.loss(prediction, target)
            value = self.loss(prediction.reshape(-1, prediction.shape[-1]), target.reshape(-1))
        except IndexError as error:
            # torch's "Target 7 is out of bounds.": checked by torch, so no step waits for it.
            refused = f"torch refused them: {str(error).rstrip('.')}"
            raise misread_classes(what, prediction, target, refused) from None
        # reduction="none": one value per position, in the targets' shape.
        return value.reshape(target.shape) if value.dim() else value
