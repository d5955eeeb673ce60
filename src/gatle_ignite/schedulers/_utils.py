"""Helpers shared by the built-in schedulers."""

from typing import Any

from gatle_ignite.dispatch import ConfigError

__all__ = ["base_lr", "steps_per_epoch"]


def steps_per_epoch(cfg: Any, train_dl: Any) -> int:
    """Iterations per training epoch: ``cfg.train_length`` when set, else the loader's length."""
    return cfg.get("train_length") or len(train_dl)


def base_lr(cfg: Any, optimizer: Any) -> float:
    """The configured ``optimizer_params.lr``, else the optimizer's first param group's lr."""
    params = cfg.get("optimizer_params") or {}
    if params.get("lr") is not None:
        return params["lr"]
    if not optimizer.param_groups:
        raise ConfigError(
            "cannot determine a base learning rate: optimizer has no param groups\n"
            "  Set cfg.optimizer_params.lr, or return an optimizer that has param groups."
        )
    return optimizer.param_groups[0]["lr"]
