"""A step taken beside the run (the FLOP count, the model's graph) that leaves it as it was:
the random streams, each module's gradients, buffers and train/eval mode, and DDP's gradient
all-reduce untouched, so a run is the same with or without it and an exact resume stays exact.
"""

import contextlib
import random

import numpy as np
import torch

__all__ = ["modules_kept", "random_streams_kept", "without_ddp"]


@contextlib.contextmanager
def random_streams_kept(device: torch.device):
    """Python's, NumPy's and torch's generators (the device's too) as they were, after."""
    python, numpy = random.getstate(), np.random.get_state()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


@contextlib.contextmanager
def modules_kept(modules):
    """Each module's gradients, buffers and train/eval mode as they were, after."""
    modules = [m for m in modules if isinstance(m, torch.nn.Module)]
    grads = [(p, p.grad) for m in modules for p in m.parameters()]
    buffers = [(b, b.detach().clone()) for m in modules for b in m.buffers()]
    modes = [(m, m.training) for m in modules]
    for parameter, _grad in grads:
        parameter.grad = None
    try:
        yield
    finally:
        for parameter, grad in grads:
            parameter.grad = grad
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        for module, training in modes:
            module.train(training)


@contextlib.contextmanager
def without_ddp(trainer):
    """``trainer.model`` unwrapped from DDP meanwhile, so the step makes no gradient all-reduce.

    DDP's gradient hooks do nothing after a forward that did not pass through DDP.
    """
    wrapped = trainer.model
    if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
        trainer.model = wrapped.module
    try:
        yield
    finally:
        trainer.model = wrapped
