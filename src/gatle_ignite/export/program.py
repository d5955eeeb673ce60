"""``torch.export`` of the model on the example inputs, shared by the pt2 and ONNX formats.

The model's forward takes the ``model_input`` keys as keyword arguments; what it returns comes
out of the program as plain dicts (a ``ModelOutput`` or another dataclass as a dict of its
fields), so the program loads without the model's code. The dimensions
:func:`~gatle_ignite.export.shapes.marked_dims` marks go to ``torch.export`` as ``Dim.AUTO``:
each is dynamic where the model allows it and static where the model fixes it, which one line
says. A dimension that indexes a position table (an embedding looked up at ``arange(length)``)
is bounded by the table's rows, and the program is exported again with that bound. When no
dynamic export can be taken at all, the example's static shapes are, and one line says why.
"""

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

import sympy
import torch
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind, TensorArgument
from torch.utils import _pytree

from gatle_ignite.export.failure import exporter_reason, failed_at, quiet_exporter
from gatle_ignite.export.shapes import BATCH, Axis, Dims, marked_dims, resized
from gatle_ignite.export.source import Source
from gatle_ignite.export.verify import described, flat_tensors
from gatle_ignite.utils.batch import named_outputs

__all__ = ["Traced", "exported_model", "size_checks", "trace"]

_aten = torch.ops.aten
# Operators an index passes through unchanged on its way from arange to an embedding.
_SAME_VALUES = {
    _aten.unsqueeze.default,
    _aten.view.default,
    _aten.reshape.default,
    _aten.expand.default,
    _aten.clone.default,
    _aten.contiguous.default,
    _aten.alias.default,
    _aten._to_copy.default,
    _aten.to.dtype,
    _aten.to.dtype_layout,
    _aten.to.device,
}
_ARANGES = {_aten.arange.default, _aten.arange.start, _aten.arange.start_step}


@dataclass
class Traced:
    program: ExportedProgram
    dims: Dims

    @property
    def dynamic(self) -> bool:
        return bool(self.dims.axes)


def _plain(value):
    """``value`` with every mapping and dataclass a dict of its set fields."""
    named = named_outputs(value)
    if named is not None:
        return {key: _plain(item) for key, item in named.items() if item is not None}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_plain(item) for item in value)
    return value


def _is_plain(value) -> bool:
    if type(value) is dict:
        return all(_is_plain(item) for item in value.values())
    if type(value) in (list, tuple):
        return all(_is_plain(item) for item in value)
    return not dataclasses.is_dataclass(value) and not isinstance(value, Mapping)


class _Holder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model


def _plain_outputs(model: torch.nn.Module) -> torch.nn.Module:
    """The model returning plain dicts where it returns a ModelOutput or a dataclass. Its
    forward carries the model's signature: torch.export names the inputs by it."""
    signature = inspect.signature(model.forward)

    def forward(self, *args, **kwargs):
        return _plain(self.model(*args, **kwargs))

    own = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = signature.replace(parameters=[own, *signature.parameters.values()])
    return type("PlainOutputs", (_Holder,), {"forward": forward})(model).eval()


def exported_model(model: torch.nn.Module, inputs: dict) -> torch.nn.Module:
    """The module to export: the model itself, or wrapped when its outputs are not plain."""
    with torch.no_grad():
        outputs = model(**inputs)
    return model if _is_plain(outputs) else _plain_outputs(model)


def _export(model, inputs: dict, dynamic_shapes=None) -> ExportedProgram:
    with quiet_exporter(), torch.no_grad():
        return torch.export.export(model, (), inputs, dynamic_shapes=dynamic_shapes, strict=False)


