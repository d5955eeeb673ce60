"""Why a checkpoint does not load into the model a config builds: the tensors that differ, and
the fields in which the config its run recorded (``run.json``) differs from this one."""

from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from gatle_ignite.run.identity import config_changes
from gatle_ignite.run.layout import MANIFEST_FILE
from gatle_ignite.run.manifest import Manifest

__all__ = ["misfit_message", "recorded_changes", "tensor_differences"]

# Names listed of the tensors only one side has; the rest are counted.
_LISTED = 5


def _shape(value) -> Optional[list]:
    shape = getattr(value, "shape", None)
    return list(shape) if shape is not None else None


def _some(names: list) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown if len(names) <= _LISTED else f"{shown} and {len(names) - _LISTED} more"


def tensor_differences(saved: Mapping, wanted: Mapping) -> list:
    """A line for each tensor whose shape differs, then for those only one side has."""
    lines = []
    for name in (name for name in wanted if name in saved):
        before, now = _shape(saved[name]), _shape(wanted[name])
        if before is not None and now is not None and before != now:
            lines.append(f"{name}: {before} in the checkpoint, {now} in this model")
    only_model = sorted(set(wanted) - set(saved))
    only_checkpoint = sorted(set(saved) - set(wanted))
    if only_model:
        lines.append(f"only in this model: {_some(only_model)}")
    if only_checkpoint:
        lines.append(f"only in the checkpoint: {_some(only_checkpoint)}")
    return lines


def recorded_changes(run_dir, payload: Mapping, defaults: Mapping) -> Optional[list]:
    """``[(field, recorded, now)]`` for each run-defining field in which the config recorded in
    ``run_dir``'s ``run.json`` differs from ``payload``; None when no readable one is there."""
    try:
        manifest = Manifest.read(run_dir)
    except ValueError:
        return None
    if manifest is None:
        return None
    return config_changes(manifest.config, payload, defaults)


def misfit_message(checkpoint, differences: list, changes: Optional[list]) -> str:
    """The whole explanation: which tensors differ, and what in the config differs from the
    config the run was trained with."""
    tensors = "\n".join(f"    {line}" for line in differences)
    record = Path(checkpoint).parent / MANIFEST_FILE
    if changes is None:
        cause = (
            f"  There is no readable {record} recording the config it was trained with: build "
            f"the model as that run did."
        )
    elif not changes:
        cause = (
            f"  {record} records the same config as this one: the model's code has changed "
            f"since that run trained."
        )
    else:
        fields = "\n".join(
            f"    {name}: {before!r} there, {now!r} here" for name, before, now in changes
        )
        cause = (
            f"  The config {record} records differs from this one in:\n{fields}\n"
            f"  Evaluate with the config the run was trained with (those fields as it has them)."
        )
    return f"{checkpoint} does not fit the model this config builds:\n{tensors}\n{cause}"
