"""What BaseTrainer attaches to its engines: the non-finite check, loss averages and the
preemption stop (progress output is in ``progress``).

The check and the averages keep each step's losses on the device and read them only every
``check_every`` iterations: a read from the device (``item()``, ``float()``) waits for every
queued kernel, so a read per step would stop the host from queueing the next one.
"""

import gc
import math
import numbers
import signal
import warnings
import weakref
from typing import Optional

import ignite.distributed as idist
import torch
from ignite.engine import Events
from ignite.metrics import Average
from ignite.metrics.metric import EpochWise

from gatle_ignite.trainer.preemption import REQUEST as PREEMPTION
from gatle_ignite.trainer.preemption import Preempted, exit_code_for, leave_mark, signal_name
from gatle_ignite.trainer.progress import progress_every, shows_progress

__all__ = [
    "DEFAULT_CHECK_EVERY",
    "LossAverage",
    "NonFiniteCheck",
    "PreemptionStop",
    "StepLosses",
    "check_every",
    "clear_state",
    "empty_cuda_cache",
    "ends_epoch",
    "gathered",
    "forced_check_cadences",
]


def clear_state(engine) -> None:
    engine.state.output = None
    engine.state.batch = None


def empty_cuda_cache(engine=None) -> None:
    """Hand cached CUDA blocks back between phases.

    The collection frees reference cycles that pin device tensors, so it only runs when there is
    a CUDA cache to release: on CPU the allocator returns memory itself and a full ``gc.collect``
    per engine per epoch costs more than a small task's training.
    """
    if not torch.cuda.is_available():
        return
    gc.collect()
    torch.cuda.empty_cache()


# A SIGINT's request kind in the ranks' agreement (see NonFiniteCheck._request_kind).
_INTERRUPT = 2

# check_every when the config leaves it unset and a read from the device is not free (a GPU, or
# several ranks, where the check's all-reduce is the cost): see bench/README.md, "host reads".
DEFAULT_CHECK_EVERY = 64


def check_every(cfg, device) -> int:
    """``cfg.check_every``, or its default: every step where a read costs nothing (one process
    on the CPU), else DEFAULT_CHECK_EVERY."""
    every = cfg.get("check_every", None)
    if every is not None:
        return every
    free = idist.get_world_size() == 1 and torch.device(device).type == "cpu"
    return 1 if free else DEFAULT_CHECK_EVERY


def forced_check_cadences(cfg, epoch_length: Optional[int] = None) -> tuple:
    """Iteration cadences at which something is saved or shown, so a check comes first: a
    checkpoint and, unless ``check_every`` is set, a progress line (which then shows the loss of
    its own iteration). A per-iteration log point forces none: its loss is written once the
    next check has read it.

    From the config and the epoch's length alone, so that every rank checks at the same
    iterations.
    """
    saving = (cfg.get("save_every_iters", 0) or 0) if cfg.save_ckpt else 0
    chosen = cfg.get("check_every", None) is not None
    showing = progress_every(epoch_length) if shows_progress(cfg) and not chosen else 0
    return (saving, showing)


def _scalar_of(value):
    # The sum keeps NaN and inf, so one number per tensor says whether it is all finite.
    if value.requires_grad:
        value = value.detach()
    return value if value.dim() == 0 else value.sum()


# engine -> its StepLosses, which lives as long as the engine does.
_STEP_LOSSES = weakref.WeakKeyDictionary()


class StepLosses:
    """The trainer's per-step bookkeeping of its losses, one ``ITERATION_COMPLETED`` handler:
    each loss tensor of the step is detached once and handed to the loss averages and the
    non-finite check, which read them later. As handlers of their own, ignite would call each
    of them every iteration, and each would detach the same tensors again.
    """

    def __init__(self):
        self.averages = []
        self.check = None

    @classmethod
    def of(cls, engine) -> "StepLosses":
        """The engine's bookkeeping, attached on first use."""
        found = _STEP_LOSSES.get(engine)
        if found is None:
            found = _STEP_LOSSES[engine] = cls()
            engine.add_event_handler(Events.ITERATION_COMPLETED, found)
        return found

    def __call__(self, engine) -> None:
        losses = engine.state.output.get("losses", {})
        detached, seen = {}, {}
        for key, value in losses.items():
            if isinstance(value, torch.Tensor):
                # A one-term total is its term: the same tensor under two keys, detached once.
                kept = seen.get(id(value))
                if kept is None:
                    kept = seen[id(value)] = value.detach()
                value = kept
            detached[key] = value
        for average in self.averages:
            average.keep(detached[average.key], engine)
        if self.check is not None:
            self.check.record(engine, tuple(detached.values()))


