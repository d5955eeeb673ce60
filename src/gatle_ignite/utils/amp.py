"""Mixed precision: which dtype autocast uses, probed from the run's device."""

import ignite.distributed as idist
import torch

from gatle_ignite.dispatch import ConfigError

__all__ = ["AMP_DTYPES", "autocast_device_type", "resolve_amp_dtype"]

AMP_DTYPES = ("auto", "bf16", "fp16", "fp32")


def resolve_amp_dtype(amp_dtype="auto"):
    """``(dtype, autocast_enabled)`` for ``cfg.amp_dtype``."""
    if amp_dtype not in AMP_DTYPES:
        raise ConfigError(f"amp_dtype must be one of {AMP_DTYPES}, got {amp_dtype!r}")
    on_cuda = idist.device().type == "cuda"
    if amp_dtype == "fp32":
        return torch.float32, False
    if amp_dtype == "bf16":
        return torch.bfloat16, True
    if amp_dtype == "fp16":
        if not on_cuda:
            raise ConfigError(
                "amp_dtype 'fp16' needs a GradScaler, which exists only on CUDA, and this run "
                "is not on a CUDA device.\n  Use amp_dtype = 'bf16' or 'auto'."
            )
        return torch.float16, True
    if on_cuda and torch.cuda.is_bf16_supported():
        return torch.bfloat16, True
    return torch.float32, False


def autocast_device_type() -> str:
    """The device type autocast runs on: the run's device."""
    return idist.device().type
