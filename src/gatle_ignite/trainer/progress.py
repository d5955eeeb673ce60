"""What a training run shows while it runs, on rank 0: text progress lines or tqdm bars.

The train loss they show is the non-finite check's last read, so showing it never reads the
device between check points; a progress line is one of them (see ``progress_every``), so its
loss is the current one. Off a terminal (a log file, a pipe) a line is also at least
``progress_seconds`` after the run's (or the evaluation's) start and after the line before, so
a log holds the epoch blocks and a line now and then, not ten lines per epoch.
"""

import sys
import time
from typing import Optional

import ignite.distributed as idist
from ignite.engine import Events

try:
    from ignite.handlers.tqdm_logger import ProgressBar
except ImportError:  # ignite 0.4.x
    from ignite.contrib.handlers import ProgressBar

__all__ = [
    "ProgressLines",
    "attach_bars",
    "attach_progress_output",
    "epoch_length_of",
    "loss_text",
    "progress_every",
    "shows_progress",
]

# Training progress lines per epoch.
_LINES_PER_EPOCH = 10
# When the epoch's length is unknown (an iterable dataset without one).
_UNKNOWN_LENGTH_EVERY = 100


def epoch_length_of(cfg, loader) -> Optional[int]:
    """Training iterations per epoch: ``train_length``, else the loader's length, else None."""
    if cfg.get("train_length", None):
        return cfg.train_length
    try:
        return len(loader)
    except TypeError:
        return None


