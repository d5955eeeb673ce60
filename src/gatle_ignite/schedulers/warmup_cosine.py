"""Linear warm-up to the base lr, then cosine annealing down to a floor, per iteration."""

from collections.abc import Mapping
from typing import Any

from ignite.engine import Events
from ignite.handlers import create_lr_scheduler_with_warmup
from torch.optim.lr_scheduler import CosineAnnealingLR

from gatle_ignite.schedulers._utils import base_lr, steps_per_epoch

__all__ = ["MIN_WARMUP_EVENTS", "get_scheduler"]

# ignite's warm-up helper rejects a warm-up of a single event.
MIN_WARMUP_EVENTS = 2

# Where get_scheduler's **kwargs go, with the arguments it gives there itself: the config
# check accepts the other keywords of ignite's create_lr_scheduler_with_warmup in
# lr_scheduler_params.
KWARGS_GO_TO = (
    (
        create_lr_scheduler_with_warmup,
        ("lr_scheduler", "warmup_start_value", "warmup_end_value", "warmup_duration"),
    ),
)


def get_scheduler(
    cfg: Any,
    train_dl: Any,
    optimizer: Any,
    engines: Mapping,
    warmup_epochs: float = 1,
    warmup_start_factor: float = 0.01,
    lr_scale_factor: float = 0.01,
    **kwargs: Any,
):
    """Warm up over ``warmup_epochs``, then anneal to ``lr * lr_scale_factor`` by the run's end,
    and stay there past it (a resume that raised ``max_epochs``)."""
    per_epoch = steps_per_epoch(cfg, train_dl)
    total = max(cfg.max_epochs * per_epoch, 1)
    lr = base_lr(cfg, optimizer)
    warmup = max(int(warmup_epochs * per_epoch), MIN_WARMUP_EVENTS)
    cosine = _CosineToTheFloor(
        optimizer, T_max=max(total - warmup, 1), eta_min=lr * lr_scale_factor
    )
    scheduler = create_lr_scheduler_with_warmup(
        cosine,
        warmup_start_value=lr * warmup_start_factor,
        warmup_end_value=lr,
        warmup_duration=warmup,
        **kwargs,
    )
    return scheduler, "trainer", Events.ITERATION_STARTED


class _CosineToTheFloor(CosineAnnealingLR):
    """torch's cosine, which climbs back up past ``T_max``; this one stays at ``eta_min``."""

    def get_lr(self) -> list:
        if self.last_epoch > self.T_max:
            return [self.eta_min for _ in self.optimizer.param_groups]
        return super().get_lr()
