"""Writing checkpoints: complete or absent, indexed in the manifest, rotated without a gap.

Each file (or sharded directory) is written under a staging name and renamed into place, so no
reader ever sees half of one. A checkpoint rotated out by ``n_saved`` is deleted only after its
replacement is on disk and in the index, so a process killed in between still leaves a
checkpoint of every kind. With ``async_save`` the write runs in a background thread: the loop
waits only for the state's copy to host memory, and the next save waits for the pending one.
"""

import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import ignite.distributed as idist
import torch
from ignite.handlers import DiskSaver

from gatle_ignite.run.filesystem import confined, save_dir_error, writing_into
from gatle_ignite.run.host_memory import host_copy
from gatle_ignite.run.layout import staging_path
from gatle_ignite.run.storage import LocalPlace, Place
from gatle_ignite.run.unchanged_state import LastWrite, snapshot

__all__ = ["BackgroundWrites", "RunSaver", "host_copy", "save_atomically"]


def save_atomically(obj, path: Path) -> None:
    """``torch.save`` to ``path`` through a staging name in the same directory; a link at
    ``path`` out of that directory is refused, and a full or read-only disk told plainly."""
    path = confined(path)
    staging = staging_path(path, uuid.uuid4().hex[:8])
    with writing_into(path.parent):
        try:
            torch.save(obj, staging)
        except BaseException as error:
            # Told while the half-written file still takes the space it ran out of.
            explained = save_dir_error(path.parent, error)
            staging.unlink(missing_ok=True)
            if explained is not None:
                raise explained from error
            raise
        os.replace(staging, path)


class BackgroundWrites:
    """Checkpoint writes run one at a time in a thread; ``wait`` for the pending one.

    An error in a write is raised by the next ``wait``, in the training thread. Since one write
    runs at a time, the host memory a write was staged in is free again for the next one:
    ``host_buffers`` keeps it.
    """

    def __init__(self):
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.host_buffers = None

    def submit(self, job: Callable) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(job,), daemon=True)
        self._thread.start()

    def _run(self, job: Callable) -> None:
        try:
            job()
        except BaseException as error:
            self._error = error

    def wait(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error


class RunSaver(DiskSaver):
    """ignite's DiskSaver for a run directory: staged writes, links, the index, late removal.

    ``on_saved(filename, metadata, removed)`` records each write in the run's index. A
    checkpoint whose state equals the run's last written file (the best file, a few handlers
    earlier in the same epoch) becomes a hard link to it instead of a second full write. A
    ``.dcp`` name is written sharded, by every rank (``process_group`` carries DCP's own
    collectives for background writes). Each finished file is published to the run's
    ``place`` (uploaded, for a URL) before the index names it, in the background write too.
    """

    def __init__(
        self,
        dirname,
        last_write: LastWrite,
        on_saved: Callable,
        writes: Optional[BackgroundWrites] = None,
        process_group=None,
        place: Optional[Place] = None,
    ):
        super().__init__(dirname=dirname, require_empty=False)
        self._last_write = last_write
        self._on_saved = on_saved
        self._writes = writes
        self._process_group = process_group
        self._place = place if place is not None else LocalPlace(dirname)
        self._rotated_out = []
        # The file this save linked to (its bytes are published already), or None.
        self._same_as = None

    def remove(self, filename: str) -> None:
        self._rotated_out.append(filename)

    def __call__(self, checkpoint, filename, metadata=None) -> None:
        if self._writes is not None:
            self._writes.wait()
        path = Path(self.dirname) / filename
        sharded = path.suffix == ".dcp"
        if sharded:
            # At a URL every rank writes its shard there itself: nothing is left to publish.
            target = self._place.shown(filename) if self._place.remote else path
            finish = self._save_sharded(checkpoint, target)
        elif idist.get_rank() == self.save_on_rank:
            finish = self._save_file(checkpoint, path)
        else:
            return
        removed, self._rotated_out = [n for n in self._rotated_out if n != filename], []
        lead = idist.get_rank() == self.save_on_rank

        same_as, self._same_as = self._same_as, None

        def job() -> None:
            finish()
            if lead:
                if not sharded:
                    self._place.publish(filename, same_as=same_as)
                self._on_saved(filename, metadata or {}, removed)
                for name in removed:
                    self._place.remove(name)

        if self._writes is not None:
            self._writes.submit(job)
        else:
            job()

    def _save_file(self, checkpoint, path: Path) -> Callable:
        state = snapshot(checkpoint)
        last = self._last_write.path
        if self._last_write.link_if_same(state, path):
            # The state on disk already (the best file of this epoch): a link, no copy.
            self._last_write.remember(path, state)
            self._same_as = last.name
            return lambda: None
        if self._writes is not None:
            checkpoint = host_copy(checkpoint, self._writes.host_buffers)
            self._writes.host_buffers = checkpoint

        def finish() -> None:
            save_atomically(checkpoint, path)
            self._last_write.remember(path, state)

        return finish

    def _save_sharded(self, checkpoint, path) -> Callable:
        # On first use: torch.distributed.checkpoint is a fifth of a second to import.
        from gatle_ignite.run.sharded import finish_sharded, save_sharded

        future = save_sharded(checkpoint, path, self._process_group, writes=self._writes)

        def finish() -> None:
            if future is not None:
                future.result()
            if idist.get_rank() == self.save_on_rank:
                finish_sharded(path)

        return finish
