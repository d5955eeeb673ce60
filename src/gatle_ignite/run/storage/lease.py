"""One writer per run on object storage: a lease object, renewed while the run trains.

No store can ``flock``. The lease is ``run.lease`` in the run's prefix: who holds it (pid, host,
command) and until when. It is created only if absent and renewed or taken over only if it is
still the version last read (S3's If-None-Match and If-Match; a memory store in its process),
so of two processes only one can hold it. A holder renews it every third of its term; one that
cannot (the store unreachable, or another process took the lease over) stops publishing. A
lease past its term, released, or held by a dead process on this host is taken over; a live
one is watched until it is renewed (refused) or runs out (taken over).

A store without conditional writes (gs://, az://, file:// through fsspec here) gets the same
lease written plainly and read back a moment later: two writers starting within that moment
are told apart, but not two whose writes are further apart than their reads (see the guide).
"""

import json
import os
import socket
import sys
import threading
import time
import uuid
import warnings
from typing import Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.redaction import shown_command
from gatle_ignite.run.layout import LEASE_FILE
from gatle_ignite.run.storage.place import StorageError

__all__ = ["LEASE_SECONDS_VAR", "Lease", "lease_holder"]

# The lease's term in seconds (default 60): how long a killed holder blocks the next run.
LEASE_SECONDS_VAR = "GATLE_IGNITE_LEASE_SECONDS"
_DEFAULT_SECONDS = 60.0
_RACES = 5

# The leases this process holds, by URL: a second trainer of the same process shares one.
_HELD: dict = {}


def _term() -> float:
    try:
        return max(float(os.environ.get(LEASE_SECONDS_VAR, _DEFAULT_SECONDS)), 1.0)
    except ValueError:
        return _DEFAULT_SECONDS


def _parse(data: bytes) -> Optional[dict]:
    try:
        note = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return note if isinstance(note, dict) else None


def _alive(note: dict) -> bool:
    """Whether the holder could still be running: not released, within its term, and, on this
    host, a process that exists."""
    if note.get("released"):
        return False
    expires = note.get("expires")
    if not isinstance(expires, (int, float)) or expires < time.time():
        return False
    if note.get("host") == socket.gethostname():
        try:
            os.kill(int(note.get("pid")), 0)
        except PermissionError:
            return True
        except (OSError, TypeError, ValueError):
            return False
    return True


def lease_holder(place) -> Optional[dict]:
    """The live holder of ``place``'s lease (``pid``, ``host``, ``command``), or None."""
    found = place.read_tagged(LEASE_FILE)
    note = _parse(found[0]) if found is not None else None
    return note if note is not None and _alive(note) else None


class _Held:
    def __init__(self, lease: "Lease"):
        self.lease = lease
        self.users = 0


class Lease:
    """The lease on one remote place: ``acquire``, ``check`` before each write, ``release``."""

    def __init__(self, place):
        self.place = place
        self.token = uuid.uuid4().hex
        self.term = _term()
        self._tag = None
        self._note = None
        self._stop = threading.Event()
        self._beat = None
        self._shared = None
        # Why the lease was lost, once it was: every later write is refused with it.
        self.lost: Optional[str] = None

    # ---- the RunLock interface ----

    def acquire(self) -> None:
        if self._shared is not None:
            return
        held = _HELD.get(self.place.url)
        if held is None:
            self._take()
            held = _HELD[self.place.url] = _Held(self)
        held.users += 1
        self._shared = held

    def note_holder(self) -> None:
        """The holder is noted in the lease itself when it is taken."""

    def release(self) -> None:
        held, self._shared = self._shared, None
        if held is None:
            return
        held.users -= 1
        if held.users:
            return
        del _HELD[self.place.url]
        held.lease._let_go()

    def check(self) -> None:
        """Refuse to write once the lease is lost: another process may be writing now."""
        owner = self._shared.lease if self._shared is not None else self
        if owner.lost is not None:
            raise StorageError(owner.lost)

    # ---- taking it ----

    def _fresh_note(self) -> dict:
        return {
            "holder": self.token,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": shown_command(sys.argv),
            "expires": time.time() + self.term,
        }

    def _write(self, tag: Optional[str]) -> Optional[str]:
        """Write a renewed note (created when ``tag`` is None); its tag, or None when the
        lease was not the version expected."""
        note = self._fresh_note()
        data = json.dumps(note).encode("utf-8")
        if tag is None:
            written = self.place.create(LEASE_FILE, data)
        else:
            written = self.place.replace(LEASE_FILE, data, tag)
        if written is not None:
            self._tag, self._note = written, note
        return written

    def _take(self) -> None:
        if not self.place.conditional:
            warnings.warn(
                f"{self.place.protocol}:// does not write on a condition here, so the lease on "
                f"{self.place.url} is written and read back after a moment; two writers that "
                f"start further apart than that are refused, two at the same moment may not be "
                f"(see 'Object storage' in the run directory guide).",
                stacklevel=4,
            )
        for _race in range(_RACES):
            found = self.place.read_tagged(LEASE_FILE)
            if found is not None and _alive(_parse(found[0]) or {}):
                found = self._watch(found, _parse(found[0]))
                if found is None:
                    continue
            if self._write(found[1] if found is not None else None) is not None:
                self._start_beating()
                return
        raise ConfigError(
            f"{self.place.url} is being taken by other processes at this moment; try again."
        )

    def _watch(self, found: tuple, note: dict) -> Optional[tuple]:
        """Wait for a live-looking lease to be renewed (its holder lives: refused) or to run
        out (returned, to be taken over); None when it changed hands meanwhile."""
        left = max(note["expires"] - time.time(), 0.0)
        print(
            f"WAITING up to {left:.0f}s for the lease on {self.place.url}: held by pid "
            f"{note.get('pid')} on {note.get('host')}, which renews it while it runs.",
            flush=True,
        )
        while _alive(note):
            time.sleep(min(1.0, self.term / 10))
            now = self.place.read_tagged(LEASE_FILE)
            if now is None:
                return None
            if now[1] != found[1]:
                renewed = _parse(now[0]) or {}
                if _alive(renewed):
                    raise _in_use(self.place.url, renewed)
                return now
        return found

    # ---- keeping it ----

    def _start_beating(self) -> None:
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="run-lease", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.term / 3):
            try:
                tag = self._write(self._tag)
            except StorageError as error:
                if time.time() > self._note["expires"]:
                    self.lost = (
                        f"the run's lease on {self.place.url} ran out: it could not be "
                        f"renewed ({error})"
                    )
                    return
                continue
            if tag is None:
                self.lost = (
                    f"another process took over the lease on {self.place.url}; this run "
                    f"stops writing there."
                )
                return

    def _let_go(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self.lost is not None or self._tag is None:
            return
        note = dict(self._note, released=True)
        try:
            self.place.replace(LEASE_FILE, json.dumps(note).encode("utf-8"), self._tag)
        except StorageError as error:
            warnings.warn(
                f"the lease on {self.place.url} could not be released ({error}); the next run "
                f"there waits for it to run out ({self.term:.0f}s).",
                stacklevel=3,
            )


def _in_use(url: str, note: dict) -> ConfigError:
    return ConfigError(
        f"{url} is in use by another gatle-ignite process (pid {note.get('pid')} on "
        f"{note.get('host')}: {shown_command(str(note.get('command')))}), which renews its "
        f"lease there.\n"
        f"  Wait for it to finish, stop it, or give this run its own save_dir."
    )
