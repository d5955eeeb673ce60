"""AdamW with biases and norm parameters kept out of weight decay."""

from collections.abc import Sequence
from typing import Any

import ignite.distributed as idist
import torch
from torch import nn

from gatle_ignite.optimizers.grouping import get_grouped_params

__all__ = ["get_optimizer"]

# Where get_optimizer's **kwargs go, with the arguments it gives there itself: the config
# check accepts the other keywords of torch.optim.AdamW in optimizer_params.
KWARGS_GO_TO = ((torch.optim.AdamW, ("params",)),)


def get_optimizer(
    model: nn.Module,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    no_decay_on_bias_and_norm: bool = True,
    **kwargs: Any,
):
    """``torch.optim.AdamW`` over :func:`get_grouped_params` groups."""
    groups = get_grouped_params(model, weight_decay, no_decay_on_bias_and_norm)
    optimizer = torch.optim.AdamW(
        groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **kwargs
    )
    return idist.auto_optim(optimizer)
