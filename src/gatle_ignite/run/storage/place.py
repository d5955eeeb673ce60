"""A run directory's place: what the run directory asks of where its files are kept.

Every file is written and read in a local directory, ``path``. For a local ``save_dir`` that
is the directory itself and the rest is nothing to do; a remote place (``storage.remote``)
publishes what is written there to its URL and fetches what is read from it.
"""

from pathlib import Path
from typing import Optional

from gatle_ignite.run.filesystem import remove_quietly
from gatle_ignite.run.layout import checkpoint_files

__all__ = ["LocalPlace", "Place", "StorageError"]


class StorageError(RuntimeError):
    """An object store that failed (down, refusing, too slow) after its retries; the message
    says what is safe where, and what to run."""


class Place:
    """The interface; :class:`LocalPlace` is the plain case."""

    remote = False
    # The local directory files are written to and read from.
    path: Path

    def shown(self, name: str = "") -> str:
        """How a message names the directory, or a file in it."""
        raise NotImplementedError

    def checkpoint_names(self) -> dict:
        """``{name: is_directory}`` of every file named like a checkpoint."""
        raise NotImplementedError

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def names(self):
        """The names directly in the directory; None when there is no such directory."""
        raise NotImplementedError

    def readable(self, name: str):
        """What ``load_checkpoint_file`` opens for ``name``: a local path (fetched once from a
        remote place), or a sharded checkpoint's URL, which DCP reads in place."""
        raise NotImplementedError

    def publish(self, name: str, same_as: Optional[str] = None) -> None:
        """Make the finished local file ``name`` the place's (``same_as``: it holds the same
        bytes as that file, published already)."""

    def publish_records(self) -> None:
        """Publish the run's record files (``run.json`` last)."""

    def pull_records(self) -> None:
        """Bring the run's record files from the place into ``path``."""

    def remove(self, name: str) -> None:
        """Delete the run's file ``name``."""
        raise NotImplementedError


class LocalPlace(Place):
    """A ``save_dir`` on this machine's file system: everything happens in place."""

    def __init__(self, path):
        self.path = Path(path)

    def shown(self, name: str = "") -> str:
        return str(self.path / name) if name else str(self.path)

    def checkpoint_names(self) -> dict:
        return {p.name: p.is_dir() for p in checkpoint_files(self.path)}

    def exists(self, name: str) -> bool:
        return (self.path / name).exists()

    def names(self):
        return [p.name for p in self.path.iterdir()] if self.path.is_dir() else None

    def readable(self, name: str) -> Path:
        return self.path / name

    def remove(self, name: str) -> None:
        remove_quietly(self.path / name)
