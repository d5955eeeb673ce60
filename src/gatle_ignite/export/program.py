"""``torch.export`` of the model on the example inputs, shared by the pt2 and ONNX formats.

The model's forward takes the ``model_input`` keys as keyword arguments and returns a dict;
both go through ``torch.export`` as they are. Every input tensor whose first dimension is the
batch's gets one shared dynamic dimension, ``batch``; when the model pins it (a reshape to a
fixed size, say), the program is exported again with the example's static batch, and that is
said on one line.
"""

from dataclasses import dataclass

import torch
from torch.export import Dim, ExportedProgram

from gatle_ignite.export.failure import exporter_reason, failed_at, quiet_exporter
from gatle_ignite.export.source import Source

__all__ = ["Traced", "trace"]


@dataclass
class Traced:
    program: ExportedProgram
    # Whether the batch dimension is dynamic in the program.
    dynamic: bool


def _batch_shapes(value, rows: int, batch: Dim):
    """``dynamic_shapes`` mirroring ``value``: ``{0: batch}`` for every tensor of ``rows``."""
    if torch.is_tensor(value):
        return {0: batch} if value.dim() > 0 and value.shape[0] == rows else None
    if isinstance(value, dict):
        return {key: _batch_shapes(item, rows, batch) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_batch_shapes(item, rows, batch) for item in value)
    return None


def _export(model, inputs: dict, dynamic_shapes=None) -> ExportedProgram:
    with quiet_exporter(), torch.no_grad():
        return torch.export.export(model, (), inputs, dynamic_shapes=dynamic_shapes, strict=False)


def trace(source: Source, stage: str = "torch.export") -> Traced:
    """The model exported on the example inputs, with a dynamic batch where it allows one;
    a failure is reported as one at ``stage``."""
    rows = source.rows
    if rows < 2:
        # torch specialises sizes 0 and 1, so a batch of one cannot stand for any batch.
        print("BATCH: static (the example batch has 1 row, which cannot be marked dynamic)")
    else:
        shapes = _batch_shapes(source.inputs, rows, Dim("batch"))
        try:
            program = _export(source.model, source.inputs, shapes)
        except Exception as error:  # any failure: the static export below says if it is real
            why = exporter_reason(error)
        else:
            print(f"BATCH: dynamic (traced on {rows} rows)")
            return Traced(program, dynamic=True)
    try:
        program = _export(source.model, source.inputs)
    except Exception as error:
        raise failed_at(stage, error) from None
    if rows >= 2:
        print(f"BATCH: static, {rows} rows: the batch dimension cannot be dynamic ({why})")
    return Traced(program, dynamic=False)
