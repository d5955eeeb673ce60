"""The sizes an exported artefact takes along each dynamic dimension, and the checks at them.

``torch.export`` gives each dynamic dimension a range (``range_constraints``), and keeps the
conditions the model's code imposed on it as guards the program checks on every call: a
pooled map must not come out 1 pixel wide, where broadcasting would change. Each dimension's
sizes, from 1 up to twice the traced size (at least 64, at most its bound), are put to those
guards on meta tensors, which computes nothing: a pt2 program takes the sizes from the smallest
its range and guards take, and a size inside the range that a guard refuses is named.

The range ``torch.export`` gives starts at 2 (it treats sizes 0 and 1 as special), yet a
program whose guards take 1 often computes the right thing there. So 1 is checked for real
against the eager model: a pt2 program that equals it there takes 1 as well; one that does not
keeps its range from 2, and a line says why. An ONNX graph keeps no guards at all: its card
states the sizes it was checked at, 1 included where it equals the eager model there.
"""

from typing import Callable, Optional

import torch
import torch.fx._pytree as fx_pytree

from gatle_ignite.export.failure import quiet_exporter
from gatle_ignite.export.shapes import BATCH, Axis, resized
from gatle_ignite.export.verify import Tolerance, check_against_eager, described

__all__ = ["check_sizes", "taken_text"]

# Sizes scanned on each dimension: up to twice the traced size, and at least this far.
_SCANNED = 64


def check_sizes(
    traced, inputs: dict, label: str, model, run: Callable, tolerance: Tolerance, guarded: bool
) -> list:
    """Check the artefact ``run`` computes (``label``) against the eager ``model``: on the
    example, on each dynamic dimension at another size in its range, and at 1. ``guarded``:
    the artefact is the pt2 program itself, whose guards refuse what it does not take.

    Returns ``[(what it ran on, {output key: max abs diff})]``; prints what each dimension
    takes."""
    for axis in traced.dims.axes:
        _read_guards(traced.module, inputs, axis)
        axis.checked = [axis.size]
    checks = _size_checks(traced, inputs)
    checked = check_against_eager(
        label, model, [(on, other) for on, other, *_ in checks], run, tolerance
    )
    for _on, _other, axis, size in checks[1:]:
        axis.checked.append(size)
    for axis in traced.dims.axes:
        if guarded and not axis.guards_take_one:
            continue
        at_one = _checked_at_one(axis, inputs, label, model, run, tolerance)
        if at_one is not None:
            checked.append(at_one)
            axis.checked.append(1)
            axis.low = 1 if guarded else axis.low
    _say(traced, guarded)
    return checked


