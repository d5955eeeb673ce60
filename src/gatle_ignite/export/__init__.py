"""Taking the trained model out of a run: its weights as safetensors, a ``torch.export`` program
(``.pt2``) or an ONNX graph, each loaded back and checked against the eager model before the
output directory appears.

``gatle_ignite.export.command.export_model`` is what ``gatle-ignite export`` runs. This package
is kept light: the command line reads the choices below without importing torch.
"""

__all__ = ["FORMATS", "PACKAGES", "WEIGHTS"]

FORMATS = ("safetensors", "pt2", "onnx")
# "eval": the weights evaluation saw (after the task's eval_context, e.g. an EMA swapped in);
# "raw": the model's own trained weights.
WEIGHTS = ("eval", "raw")
# The packages each format is written and checked with beyond torch: the `export` extra.
PACKAGES = {
    "safetensors": ("safetensors",),
    "pt2": (),
    "onnx": ("onnx", "onnxscript", "onnxruntime"),
}
