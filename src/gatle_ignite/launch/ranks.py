"""Supervising the ranks this node spawned: signals passed on, a failed rank ending the node,
and one exit code that says how the ranks ended."""

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import warnings
from typing import Optional

import torch

from gatle_ignite.run.outside import manifest_of, record_failed
from gatle_ignite.run.storage import is_url
from gatle_ignite.trainer.preemption import (
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    MARKS_DIR_VAR,
    RANKS_CTRL_C,
    REQUEST,
    Preempted,
    exit_code_for,
    leave_mark,
    preemption_signals,
    signal_name,
)

__all__ = ["EXIT_CONFIG_ERROR", "EXIT_PEER_TIMEOUT", "MARKS_DIR_VAR", "RankMarks", "supervised"]

# sysexits' EX_UNAVAILABLE: a rank's peers stopped answering; the rank that waited says so.
EXIT_PEER_TIMEOUT = 69
# The CLI's code for a config error, which a spawned rank reports itself, without a traceback.
EXIT_CONFIG_ERROR = 2


class RankMarks:
    """A folder where each rank this launcher spawned marks how its run ended.

    ``finished-<local rank>`` once its run is done, ``preempted-<local rank>`` once its
    preemption checkpoint is written (before its teardown, which a second signal may cut short),
    ``config_error-<local rank>`` when it stops on a config error; a rank that ends with none of
    them failed.
    """

    def __init__(self, folder: str):
        self.folder = folder

    leave = staticmethod(leave_mark)

    def count(self, *outcomes: str) -> int:
        return sum(name.split("-")[0] in outcomes for name in os.listdir(self.folder))

    @classmethod
    @contextlib.contextmanager
    def exported(cls):
        """A fresh folder, named to the ranks through the environment they inherit."""
        with tempfile.TemporaryDirectory(prefix="gatle-ignite-ranks-") as folder:
            os.environ[MARKS_DIR_VAR] = folder
            try:
                yield cls(folder)
            finally:
                os.environ.pop(MARKS_DIR_VAR, None)


@contextlib.contextmanager
def supervised(nproc: int, save_dir: Optional[str] = None, first_rank: int = 0):
    """Around spawning this node's ``nproc`` ranks (global ranks from ``first_rank``): signals
    passed on, a failed rank ending the node, the ranks' ends turned into one exit (code 2, 69
    or 75, or the error), and a failure recorded in the run at ``save_dir`` when given."""
    with (
        RankMarks.exported() as marks,
        _failure_recorded(save_dir, first_rank),
        _ranks_supervised(nproc, marks),
        _teardown_crash_tolerated(nproc, marks),
        _termination_explained(nproc, marks),
    ):
        yield


@contextlib.contextmanager
def _ranks_supervised(nproc: int, marks: RankMarks):
    """Pass preemption signals on to the spawned ranks, and report how the ranks ended.

    A second signal kills the ranks: the first only asks them to stop at the end of an
    iteration, which a stalled rank never reaches.
    """
    killed_by = []

    def kill_ranks(signum) -> None:
        killed_by.append(signum)
        _kill(multiprocessing.active_children())

    with preemption_signals(
        forward_to=multiprocessing.active_children, on_repeat=kill_ranks, ctrl_c_note=RANKS_CTRL_C
    ):
        try:
            yield
        except torch.multiprocessing.ProcessExitedException as error:
            if killed_by:
                raise _killed(killed_by[0], saved=marks.count("preempted") > 0) from None
            if marks.count("config_error"):
                # Whichever rank torch names (one may abort in gloo's teardown as it exits),
                # the run ended on a config error, which rank 0 has printed.
                raise SystemExit(EXIT_CONFIG_ERROR) from None
            if error.exit_code == EXIT_PREEMPTED or marks.count("preempted") == nproc:
                # Every rank saved and stopped; one may have aborted in gloo's teardown after.
                raise Preempted(
                    "the ranks were preempted and wrote a resumable checkpoint.\n"
                    "  Run the same command with --override resume=True to continue.",
                    code=_preempted_code(error),
                ) from None
            if error.exit_code == EXIT_INTERRUPTED:
                # Stopped by Ctrl-C before training, where there was nothing to save.
                raise SystemExit(EXIT_INTERRUPTED) from None
            if error.exit_code in (EXIT_PEER_TIMEOUT, EXIT_CONFIG_ERROR):
                # The rank has said why; a traceback here would only repeat it.
                raise SystemExit(error.exit_code) from None
            raise


# How long a run's lock may stay held after its ranks ended: a killed rank's DataLoader workers
# hold it until they see their parent gone (torch looks every 5 s), longer on a loaded machine.
_WORKERS_GONE_S = 60.0


@contextlib.contextmanager
def _failure_recorded(save_dir: Optional[str], first_rank: int):
    """A rank that raised, or died, fails the run in ``run.json`` with its reason: rank 0,
    which records a run's end, may have been killed for that peer's failure before it could.
    A run found ``running`` before the ranks start is not known to be theirs: left as it is."""
    if save_dir is not None and (is_url(save_dir) or _says_running(save_dir)):
        save_dir = None
    try:
        yield
    except (
        torch.multiprocessing.ProcessRaisedException,
        torch.multiprocessing.ProcessExitedException,
    ) as error:
        if save_dir is not None:
            rank = first_rank + error.error_index
            record_failed(save_dir, f"rank {rank}: {_failure_of(error)}", _WORKERS_GONE_S)
        raise


