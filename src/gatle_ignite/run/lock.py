"""One process per run directory: an OS lock on ``run.lock`` that dies with its holder.

``flock`` belongs to the open file: when the holder exits, however it exits (SIGKILL included),
the kernel drops the lock, so a dead run never blocks the next one. The file also says who holds
it, for the message a second process gets.
"""

import json
import os
import socket
import sys
from pathlib import Path
from typing import Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.layout import LOCK_FILE

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock, only the holder's note
    fcntl = None

__all__ = ["RunLock", "held", "holder"]


class _Held:
    """An acquired lock file and the RunLocks of this process that share it."""

    def __init__(self, handle):
        self.handle = handle
        self.users = 0
        self.noted = False


# The locks this process holds, by lock file: a second trainer of the same process on the same
# save_dir (a script building two to compare them) shares the lock instead of refusing itself.
_HELD: dict = {}


def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    # Appending: opening must not erase the holder's note before we know we hold the lock.
    handle = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder_text = _describe(_read_note(handle))
        handle.close()
        raise ConfigError(
            f"{path.parent} is in use by another gatle-ignite process ({holder_text}).\n"
            f"  Wait for it to finish, stop it, or give this run its own save_dir."
        ) from None
    return handle


class RunLock:
    """The lock on one ``save_dir``; ``acquire`` refuses at once when another process holds it."""

    def __init__(self, save_dir):
        self.path = (Path(save_dir) / LOCK_FILE).absolute()
        self._held = None

    def acquire(self) -> None:
        if fcntl is None or self._held is not None:
            return
        held = _HELD.get(self.path)
        if held is None:
            held = _HELD[self.path] = _Held(_lock(self.path))
        held.users += 1
        self._held = held

    def note_holder(self) -> None:
        """Say in the lock file who holds it; done once the run is sure to start."""
        if self._held is None:
            return
        note = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)}
        handle = self._held.handle
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(note) + "\n")
        handle.flush()
        self._held.noted = True

    def release(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        held.users -= 1
        if held.users:
            return
        del _HELD[self.path]
        if held.noted:
            # A note left behind would name a process that no longer holds the directory.
            held.handle.truncate(0)
        held.handle.close()


def holder(save_dir) -> Optional[dict]:
    """The live process that holds ``save_dir`` (``pid``, ``host``, ``command``), or None.

    Read without locking, so asking never gets in a starting run's way. A process on another
    host cannot be checked from here and counts as live.
    """
    try:
        with open(Path(save_dir) / LOCK_FILE, encoding="utf-8") as handle:
            note = _read_note(handle)
    except OSError:
        return None
    if note is None:
        return None
    if note.get("host") == socket.gethostname() and not _alive(note.get("pid")):
        return None
    return note


def held(save_dir) -> bool:
    """Whether a process holds ``save_dir``'s lock now: asked of the kernel, not of the note.

    Takes the lock for an instant when it is free, so a starting run may be refused in that
    instant; only a process that has no run of its own to start (a sweep worker) asks.
    """
    if fcntl is None:
        return holder(save_dir) is not None
    try:
        handle = open(Path(save_dir) / LOCK_FILE, encoding="utf-8")
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        return False


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        return True  # it exists, under another user
    except (OSError, TypeError, ValueError):
        return False
    return True


def _read_note(handle) -> Optional[dict]:
    handle.seek(0)
    try:
        note = json.loads(handle.read() or "null")
    except ValueError:
        return None
    return note if isinstance(note, dict) else None


def _describe(note: Optional[dict]) -> str:
    if note is None:
        return "it is still starting"
    return f"pid {note.get('pid')} on {note.get('host')}: {note.get('command')}"
