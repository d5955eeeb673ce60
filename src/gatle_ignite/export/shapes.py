"""Which input dimensions an export makes dynamic, and the inputs of other sizes that check them.

A dimension is marked when it varies in use: the batch (dimension 0 of every input whose first
dimension is the example's row count), each dimension whose size differs between the batches
sampled from the evaluation split, and each one the config names (``export_params["dynamic"]``
or ``--dynamic KEY=DIM,...``). A dimension marked for one input brings along every input
dimension of the same size (``attention_mask`` with ``input_ids``), as the model usually
relates them. ``torch.export`` then decides: a marked dimension the model fixes stays static.

Another size of a dimension is made from the example batch: a smaller one takes the first
entries along it, a larger one repeats the example along it.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

import torch

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.export.verify import flat_tensors

__all__ = [
    "BATCH",
    "Axis",
    "Dims",
    "marked_dims",
    "named_dims",
    "parse_dynamic",
    "resized",
    "varying_dims",
]

BATCH = "the batch"
# Why a dimension is marked when another of its size was: a guess, not worth a line if wrong.
_BROUGHT_ALONG = "its size is that of"
# torch specialises sizes 0 and 1: a dimension that small cannot stand for any size.
_SMALLEST_DYNAMIC = 2


@dataclass
class Axis:
    """One dynamic size of the exported program, shared by every input dimension it sizes."""

    # (input key, dimension) pairs whose size is this axis, the first one naming it.
    positions: list
    # The size the example batch has, and the range the program takes.
    size: int
    low: int
    high: Optional[int]
    # Why ``high`` is what it is, when there is a bound.
    bound: str = ""
    batch: bool = False
    # [(size, why)]: sizes in the range that the program's guards refused when checked.
    refused: list = field(default_factory=list)

    @property
    def name(self) -> str:
        if self.batch:
            return "batch"
        key, dim = self.positions[0]
        return f"{key} dim {dim}"

    def range_text(self) -> str:
        if self.high is None:
            return f"{self.low} and up"
        return f"{self.low} to {self.high}"

    def other_sizes(self) -> list:
        """Sizes to check the program at besides the example's, in order of preference: half
        the example's, twice it, the bound."""
        low = max(self.low, _SMALLEST_DYNAMIC)
        sizes = []
        for size in (self.size // 2, self.size * 2, self.high):
            fits = size is not None and size >= low and (self.high is None or size <= self.high)
            if fits and size not in (self.size, *sizes):
                sizes.append(size)
        return sizes


@dataclass
class Dims:
    """What the exported program takes: its dynamic axes, and the marked dimensions the model
    fixed (``(key, dim, size, why it was marked)``)."""

    axes: list = field(default_factory=list)
    static: list = field(default_factory=list)

    @property
    def batch_dynamic(self) -> bool:
        return any(axis.batch for axis in self.axes)

    def fixed(self) -> list:
        """The static entries worth telling: marked for a reason of their own, not the batch."""
        return [entry for entry in self.static if entry[3] != BATCH and not _brought(entry[3])]


def parse_dynamic(text: str) -> tuple:
    """``"input_ids=0,1"`` as ``("input_ids", [0, 1])``; a ValueError says what is wrong."""
    key, sep, dims = text.partition("=")
    parts = [part.strip() for part in dims.split(",")]
    if not sep or not key.strip() or not all(_is_dim(part) for part in parts):
        raise ValueError(f"{text!r} is not KEY=DIM[,DIM...], e.g. input_ids=0,1")
    return key.strip(), [int(part) for part in parts]


def _is_dim(part: str) -> bool:
    return part.lstrip("-").isdigit()


def named_dims(export_params, flags) -> dict:
    """``{key: [(dim, who named it)]}`` from ``export_params["dynamic"]`` and ``--dynamic``."""
    named = {}
    dynamic = (export_params or {}).get("dynamic") or {}
    for key, dims in dynamic.items():
        named.setdefault(key, []).extend((dim, "export_params") for dim in dims)
    for key, dims in flags or ():
        named.setdefault(key, []).extend((dim, "--dynamic") for dim in dims)
    return named


def varying_dims(batches: list) -> dict:
    """``{key: {dim}}``: the dimensions whose size differs between ``batches``."""
    shapes = [{k: tuple(t.shape) for k, t in flat_tensors(b).items()} for b in batches]
    varying = {}
    for key, shape in shapes[0].items():
        others = [other[key] for other in shapes[1:] if len(other.get(key, ())) == len(shape)]
        dims = {d for d in range(len(shape)) if any(o[d] != shape[d] for o in others)}
        if dims:
            varying[key] = dims
    return varying


def marked_dims(inputs: dict, rows: Optional[int], varying: dict, named: dict) -> dict:
    """``{(key, dim): why}`` for every input dimension to make dynamic."""
    tensors = flat_tensors(inputs)
    marked = {}
    if rows is not None and rows >= _SMALLEST_DYNAMIC:
        for key, tensor in tensors.items():
            if tensor.dim() > 0 and tensor.shape[0] == rows:
                marked[(key, 0)] = BATCH
    for key, dims in varying.items():
        for dim in dims:
            marked.setdefault((key, dim), "it varies between the sampled batches")
    for key, entries in named.items():
        for dim, who in entries:
            marked.setdefault(_checked_position(tensors, key, dim, who), f"named by {who}")
    for (key, dim), why in list(marked.items()):
        if why == BATCH:
            continue
        size = tensors[key].shape[dim]
        if size < _SMALLEST_DYNAMIC:
            continue
        for other, tensor in tensors.items():
            for d, other_size in enumerate(tensor.shape):
                if other_size == size and (other, d) not in marked:
                    marked[(other, d)] = f"{_BROUGHT_ALONG} {key} dim {dim}"
    return marked


def _brought(why: str) -> bool:
    return why.startswith(_BROUGHT_ALONG)


def _checked_position(tensors: dict, key: str, dim: int, who: str) -> tuple:
    """``(key, dim)`` with ``dim`` made non-negative; a config error names what exists."""
    shapes = ", ".join(f"{k} {list(t.shape)}" for k, t in tensors.items())
    if key not in tensors:
        raise ConfigError(
            f"{who} names the input {key!r}, which model_input does not hold.\n"
            f"  model_input's tensors: {shapes}."
        )
    rank = tensors[key].dim()
    if not -rank <= dim < rank:
        raise ConfigError(
            f"{who} names dimension {dim} of {key!r}, which has {rank} "
            f"({list(tensors[key].shape)}).\n  model_input's tensors: {shapes}."
        )
    return key, dim % rank


def resized(inputs, positions: list, size: int, prefix: str = ""):
    """``inputs`` with each tensor dimension at ``positions`` made ``size`` long."""
    if torch.is_tensor(inputs):
        for key, dim in positions:
            if key == (prefix or "y_pred"):
                inputs = _resize(inputs, dim, size)
        return inputs
    if isinstance(inputs, Mapping):
        return {k: resized(v, positions, size, _join(prefix, k)) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(
            resized(v, positions, size, _join(prefix, i)) for i, v in enumerate(inputs)
        )
    return inputs


def _join(prefix: str, name) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def _resize(tensor: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    have = tensor.shape[dim]
    if size > have:
        repeats = [1] * tensor.dim()
        repeats[dim] = -(-size // have)
        tensor = tensor.repeat(*repeats)
    return tensor.narrow(dim, 0, size)
