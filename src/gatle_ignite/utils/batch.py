"""Batch helpers: move nested batches to the run's device, and read values by key or path."""

import ignite.distributed as idist
from ignite.utils import convert_tensor

from gatle_ignite.dispatch import ConfigError

__all__ = ["get_value", "to_device"]


def to_device(batch, device=None, non_blocking=True):
    """Move every tensor of a nested dict / list / tuple to ``device`` (the run's by default)."""
    return convert_tensor(batch, device=device or idist.device(), non_blocking=non_blocking)


def get_value(container, name):
    """``container[name]``, or a walk along ``name`` when it is a tuple or list path."""
    if isinstance(name, (tuple, list)):
        value = container
        for i, key in enumerate(name):
            try:
                value = value[key]
            except (KeyError, TypeError) as error:
                walked = " -> ".join(str(k) for k in name[: i + 1])
                raise ConfigError(
                    f"could not resolve path {tuple(name)!r} at '{walked}': {error!r}"
                ) from error
        return value
    try:
        return container[name]
    except (KeyError, TypeError) as error:
        available = list(container.keys()) if hasattr(container, "keys") else type(container)
        raise ConfigError(f"could not resolve {name!r}; available: {available}") from error
