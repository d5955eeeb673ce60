"""Scheduler dispatch: build the configured LR scheduler and attach it to the engine it names."""

from collections.abc import Mapping
from typing import Any, Optional

from gatle_ignite.dispatch import ConfigError, call_with_params, import_entrypoint

__all__ = ["attach_scheduler", "prep_scheduler"]


def prep_scheduler(
    lr_scheduler: Optional[str], cfg: Any, train_dl: Any, optimizer: Any, engines: Mapping
) -> tuple[Any, str, Any]:
    """Call the ``get_scheduler`` that ``lr_scheduler`` names; None means no scheduling."""
    if lr_scheduler is None:
        return None, "trainer", None
    get_scheduler = import_entrypoint(lr_scheduler, "get_scheduler", field="lr_scheduler")
    params = dict(cfg.get("lr_scheduler_params", {}) or {})
    result = call_with_params(
        get_scheduler, params, "lr_scheduler_params", cfg, train_dl, optimizer, engines
    )
    if not isinstance(result, tuple) or len(result) != 3:
        raise ConfigError(
            f"{lr_scheduler}.get_scheduler must return (scheduler, engine_name, event_name), "
            f"got {result!r}"
        )
    return result


def attach_scheduler(scheduler: Any, engine_name: str, event_name: Any, engines: Mapping) -> Any:
    """Attach ``scheduler`` (or each of a list) to ``engines[engine_name]`` at ``event_name``."""
    if not scheduler:
        return scheduler
    if engine_name not in engines:
        raise ConfigError(
            f"scheduler engine_name must be one of {sorted(engines)}, got {engine_name!r}"
        )
    engine = engines[engine_name]
    if engine is None:
        raise ConfigError(
            f"the scheduler targets the {engine_name!r} engine, which was not built "
            f"(it has no dataset, or its cadence is 0).\n"
            f"  Configure that engine, or drive the scheduler from another one."
        )
    for single in scheduler if isinstance(scheduler, list) else [scheduler]:
        engine.add_event_handler(event_name, single)
    return scheduler
