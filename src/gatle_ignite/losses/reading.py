"""How the built-in losses and metrics read their two sides from a step's output.

``src_name`` names the model's output: a key, a path (tuple) into it, or None for the output
itself. A model that returns one tensor (a ``timm`` or ``torchvision`` classifier) is read as
it is, whatever ``src_name`` says: it has no names to choose from. A dataclass output (a
``transformers`` ``ModelOutput``) is read by its field names.

``tgt_name`` names a value of ``prep_batch``'s dict: a key or a path. A bare key that is not at
its top is looked up in its ``"targets"``, so ``"labels"`` reads ``("targets", "labels")``.

A name that reads nothing is a config error naming the config field that holds it
(``criterion_params.src_name``, ``val_metrics.acc.params.tgt_name``): a built-in takes its
field from :func:`params_field`, which the framework enters while it builds it from the config.
"""

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any, Optional, Union

import torch

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.utils.batch import get_value

__all__ = ["Name", "current_field", "params_field", "read_prediction", "read_target"]

# A key, or a path of keys and indices.
Name = Union[str, int, tuple, list, None]

# The config field whose mapping the built-in being built takes its keywords from.
_FIELD = contextvars.ContextVar("gatle_params_field", default=None)


@contextlib.contextmanager
def params_field(field: str) -> Iterator[None]:
    """Built-ins made inside take ``field`` (``val_metrics.acc.params``) as where their
    ``src_name`` and ``tgt_name`` come from, for their error messages."""
    token = _FIELD.set(field)
    try:
        yield
    finally:
        _FIELD.reset(token)


def current_field(default: Optional[str] = None) -> Optional[str]:
    """The field :func:`params_field` names, else ``default``."""
    return _FIELD.get() or default


def read_prediction(y_pred: Any, src_name: Name, field: Optional[str] = None) -> Any:
    """The model output ``src_name`` names; ``field`` holds it in the config."""
    if src_name is None or isinstance(y_pred, torch.Tensor):
        return y_pred
    try:
        return get_value(y_pred, src_name)
    except ConfigError as error:
        key = _key(field, "src_name")
        fix = f"Set {key} to one of the model's output names."
        what = f"{key} = {src_name!r} names none of the model's outputs"
        raise _unread(error, what, fix) from None


def read_target(prepared: Any, tgt_name: Name, field: Optional[str] = None) -> Any:
    """The value of ``prep_batch``'s dict that ``tgt_name`` names; ``field`` holds it in the
    config."""
    targets = prepared.get("targets") if isinstance(prepared, Mapping) else None
    if isinstance(tgt_name, str) and isinstance(prepared, Mapping) and tgt_name not in prepared:
        if isinstance(targets, Mapping) and tgt_name in targets:
            return targets[tgt_name]
    try:
        return get_value(prepared, tgt_name)
    except ConfigError as error:
        key = _key(field, "tgt_name")
        held = f"; its 'targets' holds {list(targets)}" if isinstance(targets, Mapping) else ""
        shown = tgt_name if isinstance(tgt_name, str) else "labels"
        fix = (
            f"Return it from prep_batch, e.g. {{'model_input': ..., 'targets': {{{shown!r}: y}}}}, "
            f"or set {key} to a key it returns."
        )
        what = f"{key} = {tgt_name!r} names nothing prep_batch returned{held}"
        raise _unread(error, what, fix) from None


def _key(field: Optional[str], name: str) -> str:
    return f"{field}.{name}" if field else name


def _unread(error: ConfigError, what: str, fix: str) -> ConfigError:
    """``error`` (which says what was there) under ``what``, with ``fix`` unless it has one."""
    message = str(error)
    if "\n" not in message:
        message += f"\n  {fix}"
    return ConfigError(f"{what}: {message}")
