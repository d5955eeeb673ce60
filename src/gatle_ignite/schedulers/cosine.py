"""Cosine annealing per iteration, from the base lr down to ``end_value``."""

from collections.abc import Mapping
from typing import Any, Optional

from ignite.engine import Events
from ignite.handlers import CosineAnnealingScheduler

from gatle_ignite.schedulers._utils import base_lr, steps_per_epoch

__all__ = ["get_scheduler"]


def get_scheduler(
    cfg: Any,
    train_dl: Any,
    optimizer: Any,
    engines: Mapping,
    start_value: Optional[float] = None,
    end_value: float = 0.0,
    cycle_epochs: Optional[int] = None,
    **kwargs: Any,
):
    """One cosine cycle over ``cycle_epochs`` (default: the whole run), stepped per iteration."""
    cycle_size = (cycle_epochs or cfg.max_epochs) * steps_per_epoch(cfg, train_dl)
    scheduler = CosineAnnealingScheduler(
        optimizer,
        "lr",
        start_value=start_value if start_value is not None else base_lr(cfg, optimizer),
        end_value=end_value,
        # ignite refuses a cycle shorter than 2 events
        cycle_size=max(cycle_size, 2),
        **kwargs,
    )
    return scheduler, "trainer", Events.ITERATION_STARTED
