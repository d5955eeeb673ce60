"""``--format onnx``: the model as an ONNX graph, ``model.onnx``.

The ``torch.export`` program of the example inputs goes through torch's dynamo ONNX exporter
(``torch.onnx.export(..., dynamo=True)``, which needs ``onnxscript``). Inputs and outputs are
named by their dotted keys (``x``, ``logits``, ``heads.a``). The graph is checked with
``onnx.checker`` and run in onnxruntime on the CPU; its outputs must be the eager model's within
``ONNX_FP32``, as onnxruntime's kernels are not torch's.
"""

from pathlib import Path

import torch

from gatle_ignite.export.card import Artefact
from gatle_ignite.export.failure import failed_at, quiet_exporter
from gatle_ignite.export.program import size_checks, trace
from gatle_ignite.export.source import Source
from gatle_ignite.export.verify import ONNX_FP32, check_against_eager, eager_outputs, flat_tensors

__all__ = ["FILE", "export_onnx"]

FILE = "model.onnx"


def export_onnx(source: Source, staging: Path) -> Artefact:
    """Write and check ``model.onnx`` in ``staging``; returns what the model card records."""
    import onnx
    import onnxruntime

    traced = trace(source, "torch.export (the ONNX exporter's first step)")
    input_names = list(flat_tensors(source.inputs))
    output_names = list(eager_outputs(source.model, source.inputs))
    path = staging / FILE
    try:
        with quiet_exporter():
            program = torch.onnx.export(
                traced.program,
                dynamo=True,
                input_names=input_names,
                output_names=output_names,
                verbose=False,
            )
            program.save(str(path))
    except Exception as error:
        raise failed_at("torch.onnx.export (dynamo=True)", error) from None
    try:
        onnx.checker.check_model(str(path))
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as error:
        raise failed_at(f"loading {FILE} (onnx.checker / onnxruntime)", error) from None
    fed = [entry.name for entry in session.get_inputs()]

    def run(inputs):
        tensors = flat_tensors(inputs)
        try:
            results = session.run(output_names, {name: tensors[name].numpy() for name in fed})
        except Exception as error:
            raise failed_at(f"running {FILE} in onnxruntime", error) from None
        return {name: torch.from_numpy(value) for name, value in zip(output_names, results)}

    checked = check_against_eager(
        FILE, source.model, size_checks(traced, source.inputs), run, ONNX_FP32
    )
    return Artefact(FILE, str(ONNX_FP32), checked, dims=traced.dims)
