"""The output directory: written under a staging name beside it, renamed into place only once
every check passed, so a failed or killed export never leaves a half-written ``DIR``.

A SIGKILL leaves that staging directory behind, and so can a kill between setting an old
``DIR`` aside and removing it; each export into a directory first removes what earlier exports
left there: a staging directory whose process is gone, and an old ``DIR`` set aside once its
replacement is in place.
"""

import hashlib
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.filesystem import remove_quietly
from gatle_ignite.run.lock import alive

__all__ = ["check_out_dir", "publish", "staged"]

# A staging name says which process writes it (its host, hashed to a plain word, and its pid),
# so that another export can tell a live one's from a dead one's.
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_LEFTOVER = re.compile(
    r"^\.(?P<name>.+)\.(?P<what>partial|replaced)-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]{8}$"
)


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse a ``DIR`` that is a file, or a non-empty directory without ``force``."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; export writes a directory. Name another path.")
    if out.is_dir() and any(out.iterdir()) and not force:
        held = ", ".join(sorted(path.name for path in out.iterdir()))
        raise ConfigError(
            f"--out {out} already holds files: {held}.\n"
            f"  Name another directory, or add --force to replace this one once the export "
            f"passes its checks."
        )


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A fresh staging directory beside ``out``, removed unless :func:`publish` took it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for leftover in remove_leftovers(out.parent):
        print(f"REMOVED {leftover}: what an export killed before it finished left")
    staging = _beside(out, "partial")
    staging.mkdir()
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish(staging: Path, out: Path) -> None:
    """Put ``staging`` in place of ``out``; an old ``out`` steps aside first and goes after (a
    symbolic link only as a link: what it points to stays)."""
    if not out.exists():
        os.replace(staging, out)
        return
    old = _beside(out, "replaced")
    os.replace(out, old)
    os.replace(staging, out)
    remove_quietly(old)


def remove_leftovers(parent: Path) -> list:
    """Remove what killed exports left in ``parent``; returns their paths.

    A staging directory goes once its process is gone (one of another host is left: nothing
    here can tell whether it lives); an old output set aside goes once its replacement is in
    place, and stays while it is the only copy.
    """
    removed = []
    for path in sorted(parent.iterdir()):
        match = _LEFTOVER.match(path.name)
        if match is None:
            continue
        if match["what"] == "replaced":
            gone = (parent / match["name"]).exists()
        else:
            gone = match["host"] == _HOST and not alive(int(match["pid"]))
        if gone:
            remove_quietly(path)
            removed.append(path)
    return removed


def _beside(out: Path, what: str) -> Path:
    """A hidden name in ``out``'s directory, unique to this call, naming this process."""
    return out.parent / f".{out.name}.{what}-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
