"""A sweep whose ``--dir`` is an object store's URL.

Its study journal, ``sweep.json`` and the workers' claims stay in the URL's local staging
directory, where they work as in a local sweep directory; each trial is a run at
``<URL>/trial_NNNN``. ``sweep.json`` and the journal are published to the URL after every trial
and at the end, and fetched first on a machine that has none, so the sweep continues there. One
machine at a time holds the sweep's lease; several machines share a sweep through a database
study (``--storage postgresql://...``), not through the journal.
"""

import contextlib
import threading
from pathlib import Path

from gatle_ignite.run.storage import is_url, local_dir, place_of
from gatle_ignite.sweep.record import RECORD_FILE
from gatle_ignite.sweep.study import JOURNAL_FILE

__all__ = ["fetch_sweep_files", "publish_sweep_files", "sweep_lease"]

_FILES = (RECORD_FILE, JOURNAL_FILE)
# Worker threads finish trials at once; one publishes at a time.
_PUBLISHING = threading.Lock()


def _place(sweep_dir):
    return place_of(sweep_dir, local=local_dir(sweep_dir))


def fetch_sweep_files(sweep_dir) -> None:
    """On a machine whose staging directory holds no ``sweep.json``: the URL's files."""
    here = local_dir(sweep_dir)
    if not is_url(sweep_dir) or (here / RECORD_FILE).exists():
        return
    place = _place(sweep_dir)
    for name in _FILES:
        data = place.read_bytes(name)
        if data is not None:
            here.mkdir(parents=True, exist_ok=True)
            (here / name).write_bytes(data)


def publish_sweep_files(sweep_dir) -> None:
    """The sweep's record and journal (up to its last whole entry) to the URL."""
    if not is_url(sweep_dir):
        return
    place = _place(sweep_dir)
    with _PUBLISHING:
        for name in _FILES:
            path = Path(place.path) / name
            if path.is_file():
                data = path.read_bytes()
                place.publish_bytes(name, data[: data.rfind(b"\n") + 1] or data)


@contextlib.contextmanager
def sweep_lease(sweep_dir, journal: bool):
    """Hold the URL sweep's lease while it runs with its journal (no lease otherwise)."""
    if not (is_url(sweep_dir) and journal):
        yield
        return
    from gatle_ignite.run.storage.lease import Lease

    lease = Lease(_place(sweep_dir))
    lease.acquire()
    try:
        yield
    finally:
        lease.release()
