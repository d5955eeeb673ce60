"""The synthetic example's trainer, plus clocks read at epoch ends for the benchmarks."""

import os
import time

import ignite.distributed as idist
import torch
from ignite.engine import Events

from bench.common import FIRST_ITERATION_ENV, RECORD_ENV, clock, final_loss, write_record
from examples.synthetic.trainer.synthetic_trainer import Trainer as SyntheticTrainer


def _stamp(stamps):
    def handler(_engine):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        stamps.append(clock())

    return handler


class Trainer(SyntheticTrainer):
    """Records ``(wall, cpu)`` at every trainer and evaluator epoch end, and the final loss."""

    def __init__(self, local_rank, cfg):
        # Spawned DDP ranks start with torch's default thread count.
        torch.set_num_threads(1)
        super().__init__(local_rank, cfg)
        self.record = {"train": [], "eval_start": [], "eval_end": [], "first_iteration": None}

    def setup(self):
        if self._built:
            return self
        super().setup()
        evaluator = self.engines.get("evaluator")
        if evaluator is not None:
            evaluator.add_event_handler(Events.EPOCH_STARTED, _stamp(self.record["eval_start"]))
            evaluator.add_event_handler(Events.EPOCH_COMPLETED, _stamp(self.record["eval_end"]))
        return self

    def attach_progress(self):
        super().attach_progress()
        trainer = self.engines["trainer"]
        # Registered last, so an epoch's evaluation and checkpoints fall inside its stamp.
        trainer.add_event_handler(Events.EPOCH_COMPLETED, _stamp(self.record["train"]))
        if os.environ.get(FIRST_ITERATION_ENV):
            # Only when asked: a once=1 filter still runs on every iteration.
            trainer.add_event_handler(Events.ITERATION_STARTED(once=1), self._first_iteration)

    def _first_iteration(self, _engine):
        # The wall clock, which the process that started this one can compare with its own.
        self.record["first_iteration"] = time.time()

    def fit(self):
        super().fit()
        self.finish_record()
        return self

    def finish_record(self):
        """Write the record (rank 0 only) with the final loss over the training samples."""
        if idist.get_rank() != 0 or not os.environ.get(RECORD_ENV):
            return
        tensors = self.dls["train"].dataset.tensors
        # Unwrapped, since a DDP forward on rank 0 alone could wait for the other ranks; and
        # forward(), since a compiled model would recompile for this batch's shape.
        model = getattr(self.model, "module", self.model).eval()
        self.record["final_loss"] = final_loss(lambda x: model.forward(x=x)["logits"], tensors)
        write_record(self.record)
