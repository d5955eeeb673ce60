"""What a training run shows while it runs, on rank 0: text progress lines or tqdm bars.

The train loss they show is the non-finite check's last read, so showing it never reads the
device between check points.
"""

import sys
import time

import ignite.distributed as idist
from ignite.engine import Events

try:
    from ignite.handlers.tqdm_logger import ProgressBar
except ImportError:  # ignite 0.4.x
    from ignite.contrib.handlers import ProgressBar

__all__ = ["ProgressLines", "attach_bars", "attach_progress_output"]


def attach_progress_output(cfg, engines, specs, dls, loss) -> None:
    """Bars under the ``pbar`` logger, else text lines unless ``verbosity`` is 0.

    ``loss`` returns the last ``(iteration, value)`` read, or None.
    """
    if idist.get_rank() != 0:
        return
    trainer = engines["trainer"]
    if "pbar" in cfg.logger_name:
        attach_bars(trainer, [e for e in engines.values() if e is not None], loss)
        return
    if cfg.get("verbosity", 1) < 1:
        return
    every = max((cfg.train_length or len(dls["train"])) // 10, 1)
    train_lines = ProgressLines(
        "TRAIN", every, cfg.train_ds_params.get("bs"), loss=loss, max_epochs=cfg.max_epochs
    )
    train_lines.attach(trainer)
    for spec in specs:
        engine = engines.get(spec.key)
        if engine is not None and _reaches_a_line(spec, cfg, dls[spec.split]):
            batch_size = cfg.get(f"{spec.split}_ds_params", {}).get("bs")
            ProgressLines(spec.progress_label, spec.progress_every, batch_size).attach(engine)


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
    """

    def __init__(self, label, every=1, batch_size=None, loss=None, max_epochs=None):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"{label} progress: every must be a positive integer, got {every!r}")
        self.label = label
        self.every = every
        self.batch_size = batch_size
        self.loss = loss
        self.max_epochs = max_epochs
        self._started = None
        self._epoch_started = None
        self._first_iteration = 0
        self._epoch_first_iteration = 0

    def attach(self, engine) -> None:
        engine.add_event_handler(Events.STARTED, self._start)
        engine.add_event_handler(Events.EPOCH_STARTED, self._start_epoch)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.report)

    def _start(self, engine) -> None:
        self._started, self._first_iteration = time.monotonic(), engine.state.iteration

    def _start_epoch(self, engine) -> None:
        self._epoch_started, self._epoch_first_iteration = time.monotonic(), engine.state.iteration

    def report(self, engine) -> None:
        state = engine.state
        if state.iteration % self.every or sys.stdout is None:
            return
        now = time.monotonic()
        parts = [self._position(state)]
        if self.loss is not None and self.loss() is not None:
            parts.append(f"loss {self.loss()[1]:.5g}")
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


# ignite's default bar, with tqdm's rate added.
_BAR = (
    "{desc}[{n_fmt}/{total_fmt}] {percentage:3.0f}%|{bar}{postfix} "
    "[{elapsed}<{remaining}, {rate_fmt}]"
)


def attach_bars(trainer, engines, loss) -> None:
    """tqdm bars: the trainer's shows the last loss read; tqdm shows it/s by itself."""
    for engine in engines:
        shown = None
        if engine is trainer and loss is not None:

            def shown(_output):
                last = loss()
                return {"loss": last[1]} if last is not None else {}

        ProgressBar(persist=False, bar_format=_BAR).attach(engine, output_transform=shown)
