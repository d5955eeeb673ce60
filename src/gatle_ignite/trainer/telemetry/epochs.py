"""Each training epoch's ``perf/`` record: where its time went, its throughput and memory.

Per iteration only the host clock is read, around the wait for the next batch
(``GET_BATCH_STARTED`` to ``GET_BATCH_COMPLETED``); evaluation and checkpoint writes are timed
around their calls; the device is asked nothing until the epoch's end, where peak memory is the
allocator's own counter. So telemetry adds no sync to a step.

An epoch's record is logged after its evaluation and its checkpoint, with the trainer's
iteration as its step like every other metric:

- ``perf/epoch_time_s``: the whole epoch, its evaluation and checkpoints included;
- ``perf/train_time_s``: its training iterations, without evaluation, checkpoint writes and
  the one-off FLOP count and trace writing;
- ``perf/data_wait_share``: the share of the training time spent waiting for the next batch;
- ``perf/eval_time_s``, ``perf/checkpoint_stall_s``: time in evaluations, and time the loop
  stood still for checkpoint writes (with ``async_save`` only the copy to host memory);
- ``perf/peak_memory_mb``, ``perf/samples_per_s``, ``perf/tokens_per_s``;
- ``perf/flops_per_step`` (with the first epoch), ``perf/achieved_tflops`` and ``perf/mfu``.

Under DDP the data-wait share and peak memory are the largest over the ranks (one all-reduce
per epoch); the times are rank 0's.
"""

import time
import warnings
from dataclasses import dataclass
from typing import Optional

import ignite.distributed as idist
import torch
from ignite.engine import Events

from gatle_ignite.run.storage import local_dir
from gatle_ignite.trainer.telemetry.devices import (
    peak_memory_mb,
    peak_tflops,
    precision_of,
    reset_peak_memory,
)
from gatle_ignite.trainer.telemetry.flops import count_step_flops
from gatle_ignite.trainer.telemetry.profiler import StepProfiler, profile_schedule
from gatle_ignite.trainer.telemetry.stopwatch import Stopwatch
from gatle_ignite.trainer.telemetry.threads import warn_if_oversubscribed

__all__ = ["Telemetry", "samples_per_batch"]


def samples_per_batch(cfg, loader) -> Optional[int]:
    """The total batch over every rank: ``bs``, else the loader's batch size times the ranks."""
    bs = cfg.get("train_ds_params", {}).get("bs")
    if bs:
        return bs
    batch_size = getattr(loader, "batch_size", None)
    return batch_size * idist.get_world_size() if batch_size else None


@dataclass
class _Epoch:
    """Clock readings at an epoch's start, and what its training loop took out of them."""

    started: float
    first_iteration: int
    checkpoints_before: float
    evaluation_before: float
    overhead_before: float
    loop_ended: float = 0.0
    last_iteration: int = 0
    # Spent inside the loop, so not training: mid-epoch checkpoints, evaluations, the FLOP
    # count and trace writing.
    not_training: float = 0.0


