"""Reduce the lr when an evaluator metric stops improving."""

from collections.abc import Mapping
from typing import Any, Optional

from ignite.engine import Events
from ignite.handlers import ReduceLROnPlateauScheduler
from torch.optim.lr_scheduler import ReduceLROnPlateau

from gatle_ignite.dispatch import ConfigError

__all__ = ["PlateauScheduler", "check_config", "get_scheduler"]

# Where get_scheduler's **kwargs go, with the arguments each step gives the next itself: ignite's
# scheduler passes its own **kwargs on to torch's. The config check accepts their other keywords
# in lr_scheduler_params.
KWARGS_GO_TO = (
    (ReduceLROnPlateauScheduler, ("optimizer",)),
    (ReduceLROnPlateau, ("optimizer",)),
)


class PlateauScheduler(ReduceLROnPlateauScheduler):
    """ignite's plateau scheduler with a state dict that loads under ``weights_only=True``."""

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        # ignite stores a bound method on the torch scheduler; it cannot be unpickled safely,
        # and load_state_dict keeps the live one because it only updates the keys it is given.
        state["scheduler"].pop("_reduce_lr", None)
        return state


def get_scheduler(
    cfg: Any,
    train_dl: Any,
    optimizer: Any,
    engines: Mapping,
    metric_name: Optional[str] = None,
    mode: str = "min",
    factor: float = 0.1,
    patience: int = 10,
    **kwargs: Any,
):
    """Watch ``metric_name`` (default ``cfg.score_name``) after every evaluator run."""
    metric_name = _watched(cfg, metric_name)
    scheduler = PlateauScheduler(
        optimizer, metric_name=metric_name, mode=mode, factor=factor, patience=patience, **kwargs
    )
    return scheduler, "evaluator", Events.COMPLETED


def _watched(cfg: Any, metric_name: Optional[str]) -> str:
    metric_name = metric_name or cfg.get("score_name")
    if not metric_name:
        raise ConfigError(
            "plateau scheduler has no metric to watch.\n"
            "  Set lr_scheduler_params.metric_name or cfg.score_name to an evaluator metric, "
            "e.g. 'valid/acc' (eval steps compute no loss)."
        )
    return metric_name


def check_config(cfg: Any) -> None:
    """What building this scheduler would refuse, found from the config alone: no metric to
    watch, or no evaluator to follow."""
    _watched(cfg, (cfg.get("lr_scheduler_params", None) or {}).get("metric_name"))
    if not cfg.get("valid_ds_name", None) or not cfg.get("every_val", 0):
        raise ConfigError(
            "the plateau scheduler steps after each evaluator run, and this config builds no "
            "evaluator (valid_ds_name is unset, or every_val = 0).\n"
            "  Give it validation data and every_val >= 1, or choose another scheduler."
        )