def _on_meta(inputs):
    """``inputs`` with every tensor on the meta device: shapes without data."""
    if torch.is_tensor(inputs):
        return torch.empty(inputs.shape, dtype=inputs.dtype, device="meta")
    if isinstance(inputs, dict):
        return {key: _on_meta(value) for key, value in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(_on_meta(value) for value in inputs)
    return inputs


def _read_guards(module, inputs: dict, axis: Axis) -> None:
    """Set the axis's range to where the program's guards take its sizes, the other axes at
    the example's: ``low`` the smallest they take in ``torch.export``'s range, ``below`` the
    largest they refuse under it, ``refused`` those they refuse above it."""
    top = max(2 * axis.size, _SCANNED)
    top = min(top, axis.high) if axis.high is not None else top
    shapes = _on_meta(inputs)
    refusals = {
        size: _guard_refusal(module, resized(shapes, axis.positions, size))
        for size in range(1, top + 1)
    }
    axis.guards_take_one = refusals[1] is None
    taken = [size for size in range(axis.low, top + 1) if refusals[size] is None]
    if not taken:
        return
    axis.low = taken[0]
    under = [size for size in range(1, axis.low) if refusals[size] is not None]
    if under:
        axis.below = (under[-1], refusals[under[-1]])
    axis.refused = [(size, refusals[size]) for size in range(axis.low, top + 1) if refusals[size]]


def _guard_refusal(module, inputs: dict) -> Optional[str]:
    """The guard the program refuses ``inputs`` (meta tensors) with, None when it takes them:
    its guard function alone where it has one (microseconds), else a call that fails at its
    first operator once the guards have passed."""
    guards = getattr(module, "_guards_fn", None)
    if guards is None:
        return _refusal(module, inputs)
    try:
        guards(*fx_pytree.tree_flatten_spec(((), inputs), module._in_spec))
    except Exception as error:
        return next(iter(str(error).splitlines()), type(error).__name__)
    return None


def _refusal(module, inputs: dict) -> Optional[str]:
    """The guard the program fails on ``inputs``; None when they pass (the run may then fail
    for another reason, which a check reports)."""
    try:
        with quiet_exporter(), torch.no_grad():
            module(**inputs)
    except Exception as error:
        first = next(iter(str(error).splitlines()), "")
        return first if first.startswith("Guard failed") else None
    return None


def _size_checks(traced, inputs: dict) -> list:
    """``[(what it is, inputs, axis, size)]``: the example, then each dynamic axis at another
    size in its range that the guards take (half the example's, twice it, the bound). A size
    the program still refuses when run (a torch without guards to read) is said, and the next
    is tried."""
    checks = [(described(inputs), inputs, None, None)]
    for axis in traced.dims.axes:
        refused = {size for size, _why in axis.refused}
        for size in axis.other_sizes():
            if size in refused:
                continue
            other = resized(inputs, axis.positions, size)
            refusal = _refusal(traced.module, other)
            if refusal is None:
                checks.append((_described_at(axis, size, other), other, axis, size))
                break
            axis.refused.append((size, refusal))
    return checks


def _described_at(axis: Axis, size: int, inputs: dict) -> str:
    return described(inputs) if axis.batch else f"{axis.name} at {size}, {described(inputs)}"


def _checked_at_one(axis: Axis, inputs: dict, label, model, run, tolerance) -> Optional[tuple]:
    """The check at size 1, or None with ``axis.not_at_one`` saying why not: the eager model
    or the artefact failing there, or their outputs differing."""
    one = resized(inputs, axis.positions, 1)
    try:
        return check_against_eager(
            label, model, [(_described_at(axis, 1, one), one)], run, tolerance
        )[0]
    except Exception as error:
        axis.not_at_one = next(iter(str(error).splitlines()), type(error).__name__)
        print(f"NOT AT 1: {axis.name}: {axis.not_at_one}")
        return None


def _sizes_text(sizes: list) -> str:
    shown = [str(size) for size in sorted(set(sizes))]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def taken_text(axis: Axis, guarded: bool) -> str:
    """What the artefact takes along ``axis``: a pt2 program its range, an ONNX graph (which
    checks no sizes) the sizes it was checked at."""
    if guarded:
        return f"takes {axis.range_text()}"
    return f"checked at {_sizes_text(axis.checked)}"


def _say(traced, guarded: bool) -> None:
    """One line for the batch, each other dynamic axis, each bound and refusal, each dimension
    kept static."""
    dims = traced.dims
    for axis in dims.axes:
        if axis.batch:
            print(f"BATCH: dynamic (traced on {traced.rows} rows), {taken_text(axis, guarded)}")
        else:
            along = [f"{key} dim {dim}" for key, dim in axis.positions[1:]]
            with_ = f" (with {', '.join(along)})" if along else ""
            why = traced.marked.get(axis.positions[0], "")
            print(
                f"DYNAMIC: {axis.name}{with_}: traced at {axis.size}, "
                f"{taken_text(axis, guarded)} ({why})"
            )
        if axis.high is not None:
            print(f"BOUND: {axis.name} at most {axis.high}: {axis.bound}")
        if guarded and axis.below is not None:
            size, why = axis.below
            print(f"REFUSED: {axis.name} at {size} and below: the program's {why}")
        for size, why in axis.refused if guarded else ():
            print(f"REFUSED: {axis.name} at {size}, in its range: the program's {why}")
    if any(why == BATCH for *_position, why in dims.static) and not dims.batch_dynamic:
        print(f"BATCH: static, {traced.rows} rows: the model fixes the batch dimension")
    for key, dim, size, why in dims.fixed():
        print(f"STATIC: {key} dim {dim} stays {size}: the model fixes it ({why})")
