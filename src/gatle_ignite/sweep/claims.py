"""Who runs which trial: OS locks in the sweep directory that die with their holder.

``flock`` belongs to an open file, so the kernel drops it when its holder dies however it dies
(SIGKILL included), and two opens conflict even within one process (two worker threads). Two
kinds:

- the scheduling lock (``locks/sweep.lock``), held for the moment a worker picks its next trial:
  the count, the ask and the claim are one step for every worker of the sweep, on this machine
  or on any other that shares the directory;
- a trial's claim (``locks/trial_NNNN.lock``), held by the worker running that trial for as
  long as it runs it. A trial the study says is running whose claim is free was left by a worker
  that died: it is an orphan, and the next worker to claim it resumes it.
"""

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Optional

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None

from gatle_ignite.dispatch import ConfigError

__all__ = ["Claim", "claim", "scheduling"]

LOCKS_DIR = "locks"


class Claim:
    """An exclusive flock on a trial's claim file, held until ``release``.

    ``previous`` is what the last holder noted in the file (its host, pid and child's pid), so
    that a worker taking over an orphan can wait for a child the dead worker left running.
    """

    def __init__(self, path: Path, handle, previous: Optional[dict]):
        self.path = path
        self.previous = previous
        self._handle = handle
        self.note()

    def note(self, **fields) -> None:
        """Say in the file who holds it, with ``fields`` (the trial's child pid)."""
        record = {"pid": os.getpid(), "host": socket.gethostname(), **fields}
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()

    def release(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()


def _open(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a+", encoding="utf-8")


def _require_flock() -> None:
    if fcntl is None:
        raise ConfigError("a sweep needs POSIX file locks (flock), which this system lacks")


def claim(sweep_dir, number: int) -> Optional[Claim]:
    """Trial ``number``'s claim, or None when a live worker holds it."""
    _require_flock()
    path = Path(sweep_dir) / LOCKS_DIR / f"trial_{number:04d}.lock"
    handle = _open(path)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return Claim(path, handle, _read_note(handle))


def _read_note(handle) -> Optional[dict]:
    handle.seek(0)
    try:
        note = json.loads(handle.read() or "null")
    except ValueError:
        return None
    return note if isinstance(note, dict) else None


@contextlib.contextmanager
def scheduling(sweep_dir):
    """Hold the sweep's scheduling lock (waiting for it) while the block runs."""
    _require_flock()
    handle = _open(Path(sweep_dir) / LOCKS_DIR / "sweep.lock")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        handle.close()
