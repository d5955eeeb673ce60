"""Adam over the trainable parameters, without decay grouping."""

from collections.abc import Sequence
from typing import Any

import ignite.distributed as idist
import torch
from torch import nn

__all__ = ["get_optimizer"]

# Where get_optimizer's **kwargs go, with the arguments it gives there itself: the config
# check accepts the other keywords of torch.optim.Adam in optimizer_params.
KWARGS_GO_TO = ((torch.optim.Adam, ("params",)),)


def get_optimizer(
    model: nn.Module,
    lr: float = 1e-3,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    **kwargs: Any,
):
    """``torch.optim.Adam`` over the parameters that require grad."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(
        params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **kwargs
    )
    return idist.auto_optim(optimizer)
