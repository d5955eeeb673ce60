"""Batch helpers: move nested batches to the run's device, and read values by key or path."""

import dataclasses
from collections.abc import Mapping

import ignite.distributed as idist
import torch

from gatle_ignite.dispatch import ConfigError

__all__ = ["get_value", "named_outputs", "to_device"]


def to_device(batch, device=None, non_blocking=True):
    """Move every tensor of a nested dict / list / tuple to ``device`` (the run's by default).

    Anything else (ints, strings, None, objects) is returned untouched.
    """
    if device is None:
        device = idist.device()
    elif not isinstance(device, torch.device):
        device = torch.device(device)
    return _move(batch, device, non_blocking)


def _move(value, device, non_blocking):
    if isinstance(value, torch.Tensor):
        # A tensor already there is returned as it is, without a dispatch through .to().
        if value.device == device:
            return value
        return value.to(device=device, non_blocking=non_blocking)
    if type(value) is dict:
        return {key: _move(item, device, non_blocking) for key, item in value.items()}
    if isinstance(value, Mapping):
        return type(value)({key: _move(item, device, non_blocking) for key, item in value.items()})
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_move(item, device, non_blocking) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_move(item, device, non_blocking) for item in value)
    return value


def get_value(container, name):
    """``container[name]``, or a walk along ``name`` when it is a tuple or list path.

    A dataclass (a model output as a library returns it) is read by its field names.
    """
    if isinstance(name, (tuple, list)):
        value = container
        for i, key in enumerate(name):
            try:
                value = _item(value, key)
            except (KeyError, TypeError) as error:
                walked = " -> ".join(str(k) for k in name[: i + 1])
                raise ConfigError(
                    f"could not resolve path {tuple(name)!r} at '{walked}': {error!r}"
                    f"{_what_is_there(value, name[:i])}{_prep_batch_hint(value, i, key)}"
                ) from error
        return value
    if isinstance(container, torch.Tensor) and isinstance(name, str):
        # Torch answers a string index with a warning and an IndexError, not a KeyError.
        raise ConfigError(_unresolved(container, name))
    try:
        return _item(container, name)
    except (KeyError, TypeError) as error:
        raise ConfigError(_unresolved(container, name)) from error


def _what_is_there(container, walked) -> str:
    """What the container the walk stopped in holds, to choose the right key from."""
    where = " -> ".join(str(k) for k in walked) or "the top"
    named = named_outputs(container)
    if named is not None:
        return f"; available at {where}: {list(named)}"
    if isinstance(container, (list, tuple)):
        return f"; at {where} is a {type(container).__name__} of {len(container)} item(s)"
    return f"; at {where} is an object of type {type(container).__name__}"


def _prep_batch_hint(container, step: int, key) -> str:
    """The fix when the first key of a path is missing from what prep_batch returned."""
    if step != 0 or not isinstance(container, Mapping) or "model_input" not in container:
        return ""
    return (
        f"\n  prep_batch returned no {key!r}: add it to the dict it returns, e.g. "
        f'{{"model_input": ..., "{key}": {{"labels": y}}}}, or point the path at a key it has.'
    )


def _is_record(value) -> bool:
    """A dataclass instance that is no mapping: read by attribute, not by subscript."""
    return (
        dataclasses.is_dataclass(value)
        and not isinstance(value, type)
        and not isinstance(value, Mapping)
    )


def named_outputs(value):
    """``{name: value}`` of a mapping or a dataclass (a ``transformers`` ``ModelOutput`` is
    both), in their order; None for anything else."""
    if isinstance(value, Mapping):
        return dict(value.items())
    if _is_record(value):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    return None


def _item(container, key):
    if _is_record(container) and isinstance(key, str):
        if key not in {field.name for field in dataclasses.fields(container)}:
            raise KeyError(key)
        return getattr(container, key)
    return container[key]


def _unresolved(container, name) -> str:
    if hasattr(container, "keys"):
        return f"could not resolve {name!r}; available: {list(container.keys())}"
    if _is_record(container):
        fields = [field.name for field in dataclasses.fields(container)]
        return f"could not resolve {name!r}; the {type(container).__name__} has {fields}"
    message = f"could not resolve {name!r}; available: {type(container)}"
    if not isinstance(name, str):
        return message
    shape = f" of shape {list(container.shape)}" if isinstance(container, torch.Tensor) else ""
    return (
        f"{message}{shape}, which has no names.\n"
        f"  A model's forward must return a dict of named outputs, e.g. {{{name!r}: ...}} (or "
        f"a dataclass, such as a transformers ModelOutput): losses and metrics read them by "
        f"name."
    )
