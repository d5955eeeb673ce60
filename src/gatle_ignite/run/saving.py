"""Writing checkpoints: complete or absent, indexed in the manifest, rotated without a gap.

Each file is written under a staging name and renamed into place, so no reader ever sees half
of one. A file rotated out by ``n_saved`` is deleted only after its replacement is on disk and
in the index, so a process killed in between still leaves a checkpoint of every kind.
"""

import os
import uuid
from collections.abc import Callable
from pathlib import Path

import ignite.distributed as idist
import torch
from ignite.handlers import DiskSaver

from gatle_ignite.run.layout import staging_path
from gatle_ignite.run.unchanged_state import LastWrite, snapshot

__all__ = ["RunSaver", "save_atomically"]


def save_atomically(obj, path: Path) -> None:
    """``torch.save`` to ``path`` through a staging name in the same directory."""
    staging = staging_path(path, uuid.uuid4().hex[:8])
    try:
        torch.save(obj, staging)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    os.replace(staging, path)


class RunSaver(DiskSaver):
    """ignite's DiskSaver for a run directory: staged writes, links, the index, late removal.

    ``on_saved(filename, metadata, removed)`` records each write in the run's index. A
    checkpoint whose state equals the run's last written file (the best file, a few handlers
    earlier in the same epoch) becomes a hard link to it instead of a second full write.
    """

    def __init__(self, dirname, last_write: LastWrite, on_saved: Callable):
        super().__init__(dirname=dirname, require_empty=False)
        self._last_write = last_write
        self._on_saved = on_saved
        self._rotated_out = []

    def remove(self, filename: str) -> None:
        self._rotated_out.append(filename)

    def __call__(self, checkpoint, filename, metadata=None) -> None:
        if idist.has_xla_support or idist.get_rank() != self.save_on_rank:
            super().__call__(checkpoint, filename, metadata)
            return
        path = Path(self.dirname) / filename
        state = snapshot(checkpoint)
        if not self._last_write.link_if_same(state, path):
            save_atomically(checkpoint, path)
        self._last_write.remember(path, state)
        removed, self._rotated_out = [n for n in self._rotated_out if n != filename], []
        self._on_saved(filename, metadata or {}, removed)
        for name in removed:
            (Path(self.dirname) / name).unlink(missing_ok=True)
