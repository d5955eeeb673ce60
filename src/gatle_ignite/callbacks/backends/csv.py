"""``<save_dir>/metrics.csv``: one row per logged value (wall time, epoch, step, name, value)."""

import csv
import io
import json
import numbers
import os
import time
from pathlib import Path

from gatle_ignite.callbacks.logging import Backend as BaseBackend
from gatle_ignite.run.filesystem import open_confined, write_atomically, writing_into
from gatle_ignite.run.storage import local_dir

__all__ = ["Backend"]

FILE_NAME = "metrics.csv"
HEADER = ("wall_time", "epoch", "step", "name", "value")


def _cell(value):
    if type(value) in (float, int):
        return value  # the writer formats it as str() would
    if value is None:
        return ""
    return str(value) if isinstance(value, numbers.Real) else json.dumps(value, default=str)


class Backend(BaseBackend):
    """A resumed run appends to the file; a fresh run starts it anew."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.save_dir = local_dir(cfg.save_dir)
        with writing_into(self.save_dir):
            os.makedirs(self.save_dir, exist_ok=True)
            self.path = os.path.join(self.save_dir, FILE_NAME)
            appending = bool(cfg.get("resume", False)) and os.path.exists(self.path)
            self._open("a" if appending else "w")
            if not appending or os.path.getsize(self.path) == 0:
                self.writer.writerow(HEADER)
                self.file.flush()

    def _open(self, mode: str):
        self.file = open_confined(self.path, mode, newline="", encoding="utf-8")
        self.writer = csv.writer(self.file)
        return self.file

    def log(self, metrics, step=None, epoch=None):
        self._write(_rows(metrics, step, epoch, str(time.time())))

    def log_many(self, records):
        """The points written together: one write and one flush for all their rows."""
        now = str(time.time())
        self._write([row for record in records for row in _rows(*record, now)])

    def _write(self, rows: list) -> None:
        with writing_into(self.save_dir):
            self.writer.writerows(rows)
            # What was logged before a crash or a kill is then on disk.
            self.file.flush()

    def rewind(self, step):
        self.file.close()
        with open(self.path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
        kept = [row for row in rows[1:] if not _after(row, step)]
        text = io.StringIO()
        csv.writer(text).writerows([HEADER, *kept])
        write_atomically(Path(self.path), text.getvalue())
        self._open("a")

    def finish(self, failed=False):
        try:
            self.file.close()
        except OSError:
            # A failed run's last rows may not fit a full disk; what failed it is told instead.
            if not failed:
                raise


def _rows(metrics, step, epoch, now: str) -> list:
    # The cells every row shares, as text once: the writer would format them row by row.
    epoch, step = str(_cell(epoch)), str(_cell(step))
    return [(now, epoch, step, name, _cell(value)) for name, value in metrics.items()]


def _after(row, step) -> bool:
    """Whether a row was logged after ``step``; a row without a step is kept."""
    try:
        return int(row[HEADER.index("step")]) > step
    except (IndexError, ValueError):
        return False
