"""Step decay per epoch: torch's StepLR wrapped for ignite."""

from collections.abc import Mapping
from typing import Any

from ignite.engine import Events
from ignite.handlers import LRScheduler
from torch.optim.lr_scheduler import StepLR

__all__ = ["get_scheduler"]

# Where get_scheduler's **kwargs go, with the arguments it gives there itself: the config
# check accepts the other keywords of StepLR in lr_scheduler_params.
KWARGS_GO_TO = ((StepLR, ("optimizer",)),)


def get_scheduler(
    cfg: Any,
    train_dl: Any,
    optimizer: Any,
    engines: Mapping,
    step_size: int = 10,
    gamma: float = 0.1,
    **kwargs: Any,
):
    """Multiply the lr by ``gamma`` every ``step_size`` epochs; ``kwargs`` go to StepLR."""
    scheduler = LRScheduler(StepLR(optimizer, step_size, gamma, **kwargs))
    return scheduler, "trainer", Events.EPOCH_COMPLETED