class NonFiniteCheck:
    """Stops training at the first non-finite loss, reading the losses every ``every`` steps.

    Each step's loss tensors are kept as they are (no device work, no read); at a check point
    they are read in one go, the first non-finite iteration is found, and under DDP one
    all-reduce makes every rank agree on it and on a pending preemption request. Check points
    are every ``every`` iterations, the iterations in ``also_at`` cadences (a checkpoint or a
    log line is due), every epoch's end, and whenever ``check_now`` is called, so nothing
    computed after a bad step is saved, evaluated or logged as good.

    ``on_read(listener)`` has ``listener`` called after every check with the
    ``(iteration, total loss)`` pairs it read, in order; ``checked_through`` is the iteration of
    the last check.
    """

    def __init__(
        self, every: int = 1, also_at=(), world_size: int = 1, preemption=None, on_stop=None
    ):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"check_every must be a positive integer, got {every!r}")
        self.every = every
        self.cadences = tuple(c for c in (every, *also_at) if c)
        self.world_size = world_size
        self.preemption = preemption
        self.on_stop = on_stop
        self.first_bad = None
        self.stopped = False
        # (iteration, total loss) of the last step read, for progress lines and logging.
        self.last_loss = None
        self._pending = []
        self._checked_at = 0
        self._due = self._next_due(0)
        self._listeners = []
        self._read_pairs = []

    @classmethod
    def for_run(cls, cfg, device, epoch_length: Optional[int], on_stop) -> "NonFiniteCheck":
        """The check a training run of ``cfg`` makes: every ``check_every`` steps, and first
        wherever something is saved or shown; every rank agrees, a preemption request too."""
        return cls(
            every=check_every(cfg, device),
            also_at=forced_check_cadences(cfg, epoch_length),
            world_size=idist.get_world_size(),
            preemption=PREEMPTION,
            on_stop=on_stop,
        )

    @property
    def checked_through(self) -> int:
        return self._checked_at

    def on_read(self, listener) -> None:
        self._listeners.append(listener)

    def attach(self, engine) -> None:
        StepLosses.of(engine).check = self
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.check_now)

    def record(self, engine, losses: tuple) -> None:
        """Keep this step's losses (StepLosses hands them over); check when a check point is
        due."""
        # The values as they are: sorting them out waits for the read, off the per-step path.
        iteration = engine.state.iteration
        self._pending.append((iteration, losses))
        if iteration >= self._due:
            # Past it only on the first step of a resumed run, which is no check point.
            due, self._due = self._due, self._next_due(iteration)
            if iteration == due:
                self.check_now(engine)

    def _next_due(self, iteration: int) -> int:
        """The first iteration after ``iteration`` that one of the cadences falls on."""
        return min((iteration // cadence + 1) * cadence for cadence in self.cadences)

    def check_now(self, engine) -> bool:
        """Read what is pending and agree across ranks; True when training must stop."""
        if engine.state.iteration != self._checked_at:
            self._checked_at = engine.state.iteration
            self._read()
            self._agree()
            if self.first_bad is not None and not self.stopped:
                self._stop(engine)
            for listener in self._listeners:
                listener(self._read_pairs)
        return self.stopped

    def _read(self) -> None:
        pending, self._pending = self._pending, []
        self._read_pairs = pairs = []
        steps = [(iteration, self._tensors_of(iteration, values)) for iteration, values in pending]
        flat = [_scalar_of(t) for _iteration, tensors in steps for t in tensors]
        if not flat:
            return
        if len(flat) == 1:
            values = [flat[0].item()]
        else:
            device = flat[0].device
            values = torch.stack([v.to(device) for v in flat]).tolist()
        position = 0
        for iteration, tensors in steps:
            step = values[position : position + len(tensors)]
            position += len(tensors)
            if not all(math.isfinite(v) for v in step):
                self._found(iteration)
            if step:
                self.last_loss = (iteration, step[0])
                pairs.append(self.last_loss)

    def _tensors_of(self, iteration: int, values: tuple) -> list:
        """A step's loss tensors, each once (the total is often its only term); a number that
        is not finite is found at once."""
        tensors = []
        for value in values:
            if isinstance(value, torch.Tensor):
                if not any(value is kept for kept in tensors):
                    tensors.append(value)
            elif isinstance(value, numbers.Number) and not math.isfinite(value):
                self._found(iteration)
        return tensors

    def _found(self, iteration: int) -> None:
        if self.first_bad is None or iteration < self.first_bad:
            self.first_bad = iteration

    def _agree(self) -> None:
        if self.world_size == 1:
            return
        never = torch.iinfo(torch.int64).max
        mine = [self.first_bad if self.first_bad is not None else never, -self._request_kind()]
        first_bad, request = idist.all_reduce(
            torch.tensor(mine, dtype=torch.int64, device=idist.device()), op="MIN"
        ).tolist()
        self.first_bad = None if first_bad == never else first_bad
        if self.preemption is not None:
            self.preemption.agreed = request < 0
            self.preemption.agreed_interrupt = request == -_INTERRUPT

    def _request_kind(self) -> int:
        """0 no request, 1 a preemption, 2 a SIGINT: the minimum of the negatives wins, so one
        rank's SIGINT makes every rank exit as interrupted."""
        if self.preemption is None or not self.preemption.received:
            return 0
        return _INTERRUPT if self.preemption.signal == signal.SIGINT else 1

    def _stop(self, engine) -> None:
        self.stopped = True
        if self.on_stop is not None:
            self.on_stop()
        found = engine.state.iteration
        when = "" if found == self.first_bad else f", found at the check after iteration {found}"
        warnings.warn(
            f"training stopped: the loss is not finite at iteration {self.first_bad}{when}; "
            f"nothing from that iteration on is saved, evaluated or logged.\n"
            f"  The run has probably diverged: check the learning rate, the loss and the data.",
            stacklevel=2,
        )
        engine.terminate()


class LossAverage(Average):
    """ignite's Average of a loss, folded once per epoch instead of once per iteration.

    Each step's detached loss is kept as it is (on its device) and summed at compute(), so a
    step costs a list append: no tensor op, and on a GPU no copy to the host.
    """

    def __init__(self, key):
        self.key = key
        super().__init__(output_transform=lambda output: output["losses"][key])

    def attach(self, engine, name, usage=EpochWise.usage_name):
        super().attach(engine, name, usage)
        # Its per-step part runs in the engine's StepLosses, not as a handler of its own.
        if engine.has_event_handler(self.iteration_completed, Events.ITERATION_COMPLETED):
            engine.remove_event_handler(self.iteration_completed, Events.ITERATION_COMPLETED)
            averages = StepLosses.of(engine).averages
            if all(average is not self for average in averages):
                averages.append(self)

    def detach(self, engine, usage=EpochWise.usage_name):
        ledger = _STEP_LOSSES.get(engine)
        if ledger is not None:
            ledger.averages = [average for average in ledger.averages if average is not self]
        super().detach(engine, usage)

    def reset(self):
        super().reset()
        self._pending = []

    def keep(self, value, engine) -> None:
        """Keep this step's loss, detached (StepLosses hands it over)."""
        # What ignite's version does for a loss, without its no_grad region, output parsing
        # and reinit wrapper: a step's scalar loss goes straight onto the list. Anything else
        # (a number, per-sample losses) takes ignite's own path and rules.
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            self._pending.append(value)
            self.num_examples += 1
        else:
            self.iteration_completed(engine)

    def compute(self):
        if self._pending:
            total = torch.stack(self._pending).to(self.accumulator).sum()
            self.accumulator = self.accumulator + total
            self._pending = []
        return super().compute()

    def state_dict(self) -> dict:
        """Every rank's sum so far and its steps' losses as they are, not folded in: a resumed
        epoch then sums the same numbers in the same order as a run that never stopped."""
        pending = torch.stack(self._pending).cpu() if self._pending else torch.zeros(0)
        mine = {
            "accumulator": torch.as_tensor(self.accumulator).cpu(),
            "num_examples": int(self.num_examples),
            "pending": pending,
        }
        return {"ranks": gathered(mine)}

    def load_state_dict(self, state_dict) -> None:
        ranks = state_dict["ranks"]
        if len(ranks) != idist.get_world_size():
            raise ValueError(f"saved by {len(ranks)} rank(s), loaded by {idist.get_world_size()}")
        mine = ranks[idist.get_rank()]
        self.accumulator = mine["accumulator"].to(self.accumulator.device)
        self.num_examples = int(mine["num_examples"])
        # On the device the steps' losses come from, to be stacked with them.
        self._pending = list(mine["pending"].to(idist.device()).unbind())


def gathered(mine) -> list:
    """``mine`` from every rank, in rank order (a list of one in a single process)."""
    if idist.get_world_size() == 1:
        return [mine]
    ranks = [None] * idist.get_world_size()
    torch.distributed.all_gather_object(ranks, mine)
    return ranks


class PreemptionStop:
    """Ends a training run at an iteration boundary once preemption is requested (and, under
    DDP, agreed at a check point): the checkpoint is written, then Preempted is raised.

    ``save_iteration(engine)`` writes the mid-epoch checkpoint and returns its path (or None);
    ``saved_epoch()`` is the path of the epoch's own checkpoint, for a request at an epoch's end;
    ``settle()`` waits for a checkpoint still being written in the background.
    """

    def __init__(self, world_size: int, save_iteration, saved_epoch, settle=None):
        self.world_size = world_size
        self.save_iteration = save_iteration
        self.saved_epoch = saved_epoch
        self.settle = settle
        self._engine = None

    def attach(self, engine) -> None:
        """After every other handler: the checkpoints of the epoch come first."""
        self._engine = engine
        if self.world_size > 1:
            # Ranks agree at check points; between them this reads a flag, nothing more.
            engine.add_event_handler(Events.ITERATION_COMPLETED, self.at_iteration)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.at_epoch_end)
        if PREEMPTION.received:
            # Signalled while the run was being set up: it stops after its first iteration.
            self.on_signal()

    def on_signal(self) -> None:
        """Called by the first signal in a single process: stop after the current iteration.

        Appended to the running event's handlers, it runs after every handler of the current
        iteration, the checkpoints included; a run never signalled pays nothing per iteration.
        """
        engine = self._engine
        if self.world_size == 1 and engine is not None:
            if not engine.has_event_handler(self.at_iteration, Events.ITERATION_COMPLETED):
                engine.add_event_handler(Events.ITERATION_COMPLETED, self.at_iteration)

    def requested(self) -> bool:
        return PREEMPTION.received if self.world_size == 1 else PREEMPTION.agreed

    def at_iteration(self, engine) -> None:
        # At an epoch's last iteration the epoch's own checkpoint, after its evaluation, is
        # the one to resume from. A run already ending (a non-finite loss) just ends.
        if self.requested() and not ends_epoch(engine) and not engine.should_terminate:
            self._preempt(engine, self.save_iteration(engine))

    def at_epoch_end(self, engine) -> None:
        if self.requested() and not engine.should_terminate:
            self._preempt(engine, self.saved_epoch())

    def _preempt(self, engine, saved) -> None:
        if self.settle is not None:
            self.settle()
        if self.world_size > 1:
            # Rank 0 may still be writing; no rank leaves before the file is complete.
            idist.barrier()
        # Its launcher, if any, then knows the checkpoint is whole, even if a second signal
        # kills this rank during its teardown.
        leave_mark("preempted", idist.get_local_rank())
        saved = saved or "nothing (this run writes no checkpoint)"
        iteration = engine.state.iteration
        if PREEMPTION.interrupted(self.world_size):
            signum = signal.SIGINT
            message = (
                f"INTERRUPTED by SIGINT after iteration {iteration}: saved {saved}; run the same "
                f"command with --override resume=True to continue."
            )
        else:
            signum = PREEMPTION.signal
            message = (
                f"PREEMPTED by {signal_name(signum)} after iteration {iteration}: saved "
                f"{saved}.\n  Run the same command with --override resume=True to continue."
            )
        if idist.get_rank() == 0:
            print(message, flush=True)
        raise Preempted(message, code=exit_code_for(signum))


def ends_epoch(engine) -> bool:
    """Whether the engine's current iteration is its epoch's last."""
    length = engine.state.epoch_length
    return bool(length) and engine.state.iteration % length == 0