class Telemetry:
    """Clocks on the trainer and its eval engines, and the epoch's ``perf/`` record.

    ``attach_clocks`` goes before every other epoch-end handler, so the training time stops
    before anything evaluates or saves; ``attach_record`` goes after the checkpoint writes, so
    the record holds them.
    """

    def __init__(self, trainer):
        cfg = trainer.cfg
        self.trainer = trainer
        self.batch = samples_per_batch(cfg, trainer.dls.get("train"))
        info = trainer.infos.get("train") or {}
        self.tokens_per_sample = info.get("tokens_per_sample") if hasattr(info, "get") else None
        self.world_size = idist.get_world_size()
        # What the loop spent in checkpoint handlers; attach_checkpoints times them into it.
        self.checkpoints = getattr(trainer, "_checkpoint_time", None) or Stopwatch()
        self.evaluation = Stopwatch()
        # One-off work inside an epoch (the FLOP count, writing a trace) left out of its time.
        self.overhead = Stopwatch()
        self.flops = None
        self._count_flops = bool(cfg.get("count_flops", True))
        self._peak = peak_tflops(
            trainer.device, precision_of(trainer.dtype, trainer.autocast_enabled)
        )
        schedule = profile_schedule(cfg.get("profile", False))
        self.profiler = (
            StepProfiler(schedule, local_dir(cfg.save_dir), self.overhead)
            if schedule is not None
            else None
        )
        self._epoch = None
        self._fetching = 0.0
        self._data_wait = 0.0
        if idist.get_rank() == 0:
            warn_if_oversubscribed(idist.get_nproc_per_node())

    # ---- attaching ----

    def attach_clocks(self, engines) -> None:
        trainer = engines["trainer"]
        trainer.add_event_handler(Events.EPOCH_STARTED, self._start_epoch)
        trainer.add_event_handler(Events.GET_BATCH_STARTED, self._fetch_started)
        trainer.add_event_handler(Events.GET_BATCH_COMPLETED, self._fetch_completed)
        trainer.add_event_handler(Events.EPOCH_COMPLETED, self._end_loop)
        if self._count_flops:
            trainer.add_event_handler(Events.ITERATION_STARTED, self._count_once)
        for key, engine in engines.items():
            if key != "trainer" and engine is not None:
                engine.add_event_handler(Events.STARTED, self.evaluation.start)
                engine.add_event_handler(Events.COMPLETED, self.evaluation.stop)
        if self.profiler is not None:
            self.profiler.attach(trainer)

    def attach_record(self, trainer) -> None:
        trainer.add_event_handler(Events.EPOCH_COMPLETED, self._record)

    def close(self) -> None:
        """At the run's end, however it ends: stop a profiler still recording."""
        if self.profiler is not None:
            self.profiler.close()

    # ---- per iteration: host clock reads only ----

    def _fetch_started(self, _engine) -> None:
        self._fetching = time.perf_counter()

    def _fetch_completed(self, _engine) -> None:
        self._data_wait += time.perf_counter() - self._fetching

    # ---- per epoch ----

    def _start_epoch(self, engine) -> None:
        reset_peak_memory(self.trainer.device)
        self._data_wait = 0.0
        self._epoch = _Epoch(
            started=time.perf_counter(),
            first_iteration=engine.state.iteration,
            checkpoints_before=self.checkpoints.seconds,
            evaluation_before=self.evaluation.seconds,
            overhead_before=self.overhead.seconds,
        )

    def _end_loop(self, engine) -> None:
        epoch = self._epoch
        epoch.loop_ended = time.perf_counter()
        epoch.last_iteration = engine.state.iteration
        epoch.not_training = (
            self.checkpoints.seconds
            - epoch.checkpoints_before
            + self.evaluation.seconds
            - epoch.evaluation_before
            + self.overhead.seconds
            - epoch.overhead_before
        )

    def _count_once(self, engine) -> None:
        """The FLOP count, on the run's first batch, before its real step; then never again."""
        engine.remove_event_handler(self._count_once, Events.ITERATION_STARTED)
        with self.overhead:
            try:
                self.flops = count_step_flops(
                    self.trainer, engine.state.batch, engine.state.iteration
                )
            except Exception as error:
                warnings.warn(
                    f"FLOPs not counted, so no perf/achieved_tflops or perf/mfu: the counting "
                    f"step failed with {type(error).__name__}: {error}\n"
                    f"  Training is unaffected. Set count_flops = False to skip the count.",
                    stacklevel=1,
                )
            reset_peak_memory(self.trainer.device)

    def _record(self, engine) -> None:
        epoch = self._epoch
        if epoch is None or self.trainer._diverged:
            return
        now = time.perf_counter()
        train = max(epoch.loop_ended - epoch.started - epoch.not_training, 1e-9)
        iterations = epoch.last_iteration - epoch.first_iteration
        share, memory = self._largest_over_ranks(min(self._data_wait / train, 1.0))
        record = {
            "perf/epoch_time_s": now - epoch.started,
            "perf/train_time_s": train,
            "perf/data_wait_share": share,
            "perf/eval_time_s": self.evaluation.seconds - epoch.evaluation_before,
            "perf/checkpoint_stall_s": self.checkpoints.seconds - epoch.checkpoints_before,
        }
        if memory is not None:
            record["perf/peak_memory_mb"] = memory
        record.update(self._throughput(iterations, train, first=engine.state.epoch == 1))
        self.trainer._tell_logger(
            "log", record, step=engine.state.iteration, epoch=engine.state.epoch
        )

    def _largest_over_ranks(self, share: float) -> tuple:
        memory = peak_memory_mb(self.trainer.device)
        if self.world_size == 1:
            return share, memory
        values = torch.tensor([share, -1.0 if memory is None else memory], dtype=torch.float64)
        values = idist.all_reduce(values.to(idist.device()), op="MAX").tolist()
        return values[0], (None if values[1] < 0 else values[1])

    def _throughput(self, iterations: int, seconds: float, first: bool) -> dict:
        figures = {}
        if self.batch:
            samples_per_s = iterations * self.batch / seconds
            figures["perf/samples_per_s"] = samples_per_s
            if self.tokens_per_sample:
                figures["perf/tokens_per_s"] = samples_per_s * self.tokens_per_sample
        if self.flops:
            # Once, with the first epoch: a resumed run keeps the row its start logged.
            if first:
                figures["perf/flops_per_step"] = self.flops
            achieved = self.flops * iterations / seconds / 1e12
            figures["perf/achieved_tflops"] = achieved
            if self._peak:
                figures["perf/mfu"] = achieved / self._peak
        return figures
