"""The synthetic example's trainer, plus what the benchmarks read from inside a run: clocks at
epoch ends, and on request the first iteration's wall clock or the loop's host reads."""

import os
import sys
import time
import warnings
from collections import Counter

import ignite.distributed as idist
import torch
from ignite.engine import Events

from bench import common
from examples.synthetic.trainer.synthetic_trainer import Trainer as SyntheticTrainer

# What tests/test_loop_checks.py counts as a read: each waits for the device's queued work.
READS = ("item", "tolist", "__bool__", "__float__", "cpu")
# The optimizer's step counters and the loader's indices are no reads of the loop's results.
NOT_THE_LOOP = ("torch/optim/", "torch/utils/data/")


def _stamp(stamps):
    def handler(_engine):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        stamps.append(common.clock())

    return handler


class HostReads:
    """Reads (``Tensor.item`` and the like) or, with ``syncs``, the CUDA synchronisations that
    ``torch.cuda.set_sync_debug_mode("warn")`` reports, from the end of the warm-up on: inside
    an iteration (its step and handlers) or between iterations (epoch starts and ends)."""

    def __init__(self, syncs):
        self.where = None  # None while not counting: the warm-up epoch, the final loss
        self.counts = {"iteration": 0, "between": 0, "iterations": 0, "epochs": 0}
        self.sources = Counter()
        if syncs:
            torch.cuda.set_sync_debug_mode("warn")
            warnings.simplefilter("always")
            warnings.showwarning = self._warned(warnings.showwarning)
        else:
            for name in READS:
                setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name), name))

    def attach(self, engine) -> None:
        """Last on each event, so an iteration's own handlers count as inside it."""
        on = engine.add_event_handler
        on(Events.ITERATION_STARTED, lambda _: self._move("iteration", "iterations"))
        on(Events.ITERATION_COMPLETED, lambda _: self._move("between"))
        on(Events.EPOCH_COMPLETED, lambda _: self._move("between", "epochs"))
        # After the epoch tally, so the warm-up epoch is not counted.
        on(
            Events.EPOCH_COMPLETED(once=common.WARMUP_EPOCHS),
            lambda _: setattr(self, "where", "between"),
        )
        on(Events.COMPLETED, lambda _: setattr(self, "where", None))

    def report(self) -> dict:
        return {**self.counts, "sources": self.sources.most_common(4)}

    def _move(self, where, tally=None):
        if self.where:
            self.where = where
            if tally:
                self.counts[tally] += 1

    def _hit(self, filename, line, what):
        if self.where and not any(part in filename for part in NOT_THE_LOOP):
            self.counts[self.where] += 1
            self.sources["/".join(filename.split(os.sep)[-2:]) + f":{line} {what}"] += 1

    def _counted(self, original, name):
        def read(tensor, *args, **kwargs):
            caller = sys._getframe(1)
            self._hit(caller.f_code.co_filename, caller.f_lineno, name)
            return original(tensor, *args, **kwargs)

        return read

    def _warned(self, show):
        def count_or_show(message, category, filename, line, *args, **kwargs):
            if "synchroniz" in str(message):
                self._hit(filename, line, "sync")
            else:
                show(message, category, filename, line, *args, **kwargs)

        return count_or_show


class Trainer(SyntheticTrainer):
    """Records ``(wall, cpu)`` at every training epoch's end, and the final loss."""

    def __init__(self, local_rank, cfg):
        # Spawned DDP ranks start with torch's default thread count.
        torch.set_num_threads(1)
        super().__init__(local_rank, cfg)
        self.record = {"train": [], "first_iteration": None}
        counting = os.environ.get(common.COUNT_ENV)
        self.host_reads = HostReads(syncs=counting == "syncs") if counting else None

    def attach_progress(self):
        super().attach_progress()
        trainer = self.engines["trainer"]
        # Registered last, so an epoch's evaluation and checkpoints fall inside its stamp.
        trainer.add_event_handler(Events.EPOCH_COMPLETED, _stamp(self.record["train"]))
        if os.environ.get(common.FIRST_ITERATION_ENV):
            # Only when asked, and gone after it: a once=1 filter would still run every time.
            trainer.add_event_handler(Events.ITERATION_STARTED, self._first_iteration)
        if self.host_reads is not None:
            self.host_reads.attach(trainer)
        if os.environ.get(common.BOUNDARY_ENV):
            self._time_boundaries(trainer)

    def _time_boundaries(self, trainer):
        """CPU from each epoch's last step to the next one's first (what the epoch's end and
        the next start cost), and the end of the last step, for the run's end."""
        self.record["boundaries"] = []

        def started(engine):
            if engine.state.iteration % engine.state.epoch_length == 1 and self._last_end:
                self.record["boundaries"].append(time.process_time() - self._last_end)

        def ended(_engine):
            self._last_end = self.record["last_step_end"] = time.process_time()

        self._last_end = None
        # Last on both events: the step and every handler of it lie between the two stamps.
        trainer.add_event_handler(Events.ITERATION_STARTED, started)
        trainer.add_event_handler(Events.ITERATION_COMPLETED, ended)

    def _first_iteration(self, engine):
        engine.remove_event_handler(self._first_iteration, Events.ITERATION_STARTED)
        # The wall clock, which the process that started this one can compare with its own,
        # and this process's CPU time since it started.
        self.record["first_iteration"] = time.time()
        self.record["first_iteration_cpu"] = time.process_time()

    def fit(self):
        super().fit()
        self.finish_record()
        return self

    def finish_record(self):
        """Write the record (rank 0 only) with the final loss over the training samples."""
        if idist.get_rank() != 0 or not os.environ.get(common.RECORD_ENV):
            return
        self.record["record_started"] = time.process_time()
        if self.host_reads is not None:
            self.record["reads"] = self.host_reads.report()
        tensors = self.dls["train"].dataset.tensors
        # Unwrapped, since a DDP forward on rank 0 alone could wait for the other ranks; and
        # forward(), since a compiled model would recompile for this batch's shape.
        model = getattr(self.model, "module", self.model).eval()
        self.record["final_loss"] = common.final_loss(
            lambda x: model.forward(x=x)["logits"], tensors
        )
        self.record["record_cpu"] = time.process_time() - self.record["record_started"]
        common.write_record(self.record)
