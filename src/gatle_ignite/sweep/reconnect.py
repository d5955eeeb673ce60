"""A study in a database rides out the database's restart.

Optuna's RDB storage gives up on the first error, and SQLAlchemy's pre-ping only replaces a
pooled connection the server dropped once the server answers again. So every storage call that
fails for want of a connection is made again, with growing pauses, until the retry bound has
passed since its first failure; then ``StorageUnreachable`` says so in one line. An error of any
other kind is raised at once. One line on stderr says when the storage stops answering and one
when it answers again, so that a sweep that waits says why.

Light to import (the trainer's pruning handler catches ``StorageUnreachable``): Optuna and
SQLAlchemy are imported when a storage is opened.
"""

import functools
import sys
import time
from typing import Callable

from gatle_ignite.redaction import redact_text

__all__ = ["DEFAULT_RETRY_S", "StorageUnreachable", "connection_lost", "reconnecting_storage"]

# Long enough for a server's restart or a fail-over, short enough that a sweep whose database
# is gone says so within minutes.
DEFAULT_RETRY_S = 120
_FIRST_PAUSE_S = 0.5
_LONGEST_PAUSE_S = 5.0


class StorageUnreachable(Exception):
    """The study's database did not answer for the whole retry bound."""


def connection_lost(error: BaseException) -> bool:
    """Whether ``error``, or an error that caused it, is a lost or refused database connection
    (Optuna wraps SQLAlchemy's error in its own ``StorageInternalError``)."""
    from sqlalchemy import exc

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (exc.OperationalError, exc.InterfaceError)):
            return True
        if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
            return True
        error = error.__cause__ or error.__context__
    return False


def _reason(error: BaseException) -> str:
    """The driver's own first line (``connection refused ...``), not SQLAlchemy's wrapping."""
    from sqlalchemy import exc

    while error is not None and not isinstance(error, exc.DBAPIError):
        error = error.__cause__ or error.__context__
    cause = error.orig if error is not None and error.orig is not None else error
    lines = str(cause).strip().splitlines()
    return redact_text(lines[0] if lines else type(cause).__name__)


def _say(line: str) -> None:
    print(f"sweep: {line}", file=sys.stderr, flush=True)


class _Reconnecting:
    """Every BaseStorage call made on an RDB storage, again while its connection is lost."""

    def __init__(self, open_backend: Callable, retry_s: float, shown: str, retry_opening: bool):
        self.retry_s = retry_s
        self.shown = shown
        self._backend = self.retried(open_backend) if retry_opening else open_backend()

    def retried(self, call: Callable, *args, **kwargs):
        """``call(*args, **kwargs)``, made again while it fails for want of a connection."""
        lost_at, pause = None, _FIRST_PAUSE_S
        while True:
            try:
                result = call(*args, **kwargs)
            except Exception as error:
                if not connection_lost(error):
                    raise
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    _say(
                        f"the study storage {self.shown} does not answer ({_reason(error)}): "
                        f"trying again for up to {self.retry_s:g} s"
                    )
                if now - lost_at >= self.retry_s:
                    raise StorageUnreachable(
                        f"the study storage {self.shown} did not answer for {self.retry_s:g} s "
                        f"({_reason(error)})"
                    ) from None
                time.sleep(min(pause, lost_at + self.retry_s - now))
                pause = min(2 * pause, _LONGEST_PAUSE_S)
                continue
            if lost_at is not None:
                waited = time.monotonic() - lost_at
                _say(f"the study storage {self.shown} answers again, after {waited:.0f} s")
            return result


def _delegated(name: str):
    def call(self, *args, **kwargs):
        return self.retried(getattr(self._backend, name), *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def reconnecting_storage(open_backend: Callable, retry_s: float, shown: str, retry_opening: bool):
    """The RDB storage ``open_backend()`` opens, its every call retried for ``retry_s`` seconds
    while its connection is lost; ``shown`` names it in messages (redacted)."""
    return _storage_class()(open_backend, retry_s, shown, retry_opening)


@functools.cache
def _storage_class():
    import optuna

    base = optuna.storages.BaseStorage
    calls = [name for name, value in vars(base).items() if callable(value) and name[0] != "_"]
    # Not an RDBStorage to Optuna, so not wrapped in its cache (which calls the RDB storage's
    # private methods, past this retry): every call is retried, and a study reads its trials
    # anew each time, which the few hundred trials of a sweep afford.
    return type(
        "ReconnectingStorage",
        (_Reconnecting, base),
        {name: _delegated(name) for name in calls},
    )
