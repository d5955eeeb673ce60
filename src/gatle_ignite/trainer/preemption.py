"""Preemption: SIGTERM, SIGUSR1 or SIGINT ends the run at an iteration boundary, resumable.

A signal only records a request. A single process stops at the end of the iteration it arrives
in; under DDP every rank agrees on it at the next check point (within ``check_every``
iterations: the flag rides on the all-reduce the non-finite check makes there). The framework
writes a ``latest_iter`` checkpoint, closes the backends, and the run exits with
``EXIT_PREEMPTED``, or ``EXIT_INTERRUPTED`` for SIGINT (Ctrl-C). A second SIGINT to a single
process stops it at once, without that checkpoint.
"""

import contextlib
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
from pathlib import Path

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_PREEMPTED",
    "MARKS_DIR_VAR",
    "ONE_PROCESS_CTRL_C",
    "PREEMPTION_SIGNALS",
    "RANKS_CTRL_C",
    "Interrupted",
    "Preempted",
    "exit_code_for",
    "leave_mark",
    "preemption_signals",
    "shield_workers",
    "signal_name",
    "stop_at_once",
]

# sysexits' EX_TEMPFAIL: a temporary failure; run it again (with resume=True) to continue.
EXIT_PREEMPTED = 75
# 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C.
EXIT_INTERRUPTED = 130
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# Set by a launcher for the ranks it spawns: a folder where each leaves a mark of how its run
# ended (launch.ranks.RankMarks reads them).
MARKS_DIR_VAR = "GATLE_IGNITE_RANK_MARKS_DIR"


def leave_mark(outcome: str, local_rank: int) -> None:
    """Tell the launcher that spawned this rank how its run ended; nothing without one."""
    folder = os.environ.get(MARKS_DIR_VAR)
    if folder:
        Path(folder, f"{outcome}-{local_rank}").touch()


def exit_code_for(signum) -> int:
    return EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED


class Preempted(SystemExit):
    """Raised out of fit() after a preemption checkpoint; exits the process with code 75 (130
    after a SIGINT).

    A SystemExit, so a spawned rank ends with the exit code rather than a traceback.
    """

    def __init__(self, message: str, code: int = EXIT_PREEMPTED):
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Interrupted(SystemExit):
    """Raised by a second SIGINT to a single process: it stops at once, without a checkpoint of
    where it was, and exits with code 130. The run stays resumable from its last checkpoint."""

    def __init__(self, message: str):
        super().__init__(EXIT_INTERRUPTED)
        self.message = message

    def __str__(self) -> str:
        return self.message


# What the first Ctrl-C says at once, in a process that acts on a second one.
ONE_PROCESS_CTRL_C = (
    "Ctrl-C: the run stops after this iteration, resumable; Ctrl-C again stops it at once."
)
RANKS_CTRL_C = (
    "Ctrl-C: the ranks stop at their next check point, resumable; Ctrl-C again stops them at once."
)


def stop_at_once(signum) -> None:
    """``on_repeat`` for a single process: a second SIGINT stops it now; a repeated
    SIGTERM or SIGUSR1 (a scheduler signalling every process twice) changes nothing."""
    if signum == signal.SIGINT:
        raise Interrupted(
            "stopped at once by a second SIGINT, without a checkpoint of this iteration.\n"
            "  --override resume=True continues from the last checkpoint written before."
        )


def signal_name(signum) -> str:
    """``"SIGTERM"`` for 15; a rank told by the others, with no signal of its own, says so."""
    return signal.Signals(signum).name if signum else "a signal to another rank"


class _Request:
    """The signal received in this process, if any, and what all ranks agreed on."""

    def __init__(self):
        self.signal = None
        self.agreed = False
        # Under DDP: whether any rank's request was a SIGINT, so all exit with the same code.
        self.agreed_interrupt = False

    @property
    def received(self) -> bool:
        return self.signal is not None

    def interrupted(self, world_size: int) -> bool:
        """Whether the run stops for a SIGINT: its own, or under DDP any rank's."""
        return self.agreed_interrupt if world_size > 1 else self.signal == signal.SIGINT


REQUEST = _Request()


@contextlib.contextmanager
def preemption_signals(forward_to=None, on_request=None, on_repeat=None, ctrl_c_note=None):
    """Turn the preemption signals into a request, while the block runs.

    ``forward_to`` returns processes to pass the signal on to (a launcher's spawned ranks).
    ``on_request`` is called (in the signal handler, once) when the first signal arrives.
    ``on_repeat``, when given, is called with the signal number on every later signal instead
    of forwarding it: the request already stands, so a repeat asks for something stronger.
    ``ctrl_c_note`` is a line for stderr when the first signal is a SIGINT: a person pressed
    Ctrl-C and waits for the iteration to end, and the line also tells when a second one counts
    as a second (two at once arrive as one).
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
        if first and ctrl_c_note and signum == signal.SIGINT:
            # Straight to the descriptor: the handler may run in the middle of a print.
            os.write(2, f"{ctrl_c_note}\n".encode())
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
        REQUEST.agreed_interrupt = False


class _ShieldThen:
    """A DataLoader worker_init_fn: shield the worker from the preemption signals, then run the
    user's own.

    The shield lasts until the main process exits: multiprocessing then ends its workers with
    SIGTERM, and a worker that ignored it would keep a failed run's process waiting for good.
    """

    def __init__(self, worker_init_fn, main_exiting):
        self.worker_init_fn = worker_init_fn
        self.main_exiting = main_exiting

    def __call__(self, worker_id):
        for sig in PREEMPTION_SIGNALS:
            signal.signal(sig, self._on_signal)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)

    def _on_signal(self, _signum, _frame):
        # Until the main process exits, a signal is a scheduler's, for the main process to act
        # on; then it is multiprocessing's. Exit 0: torch's main process reports a worker that
        # a signal killed as a crash of its own.
        if self.main_exiting.value:
            os._exit(0)


# One flag per start method (shared memory only travels to workers of its own kind), set as
# this process exits; see _lift_shields. A byte read and written without a lock: a signal can
# land while the worker's handler runs, and a lock held there (an Event's) was held for good,
# hanging the worker and, at exit, the main process that set the flag.
_MAIN_EXITING = {}


def _lift_shields() -> None:
    for flag in _MAIN_EXITING.values():
        flag.value = 1


def _main_exiting_flag(context):
    method = context.get_start_method()
    if method not in _MAIN_EXITING:
        if not _MAIN_EXITING:
            # multiprocessing runs this as the process exits (a spawned rank too, where atexit
            # never runs), just before it terminates and joins the workers.
            multiprocessing.util.Finalize(None, _lift_shields, exitpriority=0)
        _MAIN_EXITING[method] = context.RawValue("b", 0)
    return _MAIN_EXITING[method]


def shield_workers(loader) -> None:
    """Keep a DataLoader's workers alive through a preemption signal, until this process exits.

    A scheduler signals every process of a job; torch's workers die of SIGTERM, which would
    crash the main process before it can write its checkpoint. The main process owns shutdown.
    """
    if getattr(loader, "num_workers", 0) <= 0 or not hasattr(loader, "worker_init_fn"):
        return
    if not isinstance(loader.worker_init_fn, _ShieldThen):
        context = loader.multiprocessing_context or multiprocessing.get_context()
        loader.worker_init_fn = _ShieldThen(loader.worker_init_fn, _main_exiting_flag(context))
