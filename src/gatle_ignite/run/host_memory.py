"""Copies of a checkpoint's state in host memory, for writes that run behind training."""

import torch

__all__ = ["host_copy"]


def host_copy(value, into=None):
    """``value`` with every tensor copied to host memory, so training may change the original.

    Where ``into`` (an earlier copy of the same structure) has a tensor of the same shape and
    dtype, the values are copied into it: allocating fresh host memory is most of a copy's cost.
    """
    if isinstance(value, torch.Tensor):
        reusable = isinstance(into, torch.Tensor) and into.shape == value.shape
        if reusable and into.dtype == value.dtype and into.device.type == "cpu":
            return into.copy_(value.detach())
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        into = into if isinstance(into, dict) else {}
        return {key: host_copy(item, into.get(key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        into = into if isinstance(into, type(value)) and len(into) == len(value) else ()
        return type(value)(
            host_copy(item, into[i] if into else None) for i, item in enumerate(value)
        )
    return value
