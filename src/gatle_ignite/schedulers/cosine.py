"""Cosine annealing per iteration, from the base lr down to ``end_value``."""

from collections.abc import Mapping
from typing import Any, Optional

from ignite.engine import Events
from ignite.handlers import CosineAnnealingScheduler

from gatle_ignite.schedulers._utils import base_lr, steps_per_epoch

__all__ = ["get_scheduler"]

# Where get_scheduler's **kwargs go, with the arguments it gives there itself: the config
# check accepts the other keywords of ignite's CosineAnnealingScheduler in lr_scheduler_params.
KWARGS_GO_TO = ((CosineAnnealingScheduler, ("optimizer", "param_name", "cycle_size")),)


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
    """One cosine cycle over ``cycle_epochs`` (default: the whole run), stepped per iteration.

    A cycle over the whole run stays at ``end_value`` past its end, where a resume that raised
    ``max_epochs`` takes it; explicit ``cycle_epochs`` restart at ``start_value`` each cycle.
    """
    cycle_size = (cycle_epochs or cfg.max_epochs) * steps_per_epoch(cfg, train_dl)
    Schedule = CosineAnnealingScheduler if cycle_epochs else _CosineOverTheRun
    scheduler = Schedule(
        optimizer,
        "lr",
        start_value=start_value if start_value is not None else base_lr(cfg, optimizer),
        end_value=end_value,
        # ignite refuses a cycle shorter than 2 events
        cycle_size=max(cycle_size, 2),
        **kwargs,
    )
    return scheduler, "trainer", Events.ITERATION_STARTED


class _CosineOverTheRun(CosineAnnealingScheduler):
    """ignite's cosine, without the second cycle: a run trained past the schedule's end (its
    ``max_epochs`` raised on a resume) goes on at the floor instead of back at the peak."""

    def get_param(self) -> float:
        if self.cycle > 0:
            return self.end_value
        return super().get_param()
