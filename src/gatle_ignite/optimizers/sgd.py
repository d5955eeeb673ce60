"""SGD with Nesterov momentum, biases and norm parameters kept out of weight decay."""

from typing import Any

import ignite.distributed as idist
import torch
from torch import nn

from gatle_ignite.optimizers.grouping import get_grouped_params

__all__ = ["get_optimizer"]

# Where get_optimizer's **kwargs go, with the arguments it gives there itself: the config
# check accepts the other keywords of torch.optim.SGD in optimizer_params.
KWARGS_GO_TO = ((torch.optim.SGD, ("params",)),)


def get_optimizer(
    model: nn.Module,
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    nesterov: bool = True,
    no_decay_on_bias_and_norm: bool = True,
    **kwargs: Any,
):
    """``torch.optim.SGD`` over :func:`get_grouped_params` groups."""
    groups = get_grouped_params(model, weight_decay, no_decay_on_bias_and_norm)
    optimizer = torch.optim.SGD(
        groups,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
        nesterov=nesterov,
        **kwargs,
    )
    return idist.auto_optim(optimizer)