def progress_every(epoch_length: Optional[int]) -> int:
    """Iterations between two training progress lines: a tenth of an epoch."""
    if not epoch_length:
        return _UNKNOWN_LENGTH_EVERY
    return max(epoch_length // _LINES_PER_EPOCH, 1)


def shows_progress(cfg) -> bool:
    """Whether training shows progress (lines or bars), from the config alone: every rank
    answers the same, so every rank reads the loss at the same iterations."""
    return "pbar" in cfg.logger_name or cfg.get("verbosity", 1) >= 1


def _on_a_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def attach_progress_output(cfg, engines, specs, dls, loss) -> None:
    """Bars under the ``pbar`` logger on a terminal, else text lines unless ``verbosity`` is 0.

    ``loss`` returns the last ``(iteration, value)`` read, or None. A bar redraws itself with
    ``\\r`` and cursor moves, which a log file or a pipe would keep: there, lines are written.
    """
    if idist.get_rank() != 0:
        return
    trainer = engines["trainer"]
    bars = "pbar" in cfg.logger_name
    if bars and _on_a_terminal(sys.stderr):
        labels = {engines[s.key]: s.split for s in specs if engines.get(s.key) is not None}
        attach_bars(trainer, [e for e in engines.values() if e is not None], loss, labels)
        return
    if cfg.get("verbosity", 1) < 1 and not bars:
        return
    every = progress_every(epoch_length_of(cfg, dls["train"]))
    apart = 0 if _on_a_terminal(sys.stdout) else cfg.get("progress_seconds", 30)
    batch_size = cfg.train_ds_params.get("bs")
    train_lines = ProgressLines(
        "TRAIN", every, batch_size, loss=loss, max_epochs=cfg.max_epochs, seconds_apart=apart
    )
    train_lines.attach(trainer)
    for spec in specs:
        engine = engines.get(spec.key)
        if engine is not None and _reaches_a_line(spec, cfg, dls[spec.split]):
            batch_size = cfg.get(f"{spec.split}_ds_params", {}).get("bs")
            lines = ProgressLines(
                spec.progress_label, spec.progress_every, batch_size, seconds_apart=apart
            )
            lines.attach(engine)


def _reaches_a_line(spec, cfg, loader) -> bool:
    """Whether an eval run is long enough to print: each run counts from iteration 0, so a
    shorter one would only pay a call per batch."""
    length = spec.length(cfg)
    if not length:
        try:
            length = len(loader)
        except TypeError:
            return True  # an iterable dataset: its length is unknown
    return not isinstance(spec.progress_every, int) or length >= spec.progress_every


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _count(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:.1f}"


class ProgressLines:
    """A text line every ``every`` iterations, on rank 0: where the engine is, the last loss
    read, throughput, time spent and time left.

    ``loss`` returns the check's last ``(iteration, value)`` (read at check points only);
    ``batch_size`` (the global batch) gives samples/s; ``max_epochs`` gives the run's ETA.
    ``seconds_apart`` (off a terminal) keeps a line at least that long after the engine's start
    and after the line before; ``clock`` is the time source, seconds as ``time.monotonic``.
    """

    def __init__(
        self,
        label,
        every=1,
        batch_size=None,
        loss=None,
        max_epochs=None,
        seconds_apart=0,
        clock=time.monotonic,
    ):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"{label} progress: every must be a positive integer, got {every!r}")
        self.label = label
        self.every = every
        self.batch_size = batch_size
        self.loss = loss
        self.max_epochs = max_epochs
        self.seconds_apart = seconds_apart
        self.clock = clock
        self._started = None
        self._epoch_started = None
        self._last_line = None
        self._first_iteration = 0
        self._epoch_first_iteration = 0

    def attach(self, engine) -> None:
        engine.add_event_handler(Events.STARTED, self._start)
        engine.add_event_handler(Events.EPOCH_STARTED, self._start_epoch)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.report)

    def _start(self, engine) -> None:
        self._started, self._first_iteration = self.clock(), engine.state.iteration
        self._last_line = self._started

    def _start_epoch(self, engine) -> None:
        self._epoch_started, self._epoch_first_iteration = self.clock(), engine.state.iteration

    def report(self, engine) -> None:
        state = engine.state
        if state.iteration % self.every or sys.stdout is None:
            return
        now = self.clock()
        if now - self._last_line < self.seconds_apart:
            return
        self._last_line = now
        parts = [self._position(state)]
        last = self.loss() if self.loss is not None else None
        if last is not None:
            parts.append(f"loss {loss_text(last, state.iteration)}")
        done = state.iteration - self._epoch_first_iteration
        rate = done / max(now - self._epoch_started, 1e-9)
        speed = f"{_count(rate)} it/s"
        if self.batch_size:
            speed += f", {_count(rate * self.batch_size)} samples/s"
        parts.append(speed)
        parts.append(f"elapsed {_duration(now - self._started)}")
        parts.append(self._eta(state, rate, now))
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        # One write, where print() makes two.
        sys.stdout.write(f"[{stamp}] {self.label} epoch {state.epoch}: {' | '.join(parts)}\n")

    @staticmethod
    def _position(state) -> str:
        length = state.epoch_length
        if not length:
            return f"{state.iteration}/?"
        done = (state.iteration - 1) % length + 1
        return f"{done}/{length} ({done / length:.0%})"

    def _eta(self, state, rate, now) -> str:
        length = state.epoch_length
        if not length:
            return "ETA ?"
        left = length - ((state.iteration - 1) % length + 1)
        eta = f"ETA epoch {_duration(left / max(rate, 1e-9))}"
        if self.max_epochs:
            # The whole run's pace, evaluations and checkpoints included.
            overall = (state.iteration - self._first_iteration) / max(now - self._started, 1e-9)
            remaining = self.max_epochs * length - state.iteration
            eta += f", run {_duration(remaining / max(overall, 1e-9))}"
        return eta


def loss_text(last, iteration) -> str:
    """The loss read at ``last = (iteration read, value)``, with its age when it is not this
    iteration's (a check between progress points, or a run that reads it less often)."""
    read_at, value = last
    age = "" if read_at == iteration else f" (iteration {read_at})"
    return f"{value:.5g}{age}"


# ignite's default bar with tqdm's rate, and the postfix (the loss) inside the brackets after
# it: in front of them tqdm would open it with a stray comma. tqdm ends a label with ": ".
_BAR = (
    "{desc}[{n_fmt}/{total_fmt}] {percentage:3.0f}%|{bar}| "
    "[{elapsed}<{remaining}, {rate_fmt}{postfix}]"
)


def attach_bars(trainer, engines, loss, labels=None) -> None:
    """tqdm bars: the trainer's shows the last loss read; tqdm shows it/s by itself.

    ``labels`` maps an engine to its bar's label (the trainer's is ``train``, an evaluation's
    its split).
    """
    labels = labels or {}
    for engine in engines:
        shown = None
        if engine is trainer and loss is not None:

            def shown(_output):
                last = loss()
                if last is None:
                    return {}
                return {"loss": loss_text(last, trainer.state.iteration)}

        desc = labels.get(engine, "train" if engine is trainer else "eval")
        ProgressBar(persist=False, bar_format=_BAR, desc=desc).attach(
            engine, output_transform=shown
        )
