"""A run's failure recorded by the process that started it, when the run could not record it
itself: a sweep's trial ended by SIGKILL or the OOM killer, a rank killed once a peer failed.

``status`` then says ``failed`` with the reason, instead of calling a run no process trains
``interrupted`` (resumable) for good.
"""

import time
import warnings
from pathlib import Path
from typing import Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.layout import MANIFEST_FILE
from gatle_ignite.run.lock import RunLock
from gatle_ignite.run.manifest import Manifest
from gatle_ignite.run.storage import is_url, place_of

__all__ = ["manifest_of", "record_failed"]


def record_failed(save_dir, reason: str, lock_wait_s: float = 0.0) -> None:
    """Record the run in ``save_dir`` as failed for ``reason``, if its ``run.json`` still says
    ``running`` and no live process holds its lock within ``lock_wait_s`` (a killed rank's
    DataLoader workers hold it until they see their parent gone, within seconds)."""
    if is_url(save_dir):
        # Its lease runs out instead, and status calls it interrupted.
        return
    found = manifest_of(save_dir)
    if found is None or found.state != "running":
        return
    lock = RunLock(save_dir)
    deadline = time.monotonic() + lock_wait_s
    while True:
        try:
            lock.acquire()
            break
        except ConfigError:
            if time.monotonic() >= deadline:
                return  # a process still trains it (a rank outliving its killed launcher)
            time.sleep(0.2)
    try:
        manifest = manifest_of(save_dir)
        if manifest is not None and manifest.state == "running":
            manifest.state = "failed"
            manifest.stop_reason = reason
            manifest.write(save_dir, last_word=True)
    except OSError as error:
        warnings.warn(
            f"{Path(save_dir) / MANIFEST_FILE} could not record that the run failed ({error}); "
            f"`gatle-ignite status` calls it interrupted.",
            stacklevel=2,
        )
    finally:
        lock.release()


def manifest_of(save_dir) -> Optional[Manifest]:
    """The run's ``run.json`` (pulled first from a URL), None where it is damaged."""
    place = place_of(save_dir)
    try:
        place.pull_records()
        return Manifest.read(place.path)
    except (ValueError, TypeError):
        return None
