"""The read-back check: what the exported artefact computes against what the eager model does.

Outputs are compared key by key (nested outputs under dotted keys, as ``predict`` writes them);
each key's largest absolute difference is printed, and one beyond the tolerance fails the export.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.utils.batch import named_outputs

__all__ = [
    "EXACT",
    "ONNX_FP32",
    "Tolerance",
    "check_against_eager",
    "check_outputs",
    "described",
    "eager_outputs",
    "flat_tensors",
    "rows_of",
]


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def __str__(self) -> str:
        if self.atol == 0 and self.rtol == 0:
            return "exactly"
        return f"within atol {self.atol:g}, rtol {self.rtol:g}"


EXACT = Tolerance(0.0, 0.0)
# onnxruntime's kernels are not torch's: float32 sums in another order differ in the last bits.
ONNX_FP32 = Tolerance(1e-4, 1e-3)


def flat_tensors(value, prefix: str = "") -> dict:
    """``{dotted key: tensor}`` from nested mappings, dataclasses (a ``ModelOutput``), lists and
    tuples, in their order.

    The order is torch's own flattening order (a dict's insertion order), which the exported
    programs keep. Non-tensor leaves are left out: exporters bake them in as constants.
    """
    if torch.is_tensor(value):
        return {prefix or "y_pred": value}
    named = named_outputs(value)
    if named is not None:
        items = named.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return {}
    flat = {}
    for name, item in items:
        flat.update(flat_tensors(item, f"{prefix}.{name}" if prefix else str(name)))
    return flat


def rows_of(inputs: dict) -> Optional[int]:
    """The batch size: the first dimension of the first input tensor; None without one."""
    for tensor in flat_tensors(inputs).values():
        if tensor.dim() > 0:
            return tensor.shape[0]
    return None


def _max_difference(expected: torch.Tensor, got: torch.Tensor) -> float:
    if expected.numel() == 0:
        return 0.0
    expected, got = expected.double(), got.double()
    difference = (got - expected).abs()
    # Equal infinities and NaNs in the same places are equal outputs.
    same = (got == expected) | (got.isnan() & expected.isnan())
    return float(torch.where(same, torch.zeros_like(difference), difference).max())


def _within(expected: torch.Tensor, got: torch.Tensor, tolerance: Tolerance) -> bool:
    if not (expected.is_floating_point() or expected.is_complex()):
        return torch.equal(expected, got.to(expected.dtype))
    return torch.allclose(
        got.to(expected.dtype), expected, atol=tolerance.atol, rtol=tolerance.rtol, equal_nan=True
    )


def check_outputs(label: str, expected: dict, got: dict, tolerance: Tolerance, on: str) -> dict:
    """Refuse ``got`` unless it holds every key of ``expected`` with its values; print and
    return each key's largest difference."""
    missing = [key for key in expected if key not in got]
    if missing or len(got) != len(expected):
        raise ConfigError(
            f"export check failed ({label}): the outputs are {list(got)}, the eager model's "
            f"{list(expected)}."
        )
    differences, failed = {}, []
    for key, want in expected.items():
        have = got[key].detach().cpu()
        if tuple(have.shape) != tuple(want.shape):
            raise ConfigError(
                f"export check failed ({label}): output {key!r} has shape {list(have.shape)}, "
                f"the eager model's {list(want.shape)}."
            )
        difference = differences[key] = _max_difference(want, have)
        if not _within(want, have, tolerance):
            failed.append(f"{key!r} (max abs diff {difference:.3g})")
    if failed:
        raise ConfigError(
            f"export check failed ({label}) on {on}: {', '.join(failed)} not equal to the "
            f"eager model's {tolerance}."
        )
    print(f"CHECKED {label} on {on}: every output equals the eager model's {tolerance}")
    for key, difference in differences.items():
        print(f"  {key}: max abs diff {difference:.3g}")
    return differences


def eager_outputs(model, inputs: dict) -> dict:
    """The eager model's outputs on ``inputs``, flattened."""
    with torch.no_grad():
        return flat_tensors(model(**inputs))


def described(inputs: dict) -> str:
    """How a check names the inputs it ran on: the batch's row count."""
    rows = rows_of(inputs)
    return f"a batch of {rows}" if rows is not None else "the example inputs"


def check_against_eager(
    label: str, model, checks: list, run: Callable, tolerance: Tolerance
) -> list:
    """Check ``run(inputs)`` (the exported artefact, outputs flattened) against the eager
    ``model`` on each of ``checks``, ``[(what it is, inputs)]``.

    Returns ``[(what it is, {key: max abs diff})]``, one per check."""
    checked = []
    for on, inputs in checks:
        with torch.no_grad():
            got = run(inputs)
        expected = eager_outputs(model, inputs)
        checked.append((on, check_outputs(label, expected, got, tolerance, on)))
    return checked
