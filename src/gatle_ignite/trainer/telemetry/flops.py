"""FLOPs of one training step, counted once on a real batch without changing the run.

The step is the task's own: ``prep_batch``, ``forward`` and ``loss_fn`` under the run's
autocast, then ``loss.backward()``, all under ``torch.utils.flop_counter.FlopCounterMode``.
It is an extra step, never the optimizer's: the weights, the optimizer state, the gradients,
the buffers (BatchNorm's running statistics) and every random stream are as they were before
it, so a run counts the same with or without it, and an exact resume stays exact.
"""

import contextlib
import random

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["count_step_flops"]


@contextlib.contextmanager
def _random_streams_kept(device: torch.device):
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
def _modules_kept(modules):
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
def _without_ddp(trainer):
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


def count_step_flops(trainer, batch, iteration: int) -> int:
    """FLOPs of forward and backward on ``batch``, on this rank (its share of the batch).

    Under FSDP every rank must call it at the same point: the step gathers and reduces shards.
    """
    with _random_streams_kept(trainer.device), _modules_kept([trainer.model, trainer.criterion]):
        with _without_ddp(trainer):
            trainer.model.train()
            with FlopCounterMode(display=False) as counter:
                x = trainer.prep_batch(batch, split="train")
                with trainer._autocast():
                    y_pred = trainer.forward(x["model_input"])
                    loss, _ = trainer.loss_fn(y_pred, x, iteration=iteration)
                loss.backward()
    return counter.get_total_flops()
