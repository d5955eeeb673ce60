"""Preemption: SIGTERM or SIGUSR1 ends the run at an iteration boundary, resumable.

A signal only records a request. A single process stops at the end of the iteration it arrives
in; under DDP every rank agrees on it at the next check point (within ``check_every``
iterations: the flag rides on the all-reduce the non-finite check makes there). The framework
writes a ``latest_iter`` checkpoint, closes the backends, and the run exits with
``EXIT_PREEMPTED``.
"""

import contextlib
import os
import signal
import threading

__all__ = [
    "EXIT_PREEMPTED",
    "PREEMPTION_SIGNALS",
    "Preempted",
    "preemption_signals",
    "shield_workers",
    "signal_name",
]

# sysexits' EX_TEMPFAIL: a temporary failure; run it again (with resume=True) to continue.
EXIT_PREEMPTED = 75
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(SystemExit):
    """Raised out of fit() after a preemption checkpoint; exits the process with code 75.

    A SystemExit, so a spawned rank ends with the exit code rather than a traceback.
    """

    def __init__(self, message: str):
        super().__init__(EXIT_PREEMPTED)
        self.message = message

    def __str__(self) -> str:
        return self.message


def signal_name(signum) -> str:
    """``"SIGTERM"`` for 15; a rank told by the others, with no signal of its own, says so."""
    return signal.Signals(signum).name if signum else "a signal to another rank"


class _Request:
    """The signal received in this process, if any, and what all ranks agreed on."""

    def __init__(self):
        self.signal = None
        self.agreed = False

    @property
    def received(self) -> bool:
        return self.signal is not None


REQUEST = _Request()


@contextlib.contextmanager
def preemption_signals(forward_to=None, on_request=None, on_repeat=None):
    """Turn the preemption signals into a request, while the block runs.

    ``forward_to`` returns processes to pass the signal on to (a launcher's spawned ranks).
    ``on_request`` is called (in the signal handler, once) when the first signal arrives.
    ``on_repeat``, when given, is called with the signal number on every later signal instead
    of forwarding it: the request already stands, so a repeat asks for something stronger.
    Outside the main thread, where Python cannot install handlers, it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield REQUEST
        return

    def record(signum, _frame):
        if REQUEST.received and on_repeat is not None:
            on_repeat(signum)
            return
        first = not REQUEST.received
        REQUEST.signal = signum
        if first and on_request is not None:
            on_request()
        for process in forward_to() if forward_to else ():
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(process.pid, signum)

    previous = {sig: signal.signal(sig, record) for sig in PREEMPTION_SIGNALS}
    try:
        yield REQUEST
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        REQUEST.signal = None
        REQUEST.agreed = False


class _IgnorePreemptionThen:
    """A DataLoader worker_init_fn: ignore the preemption signals, then run the user's own."""

    def __init__(self, worker_init_fn):
        self.worker_init_fn = worker_init_fn

    def __call__(self, worker_id):
        for sig in PREEMPTION_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)


def shield_workers(loader) -> None:
    """Keep a DataLoader's workers alive through a preemption signal.

    A scheduler signals every process of a job; torch's workers die of SIGTERM, which would
    crash the main process before it can write its checkpoint. The main process owns shutdown.
    """
    if getattr(loader, "num_workers", 0) <= 0 or not hasattr(loader, "worker_init_fn"):
        return
    if not isinstance(loader.worker_init_fn, _IgnorePreemptionThen):
        loader.worker_init_fn = _IgnorePreemptionThen(loader.worker_init_fn)
