"""Smooth L1 (Huber-like) loss between a prediction and a target of its shape."""

from torch import nn

from gatle_ignite.losses.term import ElementwiseTerm

__all__ = ["KWARGS_GO_TO", "Loss"]

# Where Loss's **kwargs go: beta, reduction.
KWARGS_GO_TO = ((nn.SmoothL1Loss, ()),)


class Loss(ElementwiseTerm):
    """``nn.SmoothL1Loss(**kwargs)`` of ``y_pred[src_name]`` against ``target[tgt_name]``."""

    torch_loss = nn.SmoothL1Loss
