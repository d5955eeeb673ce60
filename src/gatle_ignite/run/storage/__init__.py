"""Where a run directory lives: this machine's file system, or an object store named by a URL.

A ``save_dir`` such as ``s3://bucket/prefix`` (any fsspec URL) is kept as a local staging
directory, where everything is written exactly as for a local run, and a :class:`Place` that
publishes each finished file to the URL and reads the URL back. fsspec is imported by the
remote place alone, so a local run never loads it.
"""

import os
import re
from pathlib import Path

from gatle_ignite.run.storage.place import LocalPlace, Place, StorageError

__all__ = [
    "CACHE_VAR",
    "LocalPlace",
    "Place",
    "StorageError",
    "cache_root",
    "holder_of",
    "is_url",
    "local_dir",
    "place_of",
    "sharded_io",
    "shown_in",
    "staging_dir",
]

# Where staging directories and the read cache go; default the user's cache directory.
CACHE_VAR = "GATLE_IGNITE_CACHE"
# A scheme of two letters or more, so that a Windows drive (C:\) is a path.
_URL = re.compile(r"^(?P<protocol>[A-Za-z][A-Za-z0-9+.\-]+)://(?P<rest>.*)$")


def is_url(save_dir) -> bool:
    """Whether ``save_dir`` names an object store (``s3://...``) rather than a local path."""
    return isinstance(save_dir, str) and _URL.match(save_dir) is not None


def cache_root() -> Path:
    configured = os.environ.get(CACHE_VAR)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gatle-ignite"


def staging_dir(url: str, purpose: str = "staging") -> Path:
    """The local directory that stands for ``url``: ``staging`` for the run that writes it,
    ``read`` for commands that only read it. Its path repeats the URL's, so a person finds it."""
    match = _URL.match(url)
    parts = [part for part in match["rest"].split("/") if part not in ("", ".")]
    if ".." in parts:
        raise StorageError(f"{url} climbs out of its bucket ('..'); name the prefix plainly.")
    return cache_root() / purpose / match["protocol"].lower() / Path(*parts or ["_"])


def local_dir(save_dir) -> Path:
    """Where the files of ``save_dir`` are written on this machine: itself, or for a URL its
    staging directory."""
    return staging_dir(save_dir) if is_url(save_dir) else Path(save_dir)


def shown_in(save_dir, name: str = "") -> str:
    """How a message names ``save_dir`` or the file ``name`` in it (a URL stays a URL)."""
    if is_url(save_dir):
        return f"{save_dir.rstrip('/')}/{name}" if name else save_dir
    return str(Path(save_dir) / name) if name else str(save_dir)


def holder_of(place: Place):
    """The live process writing ``place`` (``pid``, ``host``, ``command``), or None: the lock
    of a local directory, the lease of a URL."""
    if place.remote:
        from gatle_ignite.run.storage.lease import lease_holder

        return lease_holder(place)
    from gatle_ignite.run.lock import holder

    return holder(place.path)


def sharded_io():
    """DCP's fsspec writer and reader classes (``.writer``, ``.reader``), for a sharded
    checkpoint at a URL."""
    from gatle_ignite.run.storage.remote import sharded_io as classes

    return classes()


def place_of(save_dir, local=None) -> Place:
    """The :class:`Place` of ``save_dir`` (returned as it is when it is one already); a URL's
    files are read into ``local`` (default its read cache)."""
    if isinstance(save_dir, Place):
        return save_dir
    if not is_url(save_dir):
        return LocalPlace(save_dir)
    from gatle_ignite.run.storage.remote import RemotePlace

    return RemotePlace(save_dir, local if local is not None else staging_dir(save_dir, "read"))
