"""Mean squared error between a prediction and a target of its shape."""

from torch import nn

from gatle_ignite.losses.term import ElementwiseTerm

__all__ = ["KWARGS_GO_TO", "Loss"]

# Where Loss's **kwargs go: reduction.
KWARGS_GO_TO = ((nn.MSELoss, ()),)


class Loss(ElementwiseTerm):
    """``nn.MSELoss(**kwargs)`` of ``y_pred[src_name]`` against ``target[tgt_name]``."""

    torch_loss = nn.MSELoss
