"""``profile``: torch.profiler over a few training steps, a trace file, the top operators.

The schedule skips the first ``wait`` steps (start-up, the FLOP count, a compilation), warms up
for ``warmup`` steps, then records ``active`` steps; the recording is written as a Chrome trace
(``<save_dir>/profile/rank<R>_iterations_<A>-<B>.pt.trace.json``) that Perfetto and
TensorBoard's profiler plugin open. Every rank records its own; rank 0 prints the operators
that took the most time themselves. Profiling slows the recorded steps, never changes them.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import ignite.distributed as idist
import torch
from ignite.engine import Events

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.layout import PROFILE_DIR

__all__ = ["DEFAULT_SCHEDULE", "StepProfiler", "profile_schedule"]

DEFAULT_SCHEDULE = {"wait": 5, "warmup": 2, "active": 3}
# Operators in the printed table.
_TOP = 15


def profile_schedule(value) -> Optional[dict]:
    """The ``profile`` field as a schedule: None when off, else wait/warmup/active counts."""
    if value is None or value is False:
        return None
    if value is True:
        return dict(DEFAULT_SCHEDULE)
    # A mapping, or the ConfigDict that ml_collections makes of one.
    value = dict(value.items()) if hasattr(value, "items") else value
    unknown = sorted(set(value) - set(DEFAULT_SCHEDULE)) if isinstance(value, Mapping) else None
    if unknown is None or unknown:
        raise ConfigError(
            f"profile must be False, True or a mapping of {sorted(DEFAULT_SCHEDULE)}, got "
            f"{value!r}.\n  For example profile = {DEFAULT_SCHEDULE}."
        )
    schedule = {**DEFAULT_SCHEDULE, **value}
    for key, count in schedule.items():
        least = 1 if key == "active" else 0
        if isinstance(count, bool) or not isinstance(count, int) or count < least:
            raise ConfigError(f"profile[{key!r}] must be an int >= {least}, got {count!r}.")
    return schedule


def _activities() -> list:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


class StepProfiler:
    """Profiles the training steps the schedule names, from the run's first iteration.

    ``overhead`` is a Stopwatch the trace's writing is timed into, so an epoch's training time
    leaves it out.
    """

    def __init__(self, schedule: dict, save_dir, overhead):
        self.schedule = schedule
        self.directory = Path(save_dir) / PROFILE_DIR
        self.overhead = overhead
        self.trace_path = None
        self._profiler = None
        self._first = 0
        self._steps = 0
        self._engine = None

    def attach(self, engine) -> None:
        self._engine = engine
        engine.add_event_handler(Events.STARTED, self._start)

    def _start(self, engine) -> None:
        s = self.schedule
        self._first = engine.state.iteration + s["wait"] + s["warmup"] + 1
        self._profiler = torch.profiler.profile(
            activities=_activities(),
            schedule=torch.profiler.schedule(
                wait=s["wait"], warmup=s["warmup"], active=s["active"], repeat=1
            ),
            on_trace_ready=self._write,
        )
        self._profiler.start()
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._step)

    def _step(self, engine) -> None:
        self._steps += 1
        self._profiler.step()
        if self._steps >= sum(self.schedule.values()):
            self.close()

    def close(self) -> None:
        """Stop profiling (a recording cut short is still written); idempotent."""
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        engine = self._engine
        if engine.has_event_handler(self._step, Events.ITERATION_COMPLETED):
            engine.remove_event_handler(self._step, Events.ITERATION_COMPLETED)
        profiler.stop()
        if self.trace_path is None and idist.get_rank() == 0:
            print(
                f"PROFILE: no trace; the run ended within the profiler's first "
                f"{self.schedule['wait'] + self.schedule['warmup']} steps (wait + warmup)."
            )

    def _write(self, profiler) -> None:
        with self.overhead:
            last = self._engine.state.iteration
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / (
                f"rank{idist.get_rank()}_iterations_{self._first}-{last}.pt.trace.json"
            )
            profiler.export_chrome_trace(str(path))
            self.trace_path = path
            if idist.get_rank() == 0:
                self._print_top(profiler, path)

    @staticmethod
    def _print_top(profiler, path) -> None:
        on_gpu = torch.profiler.ProfilerActivity.CUDA in _activities()
        key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=key, row_limit=_TOP)
        print(
            f"PROFILE: trace written to {path} (open it in https://ui.perfetto.dev or "
            f"TensorBoard's profiler plugin)\nTop operators by self time:\n{table}"
        )
