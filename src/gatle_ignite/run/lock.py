"""One process per run directory: an OS lock on ``run.lock`` that dies with its holder.

``flock`` belongs to the open file: when the holder exits, however it exits (SIGKILL included),
the kernel drops the lock, so a dead run never blocks the next one. The file also says who holds
it, for the message a second process gets.
"""

import contextlib
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.redaction import shown_command
from gatle_ignite.run.filesystem import RECORD_LIMIT, UnsafeFile, confined, open_regular
from gatle_ignite.run.layout import LOCK_FILE

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock, only the holder's note
    fcntl = None

__all__ = ["RunLock", "alive", "held", "holder"]


class _Held:
    """An acquired lock file and the RunLocks of this process that share it."""

    def __init__(self, handle):
        self.handle = handle
        self.users = 0
        self.noted = False


# A lock file that cannot be opened for writing is still locked, read-only, where it exists.
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
_ATTEMPTS, _RETRY_SECONDS = 50, 0.02

# The locks this process holds, by lock file: a second trainer of the same process on the same
# save_dir (a script building two to compare them) shares the lock instead of refusing itself.
_HELD: dict = {}


def _lock(path: Path):
    """The open lock file, locked; None where no file can be made (a read-only directory,
    which no other process can train into either)."""
    handle = _open_lock_file(path)
    if handle is None:
        return None
    if not _try_lock(handle):
        holder_text = _describe(_read_note(handle))
        handle.close()
        raise ConfigError(
            f"{path.parent} is in use by another gatle-ignite process ({holder_text}).\n"
            f"  Wait for it to finish, stop it, or give this run its own save_dir."
        ) from None
    return handle


def _open_lock_file(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Appending: opening must not erase the holder's note before we know we hold the lock.
        return open(confined(path), "a+", encoding="utf-8")
    except OSError as error:
        if error.errno not in _READ_ONLY:
            raise
    try:
        return open(path, encoding="utf-8")
    except FileNotFoundError:
        return None


def _try_lock(handle) -> bool:
    """Take the lock without waiting for a holder; a ``status`` probing it holds it for
    microseconds, so a busy lock is tried again for a second (a loaded machine can pause the
    probe that long) before it counts as held."""
    for attempt in range(_ATTEMPTS):
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < _ATTEMPTS:
                time.sleep(_RETRY_SECONDS)
    return False


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
        handle = self._held.handle if self._held is not None else None
        if handle is None or not handle.writable():
            return  # a read-only directory, where the run's first write is refused
        note = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": shown_command(sys.argv),
        }
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
        if held.handle is None:
            return
        # Closing drops the lock even when the file system refuses the last write (a full
        # disk): the note is only a message, so its failure is not this process's error.
        with contextlib.suppress(OSError):
            if held.noted:
                # A note left behind would name a process that no longer holds the directory.
                held.handle.truncate(0)
        with contextlib.suppress(OSError):
            held.handle.close()


def holder(save_dir) -> Optional[dict]:
    """The live process that holds ``save_dir`` (``pid``, ``host``, ``command``), or None.

    The note in the lock file says who; the lock itself says whether: a non-blocking probe,
    released at once, succeeds only when no process holds it, on any host sharing the file
    system. Where the probe cannot answer (no ``flock``, a file system that refuses it), a
    holder on this host is checked by its pid, and one on another host is returned with
    ``unverified`` set: nothing here can tell whether it lives.
    """
    path = Path(save_dir) / LOCK_FILE
    try:
        with open_regular(path) as handle:
            note = _read_note(handle)
            held = _probe(handle) if note is not None else None
    except (OSError, UnsafeFile):
        return None
    if note is None or held is False:
        return None
    if held is None:
        if note.get("host") == socket.gethostname():
            return note if alive(note.get("pid")) else None
        note["unverified"] = True
    return note


def _probe(handle) -> Optional[bool]:
    """Whether a process holds the lock on ``handle``'s file; None when it cannot be told."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return False


def held(save_dir) -> bool:
    """Whether a process holds ``save_dir``'s lock now: asked of the kernel (a shared probe,
    released at once), not of the note; the note where the kernel cannot tell."""
    try:
        handle = open_regular(Path(save_dir) / LOCK_FILE)
    except (OSError, UnsafeFile):
        return False
    with handle:
        probed = _probe(handle)
    return probed if probed is not None else holder(save_dir) is not None


def alive(pid) -> bool:
    """Whether the process ``pid`` of this host exists."""
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
        note = json.loads(handle.read(RECORD_LIMIT) or "null")
    except ValueError:
        return None
    return note if isinstance(note, dict) else None


def _describe(note: Optional[dict]) -> str:
    if note is None:
        return "it is still starting"
    return f"pid {note.get('pid')} on {note.get('host')}: {shown_command(str(note.get('command')))}"