def _says_running(save_dir) -> bool:
    manifest = manifest_of(save_dir)
    return manifest is not None and manifest.state == "running"


def _failure_of(error) -> str:
    """The rank's exception as its traceback's last line gives it, or how its process ended."""
    if isinstance(error, torch.multiprocessing.ProcessExitedException):
        if error.signal_name:
            return f"its process was killed by {error.signal_name}"
        return f"its process exited with code {error.exit_code}"
    lines = [line for line in str(error.msg).splitlines() if line.strip()]
    return lines[-1].strip() if lines else "an error"


# torch's join logs this for each rank still running after one ended with an error.
_TORCH_SPAWN_LOGGER = "torch.multiprocessing.spawn"
_TERMINATING = "Terminating process"


class _TerminationLine(logging.Filter):
    """torch's "Terminating process <pid> via signal SIGTERM", said once its join has named the
    rank that failed: dropped after a config error or a preemption, which the ranks have
    reported themselves; otherwise said in words.

    A rank that ended without finishing its run or saving a preemption checkpoint has its peers
    killed here and now, rather than sent the SIGTERM: they can only wait for it in their next
    collective, or, stalled, never get there, and a SIGTERM is a preemption request they would
    act on until torch kills them 30 s later. Here, not as soon as the rank ends, so that torch
    names the rank that failed, not a peer killed before its join looked.
    """

    def __init__(self, nproc: int, marks: "RankMarks"):
        super().__init__()
        self.nproc = nproc
        self.marks = marks

    def filter(self, record) -> bool:
        if not str(record.msg).startswith(_TERMINATING):
            return True
        pid = record.args[0] if record.args else None
        killed = pid is not None and self._failed_unfinished() and _kill_pid(pid)
        if self.marks.count("config_error", "preempted"):
            return False
        record.msg, record.args = (
            "a rank ended with an error (reported below), so its peers are stopped: "
            + ("process %s killed" if killed else "SIGTERM to process %s"),
            (pid if pid is not None else "?",),
        )
        return True

    def _failed_unfinished(self) -> bool:
        """Whether a rank ended without finishing its run or saving a preemption checkpoint
        (one that finished and then died in gloo's teardown leaves its peers to finish)."""
        running = [p for p in multiprocessing.active_children() if _still_running(p.pid)]
        return self.nproc - len(running) > self.marks.count("finished", "preempted")


@contextlib.contextmanager
def _termination_explained(nproc: int, marks: "RankMarks"):
    logger = logging.getLogger(_TORCH_SPAWN_LOGGER)
    line = _TerminationLine(nproc, marks)
    logger.addFilter(line)
    # The line is the moment to act on, whatever level the program's logging shows.
    level = logger.level
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
        logger.removeFilter(line)


def _preempted_code(error) -> int:
    """The ranks' own code (75, or 130 after a SIGINT); this launcher's signal decides when
    the rank torch names aborted in gloo's teardown after saving."""
    if error.exit_code in (EXIT_PREEMPTED, EXIT_INTERRUPTED):
        return error.exit_code
    return exit_code_for(REQUEST.signal)


def _killed(signum, saved: bool) -> SystemExit:
    """The exit after a second signal killed the ranks: 130 for Ctrl-C; otherwise 75 when they
    had saved where they stopped, else 1."""
    print(_killed_message(signum, saved), file=sys.stderr, flush=True)
    if signum == signal.SIGINT:
        return SystemExit(EXIT_INTERRUPTED)
    return SystemExit(EXIT_PREEMPTED if saved else 1)


def _killed_message(signum, saved: bool) -> str:
    if saved:
        # Every rank marks its save only once the checkpoint is whole (after their barrier).
        return (
            f"stopped by a second {signal_name(signum)} while the ranks were closing down, "
            f"after they had saved the preemption checkpoint named above: they were killed "
            f"after it.\n  --override resume=True continues from that checkpoint."
        )
    return (
        f"stopped by a second {signal_name(signum)}: the ranks had not stopped after the "
        f"first, so they were killed, without a preemption checkpoint.\n"
        f"  --override resume=True continues from the last checkpoint written before."
    )


def _still_running(pid: int) -> bool:
    """Whether a child still exists, asked of the system.

    The handler can run while torch's join is reaping that child, before multiprocessing has
    recorded its end, so multiprocessing would still count it as running.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(processes) -> None:
    for process in processes:
        process.kill()


def _kill_pid(pid) -> bool:
    """SIGKILL ``pid``; whether it was there to kill."""
    try:
        os.kill(int(pid), signal.SIGKILL)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    return True


@contextlib.contextmanager
def _teardown_crash_tolerated(nproc: int, marks: RankMarks):
    """Report success when a rank dies only after every rank of this node finished the run.

    gloo can abort a process while torch tears its process group down at exit; by then every
    checkpoint and log line is written, so the run's outcome is success, not that signal.
    """
    try:
        yield
    except torch.multiprocessing.ProcessExitedException as error:
        if marks.count("finished") < nproc:
            raise
        how = error.signal_name or f"exit code {error.exit_code}"
        warnings.warn(
            f"rank {error.error_index} ended with {how} in torch's process-group teardown, "
            f"after every rank had finished the run: its checkpoints and logs are complete.",
            stacklevel=3,
        )
