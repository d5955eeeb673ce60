"""The study's journal file: no record a killed process cut short can wedge the sweep.

Optuna's journal is one JSON record per line, appended under a lock. A process killed while
appending leaves its record cut short, without its newline. Optuna's reader skips such a last
line, but the next append is written onto it: the joined line never parses, and every later
read of the study fails. So whoever takes the journal's lock first sets such a tail aside, in
``study.journal.torn`` beside it, with one warning line; the study goes on from the record
before it, as every reader saw it. A sweep also reads the journal through before opening it:
a damaged line anywhere else is a config error naming the file and the line.

The lock is an ``flock`` on ``locks/journal.lock``, which the kernel drops when its holder dies
however it dies. Optuna's own lock (a symlink) outlives a killed holder and is broken by the
next writer once the journal has not changed for 30 s, which an append can take on a loaded
machine: two writers would then append at once.
"""

import fcntl
import json
import os
import warnings
from pathlib import Path

from optuna.storages.journal import JournalFileBackend

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.sweep.claims import LOCKS_DIR

__all__ = ["TORN_SUFFIX", "check_journal", "journal_backend"]

TORN_SUFFIX = ".torn"
_LOCK_FILE = "journal.lock"


class _JournalLock:
    """The journal's append lock (what Optuna's ``lock_obj`` does: ``acquire``, ``release``);
    taking it sets aside a record its last holder left cut short."""

    def __init__(self, journal: Path):
        self.journal = journal
        self.path = journal.parent / LOCKS_DIR / _LOCK_FILE
        self._handle = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            _set_aside_torn_tail(self.journal)
        except BaseException:
            handle.close()
            raise
        self._handle = handle
        return True

    def release(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()


def journal_backend(path) -> JournalFileBackend:
    """Optuna's journal at ``path``, appended to under ``_JournalLock``."""
    path = Path(path)
    return JournalFileBackend(str(path), lock_obj=_JournalLock(path))


def check_journal(path) -> None:
    """Set aside a cut-short last record, then refuse a journal with a line that does not parse
    (a config error naming the file and the line), all under the journal's lock."""
    path = Path(path)
    if not path.exists():
        return
    lock = _JournalLock(path)
    lock.acquire()
    try:
        _check_lines(path)
    finally:
        lock.release()


def _set_aside_torn_tail(journal: Path) -> None:
    """Move the bytes after the journal's last newline to ``<journal>.torn``; the writer that
    left them died before finishing its record (whoever holds the lock is the only writer)."""
    try:
        handle = open(journal, "rb+")
    except FileNotFoundError:
        return
    with handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0 or _last_byte(handle, size) == b"\n":
            return
        keep = _end_of_last_line(handle, size)
        handle.seek(keep)
        torn = handle.read()
        aside = journal.with_name(journal.name + TORN_SUFFIX)
        with open(aside, "ab") as side:
            side.write(torn + b"\n")
            side.flush()
            os.fsync(side.fileno())
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    warnings.warn(
        f"{journal} ended in a record cut short ({len(torn)} bytes: a process died writing it); "
        f"it is set aside in {aside}, and the study goes on from the record before it.",
        stacklevel=2,
    )


def _last_byte(handle, size: int) -> bytes:
    handle.seek(size - 1)
    return handle.read(1)


def _end_of_last_line(handle, size: int, block: int = 1 << 16) -> int:
    """The offset just past the last newline (0 when there is none), read from the end."""
    end = size
    while end > 0:
        start = max(0, end - block)
        handle.seek(start)
        found = handle.read(end - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


def _check_lines(path: Path) -> None:
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                record = json.loads(line)
            except ValueError as error:
                raise ConfigError(_damaged(path, number, f"not JSON ({error})")) from None
            if not isinstance(record, dict) or "op_code" not in record:
                raise ConfigError(_damaged(path, number, "not a journal record"))


def _damaged(path: Path, number: int, what: str) -> str:
    return (
        f"{path}, line {number}, is {what}: the study's journal was damaged (edited, or "
        f"written by two processes at once).\n"
        f"  Optuna cannot read the study past it. Keep a copy of the file, then delete or "
        f"repair that line: the study loses the one operation it recorded."
    )
