"""FLOPs of one training step, counted once on a real batch without changing the run.

The step is the task's own: ``prep_batch``, ``forward`` and ``loss_fn`` under the run's
autocast, then ``loss.backward()``, all under ``torch.utils.flop_counter.FlopCounterMode``.
It is an extra step, never the optimizer's: the weights, the optimizer state, the gradients,
the buffers (BatchNorm's running statistics) and every random stream are as they were before
it, so a run counts the same with or without it, and an exact resume stays exact.
"""

from torch.utils.flop_counter import FlopCounterMode

# Module names, looked up when the count runs: a test swaps one for a no-op to show it matters.
from gatle_ignite.trainer.side_step import modules_kept as _modules_kept
from gatle_ignite.trainer.side_step import random_streams_kept as _random_streams_kept
from gatle_ignite.trainer.side_step import without_ddp as _without_ddp

__all__ = ["count_step_flops"]


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