def _hints(value, marked: dict, bounds: dict, prefix: str = ""):
    """``dynamic_shapes`` mirroring ``value``: ``Dim.AUTO`` at every marked dimension."""
    if torch.is_tensor(value):
        key = prefix or "y_pred"
        hints = {
            dim: Dim.AUTO(max=bounds[(key, dim)]) if (key, dim) in bounds else Dim.AUTO
            for dim in range(value.dim())
            if (key, dim) in marked
        }
        return hints or None
    if isinstance(value, Mapping):
        return {k: _hints(v, marked, bounds, _join(prefix, k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_hints(v, marked, bounds, _join(prefix, i)) for i, v in enumerate(value))
    return None


def _join(prefix: str, name) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def _program_inputs(program: ExportedProgram) -> dict:
    """``{dotted key: fake tensor}`` of the program's inputs, their sizes symbolic or fixed."""
    nodes = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    leaves = [
        nodes[spec.arg.name].meta["val"]
        if isinstance(spec.arg, TensorArgument)
        else getattr(spec.arg, "value", None)
        for spec in program.graph_signature.input_specs
        if spec.kind == InputKind.USER_INPUT
    ]
    _args, kwargs = _pytree.tree_unflatten(leaves, program.call_spec.in_spec)
    return flat_tensors(kwargs)


def _read_dims(program: ExportedProgram, inputs: dict, marked: dict) -> tuple:
    """``(Dims, {symbol: Axis})``: the program's dynamic axes and the marked dimensions it
    made static."""
    example = flat_tensors(inputs)
    axes, static = {}, []
    for key, fake in _program_inputs(program).items():
        for dim, size in enumerate(fake.shape):
            symbol = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)
            if symbol.is_number:
                if (key, dim) in marked:
                    static.append((key, dim, int(symbol), marked[(key, dim)]))
                continue
            if not isinstance(symbol, sympy.Symbol):
                continue  # derived from another dimension (2 * length): it follows that one
            if symbol not in axes:
                valid = program.range_constraints[symbol]
                high = int(valid.upper) if valid.upper.is_Integer else None
                axes[symbol] = Axis([], example[key].shape[dim], int(valid.lower), high)
            axes[symbol].positions.append((key, dim))
            axes[symbol].batch |= marked.get((key, dim)) == BATCH
    return Dims(list(axes.values()), static), axes


def _arange_length(node) -> Optional[tuple]:
    """``(symbol, offset)`` when the index ``node`` is ``arange(symbol) + offset`` seen through
    reshapes and copies; else None."""
    offset = 0
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target in _SAME_VALUES:
            node = node.args[0]
        elif node.target in (_aten.add.Tensor, _aten.add.Scalar) and isinstance(node.args[1], int):
            offset += node.args[1]
            node = node.args[0]
        elif node.target in _ARANGES:
            ends = [arg for arg in node.args if isinstance(arg, torch.fx.Node)]
            if node.target is not _aten.arange.default and not isinstance(node.args[0], int):
                return None
            end = ends[0].meta.get("val") if len(ends) == 1 else None
            if isinstance(end, torch.SymInt) and isinstance(end.node.expr, sympy.Symbol):
                return end.node.expr, offset
            return None
        else:
            return None
    return None


def _table_bounds(program: ExportedProgram) -> dict:
    """``{symbol: (most, table)}``: a size that indexes a position table is at most its rows."""
    signature = program.graph_signature
    names = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
    bounds = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not _aten.embedding.default:
            continue
        table, index = node.args[:2]
        found = _arange_length(index)
        rows = table.meta["val"].shape[0]
        if found is None or not isinstance(rows, int):
            continue
        symbol, offset = found
        most = rows - offset
        if symbol not in bounds or most < bounds[symbol][0]:
            name = names.get(table.name, table.name).removeprefix("model.")
            bounds[symbol] = (most, f"the position table {name} has {rows} rows")
    return bounds


def _static(model, source: Source, stage: str) -> ExportedProgram:
    try:
        return _export(model, source.inputs)
    except Exception as error:
        raise failed_at(stage, error) from None


def trace(source: Source, stage: str = "torch.export") -> Traced:
    """The model exported on the example inputs, dynamic where it varies in use and the model
    allows it; a failure is reported as one at ``stage``."""
    model = exported_model(source.model, source.inputs)
    rows = source.rows
    marked = marked_dims(source.inputs, rows, source.varying, source.named)
    if not marked:
        if rows is not None and rows < 2:
            # torch specialises sizes 0 and 1, so a batch of one cannot stand for any batch.
            print("BATCH: static (the example batch has 1 row, which cannot be marked dynamic)")
        return Traced(_static(model, source, stage), Dims())
    try:
        program = _export(model, source.inputs, _hints(source.inputs, marked, {}))
    except Exception as error:  # any failure: the static export below says if it is real
        program = _static(model, source, stage)
        print(
            f"DYNAMIC: none, the example's shapes only: no export with dynamic dimensions "
            f"could be taken ({exporter_reason(error)})"
        )
        static = [(key, dim, _size(source, key, dim), why) for (key, dim), why in marked.items()]
        return Traced(program, Dims(static=static))
    dims, axes = _read_dims(program, source.inputs, marked)
    bounded = _bounded(axes, _table_bounds(program))
    if bounded:
        limits = {position: most for position, (most, _why) in bounded.items()}
        program = _export(model, source.inputs, _hints(source.inputs, marked, limits))
        dims, _axes = _read_dims(program, source.inputs, marked)
        for axis in dims.axes:
            reasons = [bounded[p][1] for p in axis.positions if p in bounded]
            axis.bound = reasons[0] if reasons else axis.bound
    for axis in dims.axes:
        if axis.high is not None and not axis.bound:
            axis.bound = "the model's code requires it (torch.export found the condition)"
    _say(dims, rows, marked)
    return Traced(program, dims)


def _size(source: Source, key: str, dim: int) -> int:
    return flat_tensors(source.inputs)[key].shape[dim]


def _bounded(axes: dict, bounds: dict) -> dict:
    """``{(key, dim): (most, why)}`` for the axes a table bounds below what the program takes."""
    bounded = {}
    for symbol, (most, why) in bounds.items():
        axis = axes.get(symbol)
        if axis is None or most < axis.size or (axis.high is not None and axis.high <= most):
            continue
        bounded.update({position: (most, why) for position in axis.positions})
    return bounded


def _say(dims: Dims, rows, marked: dict) -> None:
    """One line for the batch, each other dynamic axis, each bound, each dimension kept static."""
    for axis in dims.axes:
        if axis.batch:
            print(f"BATCH: dynamic (traced on {rows} rows)")
        else:
            along = [f"{key} dim {dim}" for key, dim in axis.positions[1:]]
            with_ = f" (with {', '.join(along)})" if along else ""
            why = marked.get(axis.positions[0], "")
            print(
                f"DYNAMIC: {axis.name}{with_}: traced at {axis.size}, takes {axis.range_text()}"
                f" ({why})"
            )
        if axis.high is not None:
            print(f"BOUND: {axis.name} at most {axis.high}: {axis.bound}")
    if any(why == BATCH for *_position, why in dims.static) and not dims.batch_dynamic:
        print(f"BATCH: static, {rows} rows: the model fixes the batch dimension")
    for key, dim, size, why in dims.fixed():
        print(f"STATIC: {key} dim {dim} stays {size}: the model fixes it ({why})")


def size_checks(traced: Traced, inputs: dict) -> list:
    """``[(what it is, inputs)]``: the example, then each dynamic axis at another size that the
    program takes. A size in the axis's range that its guards refuse (torch keeps a guard
    where a size of 1 would change how the model broadcasts) is said, and the next is tried."""
    checks = [(described(inputs), inputs)]
    module = traced.program.module() if traced.dims.axes else None
    for axis in traced.dims.axes:
        for size in axis.other_sizes():
            other = resized(inputs, axis.positions, size)
            refusal = _refusal(module, other)
            if refusal is None:
                on = (
                    described(other) if axis.batch else f"{axis.name} at {size}, {described(other)}"
                )
                checks.append((on, other))
                break
            axis.refused.append((size, refusal))
            print(f"REFUSED: {axis.name} at {size}, in its range: the program's {refusal}")
    return checks


def _refusal(module, inputs: dict) -> Optional[str]:
    """The guard the program fails on ``inputs``; None when it runs (or fails otherwise, which
    the check then reports)."""
    try:
        with quiet_exporter(), torch.no_grad():
            module(**inputs)
    except Exception as error:
        first = next(iter(str(error).splitlines()), "")
        return first if first.startswith("Guard failed") else None
    return None
